// Fused cache-write kernels, written once over a vector type V and included per ISA unit
// in its own namespace (OPTX_ISA_NS). They call the very row functions of the norm and
// rope families (same source, same flags), which is what makes each fused op bitwise
// equal to its unfused composition.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including kv_cache_kernels_inl.h"
#endif
#include <cstring>

#include "ops/kv_cache/kv_cache_internal.h"
#include "ops/norm/norm_kernels_inl.h"
#include "ops/rope/rope_kernels_inl.h"

namespace optx::kv_detail::OPTX_ISA_NS {
namespace {

namespace nk = ::optx::norm_detail::OPTX_ISA_NS;
namespace rk = ::optx::rope_detail::OPTX_ISA_NS;

// MLA: cache[slot] = [rms_norm(c_kv) * w | rope(k_pe)]. The row is built in an L1
// buffer and streamed to its slot: slots are scattered, so ordinary stores would first
// read each destination line from DRAM. Measured (bf16, T = 4096): ordinary stores
// 0.83 ms; streaming with a fence per token 0.98 ms; with one fence per thread at the end
// (finish()) 0.53-0.60 ms.
template <class V, class T>
void mla_token_t(const MlaArgs& a, int64_t t) {
  const int64_t slot = a.slot(t);
  if (slot < 0) return;
  const T* src = static_cast<const T*>(a.kv) + t * a.ldkv;
  alignas(64) T row[kMaxMlaRow];
  T* dst = row;
  const float inv = nk::inv_rms(nk::row_sumsq<V>(src, a.rank), a.rank, a.eps);
  // Prefetch two rows ahead: kv rows are 1.1 KiB, one ahead arrives late (alternating
  // runs: 15.7-17.1 -> 17.7-20.6 GB/s).
  const T* next = t + 2 < a.T ? src + 2 * a.ldkv : nullptr;
  nk::scale_row<V>(src, static_cast<const T*>(a.weight), inv, a.rank, dst, next);
  const int64_t pos = a.rope.position(t);
  const float* c = a.rope.cos + pos * a.rope.cs_stride;
  const float* s = a.rope.sin + pos * a.rope.cs_stride;
  rk::Expanded e;
  if (a.rope.style == RopeStyle::kInterleaved && V::W > 1) rk::expand(c, s, a.rope_dim / 2, e);
  if (a.i8) {  // latent quantised from the rounded row (as kv_cache_write would), rope part apart
    quantize_row_i8(static_cast<const T*>(row), a.rank, static_cast<int8_t*>(a.cache) + slot * a.ldc, a.scales + slot);
    rk::rope_head_to<V>(src + a.rank, static_cast<T*>(a.rope_cache) + slot * a.ldr, c, s, a.rope_dim, a.rope.style, e);
    return;
  }
  rk::rope_head_to<V>(src + a.rank, dst + a.rank, c, s, a.rope_dim, a.rope.style, e);
  V::stream_copy(static_cast<T*>(a.cache) + slot * a.ldc, row, sizeof(T) * size_t(a.rank + a.rope_dim));
}

// MHA / GQA: q_out = rope(q); k_cache[slot] = rope(k); v_cache[slot] = v.
template <class V, class T>
void qkv_token_t(const QkvArgs& a, int64_t t) {
  const T* src = static_cast<const T*>(a.qkv) + t * a.ldqkv;
  const int64_t pos = a.rope.position(t), rd = a.rope.rotary_dim;
  const float* c = a.rope.cos + pos * a.rope.cs_stride;
  const float* s = a.rope.sin + pos * a.rope.cs_stride;
  rk::Expanded e;
  if (a.rope.style == RopeStyle::kInterleaved && V::W > 1) rk::expand(c, s, rd / 2, e);
  // Rotated channels go straight from the source row to their destination; only the
  // channels past rotary_dim (if any) need a copy.
  const size_t tail_bytes = sizeof(T) * size_t(a.d - rd);
  auto head = [&](const T* from, T* to) {
    rk::rope_head_to<V>(from, to, c, s, rd, a.rope.style, e);
    if (tail_bytes) std::memcpy(to + rd, from + rd, tail_bytes);
  };
  for (int64_t h = 0; h < a.hq; ++h) head(src + h * a.d, static_cast<T*>(a.q_out) + t * a.ldq_t + h * a.ldq_h);
  const int64_t slot = a.slot(t);
  if (slot < 0) return;
  T* k = static_cast<T*>(a.k_cache) + slot * a.ldk;
  for (int64_t h = 0; h < a.hkv; ++h) head(src + (a.hq + h) * a.d, k + h * a.d);
  std::memcpy(static_cast<T*>(a.v_cache) + slot * a.ldv, src + (a.hq + a.hkv) * a.d, sizeof(T) * size_t(a.d * a.hkv));
}

template <class V>
void finish() {
  V::stream_fence();
}

template <class V>
void mla_token(const MlaArgs& a, int64_t t) {
  if (a.bf16) mla_token_t<V, uint16_t>(a, t);
  else mla_token_t<V, float>(a, t);
}
template <class V>
void qkv_token(const QkvArgs& a, int64_t t) {
  if (a.bf16) qkv_token_t<V, uint16_t>(a, t);
  else qkv_token_t<V, float>(a, t);
}

}  // namespace
}  // namespace optx::kv_detail::OPTX_ISA_NS
