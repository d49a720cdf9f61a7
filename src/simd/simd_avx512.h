// Thin AVX-512 vector wrapper for op kernels written once as templates over a vector type
// (see simd_scalar.h for the interface). Include only from units built with AVX-512 flags.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "optx/tensor.h"
#include "simd/simd_tanh_inl.h"

namespace optx::simd {

struct Avx512 {
  static constexpr int W = 16;
  using F = __m512;

  OPTX_ALWAYS_INLINE static F zero() { return _mm512_setzero_ps(); }
  OPTX_ALWAYS_INLINE static F set1(float v) { return _mm512_set1_ps(v); }
  OPTX_ALWAYS_INLINE static F add(F a, F b) { return _mm512_add_ps(a, b); }
  OPTX_ALWAYS_INLINE static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  OPTX_ALWAYS_INLINE static F max(F a, F b) { return _mm512_max_ps(a, b); }
  OPTX_ALWAYS_INLINE static float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
  // e^x: 2^(x log2 e) split into 2^n (exponent bits) times a degree-6 polynomial for 2^f,
  // f in [-0.5, 0.5]; relative error < 2e-7. Inputs below -87 give 0 (so exp(-inf) = 0),
  // above 88 give +inf.
  OPTX_ALWAYS_INLINE static F exp(F x) {
    const F t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504088896341f));
    const F n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = _mm512_sub_ps(t, n);
    F p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    F r = _mm512_scalef_ps(p, n);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ), r, _mm512_setzero_ps());
    return r;
  }
  // tanh: simd_tanh_inl.h's two pieces, the sign put back, NaN kept.
  OPTX_ALWAYS_INLINE static F tanh(F x) {
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int32_t(0x80000000u)));
    const F a = _mm512_abs_ps(x);
    const F big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(detail::tanh_of_abs<Avx512>(a)), sign));
    const F r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_LT_OQ), big, detail::tanh_series<Avx512>(x));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, x);
  }
  // Swaps lanes 2i and 2i+1 (adjacent pairs).
  OPTX_ALWAYS_INLINE static F swap_pairs(F a) { return _mm512_permute_ps(a, 0xB1); }
  OPTX_ALWAYS_INLINE static F pair_dup(const float* p) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                 _mm512_castps256_ps512(_mm256_loadu_ps(p)));
  }
  OPTX_ALWAYS_INLINE static F pair_dup(const float* p, int n) {
    return _mm512_maskz_permutexvar_ps(mask(n), _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                       _mm512_castps256_ps512(_mm256_maskz_loadu_ps(__mmask8((1u << (n / 2)) - 1u), p)));
  }
  OPTX_ALWAYS_INLINE static F neg_even(F a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi64(int64_t(0x80000000))));
  }
  OPTX_ALWAYS_INLINE static F hide(F x, const int8_t* m, int n = W) {
    const __m128i b = _mm_maskz_loadu_epi8(mask(n), m);
    return _mm512_mask_blend_ps(_mm_test_epi8_mask(b, b), _mm512_set1_ps(-INFINITY), x);
  }
  OPTX_ALWAYS_INLINE static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  OPTX_ALWAYS_INLINE static F div(F a, F b) { return _mm512_div_ps(a, b); }
  OPTX_ALWAYS_INLINE static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // Horizontal sum in a fixed order (halves folded), so results are reproducible.
  OPTX_ALWAYS_INLINE static float reduce(F v) {
    // Both halves by extract: GCC 12's _mm512_castps512_ps256 goes through an
    // "undefined" vector that -Wuninitialized reports in some inlining contexts.
    const __m256 h = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
  }

  OPTX_ALWAYS_INLINE static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }
  // n < W elements (tails); lanes past n read as 0 and are not written.
  OPTX_ALWAYS_INLINE static F load(const float* p) { return _mm512_loadu_ps(p); }
  OPTX_ALWAYS_INLINE static F load(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  OPTX_ALWAYS_INLINE static F load(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  OPTX_ALWAYS_INLINE static F load(const uint16_t* p, int n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask(n), p)), 16));
  }
  // 16 dwords of bf16 pairs (x[2i] | x[2i + 1] << 16) -> the even and the odd values as f32:
  // a shift and a mask, no cross-lane shuffle (bf16 is the top half of an f32).
  OPTX_ALWAYS_INLINE static void widen_pairs(__m512i v, F& even, F& odd) {
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
  OPTX_ALWAYS_INLINE static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  OPTX_ALWAYS_INLINE static void store(float* p, F v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  // f32 -> bf16, round to nearest even; NaN becomes a quiet NaN (as f32_to_bf16).
  OPTX_ALWAYS_INLINE static __m256i to_bf16(F v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
  }
  OPTX_ALWAYS_INLINE static void store(uint16_t* p, F v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v)); }
  OPTX_ALWAYS_INLINE static void store(uint16_t* p, F v, int n) { _mm256_mask_storeu_epi16(p, mask(n), to_bf16(v)); }

  // Copies bytes with non-temporal stores when dst is 64-byte aligned: the destination
  // line is not read first (no read-for-ownership) and does not displace cached data.
  // Callers issue stream_fence() before the data is handed to another thread.
  OPTX_ALWAYS_INLINE static void stream_copy(void* dst, const void* src, size_t bytes) {
    if ((reinterpret_cast<uintptr_t>(dst) & 63) != 0) {
      std::memcpy(dst, src, bytes);
      return;
    }
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    size_t i = 0;
    for (; i + 64 <= bytes; i += 64)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
    if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
  }
  OPTX_ALWAYS_INLINE static void stream_fence() { _mm_sfence(); }
  // 2 * W elements with non-temporal stores; p must be 64-byte aligned.
  static constexpr int kStreamAlign = 64;
  OPTX_ALWAYS_INLINE static void store_stream2(float* p, F v0, F v1) {
    _mm512_stream_ps(p, v0);
    _mm512_stream_ps(p + W, v1);
  }
  OPTX_ALWAYS_INLINE static void store_stream2(uint16_t* p, F v0, F v1) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), _mm512_inserti64x4(_mm512_castsi256_si512(to_bf16(v0)), to_bf16(v1), 1));
  }
  // In-register 16 x 16 transpose of dwords (dword j of r[i] -> dword i of r[j]) in three
  // shuffle stages: 64 shuffles for 256 dwords.
  OPTX_ALWAYS_INLINE static void transpose16(__m512i (&r)[16]) {
    __m512i t[16];
    for (int k = 0; k < 8; ++k) {
      t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) {  // r[4k + c], per 128-bit lane L: column 4L + c of rows 4k..4k+3
      r[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
      r[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
      r[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
      r[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
      const __m512i y0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44), y1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
      r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
      r[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
      r[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
      r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
    }
  }
};

}  // namespace optx::simd
