// Attention job kernels for AVX512_BF16: the generic vector kernel and the few-row bf16
// decode kernel (attention_decode_inl.h), plus a vdpbf16ps job kernel for jobs of 9-96
// rows of one KV head (flash prefill up to 96, MLA decode up to 32; fewer where the
// few-row kernel cannot take them), bf16, D and Dv multiples of 16 (softcap, bias and mask
// in its softmax).
//
// The job kernel follows the AMX unit's superblock scheme (attention_pairs_inl.h) with zmm
// registers for tiles:
//   S^T   8 keys x 32 rows (16 accumulators; 8 keys x 16 rows x 2 halves of D when
//         R <= 16): per bf16 pair of D one Q^T load per 16 rows and one 4-byte broadcast
//         of each key's pair, straight from the cache row.
//   P . V 6 rows x 64 columns of O (24 accumulators) across the superblock's 64 key
//         pairs: 4 staged V-pair loads and 6 broadcasts of P pairs per 24 dot products;
//         V pairs staged once per 64-column chunk (16 KiB, in L1) for all row blocks.
// An i8 MLA latent is read as int8 by vpdpbusd (score_keys_q8), as the AMX unit reads it
// by TDPBSSD.
// Where vdpbf16ps retires at the FMA's rate (Zen 4 / 5) a dot product of bf16 pairs is
// twice the FLOPs of an f32 FMA and needs no widening; the generic kernel widens K and V
// to f32 first and did 98-108 GFLOP/s on flash S = 4096 / 8192 (Zen 5, two threads).
#include "simd/simd_avx512_bf16.h"

namespace optx::attn_detail::avx512_bf16 {
namespace {
using simd_type = simd::Avx512Bf16;
}
}  // namespace optx::attn_detail::avx512_bf16

#define OPTX_ISA_NS avx512_bf16
#include "ops/attention/attention_kernels_inl.h"
#include "ops/attention/attention_decode_inl.h"
#include "ops/attention/attention_pairs_inl.h"

