// Symmetric per-row int8 quantisation shared by every op that emits i8 rows (the i8 KV
// cache, routed MoE rows) and by their references, so op and reference agree bit for bit:
// scale = max|x| / 127, q = clamp(rne(x * (127 / max|x|)), -127, 127). -128 is never used,
// which keeps the code range symmetric; an all-zero row gets scale 0 and all-zero codes;
// NaN elements are left out of max|x| and get code 0 (±inf: max|x| = inf, scale inf).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

// AVX2 units without AVX-512 take a hand-written bf16 step (quantize_bf16_avx2).
#if defined(__AVX2__) && !defined(__AVX512F__)
#define OPTX_QUANT_BF16_AVX2 1
#include "simd/simd_avx2.h"
#else
#define OPTX_QUANT_BF16_AVX2 0
#endif

#include "optx/tensor.h"

namespace optx::numerics {
// Unnamed namespace: ISA units instantiate this with their own flags (AVX-512 ones
// vectorise it with zmm registers); with external linkage the linker would keep one
// instantiation for all units, possibly an AVX-512 build for the scalar / AVX2 paths.
namespace {

#if OPTX_QUANT_BF16_AVX2
// The finite-row step of quantize_row_i8 for bf16 rows on AVX2 units, 32 values at a
// time; returns how many it did (the scalar loop does the rest). GCC's vectorisation of
// the scalar loop ran 0.245 ns per value on one Zen 3 core, this 0.131 (kv_cache_write to
// an i8 cache: see the kv_cache PERF_LOG.md). Bitwise the scalar loop's codes: the same
// operations in the same order (one rounding for x * inv, one each for + and - 1.5 * 2^23,
// truncation of the integral result). No clamp: in a finite row |x| <= max|x|, so
// |x * inv| <= 127 * (1 + 2^-23) and rounds to at most 127 in magnitude. The widening
// (simd::Avx2::widen_bf16x16) splits each 128-bit lane into [0-3, 8-11] and [4-7, 12-15];
// vpackssdw puts such a pair back in order, vpermq the lanes after vpacksswb.
[[gnu::optimize("fp-contract=off")]] inline int64_t quantize_bf16_avx2(const uint16_t* x, int64_t n, float inv, int8_t* q) {
  const __m256 s = _mm256_set1_ps(inv), r = _mm256_set1_ps(12582912.0f);
  auto codes16 = [&](const uint16_t* p) {
    __m256 f[2];
    simd::Avx2::widen_bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), f[0], f[1]);
    __m256i c[2];
    for (int h = 0; h < 2; ++h) c[h] = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(f[h], s), r), r));
    return _mm256_packs_epi32(c[0], c[1]);  // 16 values as i16, in order
  };
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i b = _mm256_packs_epi16(codes16(x + i), codes16(x + i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permute4x64_epi64(b, 0xD8));
  }
  return i;
}
#endif

// Written so that the compiler vectorises it under each unit's flags without fast-math
// (which would change the results). max|x| is taken on the bit patterns: with the sign
// cleared, non-negative IEEE values order as integers, and an integer max reduction
// vectorises where a float one needs -ffast-math (as a float loop it ran one vmaxss per
// element); NaN patterns (above +inf's) are left out, as std::max(m, NaN) = m did. Rounding
// to nearest even is y + 1.5 * 2^23 - 1.5 * 2^23, exact for |y| < 2^22 (here |y| <= 127),
// where std::nearbyint compiled to a libm call per element. (kv_cache_write to an i8
// cache, 4096 tokens of two 1024-wide bf16 rows, one thread: 8.4 ms of libm and scalar
// max -> see the kv_cache PERF_LOG.md.)
// fp-contract=off: the ISA units are built with -mfma, and GCC's C++ default would fuse
// x * inv + 1.5 * 2^23 into one FMA, whose single rounding gives another code than the
// scalar unit and the reference where x * inv lies within half an ulp of a .5 (a row
// {4.5, 2.25}: 2.25 * fl(127 / 4.5) = 63.4999981 rounds to 63.5 -> 64, fused -> 63).
template <class T>
[[gnu::optimize("fp-contract=off")]] void quantize_row_i8(const T* x, int64_t n, int8_t* q, float* scale) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t>, "f32 or bf16 rows");
  constexpr bool kF32 = std::is_same_v<T, float>;
  using U = std::conditional_t<kF32, uint32_t, uint16_t>;
  constexpr U kAbs = kF32 ? U(0x7fffffffu) : U(0x7fff), kInf = kF32 ? U(0x7f800000u) : U(0x7f80);
  auto bits = [&](int64_t i) {
    U u;
    std::memcpy(&u, x + i, sizeof(U));
    return U(u & kAbs);
  };
  U m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, bits(i));  // a plain max reduction: vectorises
  const bool finite = m < kInf;
  if (m > kInf) {  // the row holds a NaN: again without them (skipping them above stopped the vectoriser)
    m = 0;
    for (int64_t i = 0; i < n; ++i)
      if (bits(i) <= kInf) m = std::max(m, bits(i));
  }
  float amax;
  if constexpr (kF32) std::memcpy(&amax, &m, 4);
  else amax = bf16_to_f32(m);
  auto f = [](T v) { return kF32 ? float(v) : bf16_to_f32(uint16_t(v)); };
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  // Integral after the rounding, so the truncating conversion is exact; the clamp runs on
  // the integers (vpmaxsd / vpminsd: a float clamp compiled to compares and blends). A row
  // with an inf or NaN (x * inv is then NaN somewhere, and converting NaN is undefined)
  // takes the loop that maps NaN to code 0 (its extra select cost 14% on finite rows).
  // max|x| below 127 / FLT_MAX makes 127 / max|x| overflow to inf: such a row scales by
  // x / max|x| * 127 instead, in the same loop.
  const bool inv_ok = inv <= FLT_MAX;
  if (finite && inv_ok) {
    int64_t done = 0;
#if OPTX_QUANT_BF16_AVX2
    if constexpr (!kF32) done = quantize_bf16_avx2(x, n, inv, q);
#endif
    const T* xt = x + done;  // (a loop from `done` to n: GCC 12 warned of it overflowing)
    int8_t* qt = q + done;
    for (int64_t i = 0; i < n - done; ++i) qt[i] = int8_t(std::clamp(int32_t((f(xt[i]) * inv + kRound) - kRound), -127, 127));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float y = inv_ok ? f(x[i]) * inv : f(x[i]) / amax * 127.0f;
      q[i] = int8_t(std::clamp(int32_t(((y == y ? y : 0.0f) + kRound) - kRound), -127, 127));
    }
  }
  *scale = amax / 127.0f;
}

}  // namespace
}  // namespace optx::numerics
