// `optx bench` rows for moe_forward with DeepSeek-V2-Lite shapes: hidden 2048, 64 routed
// experts of width 1408, top-6, 2 shared experts (width 2816), bf16 weights packed once.
// optx against `basic`, what a framework runs: the router (logits GEMM, biased top-k),
// then a loop over experts: for each expert with tokens, gather its rows, gate/up GEMM,
// SwiGLU, down GEMM, weighted scatter-add — the same optx GEMMs, no fusion across
// experts. Routing: uniform (random router), or skewed by a per-expert selection bias
// calibrated to Zipf (s = 1.2) loads over the expert id.
// Bytes counted: the weights of the experts the call activates (and the shared ones).
// Where the PyTorch peer is loaded (bench/torch_peer.h), a `torch` row: DeepSeek's
// reference MoE layer in PyTorch on the same weights.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "bench/basic_ops.h"
#include "bench/bench.h"
#include "bench/torch_peer.h"
#include "optx/moe.h"
#include "testing/rng.h"

namespace optx {
namespace {

constexpr int64_t kH = 2048, kE = 64, kI = 1408, kK = 6, kIs = 2816;

struct Model {
  PackedWeights gate_up, down, sgu, sdn, router_packed;
  std::vector<float> router, uniform_bias, zipf_bias;
  // The weights as given (the four matrices share these values), kept for the PyTorch
  // peer only (738 MB).
  std::vector<uint16_t> w;
  explicit Model(bool keep_plain) {
    testing::Rng rng(7);
    w.resize(static_cast<size_t>(kE * 2 * kI * kH));
    testing::fill_bf16(w.data(), int64_t(w.size()), rng, -0.02f, 0.02f);
    bench::check(pack_weights({.w = make_view(w.data(), DType::kBF16, {kE, 2 * kI, kH})}, &gate_up));
    bench::check(pack_weights({.w = make_view(w.data(), DType::kBF16, {kE, kH, kI})}, &down));
    bench::check(pack_weights({.w = make_view(w.data(), DType::kBF16, {2 * kIs, kH})}, &sgu));
    bench::check(pack_weights({.w = make_view(w.data(), DType::kBF16, {kH, kIs})}, &sdn));
    router.resize(static_cast<size_t>(kE * kH));
    testing::fill_f32(router.data(), kE * kH, rng, -0.05f, 0.05f);
    bench::check(pack_weights({.w = make_view(router.data(), DType::kF32, {kE, kH})}, &router_packed));
    uniform_bias.assign(static_cast<size_t>(kE), 0.0f);
    zipf_bias.resize(static_cast<size_t>(kE));
    // Selection is by softmax score + bias, so the bias's scale sets the skew. 0.0108 * s
    // makes the expert loads match top-6 sampling without replacement with weights
    // rank^-s, s = 1.2 (Plackett-Luce, simulated): 10-12% of the assignments differ at
    // T = 128 and 1024, where the former 0.02 * s put 44-47% elsewhere (the top three
    // experts took nearly every token).
    for (int64_t e = 0; e < kE; ++e) zipf_bias[size_t(e)] = -0.0108f * 1.2f * std::log(float(e + 1));
    if (!keep_plain) std::vector<uint16_t>().swap(w);
  }
};

void bench_case(bench::Context& ctx, Model& m, int64_t T, bool zipf) {
  testing::Rng rng{uint64_t(T)};
  constexpr int kSets = 4;
  std::vector<std::vector<uint16_t>> x(kSets, std::vector<uint16_t>(static_cast<size_t>(T * kH)));
  for (auto& v : x) testing::fill_bf16(v.data(), T * kH, rng);
  std::vector<uint16_t> out(static_cast<size_t>(T * kH));
  const TensorView bias = make_view((zipf ? m.zipf_bias : m.uniform_bias).data(), DType::kF32, {kE});
  MoeForwardParams p{.x = make_view(x[0].data(), DType::kBF16, {T, kH}), .packed_router = &m.router_packed[0],
                     .bias = bias, .top_k = kK, .renormalize = false, .gate_up = &m.gate_up, .down = &m.down,
                     .shared_gate_up = &m.sgu, .shared_down = &m.sdn, .out = make_view(out.data(), DType::kBF16, {T, kH})};
  std::vector<uint8_t> ws(moe_forward_workspace_size(p));
  // The router as a framework runs it: widen x to f32, logits GEMM, biased top-k. Used
  // for each set's routing decisions up front (the byte count) and inside basic's timed
  // call, since moe_forward's own time includes its router.
  std::vector<std::vector<int32_t>> ids(kSets, std::vector<int32_t>(static_cast<size_t>(T * kK)));
  std::vector<std::vector<float>> wts(kSets, std::vector<float>(static_cast<size_t>(T * kK)));
  std::vector<float> logits(static_cast<size_t>(T * kE)), xf(static_cast<size_t>(T * kH));
  const GemmParams router_gemm{.a = make_view(xf.data(), DType::kF32, {T, kH}), .b = make_view(m.router.data(), DType::kF32, {kE, kH}),
                               .c = make_view(logits.data(), DType::kF32, {T, kE})};
  std::vector<uint8_t> rws(gemm_workspace_size(router_gemm));
  const int th = ctx.threads;
  auto route = [&](int s) {
    const uint16_t* xs = x[size_t(s)].data();
#pragma omp parallel for num_threads(th) schedule(static)
    for (int64_t t = 0; t < T; ++t) bench::basic::bf16_to_f32_op(xs + t * kH, xf.data() + t * kH, kH);
    bench::check(gemm(router_gemm, {rws.data(), rws.size()}));
    bench::check(moe_gating_topk({.logits = make_view(logits.data(), DType::kF32, {T, kE}), .bias = bias,
                           .topk_ids = make_view(ids[size_t(s)].data(), DType::kI32, {T, kK}),
                           .topk_weights = make_view(wts[size_t(s)].data(), DType::kF32, {T, kK})}));
  };
  // Activated experts per set, for the byte count.
  double experts_used = 0;
  for (int s = 0; s < kSets; ++s) {
    route(s);
    experts_used += double(std::set<int32_t>(ids[size_t(s)].begin(), ids[size_t(s)].end()).size()) / kSets;
  }
  const double expert_bytes = 3.0 * kH * kI * 2, shared_bytes = 3.0 * kH * kIs * 2;
  const double bytes = experts_used * expert_bytes + shared_bytes;
  const double flops = 2.0 * T * (kK * 3.0 * kH * kI + 3.0 * kH * kIs);
  const std::string cs = "dtype=bf16 T=" + std::to_string(T) + " routing=" + (zipf ? "zipf" : "uniform");
  int set = 0;
  auto optx_fn = [&] {
    p.x.data = x[size_t(set++ % kSets)].data();
    bench::check(moe_forward(p, {ws.data(), ws.size()}));
  };
  // basic: the router, then the per-expert loop, optx GEMMs; the elementwise steps
  // (widening, gather, SwiGLU, scatter-add, the final add) are vectorised basic ops run on
  // all threads, as a framework's kernels are.
  std::vector<uint16_t> rows(static_cast<size_t>(T * kH)), hid(static_cast<size_t>(T * kIs)), y(static_cast<size_t>(T * kH));
  std::vector<float> gu(static_cast<size_t>(T * 2 * kIs)), acc(static_cast<size_t>(T * kH));
  std::vector<int64_t> tok(static_cast<size_t>(T));
  std::vector<float> tw(static_cast<size_t>(T));
  std::vector<uint8_t> gws(1 << 24);
  auto mlp = [&](int64_t n, const PackedMatrix& wgu, const PackedMatrix& wdn, int64_t I) {
    bench::check(gemm({.a = make_view(rows.data(), DType::kBF16, {n, kH}), .packed_b = &wgu, .c = make_view(gu.data(), DType::kF32, {n, 2 * I})},
               {gws.data(), gws.size()}));
#pragma omp parallel for num_threads(th) schedule(static)
    for (int64_t r = 0; r < n; ++r)
      bench::basic::silu_mul_f32_to_bf16(gu.data() + r * 2 * I, gu.data() + r * 2 * I + I, hid.data() + r * I, I);
    bench::check(gemm({.a = make_view(hid.data(), DType::kBF16, {n, I}), .packed_b = &wdn, .c = make_view(y.data(), DType::kBF16, {n, kH})},
               {gws.data(), gws.size()}));
  };
  // Half the sets away from optx's: interleaved calls would otherwise hand basic the
  // experts optx streamed a moment before, partly still in the last-level cache.
  int bset = kSets / 2;
  auto basic_set = [&](int s) {
    const uint16_t* xs = x[size_t(s)].data();
    route(s);
    std::memset(acc.data(), 0, acc.size() * sizeof(float));
    for (int64_t e = 0; e < kE; ++e) {
      int64_t n = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < kK; ++j)
          if (ids[size_t(s)][size_t(t * kK + j)] == e) {
            tok[size_t(n)] = t;
            tw[size_t(n)] = wts[size_t(s)][size_t(t * kK + j)];
            ++n;
          }
      if (n == 0) continue;
#pragma omp parallel for num_threads(th) schedule(static) if (n > 8)
      for (int64_t r = 0; r < n; ++r) std::memcpy(rows.data() + r * kH, xs + tok[size_t(r)] * kH, kH * 2);
      mlp(n, m.gate_up[e], m.down[e], kI);
      // A token appears once per expert, so the rows of one expert never collide.
#pragma omp parallel for num_threads(th) schedule(static) if (n > 8)
      for (int64_t r = 0; r < n; ++r)
        bench::basic::axpy_bf16_f32(tw[size_t(r)], y.data() + r * kH, acc.data() + tok[size_t(r)] * kH, kH);
    }
    std::memcpy(rows.data(), xs, size_t(T * kH) * 2);
    mlp(T, m.sgu[0], m.sdn[0], kIs);
#pragma omp parallel for num_threads(th) schedule(static)
    for (int64_t t = 0; t < T; ++t)
      bench::basic::add_f32_bf16_to_bf16(acc.data() + t * kH, y.data() + t * kH, out.data() + t * kH, kH);
  };
  auto basic_fn = [&] { basic_set(bset++ % kSets); };
  // Both write `out`: optx's result on set 0 kept aside and compared with basic's first.
  p.x.data = x[0].data();
  bench::check(moe_forward(p, {ws.data(), ws.size()}), "moe_forward " + cs);
  const std::vector<uint16_t> optx_out = out;
  basic_set(0);
  bench::expect_agree("moe_forward " + cs, optx_out.data(), out.data(), T * kH, DType::kBF16, 3e-2);
  bench::Record r{.op = "moe_forward", .case_ = cs, .impl = "optx", .roof = bench::Roof::kBF16};
  std::vector<std::function<void()>> fns = {optx_fn, basic_fn};
  // PyTorch, DeepSeek's reference layer on the plain weights, where the peer is loaded.
  std::vector<bench::Context::Peer> torch_rows;
  if (const bench::TorchPeer* torch = bench::torch_peer(ctx.threads)) {
    auto run = [torch, &x, &m, bias, T](int s, const TensorView& o) {
      return torch->moe(make_view(x[size_t(s)].data(), DType::kBF16, {T, kH}), make_view(m.router.data(), DType::kF32, {kE, kH}), bias, kK,
                        make_view(m.w.data(), DType::kBF16, {kE, 2 * kI, kH}), make_view(m.w.data(), DType::kBF16, {kE, kH, kI}),
                        make_view(m.w.data(), DType::kBF16, {2 * kIs, kH}), make_view(m.w.data(), DType::kBF16, {kH, kIs}), o);
    };
    torch_rows = bench::torch_row(*torch, r, "moe", run, p.out, optx_out.data(), kSets);
    for (const auto& peer : torch_rows) fns.push_back(peer.fn);
  }
  const auto tm = ctx.time_interleaved(fns);
  // One more call with schedule accounting (not timed): each thread's busy share of the
  // grouped GEMMs' wall time; the gap to 100% is the imbalance the queue leaves.
  ScheduleStats stats;
  p.stats = &stats;
  optx_fn();
  p.stats = nullptr;
  std::string busy;
  for (double b : stats.busy_s) busy += (busy.empty() ? "" : "/") + std::to_string(stats.wall_s > 0 ? int(100 * b / stats.wall_s + 0.5) : 0) + "%";
  std::vector<int64_t> load(static_cast<size_t>(kE), 0);
  for (int32_t e : ids[0]) ++load[size_t(e)];
  const int64_t top = *std::max_element(load.begin(), load.end());
  r.note = std::to_string(int(experts_used + 0.5)) + " experts active, top expert " + std::to_string(100 * top / T) + "% of tokens, busy " + busy;
  r.peak_bytes = double(ws.size());
  bench::Record b{.op = "moe_forward", .case_ = cs, .impl = "basic", .roof = bench::Roof::kBF16};
  b.note = "router GEMM + top-k, then per expert: gather, GEMM, SwiGLU, GEMM, scatter-add";
  ctx.add(r, tm[0], flops, bytes);
  ctx.add(b, tm[1], flops, bytes);
  for (size_t i = 0; i < torch_rows.size(); ++i) ctx.add(torch_rows[i].record, tm[2 + i], flops, bytes);
}

void bench_moe(bench::Context& ctx) {
  Model m(bench::torch_peer(ctx.threads) != nullptr);
  for (int64_t T : {1, 16, 128, 1024})
    for (bool zipf : {false, true}) {
      if (ctx.quick && T == 1024) continue;
      bench_case(ctx, m, T, zipf);
    }
}

OPTX_REGISTER_BENCH("moe_forward", bench_moe);

// The softmax router alone: optx (softmax, top-k and renormalisation in one pass per
// token) against `basic`, an eager framework's three kernels — softmax into an f32
// [T, E] buffer, top-k of each row (partial sort), renormalise the k weights — each on
// all threads. Bytes: the logits read once, ids and weights written once.
void bench_gating(bench::Context& ctx) {
  const int64_t T = ctx.quick ? 512 : 16384, E = kE, k = kK;
  testing::Rng rng(5);
  std::vector<float> logits(static_cast<size_t>(T * E)), probs(logits.size()), w(static_cast<size_t>(T * k));
  testing::fill_f32(logits.data(), T * E, rng, -4.0f, 4.0f);
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  const MoeGatingSoftmaxParams p{.logits = make_view(logits.data(), DType::kF32, {T, E}),
                                 .topk_ids = make_view(ids.data(), DType::kI32, {T, k}),
                                 .topk_weights = make_view(w.data(), DType::kF32, {T, k}), .renormalize = true};
  const int th = ctx.threads;
  auto basic_fn = [&] {
#pragma omp parallel for num_threads(th) schedule(static)
    for (int64_t t = 0; t < T; ++t) bench::basic::softmax_f32(logits.data() + t * E, probs.data() + t * E, E);
#pragma omp parallel for num_threads(th) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      int32_t order[kE];
      std::iota(order, order + E, 0);
      const float* pr = probs.data() + t * E;
      std::partial_sort(order, order + k, order + E, [&](int32_t a, int32_t b) { return pr[a] > pr[b] || (pr[a] == pr[b] && a < b); });
      for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = order[j], w[size_t(t * k + j)] = pr[order[j]];
    }
#pragma omp parallel for num_threads(th) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float s = 0;
      for (int64_t j = 0; j < k; ++j) s += w[size_t(t * k + j)];
      for (int64_t j = 0; j < k; ++j) w[size_t(t * k + j)] /= s;
    }
  };
  const auto tm = ctx.time_interleaved({[&] { bench::check(moe_gating_topk_softmax(p)); }, basic_fn});
  const std::string cs = "dtype=f32 T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k);
  const double bytes = double(T * E) * 4 + double(T * k) * 8;
  bench::Record r{.op = "moe_gating_topk_softmax", .case_ = cs, .impl = "optx", .roof = bench::Roof::kMemory};
  bench::Record b{.op = "moe_gating_topk_softmax", .case_ = cs, .impl = "basic", .roof = bench::Roof::kMemory};
  b.note = "softmax -> [T, E] f32, top-k (partial sort), renormalise";
  b.peak_bytes = double(probs.size() * sizeof(float));
  ctx.add(r, tm[0], 0.0, bytes);
  ctx.add(b, tm[1], 0.0, bytes);
}

OPTX_REGISTER_BENCH("moe_gating_topk_softmax", bench_gating);

}  // namespace
}  // namespace optx
