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
// lower index — the same order as moe.cpp's insertion scan. k passes of a vector max, each
// taking the first lane equal to the max and retiring it in a per-vector mask: ~10
// instructions per 16 experts per pass, against the scan's data-dependent branches (about
// k (1 + ln(n / k)) insertions of up to k moves each for random scores). Retiring by mask
// rather than by storing -inf into a copy keeps the next pass's vector loads clear of a
// scalar store (a store-forwarding stall per pass), and the eligibility mask comes from
// one byte test per 16 experts (it was a scalar loop over the bools). v must be finite
// (the routers clamp it): retired, ineligible and padding lanes are masked off, so they
// never tie with a candidate, and a NaN would match no lane.
void topk_avx512(const float* v, const bool* eligible, int64_t n, int64_t k, int32_t* out) {
  const V::F ninf = V::set1(-INFINITY);
  const int64_t nv = (n + V::W - 1) / V::W;
  __mmask16 live[kMaxExperts / 16];
  for (int64_t b = 0; b < nv; ++b) {
    live[b] = V::mask(int(std::min<int64_t>(V::W, n - b * V::W)));
    if (eligible) {
      const __m128i e8 = _mm_maskz_loadu_epi8(live[b], eligible + b * V::W);
      live[b] &= _mm_test_epi8_mask(e8, e8);
    }
  }
  for (int64_t j = 0; j < k; ++j) {
    V::F m = ninf;
    for (int64_t b = 0; b < nv; ++b) m = _mm512_mask_max_ps(m, live[b], m, _mm512_maskz_loadu_ps(live[b], v + b * V::W));
    const V::F mv = V::set1(V::reduce_max(m));
    for (int64_t b = 0; b < nv; ++b) {
      const __mmask16 eq = _mm512_mask_cmp_ps_mask(live[b], _mm512_maskz_loadu_ps(live[b], v + b * V::W), mv, _CMP_EQ_OQ);
      if (eq) {
        const int lane = __builtin_ctz(eq);
        out[j] = int32_t(b * V::W + lane);
        live[b] &= __mmask16(~(1u << lane));
        break;
      }
    }
  }
}

}  // namespace

const GatingKernels& gating_kernels_avx512() {
  static const GatingKernels k{load_logits_avx512, selection_scores_avx512, softmax_scores_avx512, sigmoid_scores_avx512, topk_avx512};
  return k;
}

}  // namespace optx::moe_detail
