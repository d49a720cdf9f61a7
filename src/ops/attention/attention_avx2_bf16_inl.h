// bf16, f32 and int8-cache score and P·V tiles for units without a bf16 dot-product
// instruction (AVX2, and AVX-512 without AVX512_BF16, which runs them in 512-bit vectors
// where a dimension is a multiple of 32), used by run_job_t (attention_kernels_inl.h)
// when D and Dv are multiples of 16.
//
// Why not the generic per-(row, key) dot: it widens each K row once per query row and
// ends every dot in a horizontal sum, ~3x the multiply-adds' own cost. Here a tile of up to
// 4 rows x 2 keys keeps 8 accumulators in registers, so each K chunk is widened once per
// 4 rows and 8 dot products share one reduction tree; P·V keeps 4 rows x 16 columns of O
// in registers across a block's keys.
//
// Widening: bf16 -> f32 is the 16-bit value in the high half of a dword. unpacklo /
// unpackhi with zero do that for 16 values in two uops (vpmovzx + shift per 8 takes four),
// but per 128-bit lane, so a 16-value chunk comes out as [0-3, 8-11] and [4-7, 12-15]. The
// q rows and the O accumulators are kept in that order (swap_quads16), and O is put back
// in order once per job.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including attention_avx2_bf16_inl.h"
#endif
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "simd/simd_avx2.h"
#if defined(__AVX512F__)
#include "simd/simd_avx512.h"
#endif

namespace optx::attn_detail::OPTX_ISA_NS {
namespace {

// Rows prefetched a few lines at a time from inside the tile loops. Issued in one burst,
// a block's prefetches (up to 4096 lines with all KV heads in a job) wait for the core's
// ~24 miss buffers while the tile work behind them waits too: memory and compute took
// turns (one core: 3 GB/s from DRAM against 11.5 with the cache in L2). Spread over the
// tile steps, the lines arrive while the multiply-adds run. Walks the rows in order, each
// row's lines in address order.
//
// A step prefetches whole rows or a piece of one row whose size divides the row's lines,
// so its loop is a run of prefetches with no per-line bookkeeping: the previous cursor,
// a row lookup, compare and branch per line, cost ~18% of decode with the cache in L2
// (alternating in one process, B = 1 ctx 8k: hot 1 / 2 threads +12%, from DRAM +8-12%;
// B = 8 and ctx 32k from DRAM within noise, -4% to +2%).
struct PrefetchCursor {
  const void* const* rows = nullptr;
  int64_t n = 0, lines = 0;
  int64_t whole = 0;  // rows per step, or
  int64_t piece = 0;  // lines of a row per step (divides lines); both 0: nothing to prefetch
  int64_t key = 0, line = 0;
  PrefetchCursor() = default;
  PrefetchCursor(const void* const* r, int64_t n_rows, int64_t row_lines, int64_t steps) : rows(r), n(n_rows), lines(row_lines) {
    if (steps <= 0 || n == 0 || lines == 0) return;
    const int64_t per_step = (n * lines + steps - 1) / steps;
    if (per_step >= lines) whole = (per_step + lines - 1) / lines;
    else for (piece = per_step; lines % piece;) ++piece;
  }
  OPTX_ALWAYS_INLINE void step() {
    if (whole) {
      for (int64_t r = 0; r < whole && key < n; ++r) prefetch_lines(rows[key++], 0, lines);
    } else if (piece && key < n) {
      prefetch_lines(rows[key], line, piece);
      if ((line += piece) == lines) line = 0, ++key;
    }
  }
  void rest() {
    for (; key < n; line = 0, ++key) prefetch_lines(rows[key], line, lines - line);
  }

