// AMX attention job kernel (bf16; D and Dv multiples of 32; no softcap / bias / mask
// tensor — anything else runs the vector kernel of this unit).
//
// Per superblock of 128 keys (4 steps of 32), with up to 32 query rows as two 16-row
// column tiles:
//   S^T[key][row] = K . Q^T   A tiles: 16 K rows x 32 of D, straight from the cache rows
//                             when they sit at one stride (else staged); B tiles: Q^T in
//                             pairs ([D/2][32 rows][2], built once per job) — no
//                             transposes of K.
//   online softmax            vertical, once per superblock: each key's scores are a
//                             vector over rows, so the running max, exp and sums need no
//                             horizontal reductions.
//   O[row][dv] += P . V       A tiles: P rows (the block of P^T transposed); B tiles: V
//                             key pairs by in-lane unpacks; O lives in f32 memory and
//                             each 32-column chunk stays in C tiles for the superblock's
//                             four steps (one O load / store per 128 keys).
// Measured (MLA decode, 16 rows, 576 / 512, ctx 8192, alternating runs): staging K rows by
// memcpy and a burst of prefetches per block -> direct tiles and spread prefetches:
// 7.6-8.4 -> 9.6-13 GB/s; 32 -> 128-key O passes with unpack pairs: a further ~8%.
#include <immintrin.h>

#include <cstring>

#include "simd/simd_avx512_bf16.h"

namespace optx::attn_detail::amx {
namespace {
using simd_type = simd::Avx512Bf16;
struct alignas(64) TileConfig {  // also loaded by the few-row decode kernel's AMX scores
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
}  // namespace
}  // namespace optx::attn_detail::amx

#define OPTX_ISA_NS amx
#define OPTX_ATTN_DECODE_AMX 1
#include "ops/attention/attention_kernels_inl.h"
#include "ops/attention/attention_decode_inl.h"

namespace optx::attn_detail::amx {
namespace {

constexpr int kSub = 32;          // keys per tile step: two 16-key A tiles of S^T, one P tile
constexpr int kSuper = 4 * kSub;  // keys per softmax step and per O load / store
static_assert(kSuper <= kMaxRowsPerCall);
constexpr int kStageSub = 2 * 16 * 32;  // V pairs of one 32-key step, 32 columns: lo and hi B tiles
alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};  // V of keys past the end

void configure() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// Key pairs of 32 columns of rows a and b (b null: zeros) for two B tiles, by in-lane
// 16-bit unpacks (one uop each, where a cross-lane vpermt2w is three): lo gets columns
// {0-3, 8-11, 16-19, 24-27} and hi the others, so O's columns sit in that order
// (from_pair_order undoes it once per job).
OPTX_ALWAYS_INLINE void stage_pairs(const uint16_t* a, const uint16_t* b, uint16_t* lo, uint16_t* hi) {
  const __m512i va = _mm512_loadu_si512(a), vb = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
  _mm512_store_si512(lo, _mm512_unpacklo_epi16(va, vb));
  _mm512_store_si512(hi, _mm512_unpackhi_epi16(va, vb));
}

// In-register 16 x 16 transpose of dwords (dword j of r[i] -> dword i of r[j]) in three
// shuffle stages: 64 shuffles for 256 dwords.
OPTX_ALWAYS_INLINE void transpose16_epi32(__m512i r[16]) {
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

// 16 query rows x 32 keys of P from P^T (pt: [key][32 rows] bf16, from row 0 of the
// half) into pr ([row][kSuper keys] bf16, the A tiles of P . V). Keys go in pairs, as the
// A tile holds them: dword i of a row is (p[2i], p[2i+1]). (The element-wise loop this
// replaced was ~17% of flash prefill's samples.)
OPTX_ALWAYS_INLINE void transpose_p16(const uint16_t* pt, uint16_t* pr) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) {  // r[i][row] = (p[row][2i], p[row][2i+1])
    const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(pt + (2 * i) * 32));
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(pt + (2 * i + 1) * 32));
    r[i] = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  transpose16_epi32(r);
  for (int row = 0; row < 16; ++row) _mm512_store_si512(pr + row * kSuper, r[row]);
}

