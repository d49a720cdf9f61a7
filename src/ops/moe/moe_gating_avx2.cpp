// The routers' per-expert scores and top-k on AVX2 units (8 lanes): moe_gating_avx512.cpp's
// steps with AVX2's compares and blends in place of its masks. The generic unit's scalar
// std::exp cost ~17 ns per logit per thread; bench T = 16384, E = 64, top-6, 2 threads:
// see the moe PERF_LOG.md.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "ops/moe/moe_internal.h"
#include "simd/simd_avx2.h"

namespace optx::moe_detail {
namespace {

using V = simd::Avx2;

// The first min(n, 8) values from p as f32 (zeros above) / into p: plain loads and stores
// for whole vectors, simd::Avx2's tail forms for the last.
template <class T>
inline V::F load_n(const T* p, int64_t n) { return n >= V::W ? V::load(p) : V::load(p, int(n)); }
inline void store_n(float* p, V::F v, int64_t n) {
  if (n >= V::W) V::store(p, v);
  else V::store(p, v, int(n));
}
// x in lanes [0, n), `fill` above.
inline V::F load_or(const float* p, int64_t n, V::F fill) {
  return n >= V::W ? V::load(p) : _mm256_blendv_ps(fill, V::load(p, int(n)), _mm256_castsi256_ps(V::tail_mask(int(n))));
}
// Lane i all ones where bit i of `bits` is set.
inline __m256i bit_lanes(int bits) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits), bit), bit);
}
// moe.cpp's clamp_finite on 8 lanes: max_ps(x, lo) is lo for a NaN x, as x > lo ? x : lo.
inline V::F clamp_finite(V::F x) { return _mm256_min_ps(_mm256_max_ps(x, V::set1(-FLT_MAX)), V::set1(FLT_MAX)); }

void load_logits(const void* row, DType dt, int64_t E, float* logit) {
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    const V::F x = dt == DType::kF32 ? load_n(static_cast<const float*>(row) + e, n) : load_n(static_cast<const uint16_t*>(row) + e, n);
    store_n(logit + e, clamp_finite(x), n);
  }
}

void selection_scores(const float* score, const float* bias, int64_t E, float* sel) {
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    const V::F x = load_n(score + e, n);
    store_n(sel + e, clamp_finite(bias ? V::add(x, load_n(bias + e, n)) : x), n);
  }
}

// Lanes past E take -inf into the max (a 0 there would be the max of a row of logits below
// -87 and every exponential would underflow) and are left out of the sum.
void softmax_scores(const float* logit, int64_t E, float* score) {
  const V::F ninf = V::set1(-INFINITY);
  V::F m = ninf;
  for (int64_t e = 0; e < E; e += V::W) m = V::max(m, load_or(logit + e, E - e, ninf));
  const V::F mv = V::set1(V::reduce_max(m));
  V::F s = V::zero();
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    const V::F x = V::exp(V::sub(load_n(logit + e, n), mv));
    s = V::add(s, n == V::W ? x : _mm256_and_ps(x, _mm256_castsi256_ps(V::tail_mask(n))));
    store_n(score + e, x, n);
  }
  const V::F inv = V::set1(1.0f / V::reduce(s));
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    store_n(score + e, V::mul(load_n(score + e, n), inv), n);
  }
}

void sigmoid_scores(const float* logit, int64_t E, float* score) {
  const V::F one = V::set1(1.0f);
  for (int64_t e = 0; e < E; e += V::W) {
    const int n = int(std::min<int64_t>(V::W, E - e));
    store_n(score + e, V::div(one, V::add(one, V::exp(V::sub(V::zero(), load_n(logit + e, n))))), n);
  }
}

// As topk_avx512: k passes of a vector max over a local copy whose retired, ineligible and
// padding lanes hold -inf; the first lane equal to the max is taken (ties to the lower index).
void topk(const float* v, const bool* eligible, int64_t n, int64_t k, int32_t* out) {
  alignas(32) float w[kMaxExperts];
  const V::F ninf = V::set1(-INFINITY);
  for (int64_t e = 0; e < n; e += V::W) {
    V::F x = load_or(v + e, n - e, ninf);
    if (eligible) {  // 8 bools (bytes 0 / 1) widened to lanes; a tail bit by bit
      __m256i keep;
      if (n - e >= V::W) {
        keep = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(eligible + e)));
        keep = _mm256_cmpgt_epi32(keep, _mm256_setzero_si256());
      } else {
        int ok = 0;
        for (int64_t i = 0; i < n - e; ++i) ok |= eligible[e + i] ? 1 << i : 0;
        keep = bit_lanes(ok);
      }
      x = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(keep));
    }
    _mm256_store_ps(w + e, x);
  }
  // Per pass: the max over two chains of vector maxes, then the equal lanes of up to 64
  // experts gathered into one bit mask, whose lowest bit is the pick: no branch on where
  // the max lies (a search loop mispredicted on it every pass).
  const int64_t nv = (n + V::W - 1) / V::W;
  for (int64_t j = 0; j < k; ++j) {
    V::F m0 = ninf, m1 = ninf;
    int64_t b = 0;
    for (; b + 2 <= nv; b += 2) m0 = V::max(m0, _mm256_load_ps(w + b * V::W)), m1 = V::max(m1, _mm256_load_ps(w + (b + 1) * V::W));
    if (b < nv) m0 = V::max(m0, _mm256_load_ps(w + b * V::W));
    const V::F mv = V::set1(V::reduce_max(V::max(m0, m1)));
    for (int64_t c = 0; c < nv; c += 8) {
      uint64_t eq = 0;
      for (int64_t i = 0; i < 8 && c + i < nv; ++i)
        eq |= uint64_t(unsigned(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_load_ps(w + (c + i) * V::W), mv, _CMP_EQ_OQ)))) << (8 * i);
      if (!eq) continue;
      const int lane = __builtin_ctzll(eq);
      out[j] = int32_t(c * V::W + lane);
      // Retired with a whole-vector store: a 4-byte store of -inf under the next pass's
      // 32-byte load cannot be forwarded and stalled every pass.
      float* x = w + (c + lane / 8) * V::W;
      _mm256_store_ps(x, _mm256_blendv_ps(_mm256_load_ps(x), ninf, _mm256_castsi256_ps(bit_lanes(1 << (lane % 8)))));
      break;
    }
  }
}

}  // namespace

const GatingKernels& gating_kernels_avx2() {
  static const GatingKernels k{load_logits, selection_scores, softmax_scores, sigmoid_scores, topk};
  return k;
}

}  // namespace optx::moe_detail