 private:
  OPTX_ALWAYS_INLINE static void prefetch_lines(const void* row, int64_t from, int64_t count) {
    const char* p = static_cast<const char*>(row) + 64 * from;
    for (int64_t i = 0; i < count; ++i) __builtin_prefetch(p + 64 * i, 0, 2);
  }
};

// x[0, n) (n a multiple of 16): each 16-value chunk's middle quads swapped, [0-3, 8-11,
// 4-7, 12-15]; its own inverse.
OPTX_ALWAYS_INLINE void swap_quads16(float* x, int64_t n) {
  for (int64_t d = 0; d < n; d += 16) {
    const __m256 a = _mm256_loadu_ps(x + d), b = _mm256_loadu_ps(x + d + 8);
    _mm256_storeu_ps(x + d, _mm256_permute2f128_ps(a, b, 0x20));
    _mm256_storeu_ps(x + d + 8, _mm256_permute2f128_ps(a, b, 0x31));
  }
}

// 16 bf16 values -> f32 in swap_quads16 order: lo = [0-3, 8-11], hi = [4-7, 12-15].
OPTX_ALWAYS_INLINE void widen16(const uint16_t* p, __m256& lo, __m256& hi) {
  simd::Avx2::widen_bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), lo, hi);
}

// 16 f32 values, in order: lo = [0-7], hi = [8-15] (the f32 tiles keep q and O in plain
// order).
OPTX_ALWAYS_INLINE void widen16(const float* p, __m256& lo, __m256& hi) {
  lo = _mm256_loadu_ps(p);
  hi = _mm256_loadu_ps(p + 8);
}

// 16 int8 values (an i8 cache's row, its scale applied per key outside) -> f32 in order:
// lo = [0-7], hi = [8-15]. The i8 tiles keep q and O in plain order.
OPTX_ALWAYS_INLINE void widen16(const int8_t* p, __m256& lo, __m256& hi) {
  lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
}

// The sums of 8 vectors, in order, in one vector.
OPTX_ALWAYS_INLINE __m256 sum8(const __m256* a) {
  const __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 y = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
}

#if defined(__AVX512F__)
// The AVX-512 unit without AVX512_BF16 runs the same tiles in 512-bit vectors over 32
// values per step where the dimension allows (a multiple of 32): per K / V element half
// the loads, widening unpacks and FMAs, which bound GQA decode here (paged bf16, 32 / 8
// heads: ~40 uops per 32 bytes of K and V at 256 bits). bf16 widens with the same two
// unpacks, per 128-bit lane: lo = [0-3, 8-11, 16-19, 24-27], hi = [4-7, 12-15, 20-23,
// 28-31]; q and O keep each 32-value chunk in that order (to_tile_order).
constexpr bool kWideTiles = true;
OPTX_ALWAYS_INLINE void widen32(const uint16_t* p, __m512& lo, __m512& hi) {
  const __m512i x = _mm512_loadu_si512(p), z = _mm512_setzero_si512();
  lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, x));
  hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, x));
}
OPTX_ALWAYS_INLINE void widen32(const float* p, __m512& lo, __m512& hi) {
  lo = _mm512_loadu_ps(p);
  hi = _mm512_loadu_ps(p + 16);
}
OPTX_ALWAYS_INLINE void widen32(const int8_t* p, __m512& lo, __m512& hi) {
  lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
}
// The chunk's permutation as two-source indices (>= 16: the second vector): lane t of
// the tile-order vectors holds element idx[t] of the plain chunk (to), or back (from).
struct ChunkOrder32 {
  __m512i to_lo, to_hi, from_lo, from_hi;
  ChunkOrder32() {
    alignas(64) int32_t to[32], from[32];
    for (int t = 0; t < 32; ++t) {
      const int half = t / 16, lane = t % 16 / 4, i = t % 4;
      to[t] = 8 * lane + 4 * half + i;
      from[to[t]] = t;
    }
    to_lo = _mm512_load_si512(to), to_hi = _mm512_load_si512(to + 16);
    from_lo = _mm512_load_si512(from), from_hi = _mm512_load_si512(from + 16);
  }
};
OPTX_ALWAYS_INLINE void reorder32(float* x, int64_t n, bool to) {
  static const ChunkOrder32 o;
  for (int64_t d = 0; d < n; d += 32) {
    const __m512 a = _mm512_loadu_ps(x + d), b = _mm512_loadu_ps(x + d + 16);
    _mm512_storeu_ps(x + d, _mm512_permutex2var_ps(a, to ? o.to_lo : o.from_lo, b));
    _mm512_storeu_ps(x + d + 16, _mm512_permutex2var_ps(a, to ? o.to_hi : o.from_hi, b));
  }
}

