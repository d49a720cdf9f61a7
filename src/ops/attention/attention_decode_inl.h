// bf16 pieces shared by the AMX and AVX512_BF16 units (included after
// attention_kernels_inl.h, in the unit's OPTX_ISA_NS): the conditions of the bf16 fast
// paths, the few-row decode kernel, and the rows' finalisation.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including attention_decode_inl.h"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "numerics/denormals.h"

namespace optx::attn_detail::OPTX_ISA_NS {
namespace {

// A bf16 pair (x[2p], x[2p + 1]) in every dword: the broadcast operand of vdpbf16ps.
OPTX_ALWAYS_INLINE __m512bh pair_bcast(const uint16_t* x, int64_t p) {
  using i32_alias = int32_t __attribute__((may_alias, aligned(2)));
  return (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const i32_alias*>(x + 2 * p));
}

// bf16 with D and Dv multiples of `grid` (whole steps of a kernel over D), within the
// head-dim bound.
bool bf16_shapes(const Config& c, int64_t grid) {
  return c.bf16 && c.D % grid == 0 && c.Dv % grid == 0 && c.D <= kMaxHeadDim && c.Dv <= kMaxHeadDim;
}

// The few-row decode kernel's reach: bf16 with D and Dv multiples of 32, no softcap / mask
// / bias tensor.
bool supported(const Config& c, const Job& j) {
  if (!bf16_shapes(c, 32) || c.softcap > 0.0f) return false;
  for (int r = 0; r < j.nrows; ++r)
    if (j.rows[r].mask || j.rows[r].bias) return false;
  return true;
}

// Whether a pair job kernel (the AMX tiles, vdpbf16ps) takes a job: one KV head, up to
// max_rows rows, D and Dv on its grid (softcap, bias and masks apply in the shared
// vertical softmax). Jobs of up to kDecodeRows rows go to the few-row decode kernel where
// it takes them, and run on the pair kernel with idle row lanes where it does not.
bool pair_kernel_takes(const Config& c, const Job& j, int64_t grid, int max_rows) {
  return bf16_shapes(c, grid) && j.groups == 1 && j.nrows <= max_rows && !(j.nrows <= kDecodeRows && supported(c, j));
}

// Sinks, normalisation, output and lse of a job's rows from the running max m, sum l
// and unnormalised accumulators o (row stride Dv).
void finish_rows(const Config& c, const Job& j, const float* mrow, const float* lrow, const float* o) {
  const int R = j.nrows;
  const int64_t Dv = c.Dv;
  for (int r = 0; r < R; ++r) {
    const Row& row = j.rows[r];
    numerics::SoftmaxState s;
    s.m = mrow[r];
    s.l = lrow[r];
    float extra = 1.0f;  // rescale of o for a sink above the running max
    if (row.sink != -INFINITY) {
      if (s.empty()) {
        s.m = row.sink;
        s.l = 1.0f;
      } else {
        extra = s.rescale_to(std::max(s.m, row.sink));
        s.l = s.l * extra + std::exp(row.sink - s.m);
      }
    }
    const float inv = s.inv_sum() * extra;
    const __m512 sv = _mm512_set1_ps(inv);
    if (c.partial) {
      float* out = row.part_out;
      for (int64_t d = 0; d < Dv; d += 16) _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), sv));
    } else {
      uint16_t* out = static_cast<uint16_t*>(row.out);
      for (int64_t d = 0; d < Dv; d += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), sv)));
    }
    if (row.lse) *row.lse = s.lse();
  }
}

// The first `count` of n key rows as one block (an AMX A tile, or the vdpbf16ps score
// loop's base and stride): the first row, and the rows' stride, when all `count` exist
// and sit at one positive stride (a paged block of >= count slots); else null.
template <int count = 16>
const char* uniform_rows(const void* const* rows, int64_t n, int64_t* stride) {
  const char* base = n > 0 ? static_cast<const char*>(rows[0]) : nullptr;
  *stride = n > 1 ? static_cast<const char*>(rows[1]) - base : 0;
  bool direct = n >= count && *stride > 0;
  for (int i = 2; direct && i < count; ++i) direct = static_cast<const char*>(rows[i]) - base == i * *stride;
  return direct ? base : nullptr;
}

// A bf16 q row for int8 scores against i8 caches: qs = max|q| / 127, q ~ qs * (h + l / 254)
// with h, l in [-127, 127] (error <= max|q| / 64516, below bf16's half ulp for all but the
// row's smallest values). n % 16 == 0; returns qs.
float quantize_q_i8x2(const uint16_t* q, int64_t n, int8_t* h, int8_t* l) {
  auto load = [&](int64_t d) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + d))), 16));
  };
  __m512 amax = _mm512_setzero_ps();
  for (int64_t d = 0; d < n; d += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load(d)));
  alignas(64) float lanes[16];  // not _mm512_reduce_max_ps: GCC 12 warns on its undefined vectors here
  _mm512_store_ps(lanes, amax);
  const float m = *std::max_element(lanes, lanes + 16);
  const __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f), k254 = _mm512_set1_ps(254.0f);
  for (int64_t d = 0; d < n; d += 16) {
    const __m512 x = _mm512_mul_ps(load(d), inv);
    const __m512 hf = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 lf = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(x, hf), k254), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + d), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(hf)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(l + d), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(lf)));
  }
  return m / 127.0f;
}

#ifdef OPTX_ATTN_DECODE_AMX
constexpr int kFmaScoreRows = 4;  // bf16 scores of up to this many rows per KV head: scores_fma, not tiles

// The tile's rows where they are not at one stride: `bytes` of each row from `offset` on,
// contiguous in dst, zero rows past n.
void stage_rows16(const void* const* rows, int64_t n, size_t offset, size_t bytes, void* dst) {
  for (int64_t i = 0; i < 16; ++i) {
    uint8_t* d = static_cast<uint8_t*>(dst) + size_t(i) * bytes;
    if (i < n) std::memcpy(d, static_cast<const uint8_t*>(rows[i]) + offset, bytes);
    else std::memset(d, 0, bytes);
  }
}

// A tile of 16 keys' rows (from byte `offset`, `bytes` each): straight from the rows, or
// staged in `staging`; *stride gets the tile's row stride.
template <class T>
const T* tile_rows(const void* const* rows, int64_t n, size_t offset, size_t bytes, T* staging, int64_t* stride) {
  if (const char* base = uniform_rows(rows, n, stride)) return reinterpret_cast<const T*>(base + offset);
  stage_rows16(rows, n, offset, bytes, staging);
  *stride = int64_t(bytes);
  return staging;
}

#endif