namespace optx::attn_detail::avx512_bf16 {
namespace {

constexpr int kDpRows = kDpFlashRows;  // rows of a flash job (groups of 32)
// Pairs of D (scores) or keys (P . V) between two steps of the next superblock's
// prefetch stream (SpreadPrefetch): see run_job_dp.
constexpr int64_t kPfEveryPairs = 8;
constexpr int kDpGroups = kDpRows / 32;

// Where the score loop finds 8 keys' rows: a pointer each, or (a paged block of >= 8
// slots; BSND / BNSD prefill always) two base pointers and the stride in addressing
// modes. With 8 row pointers the general registers could not also hold the prefetch
// stream's state: GCC kept the pointers in xmm registers and moved one out per broadcast
// (Zen 4, alternating in one process: MLA decode, 16 rows, ctx 8k in L3 217 -> 206 ns per
// key per core, cold 249 -> 244, ctx 32k 256 -> 244; flash S = 4096, 32-row halves, BSND
// 223-239 -> 213-228 ms, BNSD 200 -> 191, S = 8192 869 -> 825). The 16 keys x 1 half
// tile before them kept 16 row pointers live and spilled them outright.
struct KeyPointers {
  const uint16_t* const* k;
  int64_t off = 0;  // bytes into each row
  OPTX_ALWAYS_INLINE const char* row(int i) const { return reinterpret_cast<const char*>(k[i]) + off; }
  OPTX_ALWAYS_INLINE void advance(int64_t bytes) { off += bytes; }
};
struct KeyStride {
  const char* b0;  // keys 0-3 at b0 + {0, 1, 2, 3} * sb, keys 4-7 at b4 + the same
  const char* b4;
  int64_t sb, s3;
  KeyStride(const char* base, int64_t stride) : b0(base), b4(base + 4 * stride), sb(stride), s3(3 * stride) {}
  OPTX_ALWAYS_INLINE const char* row(int i) const {
    const char* b = i < 4 ? b0 : b4;
    return (i & 3) == 3 ? b + s3 : b + (i & 3) * sb;
  }
  OPTX_ALWAYS_INLINE void advance(int64_t bytes) { b0 += bytes, b4 += bytes; }
};

// S^T of 8 keys against Q^T pairs qt ([D/2][32][2]) into st [key][32 rows]: both 16-row
// halves (kTwo: one broadcast per key and pair serves two dot products), or the first
// half alone, D's pairs then split even / odd into accumulators of their own (summed at
// the end) so 16 chains run and each broadcast is a fixed displacement. The prefetch
// stream steps once per kPfEveryPairs pairs of each chain.
template <bool kTwo, class Keys>
OPTX_ALWAYS_INLINE void score_keys(Keys keys, const uint16_t* qt, int64_t D, float* st, SpreadPrefetch& pf) {
  __m512 acc[8][2];
  for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const auto bc = [](const char* a) { return pair_bcast(reinterpret_cast<const uint16_t*>(a), 0); };
  constexpr int64_t kStep = kTwo ? 1 : 2;  // pairs of D per iteration
  for (int64_t p = 0; p < D / 2; p += kStep, keys.advance(4 * kStep)) {
    if (p % (kStep * kPfEveryPairs) == 0) pf.step();
    const __m512bh q0 = (__m512bh)_mm512_load_si512(qt + p * 64);
    const __m512bh q1 = (__m512bh)_mm512_load_si512(qt + p * 64 + (kTwo ? 32 : 64));
    for (int i = 0; i < 8; ++i) {
      const char* a = keys.row(i);
      const __m512bh k0 = bc(a);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], q0, k0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], q1, kTwo ? k0 : bc(a + 4));
    }
  }
  for (int i = 0; i < 8; ++i) {
    if constexpr (kTwo) _mm512_store_ps(st + i * 32, acc[i][0]), _mm512_store_ps(st + i * 32 + 16, acc[i][1]);
    else _mm512_store_ps(st + i * 32, _mm512_add_ps(acc[i][0], acc[i][1]));
  }
}

template <bool kTwo>
OPTX_ALWAYS_INLINE void score_keys(const uint16_t* const* k, int64_t stride, const uint16_t* qt, int64_t D, float* st,
                                   SpreadPrefetch& pf) {
  if (stride) score_keys<kTwo>(KeyStride(reinterpret_cast<const char*>(k[0]), stride), qt, D, st, pf);
  else score_keys<kTwo>(KeyPointers{k}, qt, D, st, pf);
}

// An i8 MLA latent read as int8 (vpdpbusd; the dot product takes u8 x s8): q's latent
// part in two int8 halves (quantize_q_i8x2, q ~ qs (h + l / 254)) stored as u8 quads
// h + 128, l + 128 ([L/4][32 rows][4], build_q8's layout), the keys' int8 quads broadcast
// as they sit in the cache. Each dot then carries 128 * sum(k) (key_sums_i8), taken off
// before the store, so the h and l scores are exact int32 as TDPBSSD's. Against the
// latent dequantised into staging (Zen 4, 16 heads, alternating in one process, ns per
// key per core): ctx 8k 285 -> 251, 32k 317 -> 258, ctx 2k in L3 262 -> 253; the bf16
// cache beside it 231 / 254 / 248.

// vpdpbusd on accumulators typed as its 32-bit lanes: GCC 12 kept _mm512_dpbusd_epi32's
// __m512i accumulators (64-bit lanes, cast to 32-bit ones and back in the intrinsic) in a
// second set of registers and copied them across on every iteration, spilling some
// (i8 / bf16 cache time in one process, three rounds: 1.08-1.17 -> 1.02-1.08).
typedef int32_t I32x16 __attribute__((vector_size(64)));
OPTX_ALWAYS_INLINE I32x16 dpbusd(I32x16 acc, I32x16 u8, I32x16 s8) {
#if defined(__clang__)
  return (I32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u8, (__m512i)s8);
#else
  return __builtin_ia32_vpdpbusd_v16si(acc, u8, s8);
#endif
}

