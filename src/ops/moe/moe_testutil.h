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

// One DeepSeek MoE layer, weights as plain row-major float arrays (the exact values the op
// was given, after any bf16 rounding). shared_gate_up / shared_down may be null.
struct MoeLayerRef {
  int64_t H = 0, E = 0, k = 0, I = 0, Is = 0;
  const float* router = nullptr;          // [E, H]
  const float* bias = nullptr;            // [E] or null
  const float* gate_up = nullptr;         // [E, 2I, H]
  const float* down = nullptr;            // [E, H, I]
  const float* shared_gate_up = nullptr;  // [2Is, H]
  const float* shared_down = nullptr;     // [H, Is]
  MoeGatingParams gating;                 // score, groups, renormalize, routed_scaling_factor
};

// out[0..H) for one token x[0..H), in double, as the composition of the reference ops:
// logits = x . router^T -> gating_ref -> sum_j w_j * down_e(silu(gate_e x) * up_e x)
// + shared MLP. No rounding of the intermediates (a bf16 pipeline rounds h and y; the
// caller's tolerance covers that).
inline void moe_layer_ref(const MoeLayerRef& m, const double* x, double* out) {
  const int64_t H = m.H;
  std::vector<double> logits(static_cast<size_t>(m.E), 0.0);
  for (int64_t e = 0; e < m.E; ++e)
    for (int64_t h = 0; h < H; ++h) logits[size_t(e)] += x[h] * m.router[e * H + h];
  std::vector<double> bias;
  if (m.bias) bias.assign(m.bias, m.bias + m.E);
  std::vector<int> ids;
  std::vector<double> w;
  gating_ref(logits, bias, m.gating, m.k, ids, w);
  for (int64_t h = 0; h < H; ++h) out[h] = 0.0;
  auto mlp = [&](const float* gu, const float* dn, int64_t II, double scale) {  // gu [2II, H], dn [H, II]
    std::vector<double> hh(static_cast<size_t>(II));
    for (int64_t i = 0; i < II; ++i) {
      double g = 0, u = 0;
      for (int64_t h = 0; h < H; ++h) g += x[h] * gu[i * H + h], u += x[h] * gu[(II + i) * H + h];
      hh[size_t(i)] = silu(g) * u;
    }
    for (int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (int64_t i = 0; i < II; ++i) s += hh[size_t(i)] * dn[h * II + i];
      out[h] += scale * s;
    }
  };
  for (int64_t j = 0; j < m.k; ++j) {
    const int64_t e = ids[size_t(j)];
    mlp(m.gate_up + e * 2 * m.I * H, m.down + e * H * m.I, m.I, w[size_t(j)]);
  }
  if (m.shared_gate_up) mlp(m.shared_gate_up, m.shared_down, m.Is, 1.0);
}

}  // namespace optx::moe_testutil