// Sixteen dot-product partials (a[i] holds 16 partial sums of key i) to one vector of
// the sixteen sums, lane i = sum(a[i]): 45 shuffles and adds for 16 keys, where a
// horizontal sum per key costs 8 dependent ones plus a scalar store.
OPTX_ALWAYS_INLINE __m512 sum16(__m512 (&a)[16]) {
  __m512 t[8], u[4];
  for (int k = 0; k < 8; ++k)  // per 128-bit lane: [a2k, a2k+1, a2k, a2k+1] partials
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
  for (int k = 0; k < 4; ++k)  // per 128-bit lane: a4k .. a4k+3, that lane's sums
    u[k] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * k], t[2 * k + 1], 0x44), _mm512_shuffle_ps(t[2 * k], t[2 * k + 1], 0xee));
  const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
  const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x88), _mm512_shuffle_f32x4(v01, v23, 0xdd));
}

// Four rows' q (one KV head's, R = 4) as the operand of scores_quad: vector t holds row
// r's pairs 4t .. 4t + 3 (elements 8t .. 8t + 7) in its 128-bit lane r.
void quad_q(const uint16_t* const* q, int ng, __m512i* dst) {
  const auto part = [&](int r, int t) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + 8 * t)); };
  for (int t = 0; t < ng; ++t) {
    __m512i v = _mm512_castsi128_si512(part(0, t));
    v = _mm512_inserti32x4(v, part(1, t), 1);
    v = _mm512_inserti32x4(v, part(2, t), 2);
    _mm512_store_si512(dst + t, _mm512_inserti32x4(v, part(3, t), 3));
  }
}

// _mm512_shuffle_ps / _mm512_shuffle_f32x4 (and below _mm512_broadcast_i32x4) written as
// their all-lanes masked forms, the same instructions: GCC 12's plain forms pass an
// undefined vector through, which its -Wuninitialized reports where scores_quad is
// inlined into a loop.
template <int kImm>
OPTX_ALWAYS_INLINE __m512 shuffle_ps(__m512 a, __m512 b) { return _mm512_mask_shuffle_ps(a, __mmask16(0xffff), a, b, kImm); }
template <int kImm>
OPTX_ALWAYS_INLINE __m512 shuffle_f32x4(__m512 a, __m512 b) { return _mm512_mask_shuffle_f32x4(a, __mmask16(0xffff), a, b, kImm); }

// S[r][c0 .. c0 + 15] = scale * q_r . k_i for the four rows of one KV head and 16 keys,
// D = 8 NG: one vdpbf16ps chain per key, its lane 4r + j summing row r's pairs 4t + j
// against the same pairs of k_i (16 bytes of the K row broadcast to all four lanes; qg
// from quad_q). The rows share every K load and the 16 q vectors stay in registers, where
// a chain per (row, key) over D's 16-pair slices (sum16 per row) loads each K line once
// per row and folds 16 vectors per row: 44 shuffles and adds fold the four rows here,
// 180 there.
template <int NG>
void scores_quad(const uint16_t* const* k, const __m512i* qg, __m512 scale, float (*S)[kKvBlock], int64_t c0) {
  __m512bh qv[NG];
  for (int t = 0; t < NG; ++t) qv[t] = (__m512bh)_mm512_load_si512(qg + t);
  __m512 c[4];  // c[m]: keys 4m .. 4m + 3 of row r in 128-bit lane r
  for (int h = 0; h < 2; ++h) {
    __m512 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int t = 0; t < NG; ++t)
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m128i kk = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k[8 * h + i] + 8 * t));
        a[i] = _mm512_dpbf16_ps(a[i], qv[t], (__m512bh)_mm512_maskz_broadcast_i32x4(__mmask16(0xffff), kk));
      }
    // Per 128-bit lane: [j0 + j1, j2 + j3] of two keys, then whole sums of four.
    const auto fold = [](__m512 x, __m512 y) { return _mm512_add_ps(shuffle_ps<0x88>(x, y), shuffle_ps<0xdd>(x, y)); };
    const __m512 b0 = fold(a[0], a[1]), b1 = fold(a[2], a[3]), b2 = fold(a[4], a[5]), b3 = fold(a[6], a[7]);
    c[2 * h] = fold(b0, b1), c[2 * h + 1] = fold(b2, b3);
  }
  // 4 x 4 transpose of 128-bit lanes: row r's 16 keys from lane r of c[0 .. 3].
  const __m512 u0 = shuffle_f32x4<0x44>(c[0], c[1]), u1 = shuffle_f32x4<0xee>(c[0], c[1]);
  const __m512 u2 = shuffle_f32x4<0x44>(c[2], c[3]), u3 = shuffle_f32x4<0xee>(c[2], c[3]);
  _mm512_store_ps(&S[0][c0], _mm512_mul_ps(shuffle_f32x4<0x88>(u0, u2), scale));
  _mm512_store_ps(&S[1][c0], _mm512_mul_ps(shuffle_f32x4<0xdd>(u0, u2), scale));
  _mm512_store_ps(&S[2][c0], _mm512_mul_ps(shuffle_f32x4<0x88>(u1, u3), scale));
  _mm512_store_ps(&S[3][c0], _mm512_mul_ps(shuffle_f32x4<0xdd>(u1, u3), scale));
}

// The order P . V leaves 32 accumulator columns in, and the permutations to and from O's.
// Widened FMAs (kPairs false): each V row widened by a shift and a mask (bf16 is the top
// half of an f32) splits the columns into the even and the odd ones. vdpbf16ps on key
// pairs (kPairs, the AVX512_BF16 unit): V pairs of two keys' rows by in-lane 16-bit
// unpacks put them in the order {0-3, 8-11, 16-19, 24-27}, {4-7, 12-15, 20-23, 28-31}.
// kToPv: O's order (x = columns 0-15, y = 16-31) to P . V's (a, b); else back.
template <bool kPairs, bool kToPv>
OPTX_ALWAYS_INLINE void permute_pv_cols(__m512 x, __m512 y, __m512& a, __m512& b) {
  alignas(64) static constexpr int32_t kIdx[2][2][2][16] = {
      {{{0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}, {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31}},
       {{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}, {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}}},
      {{{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23}, {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}},
       {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}, {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}}}};
  const int32_t(&idx)[2][16] = kIdx[kPairs][kToPv];
  a = _mm512_permutex2var_ps(x, _mm512_load_si512(idx[0]), y);
  b = _mm512_permutex2var_ps(x, _mm512_load_si512(idx[1]), y);
}