template <class Keys>
OPTX_ALWAYS_INLINE int32_t quad_at(const Keys& keys, int i) {
  using i32_alias = int32_t __attribute__((may_alias, aligned(1)));
  return *reinterpret_cast<const i32_alias*>(keys.row(i));
}

// 128 * the sum of each of 8 keys' L int8 values (L % 64 == 0).
template <class Keys>
OPTX_ALWAYS_INLINE void key_sums_i8(const Keys& keys, int64_t L, int32_t* out) {
  const I32x16 k128 = (I32x16)_mm512_set1_epi8(char(0x80));  // as u8: 128
  for (int i = 0; i < 8; ++i) {
    const char* r = keys.row(i);
    I32x16 s = {};
    for (int64_t c = 0; c < L; c += 64) s = dpbusd(s, k128, (I32x16)_mm512_loadu_si512(r + c));
    out[i] = _mm512_reduce_add_epi32((__m512i)s);
  }
}

// Int8 scores of 8 keys over L: kTwo, one half of q (qa: h or l) for rows 0-31 into sa
// [key][32]; else rows 0-15 of both halves (qa: h, qb: l) into sa and sb. ksum from
// key_sums_i8. The prefetch stream steps once per kPfEveryPairs quads.
template <bool kTwo, class Keys>
OPTX_ALWAYS_INLINE void score_keys_i8(Keys keys, const uint8_t* qa, const uint8_t* qb, int64_t L, const int32_t* ksum,
                                      int32_t* sa, int32_t* sb, SpreadPrefetch& pf) {
  I32x16 acc[8][2];
  for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = I32x16{};
  for (int64_t p = 0; p < L / 4; ++p, keys.advance(4)) {
    if (p % kPfEveryPairs == 0) pf.step();
    const I32x16 a0 = (I32x16)_mm512_load_si512(qa + p * 128);
    const I32x16 a1 = (I32x16)_mm512_load_si512(kTwo ? qa + p * 128 + 64 : qb + p * 128);
    for (int i = 0; i < 8; ++i) {
      const I32x16 k = (I32x16)_mm512_set1_epi32(quad_at(keys, i));
      acc[i][0] = dpbusd(acc[i][0], a0, k);
      acc[i][1] = dpbusd(acc[i][1], a1, k);
    }
  }
  for (int i = 0; i < 8; ++i) {
    const __m512i c = _mm512_set1_epi32(ksum[i]);
    _mm512_store_si512(sa + i * 32, _mm512_sub_epi32((__m512i)acc[i][0], c));
    _mm512_store_si512((kTwo ? sa + 16 : sb) + i * 32, _mm512_sub_epi32((__m512i)acc[i][1], c));
  }
}

// The int8 latent scores (h and l, [2][kSuper][32] from sti) of 8 keys at k (rows: a
// pointer each, or one stride).
OPTX_ALWAYS_INLINE void score_keys_q8(const void* const* k, int64_t stride, bool two, const uint8_t* qh, const uint8_t* ql,
                                      int64_t L, int32_t* sh, int32_t* sl, SpreadPrefetch& pf) {
  const auto run = [&](auto keys) __attribute__((always_inline)) {
    alignas(64) int32_t ksum[8];
    key_sums_i8(keys, L, ksum);
    if (two) {
      score_keys_i8<true>(keys, qh, nullptr, L, ksum, sh, nullptr, pf);
      score_keys_i8<true>(keys, ql, nullptr, L, ksum, sl, nullptr, pf);
    } else {
      score_keys_i8<false>(keys, qh, ql, L, ksum, sh, sl, pf);
    }
  };
  if (stride) run(KeyStride(static_cast<const char*>(k[0]), stride));
  else run(KeyPointers{reinterpret_cast<const uint16_t* const*>(k)});
}

