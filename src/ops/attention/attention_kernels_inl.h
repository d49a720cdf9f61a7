// The attention job kernel, written once over a vector type V (src/simd) and included per
// ISA unit in its own namespace (OPTX_ISA_NS). See attention_internal.h for jobs.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including attention_kernels_inl.h"
#endif
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "numerics/online_softmax.h"
#include "ops/attention/attention_internal.h"

// Units without a bf16 dot-product instruction (AVX2, and AVX-512 without AVX512_BF16,
// as Ice Lake; the AVX512_BF16 and AMX units have their own bf16 kernels): the bf16 / f32
// / int8-cache tiles (OPTX_ATTN_BF16_TILES, named for the first of them), 512-bit on
// AVX-512 where a head dim is a multiple of 32.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512BF16__)
#define OPTX_ATTN_BF16_TILES 1
#include "ops/attention/attention_avx2_bf16_inl.h"
#include "ops/attention/attention_avx2_manyrows_inl.h"
#else
#define OPTX_ATTN_BF16_TILES 0
#endif
// Flash prefill as GEMM microkernel calls: AVX2 and AVX-512 units.
#if defined(__AVX2__) && defined(__FMA__)
#define OPTX_ATTN_GEMM_PREFILL 1
#include "ops/attention/attention_gemm_prefill_inl.h"
#else
#define OPTX_ATTN_GEMM_PREFILL 0
#endif

namespace optx::attn_detail::OPTX_ISA_NS {
namespace {

// Rows from which a decode job over one KV head takes the many-row path: its widening of
// each block (all of K and V, or MLA's latent row) pays for itself from 16 rows on. Against
// the tiles, alternating in one process, ctx 8k from DRAM, 2 threads: MLA (576 / 512) 8
// rows 0.85x, 12 0.96x, 16 1.02-1.12x, 24 1.07x, 32 1.13-1.30x; GQA (D = 128, one KV head)
// 8 rows 0.84x, 12 0.97x, 16 1.06-1.14x, 24 1.05-1.11x, 32 1.09-1.15x.
constexpr int kManyRowsMin = 16;

// Decode jobs of many rows over one KV head (MLA's heads, from a bf16 or an i8 latent;
// MQA, wide GQA groups) on the AVX-512 unit, which runs only without a bf16 dot product:
// the GEMM prefill's 6 x 64 zmm tiles, where the many-row tiles are 256-bit. (An i8 GQA
// cache keeps the int8 tiles.)
[[maybe_unused]] bool gemm_decode_job(const Config& c, const Job& j) {
#if defined(__AVX512F__)
  return c.kv_once && j.groups == 1 && j.nrows >= kManyRowsMin && (!j.kv.i8.k || j.kv.i8.mla_latent()) && c.D % 16 == 0 &&
         c.Dv % 16 == 0;
#else
  (void)c, (void)j;
  return false;
#endif
}

// This unit's dequantisation of i8 latent rows for KvView (see there). With AVX512_BF16
// the f32 -> bf16 rounding is one instruction per 16 values instead of the integer
// sequence (VCVTNEPS2BF16 rounds to nearest even as f32_to_bf16 does; it also treats
// denormals as zero, which a per-token scale of max|x| / 127 only meets for rows below
// 1e-36).
struct DequantRow {
  void operator()(const int8_t* x, float s, int64_t n, const void* rope, size_t rope_bytes, bool bf16, uint8_t* dst) const {
#if defined(__AVX512BF16__)
    if (bf16 && n % 32 == 0 && rope_bytes % 64 == 0) {
      const __m512 sv = _mm512_set1_ps(s);
      for (int64_t d = 0; d < n; d += 32) {
        const __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + d)))), sv);
        const __m512 b = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + d + 16)))), sv);
        _mm512_storeu_si512(dst + 2 * d, (__m512i)_mm512_cvtne2ps_pbh(b, a));
      }
      for (size_t b = 0; b < rope_bytes; b += 64)
        _mm512_storeu_si512(dst + 2 * n + b, _mm512_loadu_si512(static_cast<const uint8_t*>(rope) + b));
      return;
    }
