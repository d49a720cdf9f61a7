// Internal interface of the norm family: per-ISA row kernels behind one registry per op.
#pragma once

#include <cstdint>

#include "dispatch/registry.h"
#include "optx/norm.h"
#include "simd/simd_scalar.h"

namespace optx::norm_detail {

// A batch of rows, already validated; pointers at row 0, strides in elements.
struct Rows {
  int64_t T = 0, H = 0;
  bool bf16 = false;
  const void* x = nullptr;
  int64_t ldx = 0;
  void* residual = nullptr;  // add_rms_norm only
  int64_t ldr = 0;
  const void* weight = nullptr;
  void* out = nullptr;
  int64_t ldo = 0;
  float eps = 0;
  // Non-temporal stores for out: set for outputs of >= simd::kStreamMinBytes, which will not be
  // in cache when the next op reads them anyway.
  bool stream_out = false;
};

struct Kernels {
  // Rows [t0, t1) in order, by one thread; streaming stores are fenced before return.
  void (*rms_norm_rows)(const Rows& r, int64_t t0, int64_t t1);
  void (*add_rms_norm_rows)(const Rows& r, int64_t t0, int64_t t1);
};
const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels& kernels_avx512_bf16();

using NormFn = Status (*)(const Rows&);
const dispatch::Registry<NormFn>& rms_norm_registry();
const dispatch::Registry<NormFn>& add_rms_norm_registry();
Status rms_norm_reference(const Rows& r);
Status add_rms_norm_reference(const Rows& r);

// Validation + conversion to Rows (shared by the public entry points, tests and tools).
Status to_rows(const RmsNormParams& p, Rows* r);
Status to_rows(const AddRmsNormParams& p, Rows* r);

}  // namespace optx::norm_detail
