// The routers' per-expert scores with AVX-512: the vector exp of simd::Avx512 (relative
// error < 2e-7) over 16 experts at a time. The generic unit's scalar std::exp cost ~17 ns
// per logit per thread (E = 64: ~1 us of every token); selection stays in moe.cpp.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "ops/moe/moe_internal.h"
#include "simd/simd_avx512.h"

namespace optx::moe_detail {
namespace {

using V = simd::Avx512;

// moe.cpp's clamp_finite on 16 lanes: max_ps(x, lo) is lo for a NaN x, as x > lo ? x : lo.
inline V::F clamp_finite(V::F x) { return _mm512_min_ps(_mm512_max_ps(x, V::set1(-FLT_MAX)), V::set1(FLT_MAX)); }

// A row of logits (f32 or bf16) as f32, clamped. The generic unit's scalar clamps compile
// to compares and branches: 10-30% of the router (T = 16384, E = 64) when this path ran them.
void load_logits_avx512(const void* row, DType dt, int64_t E, float* logit) {
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    const V::F x = dt == DType::kBF16 ? V::load(static_cast<const uint16_t*>(row) + e, n) : V::load(static_cast<const float*>(row) + e, n);
    V::store(logit + e, clamp_finite(x), n);
  }
}

// sel[e] = clamp(score[e] + bias[e]); bias may be null.
void selection_scores_avx512(const float* score, const float* bias, int64_t E, float* sel) {
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    const V::F x = V::load(score + e, n);
    V::store(sel + e, clamp_finite(bias ? V::add(x, V::load(bias + e, n)) : x), n);
  }
}

// score[e] = softmax(logit)[e]: max, exponentials and their sum, then one scale. Lanes
// past E load -inf for the max: a 0 there would be the max of a row of logits below -87
// (the routers' -FLT_MAX for NaN or -inf ones), every exponential would underflow to 0
// and the scores come out 0 / 0.
void softmax_scores_avx512(const float* logit, int64_t E, float* score) {
  const V::F ninf = V::set1(-INFINITY);
  V::F m = ninf;
  for (int64_t e = 0; e < E; e += V::W)
    m = V::max(m, _mm512_mask_loadu_ps(ninf, V::mask(int(std::min<int64_t>(V::W, E - e))), logit + e));
  const V::F mv = V::set1(V::reduce_max(m));
  V::F s = V::zero();
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    // Lanes past E load 0 and would add e^(0 - m): masked out of the sum.
    const V::F x = V::exp(V::sub(V::load(logit + e, n), mv));
    s = _mm512_mask_add_ps(s, V::mask(n), s, x);
    V::store(score + e, x, n);
  }
  const V::F inv = V::set1(1.0f / V::reduce(s));
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    V::store(score + e, V::mul(V::load(score + e, n), inv), n);
  }
}

// score[e] = 1 / (1 + e^-logit[e]).
void sigmoid_scores_avx512(const float* logit, int64_t E, float* score) {
  const V::F one = V::set1(1.0f);
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    V::store(score + e, V::div(one, V::add(one, V::exp(V::sub(V::zero(), V::load(logit + e, n))))), n);
  }
}

