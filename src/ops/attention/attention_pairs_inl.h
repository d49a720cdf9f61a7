// Pieces of the bf16 pair-product job kernels (AMX tiles and AVX512_BF16 vdpbf16ps;
// included after attention_decode_inl.h, in the unit's OPTX_ISA_NS). Both take the job in
// superblocks of 128 keys and compute
//   S^T[key][row] = K . Q^T   Q^T in pairs [D/2][32 rows][2], built once per job, so K is
//                             read straight from its cache rows, never transposed;
//   online softmax            vertical: each key's scores are a vector over rows, so the
//                             running max, exp and sums need no horizontal reductions;
//   O[row][dv] += P . V       P rows by transposing P^T 16 x 32 at a time, V as key pairs
//                             by in-lane unpacks; O in f32 memory in "pair order" (the
//                             unpacks' column order), put right once per job.
// Both instructions read bf16 pairs, (x[2i], x[2i+1]) per dword, so the layouts are shared.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including attention_pairs_inl.h"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace optx::attn_detail::OPTX_ISA_NS {
namespace {

constexpr int kSub = 32;          // keys per score step: two 16-key A tiles of S^T, one P tile
constexpr int kSuper = 4 * kSub;  // keys per softmax step and per O load / store
static_assert(kSuper <= kMaxRowsPerCall);
alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};  // K / V of keys past the end

// Key pairs of 32 columns of rows a and b (b null: zeros), by in-lane 16-bit unpacks (one
// uop each, where a cross-lane vpermt2w is three): lo gets columns {0-3, 8-11, 16-19,
// 24-27} and hi the others, so O's columns sit in that order (from_pair_order undoes it
// once per job).
OPTX_ALWAYS_INLINE void stage_pairs(const uint16_t* a, const uint16_t* b, uint16_t* lo, uint16_t* hi) {
  const __m512i va = _mm512_loadu_si512(a), vb = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
  _mm512_store_si512(lo, _mm512_unpacklo_epi16(va, vb));
  _mm512_store_si512(hi, _mm512_unpackhi_epi16(va, vb));
}

// 16 query rows x 32 keys of P from P^T (pt: [key][32 rows] bf16, from row 0 of the
// half) into pr ([row][kSuper keys] bf16). Keys go in pairs: dword i of a row is
// (p[2i], p[2i+1]). (The element-wise loop this replaced was ~17% of flash prefill's
// samples.)
OPTX_ALWAYS_INLINE void transpose_p16(const uint16_t* pt, uint16_t* pr) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) {  // r[i][row] = (p[row][2i], p[row][2i+1])
    const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(pt + (2 * i) * 32));
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(pt + (2 * i + 1) * 32));
    r[i] = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  simd::Avx512::transpose16(r);
  for (int row = 0; row < 16; ++row) _mm512_store_si512(pr + row * kSuper, r[row]);
}

// Q^T in pairs ([D/2][32 rows][2] bf16, rows past R zero). Sixteen dword pairs of sixteen
// rows per transpose (an element loop took ~10 us per job, a quarter of a short-context
// MLA decode call).
// The job's rows first .. first + 31. D a multiple of 16: a last run of 8 pairs is loaded
// masked (no read past the row) and only its pairs stored.
void build_qt(const Job& j, int64_t D, uint16_t* qt, int first = 0) {
  for (int half = 0; half < 2; ++half)
    for (int64_t p0 = 0; p0 < D / 2; p0 += 16) {
      const int np = int(std::min<int64_t>(16, D / 2 - p0));
      const __mmask16 in = __mmask16((1u << np) - 1u);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int row = first + 16 * half + i;
        r[i] = row < j.nrows ? _mm512_maskz_loadu_epi32(in, static_cast<const uint16_t*>(j.rows[row].q) + 2 * p0) : _mm512_setzero_si512();
      }
      simd::Avx512::transpose16(r);
      for (int c = 0; c < np; ++c) _mm512_store_si512(qt + ((p0 + c) * 32 + 16 * half) * 2, r[c]);
    }
}

