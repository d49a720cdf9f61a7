// Thin AVX2 vector wrapper (interface: simd_scalar.h). Include only from AVX2-flagged units.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "optx/tensor.h"
#include "simd/simd_tanh_inl.h"

namespace optx::simd {

struct Avx2 {
  static constexpr int W = 8;
  using F = __m256;

  OPTX_ALWAYS_INLINE static F zero() { return _mm256_setzero_ps(); }
  OPTX_ALWAYS_INLINE static F set1(float v) { return _mm256_set1_ps(v); }
  OPTX_ALWAYS_INLINE static F add(F a, F b) { return _mm256_add_ps(a, b); }
  OPTX_ALWAYS_INLINE static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  OPTX_ALWAYS_INLINE static F swap_pairs(F a) { return _mm256_permute_ps(a, 0xB1); }
  OPTX_ALWAYS_INLINE static F pair_dup(const float* p) {
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  }
  OPTX_ALWAYS_INLINE static F pair_dup(const float* p, int n) {
    alignas(16) float b[4] = {};
    for (int i = 0; i < n / 2; ++i) b[i] = p[i];
    return pair_dup(b);
  }
  OPTX_ALWAYS_INLINE static F neg_even(F a) {
    return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_setr_epi32(INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0)));
  }
  OPTX_ALWAYS_INLINE static F max(F a, F b) { return _mm256_max_ps(a, b); }
  OPTX_ALWAYS_INLINE static float reduce_max(F v) {
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
  }
  // As Avx512::exp (same polynomial); 2^n built in the exponent field.
  OPTX_ALWAYS_INLINE static F exp(F x) {
    const F t = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(1.44269504088896341f));
    const F n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = _mm256_sub_ps(t, n);
    F p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    // n in [-126, 127] after the clamp: scale by building 2^n as (n + 127) << 23.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    F r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    r = _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
    return _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(88.5f), _CMP_GT_OQ));
  }
  // As Avx512::tanh.
  OPTX_ALWAYS_INLINE static F tanh(F x) {
    const F sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f)), a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const F big = _mm256_or_ps(detail::tanh_of_abs<Avx2>(a), sign);
    const F r = _mm256_blendv_ps(big, detail::tanh_series<Avx2>(x), _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_LT_OQ));
    return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  OPTX_ALWAYS_INLINE static F hide(F x, const int8_t* m, int n = W) {
    int64_t t = 0;  // n < W: no read past the mask's last byte
    std::memcpy(&t, m, size_t(n));
    const __m256i z = _mm256_cmpeq_epi32(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(t)), _mm256_setzero_si256());
    return _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(z));
  }
  OPTX_ALWAYS_INLINE static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  OPTX_ALWAYS_INLINE static F div(F a, F b) { return _mm256_div_ps(a, b); }
  OPTX_ALWAYS_INLINE static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  OPTX_ALWAYS_INLINE static float reduce(F v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
  }

  // 8 x 8 floats transposed in registers: x[i] holds column i afterwards (24 shuffles).
  OPTX_ALWAYS_INLINE static void transpose8(F (&x)[8]) {
    F t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
      x[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
  }

  // Tails (n <= W). f32 ones by vmaskmovps: masked-off lanes are neither read nor written
  // (a stack copy — scalar stores under a vector reload — stalls on store forwarding, which
  // held the AVX2 router at 2.5x its time when it used these for every vector). 16-bit ones
  // go through a zero-padded stack copy: AVX2 has no 16-bit masked load.
  OPTX_ALWAYS_INLINE static __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  OPTX_ALWAYS_INLINE static F load(const float* p) { return _mm256_loadu_ps(p); }
  OPTX_ALWAYS_INLINE static F load(const float* p, int n) { return _mm256_maskload_ps(p, tail_mask(n)); }
  OPTX_ALWAYS_INLINE static F load(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  OPTX_ALWAYS_INLINE static F load(const uint16_t* p, int n) {
    uint16_t t[W] = {};
    std::memcpy(t, p, sizeof(uint16_t) * size_t(n));
    return load(static_cast<const uint16_t*>(t));
  }
  OPTX_ALWAYS_INLINE static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  OPTX_ALWAYS_INLINE static void store(float* p, F v, int n) { _mm256_maskstore_ps(p, tail_mask(n), v); }
  // 16 bf16 values as f32 by unpacking with zero (bf16 is the top half of an f32): two
  // uops where vpmovzx + shift per 8 values take four, but per 128-bit lane, so lo holds
  // values [0-3, 8-11] and hi [4-7, 12-15]; callers keep their other operand in that order.
  OPTX_ALWAYS_INLINE static void widen_bf16x16(__m256i v, F& lo, F& hi) {
    const __m256i z = _mm256_setzero_si256();
    lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
  }
  // v rounded to bf16 (nearest even; NaN quieted), one per 32-bit lane.
  OPTX_ALWAYS_INLINE static __m256i bf16_lanes(F v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, qnan, nan);
  }
  OPTX_ALWAYS_INLINE static __m128i to_bf16(F v) {
    const __m256i r = bf16_lanes(v);  // 8 x 32-bit (values < 65536) packed to 8 x 16-bit
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  // v0 then v1 as 16 bf16: one 256-bit pack (per 128-bit lane: v0's half, v1's half) and
  // one lane permute, instead of an extract and a pack per vector and an insert.
  OPTX_ALWAYS_INLINE static __m256i to_bf16x2(F v0, F v1) {
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_lanes(v0), bf16_lanes(v1)), 0xD8);
  }
  OPTX_ALWAYS_INLINE static void store(uint16_t* p, F v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(v)); }
  OPTX_ALWAYS_INLINE static void stream_copy(void* dst, const void* src, size_t bytes) {
    if ((reinterpret_cast<uintptr_t>(dst) & 31) != 0) {
      std::memcpy(dst, src, bytes);
      return;
    }
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    if (i < bytes) std::memcpy(d + i, s + i, bytes - i);
  }
  OPTX_ALWAYS_INLINE static void stream_fence() { _mm_sfence(); }
  static constexpr int kStreamAlign = 32;
  OPTX_ALWAYS_INLINE static void store_stream2(float* p, F v0, F v1) {
    _mm256_stream_ps(p, v0);
    _mm256_stream_ps(p + W, v1);
  }
  OPTX_ALWAYS_INLINE static void store_stream2(uint16_t* p, F v0, F v1) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16x2(v0, v1));
  }
  OPTX_ALWAYS_INLINE static void store(uint16_t* p, F v, int n) {
    uint16_t t[W];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t), to_bf16(v));
    std::memcpy(p, t, sizeof(uint16_t) * size_t(n));
  }
};

}  // namespace optx::simd
