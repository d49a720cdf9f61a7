// Internal interface of the rope family (also used by the fused cache-write ops).
#pragma once

#include "dispatch/registry.h"
#include "optx/rope.h"

namespace optx::rope_detail {

inline constexpr int64_t kMaxRotaryDim = 1024;

// One tensor of heads to rotate: x + t * st + h * sh is head h of token t.
struct HeadSet {
  void* x = nullptr;
  int64_t heads = 0, st = 0, sh = 0;
};

// Validated arguments.
struct Args {
  int64_t T = 0;
  bool bf16 = false;
  HeadSet q, k;
  const void* positions = nullptr;
  bool pos64 = false;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t cs_stride = 0;  // row stride of cos / sin
  int64_t rotary_dim = 0, rotary_offset = 0;
  RopeStyle style = RopeStyle::kHalf;

  int64_t position(int64_t t) const {
    return pos64 ? static_cast<const int64_t*>(positions)[t] : static_cast<const int32_t*>(positions)[t];
  }
  // Token t's rows of the cos / sin tables.
  const float* cos_at(int64_t t) const { return cos + position(t) * cs_stride; }
  const float* sin_at(int64_t t) const { return sin + position(t) * cs_stride; }
};

using RopeFn = Status (*)(const Args&);
const dispatch::Registry<RopeFn>& registry();
Status to_args(const RopeParams& p, Args* a);
Status rope_reference(const Args& a);

// Per-ISA: rotates every head of one token (t) of the head sets in `a`.
struct Kernels {
  void (*token)(const Args& a, int64_t t);
};
const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels& kernels_avx512_bf16();

// Checks positions lie in [0, P): names the first bad index. Shared with fused ops.
Status check_positions(const char* op, const TensorView& positions, int64_t T, int64_t P);
// Validates positions, cos / sin tables, rotary_dim and style for `op`, filling the table
// part of Args (T, positions, cos, sin, cs_stride, rotary_dim, style).
Status table_args(const char* op, const TensorView& positions, const TensorView& cos, const TensorView& sin,
                  int64_t rotary_dim, RopeStyle style, int64_t T, Args* a);

}  // namespace optx::rope_detail