// f(std::true_type) when a P . V pass covers all kCh columns, else f(std::false_type):
// the full passes (all of them when Dv % kCh == 0) compile without per-vector column
// tests. Alternating with the previous build in one process: int8 cache -8% time with
// the cache in L2, -5% from DRAM; bf16 -2% in L2, even from DRAM. (The pass as a lambda
// the compiler did not inline was 25% slower: hence always_inline on it.)
template <class F>
OPTX_ALWAYS_INLINE void full_or_not(bool full, F&& f) {
  if (full) f(std::true_type{});
  else f(std::false_type{});
}

// The lines of a list of rows (each `bytes` long) in address order, handed out a few at a
// time as L2 prefetches. Rows of one paged block are adjacent, so the pointer just runs on.
constexpr int64_t kPfEvery = 8;  // keys of P . V per RowLines step (every key: 20% slower in L2)
struct RowLines {
  const void* const* rows = nullptr;
  int64_t n = 0, bytes = 0, key = 0;
  const char* p = nullptr;
  const char* end = nullptr;
  void start(const void* const* r, int64_t count, int64_t row_bytes) {
    rows = r, n = row_bytes > 0 ? count : 0, bytes = row_bytes, key = 0;
    if (n > 0) p = static_cast<const char*>(rows[0]), end = p + bytes;
  }
  // Up to `lines` prefetches; returns how many of them were left unused.
  OPTX_ALWAYS_INLINE int64_t prefetch(int64_t lines) {
    for (; lines > 0 && key < n; --lines) {
      _mm_prefetch(p, _MM_HINT_T2);
      if ((p += 64) >= end && ++key < n) p = static_cast<const char*>(rows[key]), end = p + bytes;
    }
    return lines;
  }
};

// Few rows (GQA decode: one group's 1-8 heads at 1-2 positions, for each of the job's
// KV heads). Each cache row is read once for all rows; keys go 16 at a time through
// every KV head, so the job reads whole rows in address order, and the next 16 keys' K
// rows are prefetched a KV head's share at a time; V is prefetched into L2 a block ahead
// (next_v) and into L1 by P . V itself (pv_prefetch).
//   scores   AMX unit, above kFmaScoreRows rows per KV head and when the 16 K rows sit
//            at one stride (a paged block of >= 16 slots): S^T[16 keys][R] = K . Q^T,
//            the A tile loaded straight from the cache rows, the B tiles Q^T in pairs
//            built once per job; 4 TDPBF16PS per 128 of D, two KV heads at a time.
//            Otherwise widened FMAs (scores_fma, kFma) or, where vdpbf16ps is fast,
//            vdpbf16ps of the q row against the raw K rows into 16 accumulators, then
//            one sum16 (four or eight rows per KV head: scores_quad, one chain per key
//            serving four rows).
//   softmax  per row over a block of 64 keys, exp vectorised over keys;
//   P . V    a column chunk of every row held in registers for the whole block
//            (R x CH / 16 zmm). AMX unit: f32 FMAs of p against the V row widened by a
//            shift and a mask, not vdpbf16ps, which retires half as many multiply-adds
//            per cycle as FMA on its cores (ceilings: 175 vs 336 GFLOP/s). AVX512_BF16
//            unit: vdpbf16ps on key pairs (kPairs below).
// Measured on B = 1, 32 / 8 heads, D = 128, ctx = 8192 with the cache in L2 (compute
// alone), alternating call by call in one process: sum16 scores and FMA P . V against a
// horizontal sum per score and vpmovzx-widened V, 1.22 -> 1.06 ms; AMX scores against
// sum16, 1.44 -> 1.04 ms. From DRAM the gains shrink to 6-15% each: the job is then
// bound by one core's read rate over 32 KiB blocks at random places (see PERF_LOG.md).
// S[r][c0 .. c0 + 15] = scale * q_r . k_i for 16 keys (k: their rows at this KV head's
// slice) by f32 FMAs: each bf16 K row widened by a shift and a mask (even and odd columns
// of a 32-value chunk), qw the q rows widened once per job in that order (row stride D).
// An int8 K row (T = int8_t) widens by vpmovsxbd + vcvtdq2ps in natural column order
// (qw in that order too) and its key's scale (kscale[i]) multiplies the score.
// On cores where vdpbf16ps takes both FMA ports for two cycles (Intel: half the
// multiply-adds of an FMA and nothing issues beside it), 2 FMAs per 32 values per row
// plus 2 widening uops shared by the rows cost 8 + 8 / R port slots where the dot
// product cost 16 (int8: 4 widening uops, 8 + 16 / R). Keys in groups of NK so that
// R x NK accumulators (10-16) cover the FMA's latency without spilling; sum16 then folds
// each row's 16 partial vectors.
template <int R, class T, class Pf>
OPTX_ALWAYS_INLINE void scores_fma(const T* const* k, const float* qw, int64_t D, __m512 scale, const float* kscale,
                                   float (*S)[kKvBlock], int64_t c0, Pf&& pf) {
  static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, int8_t>);
  constexpr int NK = R == 1 ? 16 : R == 2 ? 8 : R <= 4 ? 4 : 2;
  __m512 part[R][16];
  for (int i0 = 0; i0 < 16; i0 += NK) {
    pf(NK);
    __m512 a[R][NK];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < NK; ++i) a[r][i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 32) {
      __m512 ke[NK], ko[NK];
      for (int i = 0; i < NK; ++i) {
        if constexpr (std::is_same_v<T, uint16_t>) {
          simd_type::widen_pairs(_mm512_loadu_si512(k[i0 + i] + d), ke[i], ko[i]);
        } else {
          ke[i] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k[i0 + i] + d))));
          ko[i] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k[i0 + i] + d + 16))));
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512 qe = _mm512_load_ps(qw + r * D + d), qo = _mm512_load_ps(qw + r * D + d + 16);
        for (int i = 0; i < NK; ++i) a[r][i] = _mm512_fmadd_ps(qo, ko[i], _mm512_fmadd_ps(qe, ke[i], a[r][i]));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < NK; ++i) part[r][i0 + i] = a[r][i];
  }
  if constexpr (std::is_same_v<T, int8_t>) scale = _mm512_mul_ps(scale, _mm512_loadu_ps(kscale));
  for (int r = 0; r < R; ++r) _mm512_store_ps(&S[r][c0], _mm512_mul_ps(sum16(part[r]), scale));
}