#else
constexpr bool kWideTiles = false;
#endif

// Whether the tiles over a dimension of n values run 32 at a time (the 512-bit tiles).
OPTX_ALWAYS_INLINE bool wide_tiles(int64_t n) { return kWideTiles && n % 32 == 0; }

// bf16 q or O rows (n values) into the order the tiles over n keep them in, or back.
// many: the many-row path's (attention_avx2_manyrows_inl.h), which widens 16 at a time.
OPTX_ALWAYS_INLINE void to_tile_order(float* x, int64_t n, bool many = false) {
#if defined(__AVX512F__)
  if (!many && wide_tiles(n)) return reorder32(x, n, true);
#endif
  (void)many;
  swap_quads16(x, n);
}
OPTX_ALWAYS_INLINE void from_tile_order(float* x, int64_t n, bool many = false) {
#if defined(__AVX512F__)
  if (!many && wide_tiles(n)) return reorder32(x, n, false);
#endif
  (void)many;
  swap_quads16(x, n);
}

// The tiles' vectors: the unit's simd type's loads, stores and FMAs, plus the tiles'
// widening of K / V chunks and the fold of a score accumulator to 8 partial sums;
// 256-bit, 16 values a step (Lanes8), or 512-bit, 32 (Lanes16).
struct Lanes8 : simd::Avx2 {
  static constexpr int64_t kChunk = 16;
  template <class E>
  OPTX_ALWAYS_INLINE static void widen(const E* p, F& lo, F& hi) { widen16(p, lo, hi); }
  OPTX_ALWAYS_INLINE static __m256 fold(F x) { return x; }
};
#if defined(__AVX512F__)
struct Lanes16 : simd::Avx512 {
  static constexpr int64_t kChunk = 32;
  template <class E>
  OPTX_ALWAYS_INLINE static void widen(const E* p, F& lo, F& hi) { widen32(p, lo, hi); }
  OPTX_ALWAYS_INLINE static __m256 fold(F x) { return _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1)); }
};
#endif

// S[r * kKvBlock + jj] = q_r . k_jj (times ks[jj], an i8 cache's key scales, if given;
// added to S with `add`) for NR rows (f32, stride Dp, in the order L::widen gives for E)
// and keys jj < n, two keys at a time (an odd last key is paired with itself).
template <class L, int NR, class E>
void scores_tile(const float* q, int64_t Dp, const void* const* kp, int64_t n, int64_t D, const float* ks, float* S,
                 PrefetchCursor& pf, bool add) {
  constexpr int64_t kHalf = L::kChunk / 2;
  for (int64_t jj = 0; jj < n; jj += 2) {
    pf.step();
    const E* k0 = static_cast<const E*>(kp[jj]);
    const E* k1 = static_cast<const E*>(kp[jj + 1 < n ? jj + 1 : jj]);
    typename L::F acc[8];
    for (auto& a : acc) a = L::zero();
    for (int64_t d = 0; d < D; d += L::kChunk) {
      typename L::F a_lo, a_hi, b_lo, b_hi;
      L::widen(k0 + d, a_lo, a_hi);
      L::widen(k1 + d, b_lo, b_hi);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const typename L::F q_lo = L::load(q + r * Dp + d), q_hi = L::load(q + r * Dp + d + kHalf);
        acc[2 * r] = L::fmadd(a_hi, q_hi, L::fmadd(a_lo, q_lo, acc[2 * r]));
        acc[2 * r + 1] = L::fmadd(b_hi, q_hi, L::fmadd(b_lo, q_lo, acc[2 * r + 1]));
      }
    }
    __m256 folded[8];
    for (int i = 0; i < 8; ++i) folded[i] = L::fold(acc[i]);
    alignas(32) float s[8];
    _mm256_store_ps(s, sum8(folded));
    const float s0 = ks ? ks[jj] : 1.0f, s1 = ks && jj + 1 < n ? ks[jj + 1] : 1.0f;
    for (int r = 0; r < NR; ++r) {
      float* out = S + r * kKvBlock + jj;
      out[0] = add ? out[0] + s[2 * r] * s0 : s[2 * r] * s0;
      if (jj + 1 < n) out[1] = add ? out[1] + s[2 * r + 1] * s1 : s[2 * r + 1] * s1;
    }
  }
}

