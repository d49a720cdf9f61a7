// Internal interface of the kv_cache family: validated per-op arguments, per-ISA token
// kernels, registries and references.
#pragma once

#include <cstdint>

#include "dispatch/registry.h"
#include "numerics/quant_i8.h"
#include "optx/kv_cache.h"
#include "ops/rope/rope_internal.h"
#include "simd/simd_scalar.h"

namespace optx::kv_detail {

inline constexpr int64_t kMaxMlaRow = 4096;  // kv_lora_rank + rope_dim (a row is staged on the stack)

inline int64_t load_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

struct Plane {  // rows of one tensor: base + r * ld
  void* base = nullptr;
  int64_t ld = 0;
  DType dtype = DType::kF32;
  float* scales = nullptr;  // i8 caches
};

struct WriteArgs {
  int64_t T = 0, row = 0;
  const void* slots = nullptr;
  bool slots64 = false;
  bool stream = false;  // 2 x T x row x source bytes >= simd::kStreamMinBytes: non-temporal stores
  Plane k, v, k_cache, v_cache;  // k/v base null when absent
  int64_t slot(int64_t t) const { return load_index(slots, slots64, t); }
};

struct GatherArgs {
  int64_t B = 0, row = 0, block_size = 0, max_blocks = 0, total = 0;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  bool stream = false;  // output >= simd::kStreamMinBytes: non-temporal stores
  Plane k_cache, v_cache, k_out, v_out;  // out scales: Plane::scales of k_out / v_out
};

struct MlaArgs {
  int64_t T = 0, rank = 0, rope_dim = 0;
  bool bf16 = false;
  const void* kv = nullptr;
  int64_t ldkv = 0;
  const void* weight = nullptr;
  float eps = 0;
  rope_detail::Args rope;  // positions / tables / style; head sets unused
  const void* slots = nullptr;
  bool slots64 = false;
  void* cache = nullptr;
  int64_t ldc = 0;
  bool i8 = false;          // latent quantised into cache, rope part into rope_cache
  float* scales = nullptr;
  void* rope_cache = nullptr;
  int64_t ldr = 0;
  int64_t slot(int64_t t) const { return load_index(slots, slots64, t); }
};

struct QkvArgs {
  int64_t T = 0, hq = 0, hkv = 0, d = 0;
  bool bf16 = false;
  const void* qkv = nullptr;
  int64_t ldqkv = 0;
  rope_detail::Args rope;  // rotary_dim, style, tables, positions
  const void* slots = nullptr;
  bool slots64 = false;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t ldk = 0, ldv = 0;
  void* q_out = nullptr;
  int64_t ldq_t = 0, ldq_h = 0;
  bool stream_q = false;  // q_out of >= simd::kStreamMinBytes: non-temporal stores (it will not stay in cache)
  int64_t slot(int64_t t) const { return load_index(slots, slots64, t); }
};

// Per-ISA kernels: tokens (or gathered rows) [t0, t1) by one thread, its streaming stores
// fenced before return.
struct Kernels {
  void (*mla_tokens)(const MlaArgs&, int64_t t0, int64_t t1);
  void (*qkv_tokens)(const QkvArgs&, int64_t t0, int64_t t1);
  void (*write_tokens)(const WriteArgs&, int64_t t0, int64_t t1);
  void (*gather_rows)(const GatherArgs&, int64_t r0, int64_t r1);
};
const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels& kernels_avx512_bf16();

using WriteFn = Status (*)(const WriteArgs&);
using GatherFn = Status (*)(const GatherArgs&);
using MlaFn = Status (*)(const MlaArgs&);
using QkvFn = Status (*)(const QkvArgs&);
const dispatch::Registry<WriteFn>& write_registry();
const dispatch::Registry<GatherFn>& gather_registry();
const dispatch::Registry<MlaFn>& mla_registry();
const dispatch::Registry<QkvFn>& qkv_registry();

Status to_args(const KvCacheWriteParams& p, WriteArgs* a);
Status to_args(const GatherKvParams& p, GatherArgs* a);
Status to_args(const KvRmsNormRopeCacheParams& p, MlaArgs* a);
Status to_args(const QkvRopeCacheParams& p, QkvArgs* a);

Status write_reference(const WriteArgs& a);
Status gather_reference(const GatherArgs& a);
Status mla_reference(const MlaArgs& a);
Status qkv_reference(const QkvArgs& a);

// i8 rows: one quantiser for the write op and its reference (numerics/quant_i8.h).
using numerics::quantize_row_i8;

}  // namespace optx::kv_detail