template <int R, bool kFma>
void run_job_decode(const Config& c, const Job& j, float* scratch) {
  constexpr int64_t kBlock = kKvBlock;
  constexpr int kCh = R <= 4 ? 64 : 32;  // accumulator columns per pass: R * kCh / 16 <= 16 zmm
  const int64_t D = c.D, Dv = c.Dv;
  // j.groups KV heads of R rows each (rows g*R .. g*R+R-1 read slice g of each cache row).
  const int G = j.groups, NR = G * R;
  float* o = scratch;  // [NR][Dv] in O's column order
  std::memset(o, 0, sizeof(float) * size_t(NR * Dv));
  alignas(64) float S[kMaxRows][kBlock];
  float mrow[kMaxRows], lrow[kMaxRows];
  int64_t vlo[kMaxRows], vhi[kMaxRows];  // each row's visible key range
  const uint16_t* q[kMaxRows];
  for (int r = 0; r < NR; ++r) {
    mrow[r] = -INFINITY, lrow[r] = 0.0f;
    q[r] = static_cast<const uint16_t*>(j.rows[r].q);
    const KeyRange v = visible_range(c, j.rows[r].qpos, j.offset);
    vlo[r] = v.lo, vhi[r] = v.hi;
  }
  const auto [lo, hi] = job_keys(c, j, NR);
  // Four or eight rows per KV head on the dot-product kernel (GQA 4 at Sq = 1 or 2, GQA 8
  // at Sq = 1): scores_quad, a quad of rows at a time.
  const int quad_ng = !kFma && R % 4 == 0 && D <= 128 ? int(D / 8) : 0;
  const auto quad = quad_ng == 4 ? scores_quad<4> : quad_ng == 8 ? scores_quad<8> : quad_ng == 12 ? scores_quad<12> : scores_quad<16>;
  alignas(64) __m512i qg[R % 4 == 0 ? kMaxRows / 4 * 16 : 1];
  for (int qq = 0; quad_ng && qq < NR / 4; ++qq) quad_q(q + 4 * qq, quad_ng, qg + qq * 16);
  const void* kp[2 * kBlock];
  const void* vp[2 * kBlock];
  // i8 K / V caches (q8) are read as int8, nothing dequantised into staging: scores
  // straight from the K rows, by TDPBSSD against q in two int8 halves where AMX-INT8
  // runs them (q8_tiles; the ring space holds that path's buffers), else by widened FMAs
  // against q in f32 (scores_fma); P . V on the int8 V rows widened to f32. The keys'
  // scales multiply the scores and fold into p. Where the dot-product kernel runs
  // (!kFma: above kI8WidenRows rows per KV head) the rows are dequantised to bf16 by
  // rows() instead.
  const I8Kv& x8 = j.kv.i8;
  const bool q8 = kFma && x8.k && x8.v;
  const bool dequant_i8 = !kFma && x8.k && x8.v && j.kv.table;
#ifdef OPTX_ATTN_DECODE_AMX
  static const bool amx_int8 = cpu_features().amx_int8;
  const bool q8_tiles = q8 && amx_int8 && D % 64 == 0;
#endif
  alignas(64) float ksc[2 * kBlock] = {}, vsc[2 * kBlock] = {};
  // Lines of one cache row (all KV heads' slices) and one KV head's share of them.
  const int64_t es = q8 ? 1 : 2;
  const int64_t k_lines = ((G - 1) * j.k_goff * es + D * es + 63) / 64;
  const int64_t k_share = (k_lines + G - 1) / G;
  const int64_t v_row_bytes = ((G - 1) * j.v_goff + Dv) * es;
  const __m512 scale = _mm512_set1_ps(c.scale);
  // kFma: the q rows widened for scores_fma ([NR][D] after O; the AMX unit's Q^T, which
  // takes the same room, is built after them and serves only the AMX tiles).
  // An int8 K cache's scores widen K in natural column order, so q is widened so too.
  float* qw = o + NR * Dv;
  for (int r = 0; kFma && r < NR; ++r)
    for (int64_t d = 0; d < D; d += 32) {
      __m512 e, od;
      if (q8) {
        e = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[r] + d))), 16));
        od = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[r] + d + 16))), 16));
      } else {
        simd_type::widen_pairs(_mm512_loadu_si512(q[r] + d), e, od);
      }
      _mm512_store_ps(qw + r * D + d, e);
      _mm512_store_ps(qw + r * D + d + 16, od);
    }
#ifdef OPTX_ATTN_DECODE_AMX
  // Q^T in pairs per KV head: qt[g][D/2][R] dwords, the B tiles of S^T = K . Q^T.
  // A job that scores no head on tiles leaves the tile state alone (no Q^T, no config).
  const bool bf16_tile_job = !q8 && R > kFmaScoreRows;  // bf16 heads go to tiles where K allows
  const bool any_tiles = q8_tiles || bf16_tile_job;
  uint32_t* qt = reinterpret_cast<uint32_t*>(qw + NR * D);
  for (int g = 0; any_tiles && g < G; ++g)
    for (int64_t p = 0; p < D / 2; ++p)
      for (int r = 0; r < R; ++r) std::memcpy(&qt[(g * D / 2 + p) * R + r], q[g * R + r] + 2 * p, 4);
  if (any_tiles) {
    TileConfig cfg{};
    cfg.palette_id = 1;
    cfg.rows[0] = 16, cfg.colsb[0] = uint16_t(4 * R);  // C: S^T[16 keys][R]
    cfg.rows[1] = 16, cfg.colsb[1] = 64;               // A: 16 K rows x 32 of D (bf16) or 64 (int8)
    cfg.rows[2] = 16, cfg.colsb[2] = uint16_t(4 * R);  // B: 16 pairs (quads) of D x R
    cfg.rows[3] = 16, cfg.colsb[3] = uint16_t(4 * R);  // int8: C of q's l half
    cfg.rows[4] = 16, cfg.colsb[4] = uint16_t(4 * R);  // int8: B of q's l half
    cfg.rows[5] = 16, cfg.colsb[5] = 64;               // bf16: a second KV head's A, B and C
    cfg.rows[6] = 16, cfg.colsb[6] = uint16_t(4 * R);
    cfg.rows[7] = 16, cfg.colsb[7] = uint16_t(4 * R);
    _tile_loadconfig(&cfg);
  }
  alignas(64) float st[16 * R], st2[16 * R];
  alignas(64) int32_t sth[16 * R], stl[16 * R];
  // int8: q's halves per KV head as B tiles ([g][D/4][R] dwords), each row's qs, and 16
  // staged K slices for chunks whose rows are not at one stride.
  int32_t* qh = nullptr;
  int32_t* ql = nullptr;
  int8_t* kst8 = nullptr;
  float qs[kMaxRows];
  if (q8_tiles) {
    qh = reinterpret_cast<int32_t*>(x8.stage);
    ql = qh + G * D / 4 * R;
    kst8 = reinterpret_cast<int8_t*>(ql + G * D / 4 * R);
    int8_t* th = kst8 + 16 * D;  // [D] h and l of one row
    int8_t* tl = th + D;
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < R; ++r) {
        qs[g * R + r] = quantize_q_i8x2(q[g * R + r], D, th, tl);
        for (int64_t p = 0; p < D / 4; ++p) {
          std::memcpy(&qh[(g * D / 4 + p) * R + r], th + 4 * p, 4);
          std::memcpy(&ql[(g * D / 4 + p) * R + r], tl + 4 * p, 4);
        }
      }
  }
  const __m512i st_rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(R));