// O rows r0 .. r0 + NR (o: row stride Dv, at the chunk's first column) += P . V over
// npairs key pairs: pr [row][kSuper] bf16 P rows, vst [pair][NC zmm] staged V pairs.
template <int NR, int NC>
OPTX_ALWAYS_INLINE void pv_tile(float* o, int64_t Dv, const uint16_t* pr, const uint16_t* vst, int64_t npairs, SpreadPrefetch& pf) {
  __m512 acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_loadu_ps(o + r * Dv + 16 * c);
  for (int64_t p = 0; p < npairs; ++p) {
    if (p % kPfEveryPairs == 0) pf.step();
    __m512bh v[NC];
    for (int c = 0; c < NC; ++c) v[c] = (__m512bh)_mm512_load_si512(vst + (p * NC + c) * 32);
    for (int r = 0; r < NR; ++r) {
      const __m512bh pp = pair_bcast(pr + r * kSuper, p);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], v[c], pp);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + r * Dv + 16 * c, acc[r][c]);
}

// Rows r0 .. r0 + NR over the key pairs their 32-row groups reach, [pa[g], pz[g]) for
// group g (p = 0 elsewhere, so nothing is lost).
template <int NR, int NC>
OPTX_ALWAYS_INLINE void pv_block(float* o, int64_t Dv, const uint16_t* pr, const uint16_t* vst, const int64_t* pa, const int64_t* pz,
                                 int r0, SpreadPrefetch& pf) {
  int64_t a = INT64_MAX, z = 0;
  for (int g = r0 / 32; g <= (r0 + NR - 1) / 32; ++g)
    if (pz[g] > pa[g]) a = std::min(a, pa[g]), z = std::max(z, pz[g]);
  if (a < z) pv_tile<NR, NC>(o + r0 * Dv, Dv, pr + r0 * kSuper + 2 * a, vst + a * NC * 32, z - a, pf);
}

template <int NC>
void pv_rows(float* o, int64_t Dv, const uint16_t* pr, const uint16_t* vst, const int64_t* pa, const int64_t* pz, int rows,
             SpreadPrefetch& pf) {
  constexpr int kNR = 6;
  int r0 = 0;
  for (; r0 + kNR <= rows; r0 += kNR) pv_block<kNR, NC>(o, Dv, pr, vst, pa, pz, r0, pf);
  switch (rows - r0) {
    case 1: return pv_block<1, NC>(o, Dv, pr, vst, pa, pz, r0, pf);
    case 2: return pv_block<2, NC>(o, Dv, pr, vst, pa, pz, r0, pf);
    case 3: return pv_block<3, NC>(o, Dv, pr, vst, pa, pz, r0, pf);
    case 4: return pv_block<4, NC>(o, Dv, pr, vst, pa, pz, r0, pf);
    case 5: return pv_block<5, NC>(o, Dv, pr, vst, pa, pz, r0, pf);
    default: return;
  }
}

// The superblock's V pairs of columns d .. d + 16 * nc for keys 0 .. nk (rows of T: bf16,
// or an i8 latent's int8 values; keys past n zero) into vst [pair][nc zmm].
// nc = 1 (Dv's last 16 columns, bf16 only): the two 128-bit lanes' unpacks, so the zmm
// holds columns {0-3, 8-11, 4-7, 12-15} (from_pair_order).
template <class T>
OPTX_ALWAYS_INLINE void stage_v_pairs(const void* const* rows, int64_t n, int64_t nk, int64_t d, int nc, uint16_t* vst) {
  for (int64_t p = 0; p < nk / 2; ++p) {
    const T* a = static_cast<const T*>(rows[2 * p]) + d;
    const T* b = 2 * p + 1 < n ? static_cast<const T*>(rows[2 * p + 1]) + d : nullptr;
    uint16_t* dst = vst + p * nc * 32;
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (nc == 1) {
        const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
        const __m256i vb = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)) : _mm256_setzero_si256();
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst), _mm256_unpacklo_epi16(va, vb));
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 16), _mm256_unpackhi_epi16(va, vb));
        continue;
      }
    }
    stage_pairs(a, b, dst, dst + 32);
    if (nc == 4) stage_pairs(a + 32, b ? b + 32 : nullptr, dst + 64, dst + 96);
  }
}

