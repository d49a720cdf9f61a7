// Independent references for the MoE family (double precision, plain loops, std::sort for
// selection) shared by moe_test.cpp and `optx verify`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ops/moe/moe_internal.h"
#include "optx/moe.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx::moe_testutil {

// Runs f(name) once per gating implementation this host runs, each forced for both gating
// ops through OPTX_IMPL (their registries are moe.cpp's); OPTX_IMPL is restored after,
// also when f throws: what runs next must see the caller's value.
template <class F>
void for_each_gating_impl(F f) {
  struct Restore {
    std::optional<std::string> saved;
    ~Restore() {
      if (saved) setenv("OPTX_IMPL", saved->c_str(), 1);
      else unsetenv("OPTX_IMPL");
    }
  } restore;
  if (const char* v = std::getenv("OPTX_IMPL")) restore.saved = v;
  for (const std::string& name : moe_detail::gating_impl_names()) {
    setenv("OPTX_IMPL", ("moe_gating_topk=" + name + ",moe_gating_topk_softmax=" + name).c_str(), 1);
    f(name);
  }
}

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

// moe_finalize_routing's definition in double: ref[t, h] = sum_k w[t, k] y[inverse[t, k], h]
// (+ shared) (+ residual), dropped (t, k) (inverse -1) skipped; shared / residual may be
// null. bound: the f32 accumulation of k + 2 terms, plus one rounding to bf16 when the
// output is bf16.
inline void finalize_ref(const float* y, const int32_t* inverse, const float* w, const float* shared, const float* residual,
                         int64_t T, int64_t k, int64_t H, bool bf16_out, std::vector<double>& ref, std::vector<double>& bound) {
  ref.clear(), bound.clear();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double sum = 0, mag = 0;
      for (int64_t j = 0; j < k; ++j)
        if (const int32_t r = inverse[t * k + j]; r >= 0) {
          const double term = double(w[t * k + j]) * y[r * H + h];
          sum += term, mag += std::fabs(term);
        }
      for (const float* v : {shared, residual})
        if (v) sum += v[t * H + h], mag += std::fabs(v[t * H + h]);
      const double acc_err = double(k + 2) * testing::kEpsF32 * mag;
      ref.push_back(sum);
      bound.push_back(acc_err + (bf16_out ? testing::kEpsBF16 * (std::fabs(sum) + acc_err) : 0.0));
    }
}

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
// + shared MLP, no rounding of the intermediates. naive (optional): the same with h and
// each expert's output row rounded to bf16, as a bf16 pipeline stores them (the error a
// bf16 layer cannot avoid; the tests allow 2x it). mag (optional): sum of |each term| of
// the final sum, the scale of the rounding a different summation order may move.
inline void moe_layer_ref(const MoeLayerRef& m, const double* x, double* out, double* naive = nullptr, double* mag = nullptr) {
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
  for (double* v : {naive, mag})
    for (int64_t h = 0; v && h < H; ++h) v[h] = 0.0;
  auto bf16 = [](double v) { return double(bf16_to_f32(f32_to_bf16(float(v)))); };
  auto mlp = [&](const float* gu, const float* dn, int64_t II, double scale) {  // gu [2II, H], dn [H, II]
    std::vector<double> hh(static_cast<size_t>(II));
    for (int64_t i = 0; i < II; ++i) {
      double g = 0, u = 0;
      for (int64_t h = 0; h < H; ++h) g += x[h] * gu[i * H + h], u += x[h] * gu[(II + i) * H + h];
      hh[size_t(i)] = silu(g) * u;
    }
    for (int64_t h = 0; h < H; ++h) {
      double s = 0, sn = 0;
      for (int64_t i = 0; i < II; ++i) s += hh[size_t(i)] * dn[h * II + i], sn += bf16(hh[size_t(i)]) * dn[h * II + i];
      out[h] += scale * s;
      if (naive) naive[h] += scale * bf16(sn);
      if (mag) mag[h] += std::fabs(scale * s);
    }
  };
  for (int64_t j = 0; j < m.k; ++j) {
    const int64_t e = ids[size_t(j)];
    mlp(m.gate_up + e * 2 * m.I * H, m.down + e * H * m.I, m.I, w[size_t(j)]);
  }
  if (m.shared_gate_up) mlp(m.shared_gate_up, m.shared_down, m.Is, 1.0);
}