#endif
  auto fetch = [&](int64_t j0, int64_t cnt, int at) {
    if (q8) return j.kv.planes(j0, cnt, kp + at, vp + at, ksc + at, vsc + at, DequantRow{});
    j.kv.rows(j0, cnt, true, kp + at, vp + at, DequantRow{});
  };
  if (lo < hi) fetch(lo, std::min(kBlock, hi - lo), 0);
  for (int64_t kb = lo; kb < hi; kb += kBlock) {
    const int64_t n = std::min(kBlock, hi - kb);
    const int64_t n_next = std::max<int64_t>(0, std::min(kBlock, hi - kb - kBlock));
    if (n_next) fetch(kb + kBlock, n_next, int(kBlock));
    // The next block's V rows (and K rows of an int8 cache) go into L2 in address order,
    // a few lines every kPfEvery keys of this block's P . V. P . V walks a column piece
    // of every V row per pass (rows 1-2 KiB apart), which the L2 streamer does not
    // follow, so its own T0 prefetches 16 keys ahead each waited on DRAM in one of the
    // core's L1 fill buffers; from L2 they are short. DRAM, B = 1 / 8, ctx 8k / 32k,
    // alternating in one process: bf16 +13-15% keys/s, int8 +44-46% (+55-62% with its K
    // rows too; bf16 K rows on top gained nothing cold and cost 17% with the cache in L2,
    // where V alone costs 3-6%: Zen 5, vdpbf16ps). The widened-FMA kernel (kFma, Intel)
    // takes the bf16 K rows too, K first, spread over the scores as well (score_w P . V
    // steps' worth per KV head of a 16-key chunk, a slice per key group): its K loads walk
    // 4 rows at a time, not 16, and left alone waited on DRAM with fewer misses in flight.
    // Xeon VM, B = 1, ctx 8k, two threads: 2.09 -> 1.83-1.93 ms, Sq = 2 5.6 -> 3.4 ms; the
    // share issued per key group instead of per head (bursts of 64 lines stall on the 16
    // L1 fill buffers while the FMAs wait behind them) 1.87-1.89 -> 1.75-1.81 ms.
    // An i8 cache on this kernel is dequantised into the staging ring a block ahead (by
    // fetch, at the block's start), so the stream takes the int8 source rows of the block
    // after next instead of the staged ones, and the dequantisation then reads them from
    // L2 (Zen 4, B = 1, alternating in one process: ctx 8k 7.4-7.9 -> 8.7-8.9 GB/s of i8
    // bytes, 32k 7.7-9.2 -> 8.4-10.2; ctx 2k in L2 / L3 10.7 -> 10.2).
    RowLines next_k, next_v;
    int64_t n_pf = n_next;
    const void* k8[kBlock];
    const void* v8[kBlock];
    if (dequant_i8) {
      n_pf = std::max<int64_t>(0, std::min(kBlock, hi - kb - 2 * kBlock));
      if (n_pf) j.kv.planes(kb + 2 * kBlock, n_pf, k8, v8, nullptr, nullptr, DequantRow{});
      next_k.start(k8, n_pf, (G - 1) * j.k_goff + D);
      next_v.start(v8, n_pf, (G - 1) * j.v_goff + Dv);
    } else {
      next_k.start(kp + kBlock, n_next, kFma ? 64 * k_lines : 0);
      next_v.start(vp + kBlock, n_next, n_next && vp[kBlock] != kp[kBlock] ? v_row_bytes : 0);
    }
    constexpr int64_t score_w = kFma ? 4 : 0;
    const int64_t pf_steps = int64_t(G) * ((Dv + kCh - 1) / kCh) * ((n + kPfEvery - 1) / kPfEvery) + score_w * G * ((n + 15) / 16);
    const int64_t pf_step = (n_pf * (next_k.bytes + next_v.bytes) / 64 + pf_steps - 1) / pf_steps;
    const auto prefetch_next_n = [&](int64_t lines) {
      if constexpr (kFma) next_v.prefetch(next_k.prefetch(lines));
      else next_k.prefetch(next_v.prefetch(lines));
    };
    for (int64_t c0 = 0; c0 < n; c0 += 16) {
      const int nc = int(std::min<int64_t>(16, n - c0));
      const int npf = int(std::min<int64_t>(16, n + n_next - c0 - 16));  // next chunk's keys
#ifdef OPTX_ATTN_DECODE_AMX
      // AMX loads the 16 K rows as one tile when they sit at one stride (a paged block
      // of >= 16 slots holds the whole chunk). bf16 scores go to tiles only above
      // kFmaScoreRows rows per KV head: below, the tile loads (16 K lines and a Q^T tile
      // per 32 of D and head) cost more than scores_fma's widened FMAs, which take the K
      // lines the FMA kernel streams anyway (Emerald Rapids, B = 1, 32 / 8 heads, D = 128,
      // cold, three alternating rounds: ctx 8k 16.4-18.1 -> 19.5-20.2 GB/s, 32k 17.9-19.2
      // -> 20.2-21.3; Sq = 2, 8 rows, stays on tiles: 8.2 against 10.2 ms).
      int64_t kstride;
      const bool uniform = uniform_rows(kp + c0, nc, &kstride) != nullptr;
      const bool bf16_tiles = uniform && bf16_tile_job;
#endif
      // KV head g's share of the next chunk's K lines. The vdpbf16ps kernel (!kFma: Zen 4 /
      // 5) scores straight from those rows and had no prefetch of them that reached the
      // binary: GCC 12 drops this loop written with _mm_prefetch (objdump of every
      // run_job_decode instantiation shows only P . V's T0 loop), so it is an asm
      // statement here. Into L2 (T1), spread by nothing: Zen 4, B = 1, two threads,
      // alternating processes, ctx 8k 13.6-16.2 -> 18.7-19.7 GB/s, 32k 15.3 -> 19.3 (T0:
      // +3-5% only; T1 spread over the score loop: as the burst).
      // The FMA / AMX kernels (Intel) keep the source they were measured with (T0, which
      // never reached their binaries either); they take K into L2 with next_k.
      const auto prefetch_k = [&](int g) {
        const int64_t kl0 = std::min(k_lines, g * k_share), kl1 = std::min(k_lines, kl0 + k_share);
        for (int i = 0; i < npf; ++i) {
          const char* row = static_cast<const char*>(kp[c0 + 16 + i]);
          if constexpr (kFma)
            for (int64_t l = kl0; l < kl1; ++l) _mm_prefetch(row + 64 * l, _MM_HINT_T0);
          else
            for (int64_t l = kl0; l < kl1; ++l) asm volatile("prefetcht1 %0" ::"m"(row[64 * l]));
        }
      };
      for (int g = 0; g < G; ++g) {
        prefetch_k(g);
#ifdef OPTX_ATTN_DECODE_AMX
        // Heads scored on tiles take their share of the next block's lines at once;
        // scores_fma spreads it over its key groups.
        if (bf16_tiles || q8_tiles) prefetch_next_n(score_w * pf_step);
        // Two KV heads at once, each in its own A, B and C tiles (tmm1-2-0 and 5-6-7): a
        // head's scores are one chain of D / 32 dependent tdpbf16ps, and two chains
        // overlap.
        if (bf16_tiles && g + 1 < G) {
          prefetch_k(g + 1);
          prefetch_next_n(score_w * pf_step);
          const char* k0 = static_cast<const char*>(kp[c0]) + 2 * g * j.k_goff;
          const char* k1 = k0 + 2 * j.k_goff;
          const uint32_t* q0 = qt + g * D / 2 * R;
          const uint32_t* q1 = q0 + D / 2 * R;
          _tile_zero(0);
          _tile_zero(7);
          for (int64_t d = 0; d < D; d += 32) {
            _tile_loadd(1, k0 + 2 * d, kstride);
            _tile_loadd(2, q0 + d / 2 * R, 4 * R);
            _tile_dpbf16ps(0, 1, 2);
            _tile_loadd(5, k1 + 2 * d, kstride);
            _tile_loadd(6, q1 + d / 2 * R, 4 * R);
            _tile_dpbf16ps(7, 5, 6);
          }
          _tile_stored(0, st, 4 * R);
          _tile_stored(7, st2, 4 * R);
          for (int r = 0; r < R; ++r) {  // column r of S^T is row r of S
            const __m512i idx = _mm512_add_epi32(st_rows, _mm512_set1_epi32(r));
            _mm512_store_ps(&S[g * R + r][c0], _mm512_mul_ps(_mm512_i32gather_ps(idx, st, 4), scale));
            _mm512_store_ps(&S[(g + 1) * R + r][c0], _mm512_mul_ps(_mm512_i32gather_ps(idx, st2, 4), scale));
          }
          ++g;
          continue;
        }
#endif
#ifdef OPTX_ATTN_DECODE_AMX
        if (q8_tiles) {
          int64_t ks8;
          const int8_t* kbase = tile_rows(kp + c0, nc, size_t(g * j.k_goff), size_t(D), kst8, &ks8);
          _tile_zero(0);
          _tile_zero(3);
          for (int64_t d = 0; d < D; d += 64) {
            _tile_loadd(1, kbase + d, ks8);
            _tile_loadd(2, qh + (g * D + d) / 4 * R, 4 * R);
            _tile_loadd(4, ql + (g * D + d) / 4 * R, 4 * R);
            _tile_dpbssd(0, 1, 2);
            _tile_dpbssd(3, 1, 4);
          }
          _tile_stored(0, sth, 4 * R);
          _tile_stored(3, stl, 4 * R);
          const __m512 ksv = _mm512_mul_ps(_mm512_loadu_ps(ksc + c0), scale), k1_254 = _mm512_set1_ps(1.0f / 254.0f);
          for (int r = 0; r < R; ++r) {  // column r of S^T is row r of S: scale_k * qs_r * (h + l / 254)
            const __m512i idx = _mm512_add_epi32(st_rows, _mm512_set1_epi32(r));
            const __m512 h = _mm512_cvtepi32_ps(_mm512_castps_si512(_mm512_i32gather_ps(idx, sth, 4)));
            const __m512 l = _mm512_cvtepi32_ps(_mm512_castps_si512(_mm512_i32gather_ps(idx, stl, 4)));
            _mm512_store_ps(&S[g * R + r][c0], _mm512_mul_ps(_mm512_fmadd_ps(l, k1_254, h), _mm512_mul_ps(ksv, _mm512_set1_ps(qs[g * R + r]))));
          }
          continue;
        }
        if (bf16_tiles) {
          const char* kbase = static_cast<const char*>(kp[c0]) + 2 * g * j.k_goff;
          _tile_zero(0);
          for (int64_t d = 0; d < D; d += 32) {
            _tile_loadd(1, kbase + 2 * d, kstride);
            _tile_loadd(2, qt + (g * D + d) / 2 * R, 4 * R);
            _tile_dpbf16ps(0, 1, 2);
          }
          _tile_stored(0, st, 4 * R);
          for (int r = 0; r < R; ++r)  // column r of S^T is row r of S
            _mm512_store_ps(&S[g * R + r][c0], _mm512_mul_ps(_mm512_i32gather_ps(_mm512_add_epi32(st_rows, _mm512_set1_epi32(r)), st, 4), scale));
          continue;
        }
#endif
        const auto pf = [&](int nk) { prefetch_next_n((score_w * pf_step * nk + 15) / 16); };
        if (q8) {
          const int8_t* k8[16];
          for (int i = 0; i < 16; ++i) k8[i] = static_cast<const int8_t*>(kp[c0 + std::min(i, nc - 1)]) + g * j.k_goff;
          scores_fma<R>(k8, qw + g * R * D, D, scale, ksc + c0, S + g * R, c0, pf);
          continue;
        }
        const uint16_t* k[16];
        for (int i = 0; i < 16; ++i) k[i] = static_cast<const uint16_t*>(kp[c0 + std::min(i, nc - 1)]) + g * j.k_goff;
        if constexpr (kFma) {
          scores_fma<R>(k, qw + g * R * D, D, scale, nullptr, S + g * R, c0, pf);
          continue;
        }
        if (quad_ng) {
          for (int qq = g * R / 4; qq < (g + 1) * R / 4; ++qq) quad(k, qg + qq * 16, scale, S + 4 * qq, c0);
          continue;
        }
        for (int r = 0; r < R; ++r) {
          const uint16_t* qr = q[g * R + r];
          __m512 a[16];
          for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
          for (int64_t d = 0; d < D; d += 32) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512(qr + d);
            for (int i = 0; i < 16; ++i) a[i] = _mm512_dpbf16_ps(a[i], qv, (__m512bh)_mm512_loadu_si512(k[i] + d));
          }
          _mm512_store_ps(&S[g * R + r][c0], _mm512_mul_ps(sum16(a), scale));
        }
      }
    }
    // Where vdpbf16ps is fast (!kFma: AMD Zen 4 / 5), P . V by vdpbf16ps on key pairs (P
    // rounded to bf16, as the flash kernels' P, and written so by the softmax): half the
    // multiply instructions of widened FMAs and no widening. Zen 5, B = 1 / 8, 32 / 8
    // heads, alternating with the FMA build: ctx 8k from DRAM +2 to +10% / +14-15%, ctx 2k
    // in L3 ±0 to +29%. Intel's cores issue vdpbf16ps at half the FMA's rate: widen V.
    constexpr bool kPairs = !kFma;
    alignas(64) uint16_t Pb[kPairs ? kMaxRows : 1][kBlock];  // dword i: (p[2i], p[2i + 1]), 0 past n
    bool any = false;
    for (int r = 0; r < NR; ++r) {
      float* s = S[r];
      if (kb < vlo[r] || kb + n > vhi[r])
        for (int64_t jj = 0; jj < n; ++jj)
          if (kb + jj < vlo[r] || kb + jj >= vhi[r]) s[jj] = -INFINITY;
      __m512 bm = _mm512_set1_ps(-INFINITY);
      for (int64_t jj = 0; jj < n; jj += 16)
        bm = _mm512_max_ps(bm, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), __mmask16(n - jj >= 16 ? 0xffff : (1u << (n - jj)) - 1), s + jj));
      numerics::SoftmaxState st{mrow[r], lrow[r]};
      const float f = st.rescale_to(_mm512_reduce_max_ps(bm));
      if (st.empty()) {  // nothing visible yet: no probabilities this block
        if constexpr (kPairs) std::memset(Pb[r], 0, sizeof(Pb[r]));
        else std::memset(s, 0, sizeof(float) * size_t(n));
        continue;
      }
      any = true;
      if (f != 1.0f) {
        st.l *= f;
        const __m512 fv = _mm512_set1_ps(f);
        for (int64_t d = 0; d < Dv; d += 16) _mm512_storeu_ps(o + r * Dv + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), fv));
      }
      const __m512 m = _mm512_set1_ps(st.m);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t jj = 0; jj < n; jj += 16) {
        const __mmask16 live = __mmask16(n - jj >= 16 ? 0xffff : (1u << (n - jj)) - 1);
        const __m512 p = _mm512_maskz_mov_ps(live, simd_type::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + jj), m)));
        if constexpr (kPairs) _mm256_store_si256(reinterpret_cast<__m256i*>(Pb[r] + jj), (__m256i)_mm512_cvtneps_pbh(p));
        else _mm512_mask_storeu_ps(s + jj, live, p);
        sum = _mm512_add_ps(sum, p);
      }
      st.l += _mm512_reduce_add_ps(sum);
      mrow[r] = st.m, lrow[r] = st.l;
      if (q8)  // V enters as its int8 values: p carries the key's scale
        for (int64_t jj = 0; jj < n; jj += 16) _mm512_store_ps(s + jj, _mm512_mul_ps(_mm512_load_ps(s + jj), _mm512_loadu_ps(vsc + jj)));
    }
    // P . V reads a kCh-column piece of each key's V row per pass (KV head g, columns d0
    // on) and prefetches the piece kPvAhead keys on into L1, running into the next pass
    // (the rows came into L2 during the previous block: next_v). The V lines used to be
    // prefetched with the scores, a block (64 keys x 2 KiB at 8 KV heads) before use:
    // DRAM, B = 1 / 8, ctx 8k / 32k, alternating in one process, 1.19-1.27x the keys/s
    // with this and the two-head scores (the scores alone: ~5%).
    constexpr int64_t kPvAhead = 16;
    const bool v_apart = n > 0 && vp[0] != kp[0];  // else V came with the K rows
    const int64_t passes = (Dv + kCh - 1) / kCh;
    struct Piece {
      int64_t off = 0, bytes = 0;  // within a V row; bytes 0: no such pass
    };
    const auto piece = [&](int64_t pass) {
      if (pass >= G * passes) return Piece{};
      const int64_t d0 = pass % passes * kCh;
      return Piece{es * (pass / passes * j.v_goff + d0), es * std::min<int64_t>(kCh, Dv - d0)};
    };
    const auto prefetch_piece = [&](const Piece& pc, int64_t jj) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(vp[jj]) + uintptr_t(pc.off), e = p + uintptr_t(pc.bytes);
      for (uintptr_t l = p & ~uintptr_t(63); l < e; l += 64) _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
    };
    // Key jj + kPvAhead of this pass, or of the next one past the block's n keys.
    const auto pv_prefetch = [&](const Piece& cur, const Piece& next, int64_t jj) {
      if (jj + kPvAhead < n) prefetch_piece(cur, jj + kPvAhead);
      else if (jj + kPvAhead - n < n) prefetch_piece(next, jj + kPvAhead - n);
    };
    const auto prefetch_next = [&] { prefetch_next_n(pf_step); };
    if (v_apart && any) {
      const Piece first = piece(0);
      for (int64_t jj = 0; jj < std::min(kPvAhead, n); ++jj) prefetch_piece(first, jj);
    }
    for (int g = 0; q8 && any && g < G; ++g) {  // int8 V: natural column order
      float* og = o + g * R * Dv;
      const float(*Sg)[kBlock] = S + g * R;
      for (int64_t d0 = 0; d0 < Dv; d0 += kCh) full_or_not(Dv - d0 >= kCh, [&](auto full) __attribute__((always_inline)) {
        constexpr int kV = kCh / 16;
        const int nv = full ? kV : int(std::min<int64_t>(kCh, Dv - d0) / 16);
        const Piece cur = piece(g * passes + d0 / kCh), next = piece(g * passes + d0 / kCh + 1);
        __m512 acc[R][kV];
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < kV; ++v) acc[r][v] = v < nv ? _mm512_loadu_ps(og + r * Dv + d0 + 16 * v) : _mm512_setzero_ps();
        for (int64_t jj = 0; jj < n; ++jj) {
          if (v_apart) pv_prefetch(cur, next, jj);
          if (jj % kPfEvery == 0) prefetch_next();
          const int8_t* vr = static_cast<const int8_t*>(vp[jj]) + g * j.v_goff + d0;
          __m512 vv[kV];
          for (int v = 0; v < kV; ++v)
            vv[v] = v < nv ? _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 16 * v)))) : _mm512_setzero_ps();
          for (int r = 0; r < R; ++r) {
            const __m512 pr = _mm512_set1_ps(Sg[r][jj]);
            for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
          }
        }
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < nv; ++v) _mm512_storeu_ps(og + r * Dv + d0 + 16 * v, acc[r][v]);
      });
    }
    for (int g = 0; !q8 && any && g < G; ++g) {
      float* og = o + g * R * Dv;
      const float(*Sg)[kBlock] = S + g * R;
      for (int64_t d0 = 0; d0 < Dv; d0 += kCh) full_or_not(Dv - d0 >= kCh, [&](auto full) __attribute__((always_inline)) {
        constexpr int kV = kCh / 16;
        const int nv = full ? kV : int(std::min<int64_t>(kCh, Dv - d0) / 16);  // Dv % 32 == 0: 2 or kV
        const Piece cur = piece(g * passes + d0 / kCh), next = piece(g * passes + d0 / kCh + 1);
        __m512 acc[R][kV];
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < kV; v += 2) {
            if (v >= nv) acc[r][v] = acc[r][v + 1] = _mm512_setzero_ps();
            else permute_pv_cols<kPairs, true>(_mm512_loadu_ps(og + r * Dv + d0 + 16 * v), _mm512_loadu_ps(og + r * Dv + d0 + 16 * v + 16), acc[r][v], acc[r][v + 1]);
          }
        for (int64_t jj = 0; kPairs && jj < n; jj += 2) {
          if (v_apart) pv_prefetch(cur, next, jj);
          if (v_apart && jj + 1 < n) pv_prefetch(cur, next, jj + 1);
          if (jj % kPfEvery == 0) prefetch_next();
          const uint16_t* v0 = static_cast<const uint16_t*>(vp[jj]) + g * j.v_goff + d0;
          const uint16_t* v1 = jj + 1 < n ? static_cast<const uint16_t*>(vp[jj + 1]) + g * j.v_goff + d0 : nullptr;
          __m512bh vv[kV];
          for (int v = 0; v < kV; v += 2) {
            const __m512i w0 = v < nv ? _mm512_loadu_si512(v0 + 16 * v) : _mm512_setzero_si512();
            const __m512i w1 = v < nv && v1 ? _mm512_loadu_si512(v1 + 16 * v) : _mm512_setzero_si512();
            vv[v] = (__m512bh)_mm512_unpacklo_epi16(w0, w1);
            vv[v + 1] = (__m512bh)_mm512_unpackhi_epi16(w0, w1);
          }
          for (int r = 0; r < R; ++r) {
            const __m512bh pp = pair_bcast(Pb[g * R + r], jj / 2);
            for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], vv[v], pp);
          }
        }
        for (int64_t jj = 0; !kPairs && jj < n; ++jj) {
          if (v_apart) pv_prefetch(cur, next, jj);
          if (jj % kPfEvery == 0) prefetch_next();
          const uint16_t* vr = static_cast<const uint16_t*>(vp[jj]) + g * j.v_goff + d0;
          __m512 vv[kV];
          for (int v = 0; v < kV; v += 2) {
            simd_type::widen_pairs(v < nv ? _mm512_loadu_si512(vr + 16 * v) : _mm512_setzero_si512(), vv[v], vv[v + 1]);
          }
          for (int r = 0; r < R; ++r) {
            const __m512 pr = _mm512_set1_ps(Sg[r][jj]);
            for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
          }
        }
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < nv; v += 2) {
            __m512 n0, n1;
            permute_pv_cols<kPairs, false>(acc[r][v], acc[r][v + 1], n0, n1);
            _mm512_storeu_ps(og + r * Dv + d0 + 16 * v, n0);
            _mm512_storeu_ps(og + r * Dv + d0 + 16 * v + 16, n1);
          }
      });
    }
    prefetch_next_n(INT64_MAX);  // blocks with nothing visible ran no P . V
    std::copy(kp + kBlock, kp + kBlock + n_next, kp);
    std::copy(vp + kBlock, vp + kBlock + n_next, vp);
    if (q8) std::copy(ksc + kBlock, ksc + kBlock + n_next, ksc), std::copy(vsc + kBlock, vsc + kBlock + n_next, vsc);
  }