// The k largest of v[0..n) among eligible entries (null: all), descending, ties to the
// lower index — the same order as moe.cpp's insertion scan. Each entry becomes one u64
// key: the score's bits in an unsigned order (sign flipped, or all bits of a negative)
// above the complement of its index, so a larger key is a larger score, or an equal one
// at a lower index; ineligible and padding entries keep only the index part, below every
// eligible key. Pass j is a max over the keys below pass j - 1's: no lane search, no
// branch on the data. The previous scan (a masked float max per pass, then a compare per
// 16 experts and a branch on which one held it, mispredicted about every other pass) kept
// each token's passes serial: T = 16384, 2 threads, moe_gating_topk_softmax E = 64 / 160
// / 256 1.55x / 1.27x / 1.15x, the DeepSeek-V3 router (E = 256, 8 groups) 1.05x, the
// same ids. v must be finite (the routers clamp it); the eligibility mask comes from one
// byte test per 16 experts, and blocks of 16 with none eligible get no keys (the groups a
// group-limited router cut: V3 router 1.21x, V2 1.13x more).
void topk_avx512(const float* v, const bool* eligible, int64_t n, int64_t k, int32_t* out) {
  alignas(64) uint64_t keys[kMaxExperts];
  const int64_t nv = (n + V::W - 1) / V::W;
  int64_t kv = 0;  // key vectors kept: 16-entry blocks with no eligible entry are left out
  const __m512i sign = _mm512_set1_epi32(int(0x80000000u));
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t b = 0; b < nv; ++b) {
    __mmask16 live = V::mask(int(std::min<int64_t>(V::W, n - b * V::W)));
    if (eligible) {
      const __m128i e8 = _mm_maskz_loadu_epi8(live, eligible + b * V::W);
      live &= _mm_test_epi8_mask(e8, e8);
      if (!live) continue;  // a group-limited router's cut groups
    }
    // + 0: -0 becomes +0, so the two zeros tie (and break by index) as floats do.
    const __m512i u = _mm512_castps_si512(_mm512_add_ps(_mm512_maskz_loadu_ps(live, v + b * V::W), V::zero()));
    const __m512i ord = _mm512_maskz_xor_epi32(live, u, _mm512_or_si512(_mm512_srai_epi32(u, 31), sign));
    const __m512i nidx = _mm512_andnot_si512(_mm512_add_epi32(lane, _mm512_set1_epi32(int(b * V::W))), _mm512_set1_epi32(-1));
    // (~index, order) dword pairs as u64 keys; which of the 16 entries lands in which
    // half does not matter to a max.
    _mm512_store_si512(keys + 8 * kv, _mm512_unpacklo_epi32(nidx, ord));
    _mm512_store_si512(keys + 8 * kv + 8, _mm512_unpackhi_epi32(nidx, ord));
    kv += 2;
  }
  __m512i below = _mm512_set1_epi64(-1);
  for (int64_t j = 0; j < k; ++j) {
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;  // two chains
    for (int64_t q = 0; q < kv; q += 2) {
      const __m512i x0 = _mm512_load_si512(keys + 8 * q), x1 = _mm512_load_si512(keys + 8 * q + 8);
      m0 = _mm512_mask_max_epu64(m0, _mm512_cmplt_epu64_mask(x0, below), m0, x0);
      m1 = _mm512_mask_max_epu64(m1, _mm512_cmplt_epu64_mask(x1, below), m1, x1);
    }
    const uint64_t best = _mm512_reduce_max_epu64(_mm512_max_epu64(m0, m1));
    if (best >> 32 == 0) break;  // no eligible entry left (callers ask for at most as many)
    out[j] = int32_t(~uint32_t(best));
    below = _mm512_set1_epi64(int64_t(best));
  }
}

// Group scores of the group-limited routers (GatingKernels::group_scores). Lanewise, a
// group's chunks of 16 keep their largest (a) and second largest (b) value; the group's
// largest is a's max, and its second the max of a with the first lane holding that max
// replaced by b's lane there — the scalar loop's pair, a value twice where it occurs
// twice. That loop's two data-dependent branches per expert mispredicted on random
// scores (DeepSeek-V3, E = 256 in 8 groups: about half the router's time).
void group_scores_avx512(const float* sel, int64_t E, int64_t n_group, bool top2, double* out) {
  const int64_t gs = E / n_group;
  const V::F ninf = V::set1(-INFINITY);
  for (int64_t g = 0; g < n_group; ++g) {
    V::F a = ninf, b = ninf;
    for (int64_t e = 0; e < gs; e += V::W) {
      const V::F x = _mm512_mask_loadu_ps(ninf, V::mask(int(std::min<int64_t>(V::W, gs - e))), sel + g * gs + e);
      b = V::max(b, _mm512_min_ps(a, x));
      a = V::max(a, x);
    }
    const float top = V::reduce_max(a);
    if (!top2) {
      out[g] = top;
      continue;
    }
    const __mmask16 at = _mm512_cmp_ps_mask(a, V::set1(top), _CMP_EQ_OQ);
    const float second = V::reduce_max(_mm512_mask_mov_ps(a, __mmask16(at & -at), b));
    out[g] = double(top) + double(second);
  }
}

}  // namespace

const GatingKernels& gating_kernels_avx512() {
  static const GatingKernels k{load_logits_avx512, selection_scores_avx512, softmax_scores_avx512, sigmoid_scores_avx512, topk_avx512,
                               group_scores_avx512};
  return k;
}

}  // namespace optx::moe_detail