// One moe_forward layer configuration: shapes, router options, and how the router is passed.
struct LayerCase {
  DType dt = DType::kF32;
  int64_t T = 7, H = 48, E = 8, k = 3, I = 24, Is = 32;
  MoeScore score = MoeScore::kSoftmax;
  int64_t n_group = 1, topk_group = 1;
  MoeGroupScore gs = MoeGroupScore::kMax;
  bool bias = false, renorm = true;
  float scaling = 1.0f;
  int64_t hot_expert = -1;  // >= 0: a bias that makes every token pick this expert first
  bool packed_router = false;
  std::string name() const {
    std::ostringstream os;
    os << "dtype=" << dtype_name(dt) << " T=" << T << " H=" << H << " E=" << E << " k=" << k << " I=" << I << " Is=" << Is
       << " score=" << (score == MoeScore::kSoftmax ? "softmax" : score == MoeScore::kSigmoid ? "sigmoid" : "sqrt_softplus")
       << " groups=" << n_group << "/" << topk_group << " group_score=" << (gs == MoeGroupScore::kTop2Sum ? "top2" : "max") << " bias=" << bias
       << " renorm=" << renorm << " scaling=" << scaling << " hot=" << hot_expert << " packed_router=" << packed_router;
    return os.str();
  }
};

struct LayerOutcome {
  Status status;
  testing::CompareResult cmp;
  std::vector<double> out;  // what was compared (tests compare two runs)
};