// Q^T in pairs ([D/2][32 rows][2] bf16, rows past R zero): the B tiles of the scores.
// Sixteen dword pairs of sixteen rows per transpose (an element loop took ~10 us per
// job, a quarter of a short-context MLA decode call).
void build_qt(const Job& j, int64_t D, uint16_t* qt) {
  for (int half = 0; half < 2; ++half)
    for (int64_t p0 = 0; p0 < D / 2; p0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int row = 16 * half + i;
        r[i] = row < j.nrows ? _mm512_loadu_si512(static_cast<const uint16_t*>(j.rows[row].q) + 2 * p0) : _mm512_setzero_si512();
      }
      transpose16_epi32(r);
      for (int c = 0; c < 16; ++c) _mm512_store_si512(qt + ((p0 + c) * 32 + 16 * half) * 2, r[c]);
    }
}

// q's latent part for int8 scores against an i8 cache (quantize_q_i8x2 per row), h and l
// in the B-tile layout of TDPBSSD ([L/4][32 rows][4]), rows past R zero. tmp: [2][32][L]
// bytes.
void build_q8(const Job& j, int64_t L, int8_t* q8h, int8_t* q8l, float* qs, int8_t* tmp) {
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
        transpose16_epi32(r);
        int8_t* out = part ? q8l : q8h;
        for (int c = 0; c < 16; ++c) _mm512_store_si512(out + ((p0 + c) * 32 + 16 * half) * 4, r[c]);
      }
}

// V pairs of 32 columns of i8 rows a and b (b null: zeros), exactly in bf16 (every int8 is
// a bf16; the token scales go into P), in stage_pairs' order.
OPTX_ALWAYS_INLINE void stage_pairs_i8(const int8_t* a, const int8_t* b, uint16_t* lo, uint16_t* hi) {
  auto bf = [](const int8_t* x) {
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
    const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16))));
    return (__m512i)_mm512_cvtne2ps_pbh(f1, f0);
  };
  const __m512i va = bf(a), vb = b ? bf(b) : _mm512_setzero_si512();
  _mm512_store_si512(lo, _mm512_unpacklo_epi16(va, vb));
  _mm512_store_si512(hi, _mm512_unpackhi_epi16(va, vb));
}

void from_pair_order(float* o, int rows, int64_t Dv) {
  const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int r = 0; r < rows; ++r)
    for (int64_t d = 0; d < Dv; d += 32) {
      float* p = o + r * Dv + d;
      const __m512 lo = _mm512_loadu_ps(p), hi = _mm512_loadu_ps(p + 16);
      _mm512_storeu_ps(p, _mm512_permutex2var_ps(lo, i0, hi));
      _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(lo, i1, hi));
    }
}