#elif OPTX_ATTN_BF16_TILES
    // 8 values per step instead of the scalar f32_to_bf16 loop (the i8 reads that do not
    // take the AVX2 tiles: MLA's latent, head dims not a multiple of 16).
    if (bf16 && n % 8 == 0) {
      const __m256 sv = _mm256_set1_ps(s);
      uint16_t* o = reinterpret_cast<uint16_t*>(dst);
      for (int64_t d = 0; d < n; d += 8) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + d));
        simd::Avx2::store(o + d, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), sv));
      }
      if (rope_bytes) std::memcpy(dst + size_t(n) * 2, rope, rope_bytes);
      return;
    }
#endif
    dequant_i8_row(x, s, n, rope, rope_bytes, bf16, dst);
  }
};

template <class V>
OPTX_ALWAYS_INLINE int64_t round_w(int64_t n) {
  return (n + V::W - 1) / V::W * V::W;
}

// q (f32, zero-padded to W) . k (T) over D.
template <class V, class T>
OPTX_ALWAYS_INLINE float dot(const float* q, const T* k, int64_t D) {
  auto a0 = V::zero(), a1 = V::zero();
  int64_t d = 0;
  for (; d + 2 * V::W <= D; d += 2 * V::W) {
    a0 = V::fmadd(V::load(q + d), V::load(k + d), a0);
    a1 = V::fmadd(V::load(q + d + V::W), V::load(k + d + V::W), a1);
  }
  for (; d + V::W <= D; d += V::W) a0 = V::fmadd(V::load(q + d), V::load(k + d), a0);
  if (d < D) a1 = V::fmadd(V::load(q + d, int(D - d)), V::load(k + d, int(D - d)), a1);
  return V::reduce(V::add(a0, a1));
}

// acc[0..Dv) = acc * f (f != 1 only)
template <class V>
OPTX_ALWAYS_INLINE void scale_acc(float* acc, float f, int64_t Dvp) {
  const auto s = V::set1(f);
  for (int64_t d = 0; d < Dvp; d += V::W) V::store(acc + d, V::mul(V::load(acc + d), s));
}

// acc += p * v over Dv (acc padded to W; v read with a masked tail).
template <class V, class T>
OPTX_ALWAYS_INLINE void axpy(float* acc, float p, const T* v, int64_t Dv) {
  const auto s = V::set1(p);
  int64_t d = 0;
  for (; d + V::W <= Dv; d += V::W) V::store(acc + d, V::fmadd(s, V::load(v + d), V::load(acc + d)));
  if (d < Dv) V::store(acc + d, V::fmadd(s, V::load(v + d, int(Dv - d)), V::load(acc + d)));
}

// acc[0..Dv) += sum_jj p[jj] * v_jj for one row over a block: 4 vectors of the row's
// accumulator stay in registers across the block's keys (one load and store per block,
// not per key), v rows come from L1.
template <class V, class T>
OPTX_ALWAYS_INLINE void pv_block(const float* p, const void* const* vp, int64_t n, int64_t Dv, float* acc) {
  int64_t d = 0;
  for (; d + 4 * V::W <= Dv; d += 4 * V::W) {
    auto a0 = V::load(acc + d), a1 = V::load(acc + d + V::W), a2 = V::load(acc + d + 2 * V::W), a3 = V::load(acc + d + 3 * V::W);
    for (int64_t jj = 0; jj < n; ++jj) {
      if (p[jj] == 0.0f) continue;
      const auto s = V::set1(p[jj]);
      const T* v = static_cast<const T*>(vp[jj]) + d;
      a0 = V::fmadd(s, V::load(v), a0);
      a1 = V::fmadd(s, V::load(v + V::W), a1);
      a2 = V::fmadd(s, V::load(v + 2 * V::W), a2);
      a3 = V::fmadd(s, V::load(v + 3 * V::W), a3);
    }
    V::store(acc + d, a0);
    V::store(acc + d + V::W, a1);
    V::store(acc + d + 2 * V::W, a2);
    V::store(acc + d + 3 * V::W, a3);
  }
  if (d < Dv)
    for (int64_t jj = 0; jj < n; ++jj)
      if (p[jj] != 0.0f) axpy<V>(acc + d, p[jj], static_cast<const T*>(vp[jj]) + d, Dv - d);
}