// q's latent part for int8 scores against an i8 cache (quantize_q_i8x2 per row), h and l
// in the B-tile layout of TDPBSSD ([L/4][32 rows][4]), rows past R zero, each byte xor
// `bias`: 0 for TDPBSSD's s8 x s8, 0x80 (h + 128, l + 128) for vpdpbusd's u8 operand.
// tmp: [2][32][L] bytes.
void build_q8(const Job& j, int64_t L, int8_t* q8h, int8_t* q8l, float* qs, int8_t* tmp, uint8_t bias) {
  for (int r = 0; r < 32; ++r) {
    int8_t* h = tmp + r * L;
    int8_t* l = tmp + (32 + r) * L;
    if (r >= j.nrows) {
      std::memset(h, 0, size_t(L)), std::memset(l, 0, size_t(L));
      qs[r] = 0.0f;
      continue;
    }
    qs[r] = quantize_q_i8x2(static_cast<const uint16_t*>(j.rows[r].q), L, h, l);
  }
  for (int part = 0; part < 2; ++part)
    for (int half = 0; half < 2; ++half)
      for (int64_t p0 = 0; p0 < L / 4; p0 += 16) {
        __m512i r[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(tmp + (part * 32 + 16 * half + i) * L + 4 * p0);
        simd::Avx512::transpose16(r);
        int8_t* out = part ? q8l : q8h;
        const __m512i b = _mm512_set1_epi8(char(bias));
        for (int c = 0; c < 16; ++c) _mm512_store_si512(out + ((p0 + c) * 32 + 16 * half) * 4, _mm512_xor_si512(r[c], b));
      }
}

// The same from i8 rows, exactly in bf16 (every int8 is a bf16; the token scales go into
// P).
OPTX_ALWAYS_INLINE void stage_pairs(const int8_t* a, const int8_t* b, uint16_t* lo, uint16_t* hi) {
  auto bf = [](const int8_t* x) {
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
    const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16))));
    return (__m512i)_mm512_cvtne2ps_pbh(f1, f0);
  };
  const __m512i va = bf(a), vb = b ? bf(b) : _mm512_setzero_si512();
  _mm512_store_si512(lo, _mm512_unpacklo_epi16(va, vb));
  _mm512_store_si512(hi, _mm512_unpackhi_epi16(va, vb));
}

// Dv a multiple of 16: a last 16 columns (staged by the two 128-bit lanes' unpacks) sit as
// {0-3, 8-11, 4-7, 12-15}.
void from_pair_order(float* o, int rows, int64_t Dv) {
  const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512i i16 = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  for (int r = 0; r < rows; ++r) {
    int64_t d = 0;
    for (; d + 32 <= Dv; d += 32) {
      float* p = o + r * Dv + d;
      const __m512 lo = _mm512_loadu_ps(p), hi = _mm512_loadu_ps(p + 16);
      _mm512_storeu_ps(p, _mm512_permutex2var_ps(lo, i0, hi));
      _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(lo, i1, hi));
    }
    if (d < Dv) _mm512_storeu_ps(o + r * Dv + d, _mm512_permutexvar_ps(i16, _mm512_loadu_ps(o + r * Dv + d)));
  }
}

// The next superblock's rows prefetched into L2 a slice per step of the current one's
// work: issued in one burst, the prefetches wait on the fill buffers and hold up the work
// behind them, so memory and compute would take turns instead of overlapping. Into L2: a
// superblock (144 KiB for MLA) is more than L1 holds (T1 over T0, MLA ctx 8k / 32k, eight
// alternating rounds on the AMX unit: median 11.1-13.9 -> 11.9-15.9 GB/s). Each key's
// a_lines lines of pa[key], then b_lines of pb[key]; n keys over `steps` calls of step().
class SpreadPrefetch {
 public:
  SpreadPrefetch(const void* const* pa, const void* const* pb, int64_t a_lines, int64_t b_lines, int64_t n, int64_t steps)
      : pa_(pa), pb_(pb), a_lines_(a_lines), row_lines_(a_lines + b_lines), n_(n),
        per_step_(steps > 0 ? (n * row_lines_ + steps - 1) / steps : 0) {}
  // A run of consecutive lines of one row per inner loop (pointer steps only): the
  // per-line form, which recomputed each line's row and part, cost 4-11% of hot time.
  OPTX_ALWAYS_INLINE void step() {
    for (int64_t left = per_step_; left > 0 && key_ < n_;) {
      const bool in_a = line_ < a_lines_;
      const char* p = in_a ? static_cast<const char*>(pa_[key_]) + 64 * line_
                           : static_cast<const char*>(pb_[key_]) + 64 * (line_ - a_lines_);
      const int64_t cnt = std::min(left, (in_a ? a_lines_ : row_lines_) - line_);
      for (const char* e = p + 64 * cnt; p != e; p += 64) _mm_prefetch(p, _MM_HINT_T1);
      left -= cnt;
      if ((line_ += cnt) == row_lines_) line_ = 0, ++key_;
    }
  }