void run_job_dp(const Config& c, const Job& j, float* scratch) {
  // The kernel's reach: D and Dv multiples of 16 (Q^T's last pairs and P . V's last 16
  // columns as tails: D = 80 ran the widening GEMM prefill at 0.42x D = 128's rate).
  // Few-row jobs the decode kernel cannot take (D off the 32 grid, a softcap / mask /
  // bias) run here rather than on the vector kernel: paged decode at D = 80, 32 / 8 heads,
  // from DRAM, old / new build back to back: B = 1 ctx 8k 6.5 -> 12.0 GB/s, B = 4 ctx 4k
  // 5.9 -> 15.2 (D = 128 beside: 22-23).
  if (!pair_kernel_takes(c, j, 16, kDpRows)) return run_job_bf16(c, j, scratch);
  const int R = j.nrows;
  // Flash jobs of 33-96 rows run as groups of 32 rows (each with its own Q^T, scores,
  // softmax state and P) that share each superblock's K / V reads and V staging: flash
  // S = 4096 / 8192 on Zen 5, two groups against one, -8 to -16% / -14 to -17%; on Zen 4
  // (32 KiB L1D, V staging 8% of the time) three against two -3 to -9% at S = 4096 in 7
  // of 8 alternating runs, -1 to -6% at 8192 (four: mixed).
  // kDpFlashRows (attention_internal.h, which sizes the scratch) bounds the groups.
  const int groups = (R + 31) / 32;
  const bool two = R > 16;
  const int RT = groups > 1 ? 32 * groups : two ? 32 : 16;  // rows of O and P (padded)
  const int64_t D = c.D, Dv = c.Dv;
  // Scratch (64-byte aligned pieces; job_scratch_floats' `dp` term): per group Q^T
  // [D/2][32][2], scores [kSuper keys][32 rows] f32, P^T [kSuper keys][32 rows]; then P
  // rows [RT][kSuper], V pairs [kSuper / 2][64 columns][2], O [RT][Dv] in pair order.
  uint16_t* qt[kDpGroups];
  float* st[kDpGroups];
  uint16_t* pt[kDpGroups];
  char* at = reinterpret_cast<char*>(scratch);
  for (int g = 0; g < groups; ++g) {
    qt[g] = reinterpret_cast<uint16_t*>(at), at += D * 32 * 2;
    st[g] = reinterpret_cast<float*>(at), at += kSuper * 32 * 4;
    pt[g] = reinterpret_cast<uint16_t*>(at), at += kSuper * 32 * 2;
  }
  uint16_t* pr = reinterpret_cast<uint16_t*>(at);
  uint16_t* vst = pr + RT * kSuper;
  float* o = reinterpret_cast<float*>(vst + kSuper * 64);

  std::memset(o, 0, sizeof(float) * size_t(RT * Dv));
  PairRows rs[kDpGroups];
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int g = 0; g < groups; ++g) {
    rs[g] = PairRows(c, j, 32 * g);
    build_qt(j, D, qt[g], 32 * g);
    lo = std::min(lo, rs[g].lo), hi = std::max(hi, rs[g].hi);
  }
  const void* kp[kSuper];
  const void* vp[kSuper];
  const void* kn[kSuper];
  const void* vn[kSuper];
  int64_t k_lines = (D * 2 + 63) / 64, v_lines = (Dv * 2 + 63) / 64;
  // An i8 MLA latent (K = latent + rope, V = the latent) is read as int8: its scores by
  // vpdpbusd against q in two int8 halves (score_keys_q8), the rope part's by the bf16
  // score loop from the rope rows, the token scale applied per score and folded into P's
  // columns (softmax_superblock), V pairs converted exactly from int8. kp / kn then hold
  // the latent rows, vp / vn the rope rows, and KvView's ring space this path's buffers:
  // q's halves, the int32 scores, build_q8's scratch.
  // GQA's i8 K and V planes (kv_cache_write's layout: speculative decoding's 9-32 rows per
  // KV head) go the same way with no rope part: K's scores by vpdpbusd, V pairs from V's
  // int8 rows, V's token scale folded into P (kp / kn: K rows, vp / vn: V rows). Dequantised
  // into staging by rows() they ran at 0.58x the bf16 cache's tokens/s (Sq = 3 / 4, 32 / 8
  // heads, ctx 8k, Zen 4). Any other i8 cache is dequantised into that ring by rows().
  const I8Kv& x8 = j.kv.i8;
  const int64_t L = x8.k_dim, RD = x8.rope_dim;
  const size_t q8_bytes = size_t(64 * L) + size_t(2 * kSuper * 32 * 4) + size_t(64 * L);
  const bool q8_fits = groups == 1 && x8.k && L % 64 == 0 && q8_bytes <= I8Kv::stage_bytes(x8.k_width(), x8.v ? x8.v_width() : 0, true);
  const bool lat8 = q8_fits && !x8.v && L == Dv && RD > 0;
  // Dv % 32 == 0 for int8 V (as lat8's Dv = L, a multiple of 64): P . V stages int8 V pairs
  // 32 columns at a time, so a 16-column tail would read 16 bytes past each V row.
  const bool kv8 = q8_fits && x8.v && L == D && x8.v_dim == Dv && Dv % 32 == 0 && RD == 0;
  const bool q8 = lat8 || kv8;
  const bool i8 = x8.k != nullptr && !q8;  // rows dequantised into the staging ring by rows()
  uint8_t* q8h = nullptr;
  uint8_t* q8l = nullptr;
  int32_t* sti = nullptr;  // [2][kSuper keys][32 rows]: the h and l scores
  alignas(64) float qs[32], sk[kSuper], sk_next[kSuper], sv[kSuper], sv_next[kSuper];
  if (q8) {
    q8h = x8.stage;
    q8l = q8h + 32 * L;
    sti = reinterpret_cast<int32_t*>(q8l + 32 * L);
    build_q8(j, L, reinterpret_cast<int8_t*>(q8h), reinterpret_cast<int8_t*>(q8l), qs, reinterpret_cast<int8_t*>(sti + 2 * kSuper * 32), 0x80);
    k_lines = (L + 63) / 64, v_lines = kv8 ? (Dv + 63) / 64 : (RD * 2 + 63) / 64;  // the stream's int8 K / latent, V / rope lines
  }
  const auto fetch = [&](int64_t j0, int64_t cnt) {
    if (kv8) j.kv.planes(j0, cnt, kn, vn, sk_next, sv_next, DequantRow{});
    else if (lat8) j.kv.sources(j0, cnt, true, kn, vn, sk_next, DequantRow{});
    else j.kv.rows(j0, cnt, true, kn, vn, DequantRow{});
  };
  if (lo < hi) fetch(lo, std::min<int64_t>(kSuper, hi - lo));
  for (int64_t kb = lo; kb < hi; kb += kSuper) {
    const int64_t n = std::min<int64_t>(kSuper, hi - kb);
    const int nsub = int((n + kSub - 1) / kSub);
    const int64_t nk = int64_t(nsub) * kSub;  // keys the P rows cover; p = 0 past n
    for (int64_t k = 0; k < nk; ++k) {
      kp[k] = k < n ? kn[k] : kZeroRow;
      vp[k] = k < n ? vn[k] : kZeroRow;
      if (q8) sk[k] = k < n ? sk_next[k] : 0.0f;
      if (kv8) sv[k] = k < n ? sv_next[k] : 0.0f;
    }
    const int64_t n_next = std::max<int64_t>(0, std::min<int64_t>(kSuper, hi - kb - kSuper));
    if (n_next) fetch(kb + kSuper, n_next);
    if (rs[0].has_mask && masks_hide(j, kb, n)) continue;
    // The next superblock goes to L2 during this one (from the cache itself; an i8
    // cache's rows were just dequantised, nothing to fetch): decode streams each row
    // once, K and V. Prefill takes the next K rows only (its V: v_pf below). A head's K
    // serves many query tiles from L2 / L3, but in BSND each row sits on a page of its own
    // (16 heads x 128 bf16 = 4 KiB a token), and the hardware prefetchers, which stop at
    // page edges, fetched none of it ahead. Flash, 16 heads, Zen 4, `optx bench` rows with
    // the old and new build back to back: S = 4096 199.0 / 189.8 -> 188.8 / 187.6 ms, S =
    // 8192 901 / 807 -> 747 / 757 (BNSD in a driver +0-1%; GQA 32 / 8 and D = 192 / 128
    // -2 to -4% time, B = 8 S = 512 level). Its V rows as well measured the same.
    const bool v_apart = n_next > 0 && vn[0] != kn[0];
    // The stream advances every kPfEveryPairs pairs inside the score and P . V loops, a few
    // lines at a time: one burst per 8-key score call (~58 lines for MLA) filled the
    // core's miss buffers and the dot products waited behind it, so memory and compute
    // took turns (Zen 4, MLA B = 1, two threads, alternating in one process: ctx 8k
    // 280-291 -> 241-252 ns per key per core, ctx 32k 286-292 -> 250-252; flash level).
    // Each group's keys here, [ka, kz) on the 8-key grid: its rows' causal / window reach,
    // where the job's is the union of its groups' (a 96-row job's groups sit 32 positions
    // apart). Scores and P . V stay inside it; P is 0 outside, and the softmax masks the
    // keys whose scores were not computed (the group's edge rules cover them). MHA with a
    // 128-key window (96-row jobs, D = 128): ~30% fewer dot products; causal diagonal
    // blocks a few percent.
    int64_t ka[kDpGroups], kz[kDpGroups], pa[kDpGroups], pz[kDpGroups], score_calls = 0, kmax = 0;
    for (int g = 0; g < groups; ++g) {
      const int64_t a = std::clamp<int64_t>(rs[g].lo - kb, 0, n), z = std::clamp<int64_t>(rs[g].hi - kb, 0, n);
      ka[g] = a < z ? a / 8 * 8 : 0, kz[g] = a < z ? (z + 7) / 8 * 8 : 0;
      pa[g] = ka[g] / 2, pz[g] = kz[g] / 2;
      score_calls += (kz[g] - ka[g]) / 8, kmax = std::max(kmax, kz[g]);
    }
    const int64_t score_steps = q8 ? score_calls * ((two ? RD / 2 : RD / 4) / kPfEveryPairs + (two ? 2 : 1) * (L / 4 / kPfEveryPairs))
                                   : score_calls * ((two ? D / 2 : D / 4) / kPfEveryPairs);
    const int64_t pv_steps = (Dv + 63) / 64 * ((R + 5) / 6) * (kmax / 2 / kPfEveryPairs);
    SpreadPrefetch pf(kn, vn, k_lines, v_apart && c.kv_once ? v_lines : 0, i8 ? 0 : n_next, score_steps + pv_steps);
    // Prefill reads a head's K / V from L2 / L3 (they serve many query tiles): this
    // superblock's V rows go to L2 during its scores, ahead of the staging loads.
    SpreadPrefetch v_pf(vp, vp, v_lines, 0, c.kv_once ? 0 : n, score_calls);

    // Each 8-key step's row stride (0: rows apart), the same for every group.
    int64_t stride[kSuper / 8], rope_stride[kSuper / 8];
    for (int64_t k0 = 0; k0 < nk; k0 += 8) {
      if (!uniform_rows<8>(kp + k0, nk - k0, &stride[k0 / 8])) stride[k0 / 8] = 0;
      if (lat8 && !uniform_rows<8>(vp + k0, nk - k0, &rope_stride[k0 / 8])) rope_stride[k0 / 8] = 0;
    }
    const uint16_t* const* keys = reinterpret_cast<const uint16_t* const*>(kp);
    for (int g = 0; g < groups; ++g) {
      for (int64_t k0 = ka[g]; k0 < kz[g]; k0 += 8) {
        v_pf.step();
        if (q8) {  // the rope part into st, the latent's (K's) h and l into sti
          const uint16_t* const* rope = reinterpret_cast<const uint16_t* const*>(vp);
          const uint16_t* qr = qt[g] + (L / 2) * 64;
          if (lat8 && two) score_keys<true>(rope + k0, rope_stride[k0 / 8], qr, RD, st[g] + k0 * 32, pf);
          else if (lat8) score_keys<false>(rope + k0, rope_stride[k0 / 8], qr, RD, st[g] + k0 * 32, pf);
          score_keys_q8(kp + k0, stride[k0 / 8], two, q8h, q8l, L, sti + k0 * 32, sti + (kSuper + k0) * 32, pf);
          continue;
        }
        if (two) score_keys<true>(keys + k0, stride[k0 / 8], qt[g], D, st[g] + k0 * 32, pf);
        else score_keys<false>(keys + k0, stride[k0 / 8], qt[g], D, st[g] + k0 * 32, pf);
      }
      const int rt = std::min(RT - 32 * g, 32);
      softmax_superblock(c, kb, n, nk, rt, rs[g], st[g], pt[g], q8 ? Int8Scores{sti, qs, sk, kv8 ? sv : sk, lat8} : Int8Scores{});
      p_rows_and_rescale(pt[g], pr + 32 * g * kSuper, nsub, rt, rs[g], o + 32 * g * Dv, Dv);
    }

    // O += P . V, 64 columns at a time (then 32, then 16 for what is left): the chunk's V
    // pairs for all nk keys are staged once, then every 6-row block runs over them.
    for (int64_t d = 0; d < Dv;) {
      const int nc = Dv - d >= 64 ? 4 : Dv - d >= 32 ? 2 : 1;
      if (q8) stage_v_pairs<int8_t>(lat8 ? kp : vp, n, kmax, d, nc, vst);  // V: the int8 values, exactly (nc >= 2: Dv % 32 == 0)
      else stage_v_pairs<uint16_t>(vp, n, kmax, d, nc, vst);
      if (nc == 4) pv_rows<4>(o + d, Dv, pr, vst, pa, pz, R, pf);
      else if (nc == 2) pv_rows<2>(o + d, Dv, pr, vst, pa, pz, R, pf);
      else pv_rows<1>(o + d, Dv, pr, vst, pa, pz, R, pf);
      d += 16 * nc;
    }
  }
  from_pair_order(o, RT, Dv);
  alignas(64) float m[kDpRows], l[kDpRows];
  for (int g = 0; g < groups; ++g)
    for (int r = 0; r < 32; ++r) m[32 * g + r] = rs[g].mrow[r], l[32 * g + r] = rs[g].lrow[r];
  finish_rows(c, j, m, l, o);
}

}  // namespace
}  // namespace optx::attn_detail::avx512_bf16

namespace optx::attn_detail {
const Kernels& kernels_avx512_bf16() {
  static const Kernels k{avx512_bf16::run_job_dp, true, avx512_bf16::kDpRows};
  return k;
}
}  // namespace optx::attn_detail
