// The gating semantics written plainly, in double: the registry's "reference" entry for
// moe_gating_topk / moe_gating_topk_softmax (OPTX_IMPL can force it). Selection sorts
// (stable, so ties go to the lower id) where the kernels insert into a running top-k.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/moe/moe_internal.h"

namespace optx::moe_detail {
namespace {
// NaN selects last, +-inf as the largest finite values: what the kernels' clamp does.
double clamp_finite(double x) {
  const double lo = x > -double(FLT_MAX) ? x : -double(FLT_MAX);
  return lo < double(FLT_MAX) ? lo : double(FLT_MAX);
}
// The first k of idx by descending v, ties in idx's order.
std::vector<int> best(const std::vector<double>& v, std::vector<int> idx, int64_t k) {
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[size_t(a)] > v[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}
}  // namespace

Status gating_reference(const MoeGatingParams& p) {
  const int64_t T = p.logits.sizes[0], E = p.logits.sizes[1], k = p.topk_ids.sizes[1];
  const float* bias = p.bias.empty() ? nullptr : static_cast<const float*>(p.bias.data);
  const size_t n = static_cast<size_t>(E);
  std::vector<double> logit(n), score(n), sel(n);
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    int32_t* ids = static_cast<int32_t*>(p.topk_ids.data) + t * k;
    float* w = static_cast<float*>(p.topk_weights.data) + t * k;
    for (int64_t e = 0; e < E; ++e) logit[size_t(e)] = clamp_finite(load_f(p.logits, t * E + e));
    std::vector<double> wd(static_cast<size_t>(k));
    std::vector<int> pick;
    if (p.topk_then_softmax) {
      pick = best(logit, all, k);
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += (wd[size_t(j)] = std::exp(logit[size_t(pick[size_t(j)])] - logit[size_t(pick[0])]));
      for (auto& x : wd) x = x / s * p.routed_scaling_factor;
    } else {
      const double m = *std::max_element(logit.begin(), logit.end());
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        const double x = logit[size_t(e)];
        if (p.score == MoeScore::kSoftmax) sum += (score[size_t(e)] = std::exp(x - m));
        else if (p.score == MoeScore::kSigmoid) score[size_t(e)] = 1.0 / (1.0 + std::exp(-x));
        else score[size_t(e)] = std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x)));
      }
      if (p.score == MoeScore::kSoftmax)
        for (auto& x : score) x /= sum;
      for (int64_t e = 0; e < E; ++e) sel[size_t(e)] = clamp_finite(score[size_t(e)] + (bias ? double(bias[e]) : 0.0));
      std::vector<int> eligible = all;
      if (p.n_group > 1) {  // the topk_group best groups by their max or top-2 sum
        const int64_t gs = E / p.n_group;
        std::vector<double> gscore(static_cast<size_t>(p.n_group));
        std::vector<int> groups(static_cast<size_t>(p.n_group));
        std::iota(groups.begin(), groups.end(), 0);
        for (int64_t g = 0; g < p.n_group; ++g) {
          std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
          std::sort(v.rbegin(), v.rend());
          gscore[size_t(g)] = p.group_score == MoeGroupScore::kMax || gs == 1 ? v[0] : v[0] + v[1];
        }
        eligible.clear();
        std::vector<int> kept = best(gscore, groups, p.topk_group);
        std::sort(kept.begin(), kept.end());
        for (int g : kept)
          for (int64_t e = g * gs; e < (g + 1) * gs; ++e) eligible.push_back(int(e));
      }
      pick = best(sel, eligible, k);
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += (wd[size_t(j)] = score[size_t(pick[size_t(j)])]);
      const double scale = p.routed_scaling_factor / (p.renormalize && s > 0 ? s : 1.0);
      for (auto& x : wd) x *= scale;
    }
    for (int64_t j = 0; j < k; ++j) ids[j] = pick[size_t(j)], w[j] = float(wd[size_t(j)]);
  }
  return Status::Ok();
}

}  // namespace optx::moe_detail
