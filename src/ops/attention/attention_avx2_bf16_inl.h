// bf16, f32 and int8-cache score and P·V tiles for AVX2 units (no dot-product instruction for bf16), used by
// run_job_t (attention_kernels_inl.h) when D and Dv are multiples of 16.
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

// S[r * kKvBlock + jj] = q_r . k_jj (times ks[jj], an i8 cache's key scales, if given;
// added to S with `add`) for NR rows (f32, stride Dp, in the order widen16 gives for E) and
// keys jj < n, two keys at a time (an odd last key is paired with itself).
template <int NR, class E>
void scores_bf16(const float* q, int64_t Dp, const void* const* kp, int64_t n, int64_t D, const float* ks, float* S,
                 PrefetchCursor& pf, bool add) {
  for (int64_t jj = 0; jj < n; jj += 2) {
    pf.step();
    const E* k0 = static_cast<const E*>(kp[jj]);
    const E* k1 = static_cast<const E*>(kp[jj + 1 < n ? jj + 1 : jj]);
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      __m256 a_lo, a_hi, b_lo, b_hi;
      widen16(k0 + d, a_lo, a_hi);
      widen16(k1 + d, b_lo, b_hi);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m256 q_lo = _mm256_loadu_ps(q + r * Dp + d), q_hi = _mm256_loadu_ps(q + r * Dp + d + 8);
        acc[2 * r] = _mm256_fmadd_ps(a_hi, q_hi, _mm256_fmadd_ps(a_lo, q_lo, acc[2 * r]));
        acc[2 * r + 1] = _mm256_fmadd_ps(b_hi, q_hi, _mm256_fmadd_ps(b_lo, q_lo, acc[2 * r + 1]));
      }
    }
    alignas(32) float s[8];
    _mm256_store_ps(s, sum8(acc));
    const float s0 = ks ? ks[jj] : 1.0f, s1 = ks && jj + 1 < n ? ks[jj + 1] : 1.0f;
    for (int r = 0; r < NR; ++r) {
      float* out = S + r * kKvBlock + jj;
      out[0] = add ? out[0] + s[2 * r] * s0 : s[2 * r] * s0;
      if (jj + 1 < n) out[1] = add ? out[1] + s[2 * r + 1] * s1 : s[2 * r + 1] * s1;
    }
  }
}

// acc_r[0, Dv) (stride Dvp, swap_quads16 order) += sum_jj P[r * kKvBlock + jj] * v_jj for
// NR rows: 16 columns of all NR rows stay in registers over the block's keys.
template <int NR, class E>
void pv_bf16(const float* P, const void* const* vp, int64_t n, int64_t Dv, float* acc, int64_t Dvp, PrefetchCursor& pf) {
  for (int64_t d = 0; d < Dv; d += 16) {
    __m256 o[2 * NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      o[2 * r] = _mm256_loadu_ps(acc + r * Dvp + d);
      o[2 * r + 1] = _mm256_loadu_ps(acc + r * Dvp + d + 8);
    }
    pf.step();
    for (int64_t jj = 0; jj < n; ++jj) {
      __m256 v_lo, v_hi;
      widen16(static_cast<const E*>(vp[jj]) + d, v_lo, v_hi);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m256 p = _mm256_broadcast_ss(P + r * kKvBlock + jj);
        o[2 * r] = _mm256_fmadd_ps(p, v_lo, o[2 * r]);
        o[2 * r + 1] = _mm256_fmadd_ps(p, v_hi, o[2 * r + 1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      _mm256_storeu_ps(acc + r * Dvp + d, o[2 * r]);
      _mm256_storeu_ps(acc + r * Dvp + d + 8, o[2 * r + 1]);
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

template <class E>
void scores_bf16_rows(int R, const float* q, int64_t Dp, const void* const* kp, int64_t n, int64_t D, const float* ks,
                      float* S, PrefetchCursor& pf, bool add = false) {
  by_row_tiles(R, [&](auto nr, int r) { scores_bf16<nr, E>(q + r * Dp, Dp, kp, n, D, ks, S + r * kKvBlock, pf, add); });
}
template <class E>
void pv_bf16_rows(int R, const float* P, const void* const* vp, int64_t n, int64_t Dv, float* acc, int64_t Dvp,
                  PrefetchCursor& pf) {
  by_row_tiles(R, [&](auto nr, int r) { pv_bf16<nr, E>(P + r * kKvBlock, vp, n, Dv, acc + r * Dvp, Dvp, pf); });
}

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