template <class V, class T>
OPTX_ALWAYS_INLINE void load_f32(const T* x, int64_t n, float scale, float* out) {
  const auto s = V::set1(scale);
  int64_t d = 0;
  for (; d + V::W <= n; d += V::W) V::store(out + d, V::mul(V::load(x + d), s));
  if (d < n) V::store(out + d, V::mul(V::load(x + d, int(n - d)), s), int(n - d));
}

template <class V, class T>
void run_job_t(const Config& c, const Job& j, float* scratch) {
  const int R = j.nrows;
  const int64_t Dp = round_w<V>(c.D), Dvp = round_w<V>(c.Dv);
  // Prefill with K / V reused by other jobs runs as GEMM microkernel calls on each block
  // loaded (bf16: widened) once for all the job's rows (attention_gemm_prefill_inl.h), f32
  // inputs too: they ran the generic dot per (row, key) at ~0.3x the bf16 path's rate.
  [[maybe_unused]] const bool gemm_prefill =
      OPTX_ATTN_GEMM_PREFILL && (gemm_prefill_job(c, j) || gemm_decode_job(c, j));
  // q rows, or for the GEMM prefill Q's 6-row micro-panels in their place (ceil(R / 6) * 6
  // x D values, within qf_rows(c.max_rows)): a second copy of Q put the 192-row flash
  // workspace over 1% of `basic`'s score matrix.
  const int Rq = gemm_prefill ? (R + 5) / 6 * 6 : R;
  float* qf = scratch;               // Rq x Dp: R rows scaled by c.scale, zero-padded
  float* acc = qf + Rq * Dp;         // R x Dvp
  float* S = acc + R * Dvp;          // R x kKvBlock
  // The prefill GEMM path's operands (sized by job_scratch_floats).
  [[maybe_unused]] float* stage = scratch + qf_rows(c.max_rows) * Dp + c.max_rows * (Dvp + kKvBlock);
  numerics::SoftmaxState st[kMaxFlashRows];
  // Each row's sum of probabilities as a vector of partial sums, reduced once at the end
  // rather than every block (the horizontal sum and its store were ~4% of a flash call).
  alignas(64) float lsum[kMaxFlashRows * V::W];
  std::fill(lsum, lsum + R * V::W, 0.0f);
  // The AVX2 tiles read bf16 or f32 rows (and int8 caches); bf16 tiles keep q and O with
  // each 16-value chunk's middle quads swapped (see there), f32 and int8 in plain order.
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  [[maybe_unused]] const bool tiles = OPTX_ATTN_BF16_TILES && c.D % 16 == 0 && c.Dv % 16 == 0;
#if OPTX_ATTN_GEMM_PREFILL
  GemmPrefill<T> gp(gemm_prefill ? R : 0, c.D, c.Dv, c.max_rows, stage, qf);
  static_assert(kMaxFlashRows % gemm_detail::kMR == 0 && kMaxJobRows % gemm_detail::kMR == 0);
#endif
  // Decode from an i8 GQA cache: the tiles read the int8 rows themselves (the scale of
  // each key applied to its scores, and to its P column before P·V), in plain order, so
  // nothing is dequantised into staging (B=1, 2 threads, back to back: ctx 8k 4.0-4.3 ->
  // 2.5-3.2 ms, ctx 32k 22.7 -> 12.4 ms; the bf16 cache 3.5-4.8 and 14.1 ms).
  [[maybe_unused]] const bool i8_tiles = tiles && !gemm_prefill && c.kv_once && j.kv.i8.k && j.kv.i8.v;
  // MLA from an i8 latent, likewise: the int8 tiles over the latent rows (each key's scale
  // on its score and P column), the rope part's scores added by the bf16 tiles from its own
  // rows; V is the latent. Dequantising rows into staging first ran at 0.83x the bf16
  // cache's tokens/s.
  [[maybe_unused]] const bool mla_i8 = kBf16 && tiles && !gemm_prefill && c.kv_once && j.groups == 1 && j.kv.i8.mla_latent();
  // The same on the GEMM path (gemm_decode_job): the latent's int8 rows widened with
  // their scales into K^T and V (GemmPrefill::load_k_i8).
  [[maybe_unused]] const bool gemm_mla_i8 = gemm_prefill && j.kv.i8.mla_latent();
  [[maybe_unused]] float k_scale[2 * kKvBlock], v_scale[2 * kKvBlock];
  // Decode with many rows over one KV head's bf16 rows or MLA's i8 latent (MLA's heads, wide
  // GQA groups): each block widened to f32 once for all rows, then broadcast-FMA tiles
  // (attention_avx2_manyrows_inl.h).
  [[maybe_unused]] const bool many_rows = kBf16 && tiles && !gemm_prefill && c.kv_once && j.groups == 1 && (!j.kv.i8.k || mla_i8) &&
                                          c.max_rows <= kMaxRows && R >= kManyRowsMin;
#if OPTX_ATTN_BF16_TILES
  // V is K's row prefix (MLA's latent, bf16 or i8): P.V reads the widened K rows.
  const bool v_shared = mla_i8 || (j.kv.k == j.kv.v && j.kv.k_rs == j.kv.v_rs && c.Dv <= c.D);
  ManyRows mr(many_rows ? R : 0, c.D, c.Dv, v_shared, stage);
#endif
  for (int r = 0; r < R; ++r) {
    std::fill(acc + r * Dvp, acc + (r + 1) * Dvp, 0.0f);
    if (gemm_prefill) continue;
    std::fill(qf + r * Dp, qf + (r + 1) * Dp, 0.0f);
    load_f32<V>(static_cast<const T*>(j.rows[r].q), c.D, c.scale, qf + r * Dp);
#if OPTX_ATTN_BF16_TILES
    if (mla_i8) to_tile_order(qf + r * Dp + c.Dv, c.D - c.Dv, many_rows);  // the rope part only
    else if (kBf16 && tiles && !i8_tiles && !gemm_prefill) to_tile_order(qf + r * Dp, c.D, many_rows);
#endif
  }
#if OPTX_ATTN_GEMM_PREFILL
  if (gemm_prefill) gp.pack_q(j, c.scale);
#endif
#if OPTX_ATTN_BF16_TILES
  if (many_rows) mr.pack_q(qf, Dp);
#endif
  // Keys beyond every row's causal / window reach are never visited.
  const auto [lo, hi] = job_keys(c, j, R);
  // Row addresses of this block and the next. A job reads one head's slice of each cache
  // row, rows a whole slot apart, which the hardware prefetchers do not follow: without
  // software prefetches decode waited on DRAM per key. The bf16 tiles spread the next
  // block's over their steps (PrefetchCursor); the rest prefetch kPrefetchKeys ahead.
  constexpr int64_t kPrefetchKeys = 16;
  const void* kp[2 * kKvBlock];
  const void* vp[2 * kKvBlock];
  [[maybe_unused]] const void* rp[2 * kKvBlock];  // mla_i8: the rope rows
  // Job::groups runs of rows, run g reading its KV head's slice, g * k_goff / v_goff values
  // into each row: a job over all KV heads reads whole rows in address order.
  const int G = j.groups, Rg = R / G;
  const int64_t k_span = (G - 1) * j.k_goff + c.D, v_span = (G - 1) * j.v_goff + c.Dv;
  const int64_t es = i8_tiles ? 1 : int64_t(sizeof(T));  // bytes per cache value read
  const int64_t k_lines = (k_span * es + 63) / 64, v_lines = (v_span * es + 63) / 64;
  [[maybe_unused]] const int64_t lat_lines = (c.Dv + 63) / 64, rope_lines = ((c.D - c.Dv) * int64_t(sizeof(T)) + 63) / 64;
  const void* slice[kKvBlock];
  auto slices = [&](const void* const* rows, int64_t off, int64_t n) -> const void* const* {
    if (off == 0) return rows;
    for (int64_t jj = 0; jj < n; ++jj) slice[jj] = static_cast<const char*>(rows[jj]) + off * es;
    return slice;
  };
  // Rows of keys j0 .. j0 + n: plain, dequantised into staging, or the int8 rows (i8_tiles;
  // mla_i8: the latent rows, their scales and the rope rows).
  auto rows = [&](int64_t j0, int64_t n, int64_t at) {
    if (i8_tiles) {
      j.kv.planes(j0, n, kp + at, vp + at, k_scale + at, v_scale + at, DequantRow{});
    } else if (mla_i8 || gemm_mla_i8) {
      j.kv.sources(j0, n, c.bf16, kp + at, rp + at, k_scale + at, DequantRow{});
      std::copy(kp + at, kp + at + n, vp + at);
    } else {
      j.kv.rows(j0, n, c.bf16, kp + at, vp + at, DequantRow{});
    }
  };
  // Decode over several KV heads (the bf16 / int8 tiles, G > 1) steps 16 keys at a time,
  // a quarter of a block. Each step's scores take the 16 keys through every head, so K is
  // read in address order (16 slots x G heads: a paged block's rows whole), a stream the
  // hardware prefetchers follow, where a head's 64-key block at a time read 256-byte
  // pieces a slot (2 KiB) apart (B = 1 from DRAM, alternating in one process: ctx 8k
  // +8-14%, 32k +7-10%). A step is 32 KiB of K and of V with 8 KV heads of 128, so the rows in
  // flight (this step's V, prefetched during its scores, and the next step's K, during its
  // P.V) stay far inside L2 (512 KiB on Zen 3), where 64 keys and the V staging they
  // needed put ~640 KiB in play; memory and compute interleave at a finer grain too. (V is
  // read in place, see P.V.) B = 1 / 8, ctx 8k /
  // 32k from DRAM (a new cache copy every call), alternating in one process, three runs:
  // +9-18% against 64 keys, 32 keys +4-9%, 8 keys +3-10%; with the cache in L2 -1 to -5%
  // (more softmax passes and O loads / stores per key). MLA (G = 1, compute-bound here)
  // lost 2-4% at 16 or 32 keys, so other jobs keep kKvBlock.
  const int64_t step = tiles && G > 1 ? 16 : kKvBlock;
  // The next block's rows (fetched at kKvBlock) become the current ones.
  const auto shift_next = [&](int64_t n_next) {
    std::copy(kp + kKvBlock, kp + kKvBlock + n_next, kp);
    std::copy(vp + kKvBlock, vp + kKvBlock + n_next, vp);
    if (i8_tiles || mla_i8 || gemm_mla_i8) std::copy(k_scale + kKvBlock, k_scale + kKvBlock + n_next, k_scale);
    if (i8_tiles) std::copy(v_scale + kKvBlock, v_scale + kKvBlock + n_next, v_scale);
    if (mla_i8 || gemm_mla_i8) std::copy(rp + kKvBlock, rp + kKvBlock + n_next, rp);
  };
  if (lo < hi) rows(lo, std::min(step, hi - lo), 0);
  for (int64_t kb = lo; kb < hi; kb += step) {
    const int64_t n = std::min(step, hi - kb);
    const int64_t n_next = std::max<int64_t>(0, std::min(step, hi - kb - step));
    if (n_next) rows(kb + step, n_next, kKvBlock);
    if (j.rows[0].mask && masks_hide(j, kb, n)) {  // blocks no row sees (attention_internal.h)
      shift_next(n_next);
      continue;
    }
#if OPTX_ATTN_BF16_TILES
    // The scores read this block's K and P·V its V: the scores prefetch this block's V,
    // P·V the next block's K, so about half a block's rows are in flight or waiting in L2
    // rather than a whole next block (+3-13% from DRAM against prefetching the next
    // block's K during the scores and its V during P·V).
    PrefetchCursor pf_s, pf_v;
    if (many_rows && mla_i8) {
      pf_s = PrefetchCursor(kp + kKvBlock, n_next, lat_lines, mr.steps(n));
      pf_v = PrefetchCursor(rp + kKvBlock, n_next, rope_lines, mr.steps(n));
    } else if (many_rows) {
      pf_s = PrefetchCursor(kp + kKvBlock, n_next, k_lines, mr.steps(n));
      if (!v_shared) pf_v = PrefetchCursor(vp + kKvBlock, n_next, v_lines, mr.steps(n));
    } else if (mla_i8) {  // K and V are the same rows: the next block's rope rows, then its latent
      pf_s = PrefetchCursor(rp + kKvBlock, n_next, rope_lines, G * score_steps(Rg, n));
      pf_v = PrefetchCursor(kp + kKvBlock, n_next, lat_lines, G * pv_steps(Rg, c.Dv));
    } else if (tiles && c.kv_once && !gemm_prefill) {
      pf_s = PrefetchCursor(vp, n, v_lines, G * score_steps(Rg, n));
      pf_v = PrefetchCursor(kp + kKvBlock, n_next, k_lines, G * pv_steps(Rg, c.Dv));
    }
#endif
    if (!tiles && c.kv_once)
      for (int64_t jj = 0; jj + kPrefetchKeys < n + n_next && jj < n; ++jj) {
        const char* pk = static_cast<const char*>(kp[jj + kPrefetchKeys]);
        const char* pv = static_cast<const char*>(vp[jj + kPrefetchKeys]);
        for (int64_t l = 0; l < k_lines; ++l) __builtin_prefetch(pk + 64 * l);
        for (int64_t l = 0; l < v_lines; ++l) __builtin_prefetch(pv + 64 * l);
      }
#if OPTX_ATTN_GEMM_PREFILL
    if (gemm_prefill) {
#if defined(__AVX512F__)
      if (gemm_mla_i8) {
        gp.load_k_i8(kp, k_scale, rp, n);
        gp.load_v_i8(kp, k_scale, n);
        gp.next_rows_i8(kp + kKvBlock, rp + kKvBlock, n_next);
      } else
#endif
      {
        gp.load_k(kp, n);
        gp.load_v(vp, n);
        gp.next_rows(kp + kKvBlock, vp + kKvBlock, n_next);
      }
      gp.find_live(c, j, kb, n);
      gp.scores(S);
    }
#endif
#if OPTX_ATTN_BF16_TILES
    if (many_rows) {
      if (mla_i8) mr.widen_i8(kp, k_scale, rp, n);
      else mr.widen(kp, vp, n);
      mr.scores(n, S, pf_s, pf_v);
    }
#endif
    for (int g = 0; g < G; ++g) {
      const void* const* kg = slices(kp, g * j.k_goff, n);
      if (gemm_prefill) continue;
#if OPTX_ATTN_BF16_TILES
      if (many_rows) continue;
      if (i8_tiles) {
        scores_bf16_rows<int8_t>(Rg, qf + g * Rg * Dp, Dp, kg, n, c.D, k_scale, S + g * Rg * kKvBlock, pf_s);
        continue;
      }
      if (mla_i8) {
        PrefetchCursor none;
        scores_bf16_rows<int8_t>(R, qf, Dp, kp, n, c.Dv, k_scale, S, pf_s);
        scores_bf16_rows<uint16_t>(R, qf + c.Dv, Dp, rp, n, c.D - c.Dv, nullptr, S, none, /*add=*/true);
        continue;
      }
      if (tiles) {
        scores_bf16_rows<T>(Rg, qf + g * Rg * Dp, Dp, kg, n, c.D, nullptr, S + g * Rg * kKvBlock, pf_s);
        continue;
      }
#endif
      for (int r = g * Rg; r < (g + 1) * Rg; ++r)
        for (int64_t jj = 0; jj < n; ++jj) S[r * kKvBlock + jj] = dot<V>(qf + r * Dp, static_cast<const T*>(kg[jj]), c.D);
    }
    // Softcap, bias, masks; then per row the online-softmax update of the block.
    bool any = false;
    for (int r = 0; r < R; ++r) {
      const Row& row = j.rows[r];
      float* s = S + r * kKvBlock;
      float bmax = -INFINITY;
      // Causal / window visibility is an interval of the block's keys, [a, b).
      const auto [a, b] = visible_keys(c, row.qpos, j.offset, kb, n);
      // Softcap, a unit-stride bias and a unit-stride mask in vectors: std::tanh per score
      // cost about twice the rest of the call (flash bf16 S = 2048, 16 heads, softcap 50:
      // `avx512` unit 329 -> 118 ms, the plain call 111; `avx2` 331 -> 161).
      const bool cap = c.softcap > 0.0f, vbias = row.bias && row.bias_cs == 1, vmask = row.mask && row.mask_cs == 1;
      if (cap || vbias || vmask) {
        const auto capv = V::set1(c.softcap), inv = V::set1(cap ? 1.0f / c.softcap : 0.0f);
        const auto logit = [&](auto x, int64_t jj, int w) {
          if (cap) x = V::mul(capv, V::tanh(V::mul(x, inv)));
          if (vbias) x = V::add(x, w == V::W ? V::load(row.bias + kb + jj) : V::load(row.bias + kb + jj, w));
          return vmask ? V::hide(x, row.mask + kb + jj, w) : x;
        };
        int64_t jj = a;
        for (; jj + V::W <= b; jj += V::W) V::store(s + jj, logit(V::load(s + jj), jj, V::W));
        // The tail alone masked: AVX2's masked store (vmaskmovps) is microcoded on AMD,
        // and every block through it ran the bias case 10-25% slower than scalar adds.
        if (const int w = int(b - jj); w > 0) V::store(s + jj, logit(V::load(s + jj, w), jj, w), w);
      }
      if ((!row.mask || vmask) && (!row.bias || vbias)) {
        // The rest of the block is masked by two fills, and the max runs in vectors.
        // (Each row meets partly visible blocks around its diagonal; they went key by key
        // through the generic loop below: causal bf16 prefill, 16 heads, alternating in
        // one process, S = 2048 / 4096 +1 to +3.5%.)
        std::fill(s, s + a, -INFINITY);
        std::fill(s + b, s + n, -INFINITY);
        auto vmax = V::set1(-INFINITY);
        int64_t jj = a;
        for (; jj + V::W <= b; jj += V::W) vmax = V::max(vmax, V::load(s + jj));
        bmax = V::reduce_max(vmax);
        for (; jj < b; ++jj) bmax = std::max(bmax, s[jj]);
      } else {
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t key = kb + jj;
          float x = s[jj];
          if (row.bias && !vbias) x += row.bias[key * row.bias_cs];
          if (jj < a || jj >= b || (row.mask && !vmask && row.mask[key * row.mask_cs] == 0)) x = -INFINITY;
          s[jj] = x;
          bmax = std::max(bmax, x);
        }
      }
      const float f = st[r].rescale_to(bmax);
      if (st[r].empty()) {  // nothing visible yet: no probabilities this block
        for (int64_t jj = 0; jj < n; ++jj) s[jj] = 0.0f;
        continue;
      }
      any = true;
      float* lv = lsum + r * V::W;
      if (f != 1.0f) {
        st[r].l *= f;
        V::store(lv, V::mul(V::load(lv), V::set1(f)));
#if OPTX_ATTN_GEMM_PREFILL
        if (gemm_prefill) gp.scale_row(r, f);
        else
#endif
        scale_acc<V>(acc + r * Dvp, f, Dvp);
      }
      const auto m = V::set1(st[r].m);
      auto sum = V::zero();
      int64_t jj = 0;
      for (; jj + V::W <= n; jj += V::W) {
        const auto p = V::exp(V::sub(V::load(s + jj), m));
        V::store(s + jj, p);
        sum = V::add(sum, p);
      }
      float tail = 0.0f;
      for (; jj < n; ++jj) {
        s[jj] = std::exp(s[jj] - st[r].m);
        tail += s[jj];
      }
      V::store(lv, V::add(V::load(lv), sum));
      st[r].l += tail;
    }
    for (int g = 0; any && g < G; ++g) {
      const void* const* vg = slices(vp, g * j.v_goff, n);
#if OPTX_ATTN_GEMM_PREFILL
      if (gemm_prefill) {
        gp.pv(S, n);
        continue;
      }
#endif
#if OPTX_ATTN_BF16_TILES
      if (many_rows) {
        mr.pv(S, n, acc, Dvp, pf_s, pf_v);
        continue;
      }
      if (tiles) {
        // P.V reads a KV head's V slices in place. With 64-key blocks they shared a few
        // L1 sets (64 rows a slot apart) and went through a contiguous copy first; a
        // 16-key step's slices fit their sets, and without the copy decode ran from DRAM
        // +8-11% (in L2 +14%), alternating in one process.
        float* P = S + g * Rg * kKvBlock;
        if (i8_tiles || mla_i8) {
          const float* vs = mla_i8 ? k_scale : v_scale;  // MLA: V is the latent, its scale K's
          for (int r = 0; r < Rg; ++r)
            for (int64_t jj = 0; jj < n; ++jj) P[r * kKvBlock + jj] *= vs[jj];
          pv_bf16_rows<int8_t>(Rg, P, vg, n, c.Dv, acc + g * Rg * Dvp, Dvp, pf_v);
        } else {
          pv_bf16_rows<T>(Rg, P, vg, n, c.Dv, acc + g * Rg * Dvp, Dvp, pf_v);
        }
        continue;
      }
#endif
      for (int r = g * Rg; r < (g + 1) * Rg; ++r) pv_block<V, T>(S + r * kKvBlock, vg, n, c.Dv, acc + r * Dvp);
    }
#if OPTX_ATTN_BF16_TILES
    pf_s.rest();
    pf_v.rest();
#endif
    shift_next(n_next);
  }