// S^T tiles of 32 keys (A tiles a[0], a[1]: 16 key rows each) against q's B tiles over
// `bytes` bytes of each row, into C tiles 0 / 2 (rows 0-15) and 1 / 3 (rows 16-31, with
// two). bf16 (TDPBF16PS, q as Q^T pairs [D/2][32][2]) and int8 (TDPBSSD, q quads
// [L/4][32][4]) share the byte layout: each step takes 64 bytes of every key row and a
// 2 KiB slab of q, its rows 16-31 64 bytes in. (The tile intrinsics paste their tile
// numbers into the asm text, so the instruction is chosen by a macro that keeps them
// literal, not by a helper taking them as parameters.)
template <bool kInt8, class Prefetch>
OPTX_ALWAYS_INLINE void score_tiles(const void* const a[2], const int64_t stride[2], const void* q, int64_t bytes, bool two,
                                    Prefetch&& prefetch) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const char* a0 = static_cast<const char*>(a[0]);
  const char* a1 = static_cast<const char*>(a[1]);
  const char* qb = static_cast<const char*>(q);
  for (int64_t o = 0; o < bytes; o += 64) {
    prefetch();
    _tile_loadd(4, a0 + o, stride[0]);
    _tile_loadd(5, a1 + o, stride[1]);
#define OPTX_SCORE_TDP(c, a, b) \
  do {                            \
    if constexpr (kInt8)          \
      _tile_dpbssd(c, a, b);      \
    else                          \
      _tile_dpbf16ps(c, a, b);    \
  } while (0)
    _tile_loadd(6, qb + o * 32, 128);
    OPTX_SCORE_TDP(0, 4, 6);
    OPTX_SCORE_TDP(2, 5, 6);
    if (two) {
      _tile_loadd(7, qb + o * 32 + 64, 128);
      OPTX_SCORE_TDP(1, 4, 7);
      OPTX_SCORE_TDP(3, 5, 7);
    }
#undef OPTX_SCORE_TDP
  }
}

// C tiles 0-3 to [32 keys][32 rows] of 4-byte scores at s (row stride 128 bytes).
OPTX_ALWAYS_INLINE void store_scores(void* s, bool two) {
  char* b = static_cast<char*>(s);
  _tile_stored(0, b, 128);
  _tile_stored(2, b + 16 * 128, 128);
  if (two) {
    _tile_stored(1, b + 64, 128);
    _tile_stored(3, b + 16 * 128 + 64, 128);
  }
}