// acc_r[0, Dv) (stride Dvp, in the order L::widen gives for E) += sum_jj P[r * kKvBlock +
// jj] * v_jj for NR rows: a chunk of columns of all NR rows stays in registers over the
// block's keys.
template <class L, int NR, class E>
void pv_tile(const float* P, const void* const* vp, int64_t n, int64_t Dv, float* acc, int64_t Dvp, PrefetchCursor& pf) {
  constexpr int64_t kHalf = L::kChunk / 2;
  for (int64_t d = 0; d < Dv; d += L::kChunk) {
    typename L::F o[2 * NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      o[2 * r] = L::load(acc + r * Dvp + d);
      o[2 * r + 1] = L::load(acc + r * Dvp + d + kHalf);
    }
    for (int i = 0; i < L::kChunk / 16; ++i) pf.step();  // pv_steps counts 16-column steps
    for (int64_t jj = 0; jj < n; ++jj) {
      typename L::F v_lo, v_hi;
      L::widen(static_cast<const E*>(vp[jj]) + d, v_lo, v_hi);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const typename L::F p = L::set1(P[r * kKvBlock + jj]);
        o[2 * r] = L::fmadd(p, v_lo, o[2 * r]);
        o[2 * r + 1] = L::fmadd(p, v_hi, o[2 * r + 1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      L::store(acc + r * Dvp + d, o[2 * r]);
      L::store(acc + r * Dvp + d + kHalf, o[2 * r + 1]);
    }
  }
}

// All R rows, four at a time: f(std::integral_constant<int, NR>, first row) per tile.
template <class F>
OPTX_ALWAYS_INLINE void by_row_tiles(int R, F&& f) {
  int r = 0;
  for (; r + 4 <= R; r += 4) f(std::integral_constant<int, 4>{}, r);
  switch (R - r) {
    case 3: f(std::integral_constant<int, 3>{}, r); break;
    case 2: f(std::integral_constant<int, 2>{}, r); break;
    case 1: f(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}
// Steps of the score tiles / P·V over R rows, for PrefetchCursor.
inline int64_t score_steps(int R, int64_t n) { return (R + 3) / 4 * ((n + 1) / 2); }
inline int64_t pv_steps(int R, int64_t Dv) { return (R + 3) / 4 * (Dv / 16); }

template <class L, class E>
void scores_rows(int R, const float* q, int64_t Dp, const void* const* kp, int64_t n, int64_t D, const float* ks, float* S,
                 PrefetchCursor& pf, bool add) {
  by_row_tiles(R, [&](auto nr, int r) { scores_tile<L, nr, E>(q + r * Dp, Dp, kp, n, D, ks, S + r * kKvBlock, pf, add); });
}
template <class E>
void scores_bf16_rows(int R, const float* q, int64_t Dp, const void* const* kp, int64_t n, int64_t D, const float* ks,
                      float* S, PrefetchCursor& pf, bool add = false) {
#if defined(__AVX512F__)
  if (wide_tiles(D)) return scores_rows<Lanes16, E>(R, q, Dp, kp, n, D, ks, S, pf, add);
#endif
  scores_rows<Lanes8, E>(R, q, Dp, kp, n, D, ks, S, pf, add);
}
template <class L, class E>
void pv_rows(int R, const float* P, const void* const* vp, int64_t n, int64_t Dv, float* acc, int64_t Dvp, PrefetchCursor& pf) {
  by_row_tiles(R, [&](auto nr, int r) { pv_tile<L, nr, E>(P + r * kKvBlock, vp, n, Dv, acc + r * Dvp, Dvp, pf); });
}
template <class E>
void pv_bf16_rows(int R, const float* P, const void* const* vp, int64_t n, int64_t Dv, float* acc, int64_t Dvp,
                  PrefetchCursor& pf) {
#if defined(__AVX512F__)
  if (wide_tiles(Dv)) return pv_rows<Lanes16, E>(R, P, vp, n, Dv, acc, Dvp, pf);
#endif
  pv_rows<Lanes8, E>(R, P, vp, n, Dv, acc, Dvp, pf);
}

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