#ifdef OPTX_ATTN_DECODE_AMX
  if (any_tiles) _tile_release();
#endif
  finish_rows(c, j, mrow, lrow, o);
}

// The widened-FMA kernel runs with denormals as zero (numerics/denormals.h): an FMA with
// a denormal input takes a microcode assist on Intel, and vdpbf16ps treats them as zero.
template <bool kFma>
void run_decode_t(const Config& c, const Job& j, float* scratch) {
  const numerics::DenormalsAsZero daz(kFma);
  switch (j.nrows / j.groups) {
    case 1: return run_job_decode<1, kFma>(c, j, scratch);
    case 2: return run_job_decode<2, kFma>(c, j, scratch);
    case 3: return run_job_decode<3, kFma>(c, j, scratch);
    case 4: return run_job_decode<4, kFma>(c, j, scratch);
    case 5: return run_job_decode<5, kFma>(c, j, scratch);
    case 6: return run_job_decode<6, kFma>(c, j, scratch);
    case 7: return run_job_decode<7, kFma>(c, j, scratch);
    default: return run_job_decode<8, kFma>(c, j, scratch);
  }
}

// Widened FMAs wherever vdpbf16ps is not fast (the AMX unit is Intel's); the dot product
// where it retires at the FMA's rate, except for an i8 cache at up to kI8WidenRows rows per
// KV head: the widened kernel reads its int8 rows as they are, where the dot-product one
// first dequantises each block to bf16 in staging (a store and a second read of every
// value, at twice the bytes). Zen 4, 8 KV heads, D = 128, 16-slot blocks, alternating in
// one process, GB/s of i8 bytes: 32 q heads ctx 8k 8.5 -> 11.9, 32k 9.3 -> 13.8, ctx 2k in
// L3 11.3 -> 17.4; 8 / 16 / 24 q heads +30-36%. At 6 and 8 rows (48 / 64 q heads, or
// Sq = 2) the dot products' halved multiply count wins: 9.1 / 5.6 / 7.2 against 8.1 /
// 4.8 / 6.4.
constexpr int kI8WidenRows = 4;
void run_decode(const Config& c, const Job& j, float* scratch) {
#ifdef OPTX_ATTN_DECODE_AMX
  return run_decode_t<true>(c, j, scratch);
#else
  static const bool fma = !cpu_features().fast_bf16_dot;
  const bool i8_widened = j.kv.i8.k && j.kv.i8.v && j.nrows / j.groups <= kI8WidenRows;
  return fma || i8_widened ? run_decode_t<true>(c, j, scratch) : run_decode_t<false>(c, j, scratch);
#endif
}

// The bf16 few-row fast path where it applies, flash prefill on the `avx512` unit's GEMM
// prefill (gemm_prefill_job), else the unit's vector kernel.
void run_job_bf16(const Config& c, const Job& j, float* scratch) {
  if (supported(c, j) && j.nrows / j.groups <= kDecodeRows) return run_decode(c, j, scratch);
  if (gemm_prefill_job(c, j)) return kernels_avx512().run_job(c, j, scratch);
  run_job(c, j, scratch);
}

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