void run_job_amx(const Config& c, const Job& j, float* scratch) {
  if (!supported(c, j) || j.groups > 1 || j.nrows <= kDecodeRows) return run_job_bf16(c, j, scratch);
  const int R = j.nrows;
  const bool two = R > 16;  // second column tile of rows
  const int RT = two ? 32 : 16;
  const int64_t D = c.D, Dv = c.Dv;
  // Scratch layout (all 64-byte aligned multiples; see job_scratch_floats).
  uint16_t* qt = reinterpret_cast<uint16_t*>(scratch);         // [D/2][32][2]
  uint16_t* kst = qt + D * 32;                                  // [32][D] staged K rows
  uint16_t* stage = kst + 32 * D;                               // [2][kStageSub]
  float* st = reinterpret_cast<float*>(stage + 2 * kStageSub);  // [kSuper keys][32 rows]
  uint16_t* pt = reinterpret_cast<uint16_t*>(st + kSuper * 32);   // [kSuper keys][32 rows]
  uint16_t* pr = pt + kSuper * 32;                                // [32 rows][kSuper keys]
  float* o = reinterpret_cast<float*>(pr + 32 * kSuper);          // [32 rows][Dv], pair order

  build_qt(j, D, qt);
  std::memset(o, 0, sizeof(float) * size_t(RT * Dv));
  // An i8 latent cache: scores from TDPBSSD on the cache's int8 rows against q in two
  // int8 halves (build_q8), the rope part in bf16, the token scale applied to each key's
  // latent score and folded into its P column; V pairs converted exactly from int8. No
  // dequantised rows are staged (KvView's ring space holds this path's buffers instead).
  const I8Kv& x8 = j.kv.i8;
  const int64_t L = x8.k_dim, RD = x8.rope_dim;
  static const bool amx_int8 = cpu_features().amx_int8;
  const size_t q8_bytes = size_t(64 * L) + size_t(2 * kSuper * 32 * 4) + size_t(32 * L) + size_t(64 * RD) + size_t(64 * L);
  const bool q8 = x8.k && !x8.v && amx_int8 && L % 64 == 0 && RD % 32 == 0 && q8_bytes <= I8Kv::stage_bytes(x8.k_width(), 0, true);
  int8_t* q8h = nullptr;
  int8_t* q8l = nullptr;
  int32_t* sti = nullptr;  // [2][kSuper keys][32 rows]: the h and l scores
  int8_t* kst8 = nullptr;  // [32][L] staged latent rows (where not at one stride)
  uint16_t* kstr = nullptr;  // [32][RD] staged rope rows
  alignas(64) float qs[32];
  if (q8) {
    q8h = reinterpret_cast<int8_t*>(x8.stage);
    q8l = q8h + 32 * L;
    sti = reinterpret_cast<int32_t*>(q8l + 32 * L);
    kst8 = reinterpret_cast<int8_t*>(sti + 2 * kSuper * 32);
    kstr = reinterpret_cast<uint16_t*>(kst8 + 32 * L);
    build_q8(j, L, q8h, q8l, qs, reinterpret_cast<int8_t*>(kstr + 32 * RD));
  }
  // Per-row running state as vectors over rows; diagonal positions (padded rows see nothing).
  alignas(64) float diag[32], mrow[32], lrow[32];
  for (int r = 0; r < 32; ++r) {
    diag[r] = r < R ? float(j.rows[r].qpos + j.offset) : -1e30f;
    mrow[r] = -INFINITY;
    lrow[r] = 0.0f;
  }
  int64_t lo = j.kv_begin, hi = j.kv_end;
  {
    float dmin = 1e30f, dmax = -1e30f;
    for (int r = 0; r < R; ++r) dmin = std::min(dmin, diag[r]), dmax = std::max(dmax, diag[r]);
    if (R > 0) {
      if (c.causal) hi = std::min<int64_t>(hi, int64_t(dmax) + 1);
      if (c.window_right >= 0) hi = std::min<int64_t>(hi, int64_t(dmax) + c.window_right + 1);
      if (c.window_left >= 0) lo = std::max<int64_t>(lo, int64_t(dmin) - c.window_left);
    }
  }
  configure();
  const void* kp[kSuper];
  const void* vpp[kSuper];
  const void* kn[kSuper];
  const void* vn[kSuper];
  const __m512 scale = _mm512_set1_ps(c.scale);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  const int64_t k_lines = (D * 2 + 63) / 64, v_lines = (Dv * 2 + 63) / 64;
  // An i8 latent staged by rows() is read from memory when rows() dequantises it, a
  // superblock before its use: its prefetches run two superblocks ahead, over the sources.
  // The int8 path reads the sources themselves (kp / vpp: latent / rope rows).
  const bool i8 = x8.k != nullptr && !x8.v;  // MLA latent (K and V planes: no source prefetch)
  const void* src_lat[kSuper];
  const void* src_rope[kSuper];
  alignas(64) float sk[kSuper], sk_next[kSuper];  // int8 path: the keys' scales
  const int64_t lat_lines = (L + 63) / 64, rope_lines = (RD * 2 + 63) / 64;
  auto fetch = [&](int64_t j0, int64_t cnt) {
    if (q8) j.kv.sources(j0, cnt, true, kn, vn, sk_next, DequantRow{});
    else j.kv.rows(j0, cnt, true, kn, vn, DequantRow{});
  };
  if (lo < hi) fetch(lo, std::min<int64_t>(kSuper, hi - lo));
  for (int64_t kb = lo; kb < hi; kb += kSuper) {
    const int64_t n = std::min<int64_t>(kSuper, hi - kb);
    const int nsub = int((n + kSub - 1) / kSub);
    std::copy(kn, kn + n, kp);
    std::copy(vn, vn + n, vpp);
    if (q8) std::copy(sk_next, sk_next + n, sk);
    const int64_t n_next = std::max<int64_t>(0, std::min<int64_t>(kSuper, hi - kb - kSuper));
    if (n_next) fetch(kb + kSuper, n_next);
    // The next superblock's rows are prefetched a slice per tile step: issued in one
    // burst, the prefetches wait on the fill buffers and hold up the tile work behind
    // them, so memory and compute would take turns instead of overlapping. Into L2: a
    // superblock (144 KiB for MLA) is more than L1 holds (T1 over T0, MLA ctx 8k / 32k,
    // eight alternating rounds: median 11.1-13.9 -> 11.9-15.9 GB/s). Not in prefill
    // (Config::kv_once): flash S = 4096 / 8192 ran 5-25% faster without them.
    const bool v_apart = n_next > 0 && vn[0] != kn[0];
    int64_t n_pf = n_next, a_lines = k_lines, b_lines = v_apart ? v_lines : 0;
    const void* const* pa = kn;
    const void* const* pb = vn;
    if (q8) {
      a_lines = lat_lines, b_lines = rope_lines;
    } else if (i8) {
      n_pf = std::max<int64_t>(0, std::min<int64_t>(kSuper, hi - kb - 2 * kSuper));
      if (n_pf) j.kv.sources(kb + 2 * kSuper, n_pf, true, src_lat, src_rope, nullptr, DequantRow{});
      pa = src_lat, pb = src_rope, a_lines = lat_lines, b_lines = rope_lines;
    }
    const int64_t row_lines = a_lines + b_lines;
    const int64_t steps = nsub * (D / 32) + Dv / 32;
    const int64_t pf_step = c.kv_once ? (n_pf * row_lines + steps - 1) / steps : 0;
    int64_t pf_key = 0, pf_line = 0;
    // A run of consecutive lines of one row per inner loop (pointer steps only): the
    // per-line form, which recomputed each line's row and part, cost 4-11% of hot time.
    auto prefetch_next = [&] {
      for (int64_t left = pf_step; left > 0 && pf_key < n_pf;) {
        const bool in_a = pf_line < a_lines;
        const char* p = in_a ? static_cast<const char*>(pa[pf_key]) + 64 * pf_line
                             : static_cast<const char*>(pb[pf_key]) + 64 * (pf_line - a_lines);
        const int64_t cnt = std::min(left, (in_a ? a_lines : row_lines) - pf_line);
        for (const char* e = p + 64 * cnt; p != e; p += 64) _mm_prefetch(p, _MM_HINT_T1);
        left -= cnt;
        if ((pf_line += cnt) == row_lines) pf_line = 0, ++pf_key;
      }
    };
    // S^T = K . Q^T, 32 keys per step over D in steps of 32.
    for (int sb = 0; q8 && sb < nsub; ++sb) {
      const int64_t s0 = int64_t(sb) * kSub, ns = std::min<int64_t>(kSub, n - s0);
      // A tiles straight from the latent / rope rows where 16 keys sit at one stride.
      const void* la[2];
      const void* ra[2];
      int64_t la_stride[2], ra_stride[2];
      for (int t = 0; t < 2; ++t) {
        const int64_t k0 = 16 * t;
        la[t] = tile_rows(kp + s0 + k0, ns - k0, 0, size_t(L), kst8 + k0 * L, &la_stride[t]);
        ra[t] = tile_rows(vpp + s0 + k0, ns - k0, 0, size_t(RD) * 2, kstr + k0 * RD, &ra_stride[t]);
      }
      for (int part = 0; part < 2; ++part) {
        score_tiles<true>(la, la_stride, part ? q8l : q8h, L, two, prefetch_next);
        store_scores(sti + (part * kSuper + s0) * 32, two);
      }
      score_tiles<false>(ra, ra_stride, qt + (L / 2) * 64, RD * 2, two, prefetch_next);  // the rope part
      store_scores(st + s0 * 32, two);
    }
    for (int sb = 0; !q8 && sb < nsub; ++sb) {
      const int64_t s0 = int64_t(sb) * kSub, ns = std::min<int64_t>(kSub, n - s0);
      // Each 16-key A tile loads straight from the cache rows when they sit at one
      // stride (a paged block of >= 16 slots); otherwise, or past n, from rows staged in kst.
      const void* ka[2];
      int64_t ka_stride[2];
      for (int t = 0; t < 2; ++t) ka[t] = tile_rows(kp + s0 + 16 * t, ns - 16 * t, 0, size_t(D) * 2, kst + 16 * t * D, &ka_stride[t]);
      score_tiles<false>(ka, ka_stride, qt, D * 2, two, prefetch_next);
      store_scores(st + s0 * 32, two);
    }
    // Vertical online softmax over the superblock's keys, 16 rows per vector.
    const int64_t nk = int64_t(nsub) * kSub;  // keys the P tiles cover; p = 0 past n
    alignas(64) float corr[32];
    for (int half = 0; half < RT / 16; ++half) {
      const __m512 dg = _mm512_load_ps(diag + 16 * half);
      const __mmask16 real = _mm512_cmp_ps_mask(dg, _mm512_set1_ps(-1e29f), _CMP_GT_OQ);  // not padded rows
      // Position masks only where the superblock crosses a row's causal / window edge
      // (in causal prefill, only the blocks on the diagonal).
      float dlo = 1e30f, dhi = -1e30f;
      for (int r = 16 * half; r < 16 * half + 16; ++r)
        if (diag[r] > -1e29f) dlo = std::min(dlo, diag[r]), dhi = std::max(dhi, diag[r]);
      const float first = float(kb), last = float(kb + n - 1);
      const bool edge = (c.causal && last > dlo) || (c.window_left >= 0 && first < dhi - float(c.window_left)) ||
                        (c.window_right >= 0 && last > dlo + float(c.window_right));
      __m512 bmax = neg_inf;
      const __m512 qsv = _mm512_load_ps(qs + 16 * half), k1_254 = _mm512_set1_ps(1.0f / 254.0f);
      for (int64_t k = 0; k < n; ++k) {
        __m512 s = _mm512_load_ps(st + k * 32 + 16 * half);
        if (q8) {  // + scale_k * qs_r * (h + l / 254)
          const __m512 h = _mm512_cvtepi32_ps(_mm512_load_si512(sti + k * 32 + 16 * half));
          const __m512 lo8 = _mm512_cvtepi32_ps(_mm512_load_si512(sti + (kSuper + k) * 32 + 16 * half));
          s = _mm512_fmadd_ps(_mm512_fmadd_ps(lo8, k1_254, h), _mm512_mul_ps(qsv, _mm512_set1_ps(sk[k])), s);
        }
        s = _mm512_mul_ps(s, scale);
        __mmask16 vis = real;
        if (edge) {
          const __m512 key = _mm512_set1_ps(float(kb + k));
          if (c.causal) vis &= _mm512_cmp_ps_mask(key, dg, _CMP_LE_OQ);
          if (c.window_left >= 0)
            vis &= _mm512_cmp_ps_mask(key, _mm512_sub_ps(dg, _mm512_set1_ps(float(c.window_left))), _CMP_GE_OQ);
          if (c.window_right >= 0)
            vis &= _mm512_cmp_ps_mask(key, _mm512_add_ps(dg, _mm512_set1_ps(float(c.window_right))), _CMP_LE_OQ);
        }
        s = _mm512_mask_blend_ps(vis, neg_inf, s);
        _mm512_store_ps(st + k * 32 + 16 * half, s);
        bmax = _mm512_max_ps(bmax, s);
      }
      const __m512 m_old = _mm512_load_ps(mrow + 16 * half);
      const __m512 m_new = _mm512_max_ps(m_old, bmax);
      const __mmask16 live = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_OQ);
      // exp(m_old - m_new): 1 where nothing is live yet (avoids -inf - -inf).
      const __m512 f = _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f), simd_type::exp(_mm512_sub_ps(m_old, m_new)));
      __m512 l = _mm512_mul_ps(_mm512_load_ps(lrow + 16 * half), f);
      for (int64_t k = 0; k < nk; ++k) {
        __m512 p = _mm512_setzero_ps();
        if (k < n) p = _mm512_maskz_mov_ps(live, simd_type::exp(_mm512_sub_ps(_mm512_load_ps(st + k * 32 + 16 * half), m_new)));
        l = _mm512_add_ps(l, p);
        if (q8 && k < n) p = _mm512_mul_ps(p, _mm512_set1_ps(sk[k]));  // V is the unscaled int8 row
        _mm256_store_si256(reinterpret_cast<__m256i*>(pt + k * 32 + 16 * half), (__m256i)_mm512_cvtneps_pbh(p));
      }
      _mm512_store_ps(mrow + 16 * half, m_new);
      _mm512_store_ps(lrow + 16 * half, l);
      _mm512_store_ps(corr + 16 * half, f);
    }
    // P = (P^T)^T: rows x keys, 16 rows x 32 keys at a time.
    for (int sb = 0; sb < nsub; ++sb)
      for (int half = 0; half < RT / 16; ++half) transpose_p16(pt + sb * kSub * 32 + 16 * half, pr + 16 * half * kSuper + sb * kSub);
    // Rescale O rows whose max moved.
    for (int r = 0; r < RT; ++r)
      if (corr[r] != 1.0f) {
        const __m512 f = _mm512_set1_ps(corr[r]);
        for (int64_t d = 0; d < Dv; d += 16) _mm512_storeu_ps(o + r * Dv + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), f));
      }
    // O[row][dv] += P . V, 32 columns at a time held in C tiles across the whole
    // superblock (one O load / store per kSuper keys, not per 32); the V pairs of each
    // 32-key step are staged just before use, double-buffered. (Staging columns d + 32
    // during the tiles of d measured no better.)
    for (int64_t d = 0; d < Dv; d += 32) {
      prefetch_next();
      _tile_loadd(0, o + d, Dv * 4);
      _tile_loadd(1, o + d + 16, Dv * 4);
      if (two) {
        _tile_loadd(2, o + 16 * Dv + d, Dv * 4);
        _tile_loadd(3, o + 16 * Dv + d + 16, Dv * 4);
      }
      for (int sb = 0; sb < nsub; ++sb) {
        const int64_t s0 = int64_t(sb) * kSub;
        uint16_t* blo = stage + (sb & 1) * kStageSub;
        uint16_t* bhi = blo + kStageSub / 2;
        for (int p = 0; p < kSub / 2; ++p) {
          const int64_t k0 = s0 + 2 * p, k1 = k0 + 1;
          if (q8) {
            const int8_t* a = k0 < n ? static_cast<const int8_t*>(kp[k0]) + d : reinterpret_cast<const int8_t*>(kZeroRow);
            const int8_t* b = k1 < n ? static_cast<const int8_t*>(kp[k1]) + d : nullptr;
            stage_pairs_i8(a, b, blo + p * 32, bhi + p * 32);
            continue;
          }
          const uint16_t* a = k0 < n ? static_cast<const uint16_t*>(vpp[k0]) + d : kZeroRow;
          const uint16_t* b = k1 < n ? static_cast<const uint16_t*>(vpp[k1]) + d : nullptr;
          stage_pairs(a, b, blo + p * 32, bhi + p * 32);
        }
        _tile_loadd(6, blo, 64);
        _tile_loadd(7, bhi, 64);
        _tile_loadd(4, pr + s0, kSuper * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, pr + 16 * kSuper + s0, kSuper * 2);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, o + d, Dv * 4);
      _tile_stored(1, o + d + 16, Dv * 4);
      if (two) {
        _tile_stored(2, o + 16 * Dv + d, Dv * 4);
        _tile_stored(3, o + 16 * Dv + d + 16, Dv * 4);
      }
    }
  }
  _tile_release();
  from_pair_order(o, RT, Dv);
  finish_rows(c, j, mrow, lrow, o);
}

}  // namespace
}  // namespace optx::attn_detail::amx

namespace optx::attn_detail {
const Kernels& kernels_amx() {
  static const Kernels k{amx::run_job_amx, true};
  return k;
}
}  // namespace optx::attn_detail
