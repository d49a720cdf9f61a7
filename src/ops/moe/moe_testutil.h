// Independent references for the MoE family (double precision, plain loops, std::sort for
// selection) shared by moe_test.cpp and `optx verify`.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "optx/moe.h"

namespace optx::moe_testutil {

// Selected expert ids (descending score, ties to the lower id) and weights for one token.
inline void gating_ref(const std::vector<double>& logits, const std::vector<double>& bias, const MoeGatingParams& p, int64_t k,
                       std::vector<int>& ids, std::vector<double>& w) {
  const int64_t E = int64_t(logits.size());
  std::vector<double> score(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
  auto order = [&](const std::vector<double>& v, std::vector<int> idx) {
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[size_t(a)] > v[size_t(b)]; });
    return idx;
  };
  std::vector<int> all(static_cast<size_t>(E));
  std::iota(all.begin(), all.end(), 0);
  if (p.topk_then_softmax) {
    const std::vector<int> o = order(logits, all);
    ids.assign(o.begin(), o.begin() + k);
    double m = logits[size_t(ids[0])], s = 0;
    w.resize(size_t(k));
    for (int64_t j = 0; j < k; ++j) s += (w[size_t(j)] = std::exp(logits[size_t(ids[size_t(j)])] - m));
    for (auto& x : w) x = x / s * p.routed_scaling_factor;
    return;
  }
  if (p.score == MoeScore::kSoftmax) {
    double m = *std::max_element(logits.begin(), logits.end()), s = 0;
    for (int64_t e = 0; e < E; ++e) s += (score[size_t(e)] = std::exp(logits[size_t(e)] - m));
    for (auto& x : score) x /= s;
  } else if (p.score == MoeScore::kSigmoid) {
    for (int64_t e = 0; e < E; ++e) score[size_t(e)] = 1.0 / (1.0 + std::exp(-logits[size_t(e)]));
  } else {
    for (int64_t e = 0; e < E; ++e) score[size_t(e)] = std::sqrt(std::log1p(std::exp(logits[size_t(e)])));
  }
  for (int64_t e = 0; e < E; ++e) sel[size_t(e)] = score[size_t(e)] + (bias.empty() ? 0.0 : bias[size_t(e)]);
  std::vector<int> cand = all;
  if (p.n_group > 1) {
    const int64_t gs = E / p.n_group;
    std::vector<double> gscore(static_cast<size_t>(p.n_group));
    for (int64_t g = 0; g < p.n_group; ++g) {
      std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      gscore[size_t(g)] = p.group_score == MoeGroupScore::kMax ? v[0] : v[0] + (gs > 1 ? v[1] : 0.0);
    }
    std::vector<int> gid(static_cast<size_t>(p.n_group));
    std::iota(gid.begin(), gid.end(), 0);
    const std::vector<int> go = order(gscore, gid);
    cand.clear();
    for (int e = 0; e < E; ++e)
      if (std::find(go.begin(), go.begin() + p.topk_group, e / gs) != go.begin() + p.topk_group) cand.push_back(e);
  }
  const std::vector<int> o = order(sel, cand);
  ids.assign(o.begin(), o.begin() + k);
  w.resize(size_t(k));
  double s = 0;
  for (int64_t j = 0; j < k; ++j) s += (w[size_t(j)] = score[size_t(ids[size_t(j)])]);
  for (auto& x : w) x = x * p.routed_scaling_factor / (p.renormalize && s > 0 ? s : 1.0);
}

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace optx::moe_testutil