// Runs moe_forward on random weights (rounded to the case's dtype first, so the reference
// sees the values the op sees) and compares every output row with moe_layer_ref. The
// output starts as NaN, so a row the op never writes fails. Bounds: f32 1e-5 of the row's
// scale; bf16 2x the naive bf16 pipeline's error plus two roundings of the terms' scale
// (each expert row and the output round once; which way depends on summation order).
inline LayerOutcome run_moe_forward(const LayerCase& c, uint64_t seed) {
  const DType dt = c.dt;
  const int64_t T = c.T, H = c.H, E = c.E, I = c.I, Is = c.Is;
  testing::Rng rng{seed};
  auto rnd = [&](size_t n, float a) {
    std::vector<float> v(n);
    for (auto& x : v) x = rng.uniform(-a, a);
    if (dt == DType::kBF16)
      for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  };
  std::vector<float> x = rnd(size_t(T * H), 1), router = rnd(size_t(E * H), 0.5f), gu = rnd(size_t(E * 2 * I * H), 0.2f),
                     dn = rnd(size_t(E * H * I), 0.2f), sgu = rnd(size_t(2 * Is * H), 0.2f), sdn = rnd(size_t(H * Is), 0.2f);
  std::vector<float> bias(static_cast<size_t>(E));
  for (auto& b : bias) b = rng.uniform(-0.1f, 0.1f);
  // |logit| <= 0.5 H here, so a score is at most 1 (softmax, sigmoid) or sqrt(softplus(0.5 H))
  // (about 5.3 at H = 56): +10 wins for the shapes the tests use.
  if (c.hot_expert >= 0) bias[size_t(c.hot_expert)] = 10.0f;
  const bool use_bias = c.bias || c.hot_expert >= 0;
  auto as = [&](std::vector<float>& v, std::vector<uint16_t>& b) -> void* {
    if (dt == DType::kF32) return v.data();
    b.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    return b.data();
  };
  std::vector<uint16_t> xb, gub, dnb, sgub, sdnb;
  PackedWeights Wgu, Wdn, Wsgu, Wsdn, Wr;
  LayerOutcome o;
  o.status = pack_weights({.w = make_view(as(gu, gub), dt, {E, 2 * I, H})}, &Wgu);
  if (o.status.ok()) o.status = pack_weights({.w = make_view(as(dn, dnb), dt, {E, H, I})}, &Wdn);
  if (o.status.ok() && Is > 0) o.status = pack_weights({.w = make_view(as(sgu, sgub), dt, {2 * Is, H})}, &Wsgu);
  if (o.status.ok() && Is > 0) o.status = pack_weights({.w = make_view(as(sdn, sdnb), dt, {H, Is})}, &Wsdn);
  std::vector<float> outf(static_cast<size_t>(T * H), NAN);
  std::vector<uint16_t> outb(static_cast<size_t>(T * H), 0x7fc0);  // bf16 NaN
  MoeForwardParams p{.x = make_view(as(x, xb), dt, {T, H}), .router = make_view(router.data(), DType::kF32, {E, H}),
                     .bias = use_bias ? make_view(bias.data(), DType::kF32, {E}) : TensorView{}, .top_k = c.k, .score = c.score,
                     .n_group = c.n_group, .topk_group = c.topk_group, .group_score = c.gs, .renormalize = c.renorm,
                     .routed_scaling_factor = c.scaling, .gate_up = &Wgu, .down = &Wdn,
                     .shared_gate_up = Is > 0 ? &Wsgu : nullptr, .shared_down = Is > 0 ? &Wsdn : nullptr,
                     .out = make_view(dt == DType::kF32 ? static_cast<void*>(outf.data()) : outb.data(), dt, {T, H})};
  if (o.status.ok() && c.packed_router) {
    o.status = pack_weights({.w = p.router}, &Wr);
    p.router = {};
    p.packed_router = o.status.ok() ? &Wr[0] : nullptr;
  }
  std::vector<uint8_t> ws(moe_forward_workspace_size(p));
  if (o.status.ok()) o.status = moe_forward(p, {ws.data(), ws.size()});
  MoeLayerRef m{.H = H, .E = E, .k = c.k, .I = I, .Is = Is, .router = router.data(), .bias = use_bias ? bias.data() : nullptr,
                .gate_up = gu.data(), .down = dn.data(), .shared_gate_up = Is > 0 ? sgu.data() : nullptr,
                .shared_down = Is > 0 ? sdn.data() : nullptr};
  m.gating.score = c.score, m.gating.n_group = c.n_group, m.gating.topk_group = c.topk_group, m.gating.group_score = c.gs;
  m.gating.renormalize = c.renorm, m.gating.routed_scaling_factor = c.scaling;
  std::vector<double> got, ref(static_cast<size_t>(T * H)), naive(ref.size()), mag(ref.size()), extra, xd(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) xd[size_t(h)] = x[size_t(t * H + h)];
    moe_layer_ref(m, xd.data(), ref.data() + t * H, naive.data() + t * H, mag.data() + t * H);
    double mx = 0;
    for (int64_t h = 0; h < H; ++h) mx = std::max(mx, std::fabs(ref[size_t(t * H + h)]));
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = size_t(t * H + h);
      got.push_back(dt == DType::kF32 ? double(outf[i]) : double(bf16_to_f32(outb[i])));
      const double nv = double(bf16_to_f32(f32_to_bf16(float(naive[i]))));  // and the bf16 output itself
      extra.push_back(dt == DType::kF32 ? 1e-5 * (std::fabs(ref[i]) + mx)
                                        : 2 * std::fabs(nv - ref[i]) + 2 * testing::kEpsBF16 * (mag[i] + std::fabs(ref[i])));
    }
  }
  o.cmp = testing::compare(got, ref, {0, 0}, &extra);
  o.out = std::move(got);
  return o;
}

}  // namespace optx::moe_testutil
