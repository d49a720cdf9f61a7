// AMX attention job kernel (bf16; D and Dv multiples of 32; no softcap / bias / mask
// tensor — anything else runs the vector kernel of this unit).
//
// Per superblock of 128 keys (4 steps of 32), with up to 32 query rows as two 16-row
// column tiles (a flash job: up to four such groups sharing the superblock):
//   S^T[key][row] = K . Q^T   A tiles: 16 K rows x 32 of D, straight from the cache rows
//                             when they sit at one stride (else staged; in a job of
//                             several groups, also rows off 64-byte lines); B tiles: Q^T in
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
#include "ops/attention/attention_pairs_inl.h"

namespace optx::attn_detail::amx {
namespace {

static_assert(kAmxFlashRows % 32 == 0 && kAmxFlashRows <= kMaxFlashRows);  // up to four groups of 32
constexpr int kAmxGroups = kAmxFlashRows / 32;
constexpr int kStageSub = 2 * 16 * 32;  // V pairs of one 32-key step, 32 columns: lo and hi B tiles
void configure() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

OPTX_ALWAYS_INLINE void zero_c_tiles() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
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
  zero_c_tiles();
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

// One row tile (<= 16 rows: MLA decode's heads, a few GQA rows) against 64 keys, a
// 16-key A tile each into C tiles 0-3: four independent accumulation chains per D step
// where score_tiles' one row tile has two. The A tiles rotate through 4, 5 and 7 (the
// fourth reloads 4 once its product has read it); two prefetch steps per D step, as two
// score_tiles calls take. MLA decode, 16 heads, cold, alternating: ctx 8k / 32k 1.04 /
// 1.05x the 32-key passes.
template <class Prefetch>
OPTX_ALWAYS_INLINE void score_tiles64(const void* const a[4], const int64_t stride[4], const void* q, int64_t bytes, Prefetch&& prefetch) {
  zero_c_tiles();
  const char* a0 = static_cast<const char*>(a[0]);
  const char* a1 = static_cast<const char*>(a[1]);
  const char* a2 = static_cast<const char*>(a[2]);
  const char* a3 = static_cast<const char*>(a[3]);
  const char* qb = static_cast<const char*>(q);
  for (int64_t o = 0; o < bytes; o += 64) {
    prefetch();
    prefetch();
    _tile_loadd(6, qb + o * 32, 128);
    _tile_loadd(4, a0 + o, stride[0]);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, a1 + o, stride[1]);
    _tile_dpbf16ps(1, 5, 6);
    _tile_loadd(7, a2 + o, stride[2]);
    _tile_dpbf16ps(2, 7, 6);
    _tile_loadd(4, a3 + o, stride[3]);
    _tile_dpbf16ps(3, 4, 6);
  }
}

// score_tiles64's C tiles 0-3 (keys 0-15, ..., 48-63) to [64 keys][32 rows] of 4-byte
// scores at s (row stride 128 bytes; rows past the row tile's 16 untouched).
OPTX_ALWAYS_INLINE void store_scores64(void* s) {
  char* b = static_cast<char*>(s);
  _tile_stored(0, b, 128);
  _tile_stored(1, b + 16 * 128, 128);
  _tile_stored(2, b + 32 * 128, 128);
  _tile_stored(3, b + 48 * 128, 128);
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
  if (!pair_kernel_takes(c, j, 32, kAmxFlashRows)) return run_job_bf16(c, j, scratch);  // 32: whole tile steps
  const int R = j.nrows;
  // Flash jobs of 33-128 rows run as up to four groups of 32 (each with its own Q^T,
  // softmax state and P rows) that share each superblock's K / V reads and V staging. In
  // BSND a head's K / V rows sit a token's row (4 KiB at 16 heads) apart: every row is a
  // new page to the L2 streamer and the rows alias into a few L1 / L2 sets, so they come
  // from L3 on every visit; G groups visit them 1/G as often and stage V once for G.
  // (Four groups: flash S = 4096 / 8192 1.15-1.22x two; six measured level with four.)
  const int groups = std::max(1, (R + 31) / 32);
  const bool two = R > 16;  // second column tile of rows (every group of a many-group job)
  const int RT = groups > 1 ? 32 * groups : two ? 32 : 16;  // rows of O and P (padded)
  const int64_t D = c.D, Dv = c.Dv;
  // Scratch layout (all 64-byte aligned multiples; see job_scratch_floats).
  uint16_t* qts[kAmxGroups];
  qts[0] = reinterpret_cast<uint16_t*>(scratch);                // [groups][D/2][32][2]
  for (int g = 1; g < groups; ++g) qts[g] = qts[g - 1] + D * 32;  // only the groups the scratch holds
  // Staged K rows: a 32-key step's where they do not sit at one stride, or, in a job of
  // several groups, the whole superblock's where its rows are off 64-byte lines
  // (stage_keys).
  const bool stage_keys = groups > 1;
  uint16_t* kst = qts[0] + groups * D * 32;                     // [32 or kSuper][D]
  uint16_t* stage = kst + (stage_keys ? kSuper : 32) * D;       // [kSuper / kSub][kStageSub]
  float* st = reinterpret_cast<float*>(stage + (kSuper / kSub) * kStageSub);  // [kSuper keys][32 rows]
  uint16_t* pt = reinterpret_cast<uint16_t*>(st + kSuper * 32);   // [kSuper keys][32 rows]
  uint16_t* pr = pt + kSuper * 32;                                // [RT rows][kSuper keys]
  float* o = reinterpret_cast<float*>(pr + RT * kSuper);          // [RT rows][Dv], pair order
  const uint16_t* qt = qts[0];

  for (int g = 0; g < groups; ++g) build_qt(j, D, qts[g], 32 * g);
  std::memset(o, 0, sizeof(float) * size_t(RT * Dv));
  // An i8 latent cache: scores from TDPBSSD on the cache's int8 rows against q in two
  // int8 halves (build_q8), the rope part in bf16, the token scale applied to each key's
  // latent score and folded into its P column; V pairs converted exactly from int8. No
  // dequantised rows are staged (KvView's ring space holds this path's buffers instead).
  // GQA's i8 K and V planes (speculative decoding's 9-32 rows per KV head) go the same way
  // with no rope part (kv8): K's scores by TDPBSSD, V pairs from V's int8 rows, V's token
  // scale folded into P; kp / kn then hold the K rows, vpp / vn the V rows. Dequantised
  // into staging by rows() they ran at 0.81x the bf16 cache's tokens/s (Sq = 4, 32 / 8
  // heads, ctx 8k, Sapphire Rapids VM).
  const I8Kv& x8 = j.kv.i8;
  const int64_t L = x8.k_dim, RD = x8.rope_dim;
  static const bool amx_int8 = cpu_features().amx_int8;
  const size_t q8_bytes = size_t(64 * L) + size_t(2 * kSuper * 32 * 4) + size_t(32 * L) + size_t(64 * RD) + size_t(64 * L);
  const bool q8_fits = groups == 1 && x8.k && amx_int8 && L % 64 == 0 &&
                       q8_bytes <= I8Kv::stage_bytes(x8.k_width(), x8.v ? x8.v_width() : 0, true);
  const bool lat8 = q8_fits && !x8.v && RD % 32 == 0;
  const bool kv8 = q8_fits && x8.v && L == D && x8.v_dim == Dv && RD == 0;
  const bool q8 = lat8 || kv8;
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
    build_q8(j, L, q8h, q8l, qs, reinterpret_cast<int8_t*>(kstr + 32 * RD), 0);
  }
  PairRows rss[kAmxGroups];
  for (int g = 0; g < groups; ++g) rss[g] = PairRows(c, j, 32 * g);
  PairRows& rs = rss[0];
  int64_t lo = rs.lo, hi = rs.hi;
  for (int g = 1; g < groups; ++g) lo = std::min(lo, rss[g].lo), hi = std::max(hi, rss[g].hi);
  configure();
  const void* kp[kSuper];
  const void* vpp[kSuper];
  const void* const* v8 = kv8 ? vpp : kp;  // int8 V pairs: V's rows, or the latent
  const void* kn[kSuper];
  const void* vn[kSuper];
  const int64_t k_lines = (D * 2 + 63) / 64, v_lines = (Dv * 2 + 63) / 64;
  // An i8 latent staged by rows() is read from memory when rows() dequantises it, a
  // superblock before its use: its prefetches run two superblocks ahead, over the sources.
  // The int8 path reads the sources themselves (kp / vpp: latent / rope rows).
  const bool i8 = x8.k != nullptr && !x8.v;  // MLA latent (K and V planes: no source prefetch)
  const void* src_lat[kSuper];
  const void* src_rope[kSuper];
  alignas(64) float sk[kSuper], sk_next[kSuper], sv[kSuper], sv_next[kSuper];  // int8 path: the keys' scales
  const int64_t lat_lines = (L + 63) / 64, rope_lines = (RD * 2 + 63) / 64;
  auto fetch = [&](int64_t j0, int64_t cnt) {
    if (kv8) j.kv.planes(j0, cnt, kn, vn, sk_next, sv_next, DequantRow{});
    else if (q8) j.kv.sources(j0, cnt, true, kn, vn, sk_next, DequantRow{});
    else j.kv.rows(j0, cnt, true, kn, vn, DequantRow{});
  };
  if (lo < hi) fetch(lo, std::min<int64_t>(kSuper, hi - lo));
  for (int64_t kb = lo; kb < hi; kb += kSuper) {
    const int64_t n = std::min<int64_t>(kSuper, hi - kb);
    const int nsub = int((n + kSub - 1) / kSub);
    std::copy(kn, kn + n, kp);
    std::copy(vn, vn + n, vpp);
    if (q8) std::copy(sk_next, sk_next + n, sk);
    if (kv8) std::copy(sv_next, sv_next + n, sv);
    const int64_t n_next = std::max<int64_t>(0, std::min<int64_t>(kSuper, hi - kb - kSuper));
    if (n_next) fetch(kb + kSuper, n_next);
    if (rs.has_mask && masks_hide(j, kb, n)) continue;  // a superblock no row sees
    // Decode: the next superblock's rows are prefetched a slice per tile step
    // (SpreadPrefetch). Prefill (not Config::kv_once) does without them (flash S = 4096 /
    // 8192 ran 5-25% faster), but pulls this superblock's V rows into L2 over its score
    // steps instead, as the vdpbf16ps kernel's v_pf does: a head's K / V are re-read from
    // L3 by each of its jobs, and P.V's pair staging otherwise waits on V's rows there.
    // Flash S = 4096 / 8192 (16 heads, causal, bf16, BSND), alternating call by call:
    // 1.05-1.07x / 1.05x, one thread 1.08x; the same rows T0 level with T1, spread over
    // fewer steps (the first group's) 0.97-0.99x, the next superblock's V instead 1.0x, and
    // the next K during P.V on top 0.96x.
    const bool v_apart = n_next > 0 && vn[0] != kn[0];
    int64_t n_pf = n_next, a_lines = k_lines, b_lines = v_apart ? v_lines : 0;
    const void* const* pa = kn;
    const void* const* pb = vn;
    if (q8) {
      a_lines = lat_lines, b_lines = kv8 ? (Dv + 63) / 64 : rope_lines;
    } else if (i8) {
      n_pf = std::max<int64_t>(0, std::min<int64_t>(kSuper, hi - kb - 2 * kSuper));
      if (n_pf) j.kv.sources(kb + 2 * kSuper, n_pf, true, src_lat, src_rope, nullptr, DequantRow{});
      pa = src_lat, pb = src_rope, a_lines = lat_lines, b_lines = rope_lines;
    }
    const int64_t steps = groups * nsub * (D / 32) + Dv / 32;
    SpreadPrefetch pf = c.kv_once || q8 || i8 ? SpreadPrefetch(pa, pb, a_lines, b_lines, c.kv_once ? n_pf : 0, steps)
                                              : SpreadPrefetch(vpp, nullptr, v_lines, 0, n, groups * nsub * (D / 32));
    auto prefetch_next = [&] { pf.step(); };
    // S^T = K . Q^T, 32 keys per step over D in steps of 32.
    for (int sb = 0; q8 && sb < nsub; ++sb) {
      const int64_t s0 = int64_t(sb) * kSub, ns = std::min<int64_t>(kSub, n - s0);
      // A tiles straight from the latent / rope rows where 16 keys sit at one stride.
      const void* la[2];
      const void* ra[2] = {};
      int64_t la_stride[2], ra_stride[2];
      for (int t = 0; t < 2; ++t) {
        const int64_t k0 = 16 * t;
        la[t] = tile_rows(kp + s0 + k0, ns - k0, 0, size_t(L), kst8 + k0 * L, &la_stride[t]);
        if (RD > 0) ra[t] = tile_rows(vpp + s0 + k0, ns - k0, 0, size_t(RD) * 2, kstr + k0 * RD, &ra_stride[t]);
      }
      for (int part = 0; part < 2; ++part) {
        score_tiles<true>(la, la_stride, part ? q8l : q8h, L, two, prefetch_next);
        store_scores(sti + (part * kSuper + s0) * 32, two);
      }
      if (RD == 0) continue;
      score_tiles<false>(ra, ra_stride, qt + (L / 2) * 64, RD * 2, two, prefetch_next);  // the rope part
      store_scores(st + s0 * 32, two);
    }
    const int64_t nk = int64_t(nsub) * kSub;  // keys the P tiles cover; p = 0 past n
    if (q8) {
      softmax_superblock(c, kb, n, nk, RT, rs, st, pt, Int8Scores{sti, qs, sk, kv8 ? sv : sk, lat8});
      p_rows_and_rescale(pt, pr, nsub, RT, rs, o, Dv);
    }
    // 64 keys of one row tile per pass (score_tiles64) where each of their four 16-key
    // tiles loads straight from its cache rows (else the 32-key passes, which stage).
    const auto scores64 = [&](const uint16_t* qt_g, int64_t s0) {
      const void* ka[4];
      int64_t ka_stride[4];
      for (int t = 0; t < 4; ++t)
        if (!(ka[t] = uniform_rows(kp + s0 + 16 * t, n - s0 - 16 * t, &ka_stride[t]))) return false;
      score_tiles64(ka, ka_stride, qt_g, D * 2, prefetch_next);
      store_scores64(st + s0 * 32);
      return true;
    };
    // K rows off 64-byte lines (a std::vector's buffer, say): each 64 bytes a tile row
    // takes span two lines, so every group's tiles would read twice the lines. A job of
    // several groups copies the superblock's rows onto lines in kst once, and every group's
    // score tiles load them from there. Flash S = 4096 (causal, 16 heads, bf16, jobs of
    // four groups) with rows 16 bytes off, builds in turn, medians: 87.8 / 89.7 -> 82.9 /
    // 79.7 ms (S = 8192 333 -> 320); rows on lines, which load straight, level. Copied on
    // lines too, they cost 5-8%, and with one group (each row read once) off lines 0-4%.
    bool staged = false;
    if (stage_keys && !q8) {
      for (int64_t i = 0; i < n && !staged; ++i) staged = (reinterpret_cast<uintptr_t>(kp[i]) & 63) != 0;
    }
    if (staged)
      for (int64_t i0 = 0; i0 < nk; i0 += 16) stage_rows16(kp + i0, n - i0, 0, size_t(D) * 2, kst + i0 * D);
    for (int g = 0; !q8 && g < groups; ++g) {
      for (int sb = 0; sb < nsub; ++sb) {
        const int64_t s0 = int64_t(sb) * kSub, ns = std::min<int64_t>(kSub, n - s0);
        if (!two && sb + 1 < nsub && scores64(qts[g], s0)) {
          ++sb;
          continue;
        }
        // Each 16-key A tile loads straight from the cache rows when they sit at one
        // stride (a paged block of >= 16 slots); otherwise, or past n, from rows staged in
        // kst (the superblock's, where it is staged whole).
        const void* ka[2];
        int64_t ka_stride[2];
        for (int t = 0; t < 2; ++t)
          ka[t] = staged ? (ka_stride[t] = D * 2, kst + (s0 + 16 * t) * D)
                         : tile_rows(kp + s0 + 16 * t, ns - 16 * t, 0, size_t(D) * 2, kst + 16 * t * D, &ka_stride[t]);
        score_tiles<false>(ka, ka_stride, qts[g], D * 2, two, prefetch_next);
        store_scores(st + s0 * 32, two);
      }
      const int rt = std::min(RT - 32 * g, 32);
      softmax_superblock(c, kb, n, nk, rt, rss[g], st, pt);
      p_rows_and_rescale(pt, pr + 32 * g * kSuper, nsub, rt, rss[g], o + 32 * g * Dv, Dv);
    }
    // O[row][dv] += P . V, 32 columns at a time held in C tiles across the whole
    // superblock (one O load / store per kSuper keys, not per 32); the V pairs of each
    // 32-key step are staged just before the first group's tiles use them, and the later
    // groups reuse them. (Staging columns d + 32 during the tiles of d measured no better.)
    for (int64_t d = 0; d < Dv; d += 32) {
      prefetch_next();
      for (int g = 0; g < groups; ++g) {
        float* og = o + 32 * g * Dv;
        const uint16_t* pg = pr + 32 * g * kSuper;
        _tile_loadd(0, og + d, Dv * 4);
        _tile_loadd(1, og + d + 16, Dv * 4);
        if (two) {
          _tile_loadd(2, og + 16 * Dv + d, Dv * 4);
          _tile_loadd(3, og + 16 * Dv + d + 16, Dv * 4);
        }
        for (int sb = 0; sb < nsub; ++sb) {
          const int64_t s0 = int64_t(sb) * kSub;
          uint16_t* blo = stage + sb * kStageSub;
          uint16_t* bhi = blo + kStageSub / 2;
          for (int p = 0; g == 0 && p < kSub / 2; ++p) {
            const int64_t k0 = s0 + 2 * p, k1 = k0 + 1;
            if (q8) {
              const int8_t* a = k0 < n ? static_cast<const int8_t*>(v8[k0]) + d : reinterpret_cast<const int8_t*>(kZeroRow);
              const int8_t* b = k1 < n ? static_cast<const int8_t*>(v8[k1]) + d : nullptr;
              stage_pairs(a, b, blo + p * 32, bhi + p * 32);
              continue;
            }
            const uint16_t* a = k0 < n ? static_cast<const uint16_t*>(vpp[k0]) + d : kZeroRow;
            const uint16_t* b = k1 < n ? static_cast<const uint16_t*>(vpp[k1]) + d : nullptr;
            stage_pairs(a, b, blo + p * 32, bhi + p * 32);
          }
          _tile_loadd(6, blo, 64);
          _tile_loadd(7, bhi, 64);
          _tile_loadd(4, pg + s0, kSuper * 2);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if (two) {
            _tile_loadd(5, pg + 16 * kSuper + s0, kSuper * 2);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, og + d, Dv * 4);
        _tile_stored(1, og + d + 16, Dv * 4);
        if (two) {
          _tile_stored(2, og + 16 * Dv + d, Dv * 4);
          _tile_stored(3, og + 16 * Dv + d + 16, Dv * 4);
        }
      }
    }
  }
  _tile_release();
  from_pair_order(o, RT, Dv);
  alignas(64) float m[kAmxFlashRows], l[kAmxFlashRows];
  for (int g = 0; g < groups; ++g)
    for (int r = 0; r < 32; ++r) m[32 * g + r] = rss[g].mrow[r], l[32 * g + r] = rss[g].lrow[r];
  finish_rows(c, j, m, l, o);
}

}  // namespace
}  // namespace optx::attn_detail::amx

namespace optx::attn_detail {
const Kernels& kernels_amx() {
  static const Kernels k{amx::run_job_amx, true, kAmxFlashRows};
  return k;
}
}  // namespace optx::attn_detail