 private:
  const void* const* pa_;
  const void* const* pb_;
  int64_t a_lines_, row_lines_, n_, per_step_;
  int64_t key_ = 0, line_ = 0;
};

// Per-row running state of a job as vectors over its 32 row slots, and the keys
// [lo, hi) the job visits (cut to its rows' causal / window reach). Positions stay int64:
// as floats, those past 2^24 round (key 2^24 + 1 to 2^24), so masks and [lo, hi) moved.
struct PairRows {
  int64_t diag[32];  // each row's diagonal key position (rows < R)
  int R = 0;
  alignas(64) float mrow[32], lrow[32];
  alignas(64) float corr[32];  // the last superblock's rescale of each row's O
  int64_t lo = 0, hi = 0;
  // The rows' mask / bias over keys (null past R), column strides as the tensors' (one
  // tensor each, so the same for every row).
  const int8_t* mask[32] = {};
  const float* bias[32] = {};
  int64_t mask_cs = 0, bias_cs = 0;
  bool has_mask = false, has_bias = false;
  PairRows() = default;
  // The job's rows first .. first + 31.
  PairRows(const Config& c, const Job& j, int first = 0) : R(std::clamp(j.nrows - first, 0, 32)) {
    for (int r = 0; r < 32; ++r) {
      diag[r] = r < R ? j.rows[first + r].qpos + j.offset : 0;
      mrow[r] = -INFINITY;
      lrow[r] = 0.0f;
    }
    for (int r = 0; r < R; ++r) {
      const Row& row = j.rows[first + r];
      if (row.mask) mask[r] = row.mask, mask_cs = row.mask_cs, has_mask = true;
      if (row.bias) bias[r] = row.bias, bias_cs = row.bias_cs, has_bias = true;
    }
    lo = j.kv_begin, hi = j.kv_end;
    if (R > 0) {
      const int64_t dmin = *std::min_element(diag, diag + R), dmax = *std::max_element(diag, diag + R);
      if (c.causal) hi = std::min<int64_t>(hi, dmax + 1);
      if (c.window_right >= 0) hi = std::min<int64_t>(hi, dmax + c.window_right + 1);
      if (c.window_left >= 0) lo = std::max<int64_t>(lo, dmin - c.window_left);
    }
  }
};

// Keys key0 .. key0 + cnt (cnt <= 16) of 16 rows' mask or bias as 16 vectors over the rows
// (r[key][row], int8 widened to int32, f32 as its bits), rows without one 0. A unit column
// stride loads each row's keys (no read past key0 + cnt) and transposes; any other stride
// (0 for a mask broadcast over keys) gathers element by element.
template <class T>
void key_vectors(const T* const* rows, int64_t cs, int64_t key0, int cnt, __m512i (&r)[16]) {
  if (cs == 1) {
    const __mmask16 m = __mmask16((1u << cnt) - 1u);
    for (int i = 0; i < 16; ++i) {
      if (!rows[i]) r[i] = _mm512_setzero_si512();
      else if constexpr (sizeof(T) == 4) r[i] = _mm512_maskz_loadu_epi32(m, rows[i] + key0);
      else r[i] = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, rows[i] + key0));
    }
    simd::Avx512::transpose16(r);
    return;
  }
  alignas(64) int32_t t[16][16] = {};  // [key][row]
  for (int i = 0; i < 16; ++i)
    if (rows[i])
      for (int k = 0; k < cnt; ++k) {
        const T x = rows[i][(key0 + k) * cs];
        if constexpr (sizeof(T) == 4) std::memcpy(&t[k][i], &x, 4);
        else t[k][i] = x;
      }
  for (int k = 0; k < 16; ++k) r[k] = _mm512_load_si512(t[k]);
}

