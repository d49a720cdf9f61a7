// Attention job kernels for AVX512_BF16: the generic vector kernel and the few-row bf16
// decode kernel (attention_decode_inl.h), plus a vdpbf16ps job kernel for jobs of 9-96
// rows of one KV head (flash prefill up to 96, MLA decode up to 32), bf16, D and Dv
// multiples of 32, no softcap / bias / mask tensor.
//
// The job kernel follows the AMX unit's superblock scheme (attention_pairs_inl.h) with zmm
// registers for tiles:
//   S^T   8 keys x 32 rows (16 accumulators; 8 keys x 16 rows x 2 halves of D when
//         R <= 16): per bf16 pair of D one Q^T load per 16 rows and one 4-byte broadcast
//         of each key's pair, straight from the cache row.
//   P . V 6 rows x 64 columns of O (24 accumulators) across the superblock's 64 key
//         pairs: 4 staged V-pair loads and 6 broadcasts of P pairs per 24 dot products;
//         V pairs staged once per 64-column chunk (16 KiB, in L1) for all row blocks.
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

template <int NC>
void pv_rows(float* o, int64_t Dv, const uint16_t* pr, const uint16_t* vst, int64_t npairs, int rows, SpreadPrefetch& pf) {
  constexpr int kNR = 6;
  int r0 = 0;
  for (; r0 + kNR <= rows; r0 += kNR) pv_tile<kNR, NC>(o + r0 * Dv, Dv, pr + r0 * kSuper, vst, npairs, pf);
  float* ob = o + r0 * Dv;
  const uint16_t* pb = pr + r0 * kSuper;
  switch (rows - r0) {
    case 1: return pv_tile<1, NC>(ob, Dv, pb, vst, npairs, pf);
    case 2: return pv_tile<2, NC>(ob, Dv, pb, vst, npairs, pf);
    case 3: return pv_tile<3, NC>(ob, Dv, pb, vst, npairs, pf);
    case 4: return pv_tile<4, NC>(ob, Dv, pb, vst, npairs, pf);
    case 5: return pv_tile<5, NC>(ob, Dv, pb, vst, npairs, pf);
    default: return;
  }
}

void run_job_dp(const Config& c, const Job& j, float* scratch) {
  if (!supported(c, j) || j.groups > 1 || j.nrows <= kDecodeRows || j.nrows > kDpRows) return run_job_bf16(c, j, scratch);
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
  const int64_t k_lines = (D * 2 + 63) / 64, v_lines = (Dv * 2 + 63) / 64;
  const bool i8 = j.kv.i8.k != nullptr;  // rows dequantised into the staging ring by rows()
  if (lo < hi) j.kv.rows(lo, std::min<int64_t>(kSuper, hi - lo), true, kn, vn, DequantRow{});
  for (int64_t kb = lo; kb < hi; kb += kSuper) {
    const int64_t n = std::min<int64_t>(kSuper, hi - kb);
    const int nsub = int((n + kSub - 1) / kSub);
    const int64_t nk = int64_t(nsub) * kSub;  // keys the P rows cover; p = 0 past n
    for (int64_t k = 0; k < nk; ++k) {
      kp[k] = k < n ? kn[k] : kZeroRow;
      vp[k] = k < n ? vn[k] : kZeroRow;
    }
    const int64_t n_next = std::max<int64_t>(0, std::min<int64_t>(kSuper, hi - kb - kSuper));
    if (n_next) j.kv.rows(kb + kSuper, n_next, true, kn, vn, DequantRow{});
    // Decode streams each row once: the next superblock goes to L2 during this one (from
    // the cache itself; an i8 cache's rows were just dequantised, nothing to fetch).
    const bool v_apart = n_next > 0 && vn[0] != kn[0];
    // The stream advances every kPfEveryPairs pairs inside the score and P . V loops, a few
    // lines at a time: one burst per 8-key score call (~58 lines for MLA) filled the
    // core's miss buffers and the dot products waited behind it, so memory and compute
    // took turns (Zen 4, MLA B = 1, two threads, alternating in one process: ctx 8k
    // 280-291 -> 241-252 ns per key per core, ctx 32k 286-292 -> 250-252; flash level).
    const int64_t score_calls = groups * nk / 8;
    const int64_t score_steps = score_calls * ((two ? D / 2 : D / 4) / kPfEveryPairs);
    const int64_t pv_steps = (Dv + 63) / 64 * ((R + 5) / 6) * (nk / 2 / kPfEveryPairs);
    SpreadPrefetch pf(kn, vn, k_lines, v_apart ? v_lines : 0, c.kv_once && !i8 ? n_next : 0, score_steps + pv_steps);
    // Prefill reads a head's K / V from L2 / L3 (they serve many query tiles): this
    // superblock's V rows go to L2 during its scores, ahead of the staging loads.
    SpreadPrefetch v_pf(vp, vp, v_lines, 0, c.kv_once ? 0 : n, score_calls);

    // Each 8-key step's row stride (0: rows apart), the same for every group.
    int64_t stride[kSuper / 8];
    for (int64_t k0 = 0; k0 < nk; k0 += 8)
      if (!uniform_rows<8>(kp + k0, nk - k0, &stride[k0 / 8])) stride[k0 / 8] = 0;
    const uint16_t* const* keys = reinterpret_cast<const uint16_t* const*>(kp);
    for (int g = 0; g < groups; ++g) {
      for (int64_t k0 = 0; k0 < nk; k0 += 8) {
        v_pf.step();
        if (two) score_keys<true>(keys + k0, stride[k0 / 8], qt[g], D, st[g] + k0 * 32, pf);
        else score_keys<false>(keys + k0, stride[k0 / 8], qt[g], D, st[g] + k0 * 32, pf);
      }
      const int rt = std::min(RT - 32 * g, 32);
      softmax_superblock(c, kb, n, nk, rt, rs[g], st[g], pt[g]);
      p_rows_and_rescale(pt[g], pr + 32 * g * kSuper, nsub, rt, rs[g], o + 32 * g * Dv, Dv);
    }

    // O += P . V, 64 columns at a time (32 for a last odd chunk): the chunk's V pairs for
    // all nk keys are staged once, then every 6-row block runs over them.
    for (int64_t d = 0; d < Dv; d += 64) {
      const int nc = Dv - d >= 64 ? 4 : 2;
      for (int64_t p = 0; p < nk / 2; ++p) {
        const uint16_t* a = static_cast<const uint16_t*>(vp[2 * p]) + d;
        const uint16_t* b = 2 * p + 1 < n ? static_cast<const uint16_t*>(vp[2 * p + 1]) + d : nullptr;
        uint16_t* dst = vst + p * nc * 32;
        stage_pairs(a, b, dst, dst + 32);
        if (nc == 4) stage_pairs(a + 32, b ? b + 32 : nullptr, dst + 64, dst + 96);
      }
      if (nc == 4) pv_rows<4>(o + d, Dv, pr, vst, nk / 2, R, pf);
      else pv_rows<2>(o + d, Dv, pr, vst, nk / 2, R, pf);
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
