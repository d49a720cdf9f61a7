// RMSNorm row kernels written once over a vector type V (src/simd) and included by each
// ISA unit inside its own namespace (OPTX_ISA_NS).
//
// Both ops share row_sumsq's reduction order (chunk c of W lanes goes to accumulator
// c % 4; the tail chunk continues the cycle) and scale_row, which is what makes
// add_rms_norm bitwise equal to "residual += x; rms_norm(residual)".
// A row of 7168 bf16 is 14 KiB: the second pass over it hits L1, so each element crosses
// the memory bus once per read and once per write.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including norm_kernels_inl.h"
#endif
#include <cmath>

#include "ops/norm/norm_internal.h"

namespace optx::norm_detail::OPTX_ISA_NS {
namespace {

// Chunk c of W lanes accumulates into acc[c % 4]. The main loop is unrolled by four with
// constant indices: a rotating index made GCC keep the accumulators on the stack, a
// store-to-load round trip per vector (measured: rms_norm of 512-wide bf16 rows 121 ns per
// row before, L2-resident).
template <class V, class T>
OPTX_ALWAYS_INLINE float row_sumsq(const T* x, int64_t H) {
  typename V::F a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
  int64_t i = 0;
  for (; i + 4 * V::W <= H; i += 4 * V::W) {
    const auto v0 = V::load(x + i), v1 = V::load(x + i + V::W), v2 = V::load(x + i + 2 * V::W),
               v3 = V::load(x + i + 3 * V::W);
    a0 = V::fmadd(v0, v0, a0);
    a1 = V::fmadd(v1, v1, a1);
    a2 = V::fmadd(v2, v2, a2);
    a3 = V::fmadd(v3, v3, a3);
  }
  // Up to three more whole chunks (to a0, a1, a2), then the partial chunk to the next one.
  typename V::F* next[4] = {&a0, &a1, &a2, &a3};
  int c = 0;
  for (; i + V::W <= H; i += V::W, ++c) {
    const auto v = V::load(x + i);
    *next[c] = V::fmadd(v, v, *next[c]);
  }
  if (i < H) {
    const auto v = V::load(x + i, int(H - i));
    *next[c] = V::fmadd(v, v, *next[c]);
  }
  return V::reduce(V::add(V::add(a0, a1), V::add(a2, a3)));
}

OPTX_ALWAYS_INLINE float inv_rms(float sumsq, int64_t H, float eps) {
  return 1.0f / std::sqrt(sumsq / float(H) + eps);
}

// The second pass runs from L1 and leaves the memory bus idle unless it asks for the next
// row meanwhile: pf0 / pf1 (the next row's inputs, or nullptr) are prefetched alongside,
// one line per 64 bytes of this row. Without it the two passes serialise memory and
// compute (measured: rms_norm bf16 4096 x 7168 at 13 GB/s).
//
// stream: write out with non-temporal stores (where out is aligned) — for outputs too big
// to stay in cache, whose lines would otherwise be read from DRAM before being written.
template <class V, class T>
OPTX_ALWAYS_INLINE void scale_row(const T* x, const T* w, float inv, int64_t H, T* out, const T* pf0,
                                  const T* pf1, bool stream = false) {
  const auto s = V::set1(inv);
  int64_t i = 0;
  constexpr int64_t kLine = 64 / sizeof(T);
  if (stream && reinterpret_cast<uintptr_t>(out) % V::kStreamAlign == 0) {
    for (; i + 2 * V::W <= H; i += 2 * V::W) {
      if (i % kLine == 0) {
        if (pf0) __builtin_prefetch(pf0 + i);
        if (pf1) __builtin_prefetch(pf1 + i);
      }
      const auto y0 = V::mul(V::mul(V::load(x + i), s), V::load(w + i));
      const auto y1 = V::mul(V::mul(V::load(x + i + V::W), s), V::load(w + i + V::W));
      V::store_stream2(out + i, y0, y1);
    }
  }
  for (; i + V::W <= H; i += V::W) {
    if (i % kLine == 0) {
      if (pf0) __builtin_prefetch(pf0 + i);
      if (pf1) __builtin_prefetch(pf1 + i);
    }
    V::store(out + i, V::mul(V::mul(V::load(x + i), s), V::load(w + i)));
  }
  if (i < H) {
    const int n = int(H - i);
    V::store(out + i, V::mul(V::mul(V::load(x + i, n), s), V::load(w + i, n)), n);
  }
}

template <class V, class T>
void rms_norm_row_t(const Rows& r, int64_t t) {
  const T* x = static_cast<const T*>(r.x) + t * r.ldx;
  const float inv = inv_rms(row_sumsq<V>(x, r.H), r.H, r.eps);
  const T* next = t + 1 < r.T ? x + r.ldx : nullptr;
  scale_row<V>(x, static_cast<const T*>(r.weight), inv, r.H, static_cast<T*>(r.out) + t * r.ldo, next,
               static_cast<const T*>(nullptr), r.stream_out);
}

// residual += x, rounded to T as stored; then the norm of the stored values.
template <class V, class T>
void add_rms_norm_row_t(const Rows& r, int64_t t) {
  const T* x = static_cast<const T*>(r.x) + t * r.ldx;
  T* res = static_cast<T*>(r.residual) + t * r.ldr;
  int64_t i = 0;
  for (; i + V::W <= r.H; i += V::W) V::store(res + i, V::add(V::load(res + i), V::load(x + i)));
  if (i < r.H) {
    const int n = int(r.H - i);
    V::store(res + i, V::add(V::load(res + i, n), V::load(x + i, n)), n);
  }
  // Re-read the row just written (L1) so the statistics see the rounded values.
  const float inv = inv_rms(row_sumsq<V>(static_cast<const T*>(res), r.H), r.H, r.eps);
  const bool more = t + 1 < r.T;
  scale_row<V>(static_cast<const T*>(res), static_cast<const T*>(r.weight), inv, r.H,
               static_cast<T*>(r.out) + t * r.ldo, more ? x + r.ldx : nullptr, more ? static_cast<const T*>(res + r.ldr) : nullptr,
               r.stream_out);
}

template <class V>
void finish() {
  V::stream_fence();
}

template <class V>
void rms_norm_row(const Rows& r, int64_t t) {
  if (r.bf16) rms_norm_row_t<V, uint16_t>(r, t);
  else rms_norm_row_t<V, float>(r, t);
}
template <class V>
void add_rms_norm_row(const Rows& r, int64_t t) {
  if (r.bf16) add_rms_norm_row_t<V, uint16_t>(r, t);
  else add_rms_norm_row_t<V, float>(r, t);
}

}  // namespace
}  // namespace optx::norm_detail::OPTX_ISA_NS