// Int8 scores of a superblock (an i8 MLA latent, or GQA's i8 K): the h and l parts
// [2][kSuper keys][32 rows], q's scales per row, the keys' K scales, and the scales
// folded into P's columns (V's: sk again for a latent, which is V too). st_part: the
// float scores st hold a part of each score (the rope's), else st is not read.
struct Int8Scores {
  const int32_t* sti = nullptr;
  const float* qs = nullptr;
  const float* sk = nullptr;
  const float* sv = nullptr;
  bool st_part = true;
};

// The vertical online softmax of one superblock of n keys from kb (n <= kSuper), rows
// 16 at a time: scores st [key][32 rows] are masked in place where a mask applies, P^T
// written to pt [key][32 rows] bf16 (zero for keys n .. nk), the rows' m, l and corr
// updated.
// The scale is applied inside the exponent, exp(s scale - m) = 2^(s c - m log2 e) with
// c = scale log2 e, one FMA, rather than to every score in the max pass: that pass is
// then a bare max over four chains (one max chain was bound by its latency, 4 cycles per
// key), and scores are stored back only where a mask changed them.
void softmax_superblock(const Config& c, int64_t kb, int64_t n, int64_t nk, int RT, PairRows& rs, float* st, uint16_t* pt,
                        const Int8Scores& q8 = {}) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), lo_arg = _mm512_set1_ps(-125.0f);
  for (int half = 0; half < RT / 16; ++half) {
    // Rows 16 * half .. that exist; their position bounds relative to kb as floats: exact
    // within 2^24 of kb, and beyond it rounding (monotonic) keeps their order against the
    // key indices 0 .. n - 1.
    const int nreal = std::clamp(rs.R - 16 * half, 0, 16);
    const __mmask16 real = __mmask16((1u << nreal) - 1);  // not padded rows
    alignas(64) float dgr[16] = {}, wlr[16] = {}, wrr[16] = {};
    int64_t dlo = INT64_MAX, dhi = INT64_MIN;
    for (int i = 0; i < nreal; ++i) {
      const int64_t d = rs.diag[16 * half + i];
      dgr[i] = float(d - kb);
      if (c.window_left >= 0) wlr[i] = float(d - c.window_left - kb);
      if (c.window_right >= 0) wrr[i] = float(d + c.window_right - kb);
      dlo = std::min(dlo, d), dhi = std::max(dhi, d);
    }
    const __m512 dg = _mm512_load_ps(dgr), wl = _mm512_load_ps(wlr), wr = _mm512_load_ps(wrr);
    // Position masks only where the superblock crosses a row's causal / window edge
    // (in causal prefill, only the blocks on the diagonal).
    const int64_t first = kb, last = kb + n - 1;
    const bool edge = nreal > 0 && ((c.causal && last > dlo) || (c.window_left >= 0 && first < dhi - c.window_left) ||
                                    (c.window_right >= 0 && last > dlo + c.window_right));
    // st holds u with the scaled score u * u_scale, u_scale > 0 (so max commutes with it):
    // the raw score, or for a negative scale, a softcap or a bias the final logit.
    const bool cap = c.softcap > 0.0f;
    const bool logit = c.scale < 0.0f || cap || rs.has_bias;
    const float u_scale = logit ? 1.0f : c.scale;
    // The rows' bias and mask over this superblock's keys as [key][16 rows], transposed
    // 16 keys at a time (one row's keys are contiguous, each key here a vector over rows).
    alignas(64) float bias_t[kSuper * 16];
    __mmask16 mask_t[kSuper];
    if (rs.has_bias || rs.has_mask)
      for (int64_t k0 = 0; k0 < n; k0 += 16) {
        const int cnt = int(std::min<int64_t>(16, n - k0));
        __m512i r[16];
        if (rs.has_bias) {
          key_vectors(rs.bias + 16 * half, rs.bias_cs, kb + k0, cnt, r);
          for (int i = 0; i < 16; ++i) _mm512_store_si512(bias_t + (k0 + i) * 16, r[i]);
        }
        if (rs.has_mask) {
          key_vectors(rs.mask + 16 * half, rs.mask_cs, kb + k0, cnt, r);
          for (int i = 0; i < cnt; ++i) mask_t[k0 + i] = _mm512_test_epi32_mask(r[i], r[i]);
        }
      }
    __m512 bm0 = neg_inf, bm1 = neg_inf, bm2 = neg_inf, bm3 = neg_inf;  // named, not an array: a
    // runtime-indexed array of vectors lives on the stack
    if (edge || q8.sti || nreal < 16 || logit || rs.has_mask) {
      const __m512 qsv = q8.sti ? _mm512_load_ps(q8.qs + 16 * half) : _mm512_setzero_ps(), k1_254 = _mm512_set1_ps(1.0f / 254.0f);
      const __m512 scale = _mm512_set1_ps(c.scale), capv = _mm512_set1_ps(c.softcap), inv_cap = _mm512_set1_ps(cap ? 1.0f / c.softcap : 0.0f);
      for (int64_t k = 0; k < n; ++k) {
        __m512 s = q8.sti && !q8.st_part ? _mm512_setzero_ps() : _mm512_load_ps(st + k * 32 + 16 * half);
        if (q8.sti) {  // + scale_k * qs_r * (h + l / 254)
          const __m512 h = _mm512_cvtepi32_ps(_mm512_load_si512(q8.sti + k * 32 + 16 * half));
          const __m512 lo8 = _mm512_cvtepi32_ps(_mm512_load_si512(q8.sti + (kSuper + k) * 32 + 16 * half));
          s = _mm512_fmadd_ps(_mm512_fmadd_ps(lo8, k1_254, h), _mm512_mul_ps(qsv, _mm512_set1_ps(q8.sk[k])), s);
        }
        // The order of the reference: scale, softcap, bias, then the masks.
        if (logit) s = _mm512_mul_ps(s, scale);
        if (cap) s = _mm512_mul_ps(capv, simd_type::tanh(_mm512_mul_ps(s, inv_cap)));
        if (rs.has_bias) s = _mm512_add_ps(s, _mm512_load_ps(bias_t + k * 16));
        __mmask16 vis = rs.has_mask ? __mmask16(real & mask_t[k]) : real;
        if (edge) {
          const __m512 key = _mm512_set1_ps(float(k));
          if (c.causal) vis &= _mm512_cmp_ps_mask(key, dg, _CMP_LE_OQ);
          if (c.window_left >= 0) vis &= _mm512_cmp_ps_mask(key, wl, _CMP_GE_OQ);
          if (c.window_right >= 0) vis &= _mm512_cmp_ps_mask(key, wr, _CMP_LE_OQ);
        }
        s = _mm512_mask_blend_ps(vis, neg_inf, s);
        _mm512_store_ps(st + k * 32 + 16 * half, s);
        bm0 = _mm512_max_ps(bm0, s);
      }
    } else {
      const float* sh = st + 16 * half;
      int64_t k = 0;
      for (; k + 4 <= n; k += 4) {
        bm0 = _mm512_max_ps(bm0, _mm512_load_ps(sh + k * 32));
        bm1 = _mm512_max_ps(bm1, _mm512_load_ps(sh + k * 32 + 32));
        bm2 = _mm512_max_ps(bm2, _mm512_load_ps(sh + k * 32 + 64));
        bm3 = _mm512_max_ps(bm3, _mm512_load_ps(sh + k * 32 + 96));
      }
      for (; k < n; ++k) bm0 = _mm512_max_ps(bm0, _mm512_load_ps(sh + k * 32));
    }
    const __m512 bmax = _mm512_mul_ps(_mm512_max_ps(_mm512_max_ps(bm0, bm1), _mm512_max_ps(bm2, bm3)), _mm512_set1_ps(u_scale));
    const __m512 m_old = _mm512_load_ps(rs.mrow + 16 * half);
    const __m512 m_new = _mm512_max_ps(m_old, bmax);
    const __mmask16 live = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_OQ);
    // exp(m_old - m_new): 1 where nothing is live yet (avoids -inf - -inf).
    const __m512 f = _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f), simd_type::exp(_mm512_sub_ps(m_old, m_new)));
    // p = 2^t, t = u c - m log2 e, as 2^floor(t) (scalef) times a degree-5 polynomial for
    // 2^r, r = t - floor(t) in [0, 1) (vreduceps: one uop for the range reduction;
    // relative error 1.6e-7 evaluated in f32, as simd exp's degree 6 on [-0.5, 0.5]).
    // t below -125 (exp's -87 nats), masked keys (-inf, whose r is NaN) and rows with
    // nothing live give 0 through scalef's zero mask.
    const __m512 cu = _mm512_mul_ps(_mm512_set1_ps(u_scale), log2e), nm = _mm512_maskz_mul_ps(live, m_new, _mm512_set1_ps(-1.44269504088896341f));
    // The superblock's sum first, then into l: one key at a time, an f32 l stops growing
    // at 2^24 (a flat row over 33.5M keys gave lse 16.64 for 17.33). Two sums, so the adds
    // are not one latency chain.
    const auto p_of = [&](int64_t k) {
      const __m512 t = _mm512_fmadd_ps(_mm512_load_ps(st + k * 32 + 16 * half), cu, nm);
      const __m512 r = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      __m512 q = _mm512_set1_ps(1.877576645e-3f);
      q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.989340163e-3f));
      q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(5.582631799e-2f));
      q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(2.401536171e-1f));
      q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(6.931530732e-1f));
      q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(9.999999251e-1f));
      return _mm512_maskz_scalef_ps(_mm512_mask_cmp_ps_mask(live, t, lo_arg, _CMP_GE_OQ), q, t);
    };
    const float* sv = q8.sti ? q8.sv : nullptr;  // hoisted: q8's fields are re-read past pt's stores
    const auto store_p = [&](int64_t k, __m512 p) {
      if (sv) p = _mm512_mul_ps(p, _mm512_set1_ps(sv[k]));  // V is the unscaled int8 row
      _mm256_store_si256(reinterpret_cast<__m256i*>(pt + k * 32 + 16 * half), (__m256i)_mm512_cvtneps_pbh(p));
    };
    __m512 lb0 = _mm512_setzero_ps(), lb1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 2 <= n; k += 2) {
      const __m512 p0 = p_of(k), p1 = p_of(k + 1);
      lb0 = _mm512_add_ps(lb0, p0), lb1 = _mm512_add_ps(lb1, p1);
      store_p(k, p0), store_p(k + 1, p1);
    }
    for (; k < n; ++k) {
      const __m512 p0 = p_of(k);
      lb0 = _mm512_add_ps(lb0, p0);
      store_p(k, p0);
    }
    for (; k < nk; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(pt + k * 32 + 16 * half), _mm256_setzero_si256());
    _mm512_store_ps(rs.mrow + 16 * half, m_new);
    _mm512_store_ps(rs.lrow + 16 * half, _mm512_fmadd_ps(_mm512_load_ps(rs.lrow + 16 * half), f, _mm512_add_ps(lb0, lb1)));
    _mm512_store_ps(rs.corr + 16 * half, f);
  }
}

// P = (P^T)^T for the superblock's nsub 32-key steps, and O's rows rescaled where their
// max moved.
void p_rows_and_rescale(const uint16_t* pt, uint16_t* pr, int nsub, int RT, const PairRows& rs, float* o, int64_t Dv) {
  for (int sb = 0; sb < nsub; ++sb)
    for (int half = 0; half < RT / 16; ++half) transpose_p16(pt + sb * kSub * 32 + 16 * half, pr + 16 * half * kSuper + sb * kSub);
  for (int r = 0; r < RT; ++r)
    if (rs.corr[r] != 1.0f) {
      const __m512 f = _mm512_set1_ps(rs.corr[r]);
      for (int64_t d = 0; d < Dv; d += 16) _mm512_storeu_ps(o + r * Dv + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), f));
    }
}

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