#if OPTX_ATTN_GEMM_PREFILL
  if (gemm_prefill) gp.store_o(acc, Dvp);
#endif
#if OPTX_ATTN_BF16_TILES
  if (kBf16 && tiles && !i8_tiles && !mla_i8 && !gemm_prefill)
    for (int r = 0; r < R; ++r) from_tile_order(acc + r * Dvp, c.Dv, many_rows);
#endif
  for (int r = 0; r < R; ++r) {
    const Row& row = j.rows[r];
    numerics::SoftmaxState s = st[r];
    s.l += V::reduce(V::load(lsum + r * V::W));
    if (row.sink != -INFINITY) {  // the sink joins the denominator only
      if (s.empty()) {
        s.m = row.sink;
        s.l = 1.0f;
      } else {
        const float f = s.rescale_to(std::max(s.m, row.sink));
        s.l = s.l * f + std::exp(row.sink - s.m);
        if (f != 1.0f) scale_acc<V>(acc + r * Dvp, f, Dvp);
      }
    }
    const float inv = s.inv_sum();
    if (c.partial) {
      load_f32<V>(static_cast<const float*>(acc + r * Dvp), c.Dv, inv, row.part_out);
    } else {
      T* o = static_cast<T*>(row.out);
      const auto sv = V::set1(inv);
      int64_t d = 0;
      for (; d + V::W <= c.Dv; d += V::W) V::store(o + d, V::mul(V::load(acc + r * Dvp + d), sv));
      if (d < c.Dv) V::store(o + d, V::mul(V::load(acc + r * Dvp + d), sv), int(c.Dv - d));
    }
    if (row.lse) *row.lse = s.lse();
  }
}

void run_job(const Config& c, const Job& j, float* scratch) {
  if (c.bf16) run_job_t<simd_type, uint16_t>(c, j, scratch);
  else run_job_t<simd_type, float>(c, j, scratch);
}

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
