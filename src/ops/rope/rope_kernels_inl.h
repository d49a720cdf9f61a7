// RoPE head kernels written once over a vector type V (src/simd), included per ISA unit in
// its own namespace (OPTX_ISA_NS). rope_head() is also what the fused cache-write ops call,
// so "fused == rope then write" holds bit for bit.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including rope_kernels_inl.h"
#endif
#include "ops/rope/rope_internal.h"
#include "simd/simd_scalar.h"

namespace optx::rope_detail::OPTX_ISA_NS {
namespace {

OPTX_ALWAYS_INLINE float scalar_f32(const float* p) { return *p; }
OPTX_ALWAYS_INLINE float scalar_f32(const uint16_t* p) { return bf16_to_f32(*p); }

// y1 = x1 c - x2 s, y2 = x2 c + x1 s over i < half; x1/x2 and y1/y2 may be different
// memory (de-interleaving goes through an f32 buffer). stream: y1 and y2 are aligned for
// V::store_stream2 and whole pairs of vectors are written with non-temporal stores.
template <class V, class S, class T>
OPTX_ALWAYS_INLINE void rotate_halves(const S* x1, const S* x2, const float* c, const float* s, int64_t half,
                                      T* y1, T* y2, bool stream = false) {
  // Both halves of a step are computed before either is stored: y may be x (in place).
  struct Pair {
    typename V::F lo, hi;
  };
  const auto rot = [&](int64_t i) {
    const auto a = V::load(x1 + i), b = V::load(x2 + i), cc = V::load(c + i), ss = V::load(s + i);
    return Pair{V::sub(V::mul(a, cc), V::mul(b, ss)), V::add(V::mul(b, cc), V::mul(a, ss))};
  };
  int64_t i = 0;
  if (stream)
    for (; i + 2 * V::W <= half; i += 2 * V::W) {
      const Pair p0 = rot(i), p1 = rot(i + V::W);
      V::store_stream2(y1 + i, p0.lo, p1.lo);
      V::store_stream2(y2 + i, p0.hi, p1.hi);
    }
  for (; i + V::W <= half; i += V::W) {
    const Pair p = rot(i);
    V::store(y1 + i, p.lo);
    V::store(y2 + i, p.hi);
  }
  if (i < half) {
    const int n = int(half - i);
    const auto a = V::load(x1 + i, n), b = V::load(x2 + i, n), cc = V::load(c + i, n), ss = V::load(s + i, n);
    V::store(y1 + i, V::sub(V::mul(a, cc), V::mul(b, ss)), n);
    V::store(y2 + i, V::add(V::mul(b, cc), V::mul(a, ss)), n);
  }
}

// Rotates one head slice x[0..d) into y[0..d) (y may equal x). Reading from the source and
// writing the destination directly spares fused ops a copy per head.
// Interleaved (W > 1): y = x * (c0, c0, c1, c1, ..) + swap_pairs(x) * (-s0, s0, -s1, s1, ..),
// the tables widened in registers per vector. Widening them once per token into an L1
// table cost more than the rotation for a single head (MLA's k_pe: see the kv_cache PERF_LOG.md).
// stream: non-temporal stores where y allows them (outputs that will not be read from
// cache: the lines are not read from DRAM before being written).
template <class V, class T>
OPTX_ALWAYS_INLINE void rope_head_to(const T* x, T* y, const float* c, const float* s, int64_t d, RopeStyle style,
                                     bool stream = false) {
  const int64_t half = d / 2;
  if (style == RopeStyle::kHalf) {
    rotate_halves<V>(x, x + half, c, s, half, y, y + half,
                     stream && simd::stream_aligned<V>(y) && simd::stream_aligned<V>(y + half));
  } else if (style == RopeStyle::kInterleaved) {
    if constexpr (V::W == 1) {
      for (int64_t i = 0; i < half; ++i) {
        const float a = V::load(x + 2 * i), b = V::load(x + 2 * i + 1);
        V::store(y + 2 * i, a * c[i] - b * s[i]);
        V::store(y + 2 * i + 1, b * c[i] + a * s[i]);
      }
    } else {
      const auto rot = [&](int64_t j) {
        const auto v = V::load(x + j);
        const auto ce = V::pair_dup(c + j / 2), se = V::neg_even(V::pair_dup(s + j / 2));
        return V::add(V::mul(v, ce), V::mul(V::swap_pairs(v), se));
      };
      int64_t j = 0;
      if (stream && simd::stream_aligned<V>(y))
        for (; j + 2 * V::W <= d; j += 2 * V::W) V::store_stream2(y + j, rot(j), rot(j + V::W));
      for (; j + V::W <= d; j += V::W) V::store(y + j, rot(j));
      if (j < d) {  // n is even: pairs never straddle the tail
        const int n = int(d - j);
        const auto v = V::load(x + j, n);
        const auto ce = V::pair_dup(c + j / 2, n), se = V::neg_even(V::pair_dup(s + j / 2, n));
        V::store(y + j, V::add(V::mul(v, ce), V::mul(V::swap_pairs(v), se)), n);
      }
    }
  } else {  // kInterleavedToHalf: de-interleave into f32, rotate halves, write [y1 | y2]
    alignas(64) float buf[kMaxRotaryDim];
    for (int64_t i = 0; i < half; ++i) {
      buf[i] = scalar_f32(x + 2 * i);
      buf[half + i] = scalar_f32(x + 2 * i + 1);
    }
    rotate_halves<V>(static_cast<const float*>(buf), static_cast<const float*>(buf + half), c, s, half, y, y + half);
  }
}

template <class V, class T>
OPTX_ALWAYS_INLINE void rope_head(T* x, const float* c, const float* s, int64_t d, RopeStyle style) {
  rope_head_to<V>(static_cast<const T*>(x), x, c, s, d, style);
}

template <class V, class T>
void rope_token_t(const Args& a, int64_t t) {
  const float* c = a.cos_at(t);
  const float* s = a.sin_at(t);
  // Each head also asks for the same head of token t + 2: the rotation is an in-place
  // read-modify-write whose next lines the hardware prefetcher, seeing short runs per
  // head, does not fetch early enough on its own.
  const bool ahead = t + 2 < a.T;
  const int64_t lines = (a.rotary_dim * int64_t(sizeof(T)) + 63) / 64;
  for (const HeadSet* hs : {&a.q, &a.k})
    for (int64_t h = 0; h < hs->heads; ++h) {
      T* x = static_cast<T*>(hs->x) + t * hs->st + h * hs->sh + a.rotary_offset;
      if (ahead)
        for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(reinterpret_cast<const char*>(x + 2 * hs->st) + 64 * l, 1);
      rope_head<V>(x, c, s, a.rotary_dim, a.style);
    }
}

template <class V>
void rope_token(const Args& a, int64_t t) {
  if (a.bf16) rope_token_t<V, uint16_t>(a, t);
  else rope_token_t<V, float>(a, t);
}

}  // namespace
}  // namespace optx::rope_detail::OPTX_ISA_NS
