// `optx verify` cases for the MoE family: routers of DeepSeek V2 / V3 / V4 kinds against
// the independent reference (exact ids, weights to 1e-5), and grouped GEMM (+ SwiGLU)
// under both schedules against per-expert double-precision products.
#include <numeric>
#include <string>

#include "ops/moe/moe_testutil.h"
#include "testing/compare.h"
#include "testing/rng.h"
#include "tools/verify.h"

namespace optx {
namespace {

void verify_gating(std::vector<verify::Record>& out) {
  struct C {
    const char* name;
    MoeScore score;
    int64_t E, k, ng, tg;
    MoeGroupScore gs;
    bool bias, renorm;
    float scaling;
    bool tks = false, softmax_api = false;  // top-k then softmax; via moe_gating_topk_softmax
  };
  const C cases[] = {{"softmax E=64 k=6", MoeScore::kSoftmax, 64, 6, 1, 1, MoeGroupScore::kMax, false, false, 1.0f},
                     {"softmax E=160 k=6 groups=8/3 max", MoeScore::kSoftmax, 160, 6, 8, 3, MoeGroupScore::kMax, false, false, 16.0f},
                     {"sigmoid E=256 k=8 groups=8/4 top2 bias renorm", MoeScore::kSigmoid, 256, 8, 8, 4, MoeGroupScore::kTop2Sum, true, true, 2.5f},
                     {"sqrt_softplus E=64 k=6 bias renorm", MoeScore::kSqrtSoftplus, 64, 6, 1, 1, MoeGroupScore::kMax, true, true, 1.5f},
                     {"E=8 k=2 renorm", MoeScore::kSoftmax, 8, 2, 1, 1, MoeGroupScore::kMax, false, true, 1.0f, false, true},
                     {"E=60 k=4 topk_then_softmax", MoeScore::kSoftmax, 60, 4, 1, 1, MoeGroupScore::kMax, false, false, 1.0f, true, true}};
  for (const C& c : cases) {
    const int64_t T = 300;
    testing::Rng rng(uint64_t(c.E));
    std::vector<float> logits(static_cast<size_t>(T * c.E)), bias(static_cast<size_t>(c.E));
    for (auto& x : logits) x = rng.uniform(-4, 4);
    for (auto& x : bias) x = rng.uniform(-0.5f, 0.5f);
    std::vector<int32_t> ids(static_cast<size_t>(T * c.k));
    std::vector<float> w(static_cast<size_t>(T * c.k));
    MoeGatingParams p{.logits = make_view(logits.data(), DType::kF32, {T, c.E}),
                      .bias = c.bias ? make_view(bias.data(), DType::kF32, {c.E}) : TensorView{},
                      .topk_ids = make_view(ids.data(), DType::kI32, {T, c.k}), .topk_weights = make_view(w.data(), DType::kF32, {T, c.k}),
                      .score = c.score, .n_group = c.ng, .topk_group = c.tg, .group_score = c.gs, .renormalize = c.renorm,
                      .topk_then_softmax = c.tks, .routed_scaling_factor = c.scaling};
    const Status st = c.softmax_api ? moe_gating_topk_softmax({.logits = p.logits, .topk_ids = p.topk_ids, .topk_weights = p.topk_weights,
                                                               .renormalize = c.renorm, .topk_then_softmax = c.tks})
                                    : moe_gating_topk(p);
    std::vector<double> got, ref;
    bool ids_ok = true;
    int64_t bad = -1;
    for (int64_t t = 0; st.ok() && t < T; ++t) {
      std::vector<double> l(logits.begin() + t * c.E, logits.begin() + (t + 1) * c.E), b;
      if (c.bias) b.assign(bias.begin(), bias.end());
      std::vector<int> rid;
      std::vector<double> rw;
      moe_testutil::gating_ref(l, b, p, c.k, rid, rw);
      for (int64_t j = 0; j < c.k; ++j) {
        if (ids[size_t(t * c.k + j)] != rid[size_t(j)] && ids_ok) ids_ok = false, bad = t * c.k + j;
        got.push_back(w[size_t(t * c.k + j)]);
        ref.push_back(rw[size_t(j)]);
      }
    }
    testing::CompareResult cmp = testing::compare(got, ref, {1e-6, 1e-5});
    if (!ids_ok) cmp.pass = false, cmp.worst_index = bad, cmp.message = "expert ids differ from the reference";
    out.push_back(verify::make_record(c.softmax_api ? "moe_gating_topk_softmax" : "moe_gating_topk", "generic",
                                      std::string("T=300 ") + c.name, st, cmp));
  }
}

OPTX_REGISTER_VERIFY("moe_gating_topk", verify_gating);

// Skewed group sizes with empty groups; at 1 thread each GEMM runs split, at 2+ threads
// the expert queue runs (with the 400-row group cut into row tiles). N = 144 puts SwiGLU
// through the f32 buffer (I = 72), N = 256 into the GEMM epilogue (I = 128); int8 output
// rows are dequantised and held to 1 LSB of their row scale.
void verify_grouped_n(std::vector<verify::Record>& out, int64_t N) {
  const int64_t E = 16, K = 200, I = N / 2;
  testing::Rng rng(11);
  std::vector<int64_t> counts(static_cast<size_t>(E));
  for (int64_t g = 0; g < E; ++g) counts[size_t(g)] = g % 5 == 1 ? 0 : int64_t(rng.below(40));
  counts[3] = 400;
  const int64_t M = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  std::vector<int64_t> offs(counts.size());
  std::partial_sum(counts.begin(), counts.end(), offs.begin());
  std::vector<uint16_t> x(static_cast<size_t>(M * K)), w(static_cast<size_t>(E * N * K));
  testing::fill_bf16(x.data(), M * K, rng);
  testing::fill_bf16(w.data(), E * N * K, rng);
  PackedWeights pw;
  const Status packed = pack_weights({.w = make_view(w.data(), DType::kBF16, {E, N, K})}, &pw);
  // Reference: out[r, n] in double from the same bf16 values.
  std::vector<double> ref(static_cast<size_t>(M * N));
  for (int64_t g = 0, r = 0; g < E; ++g)
    for (int64_t i = 0; i < counts[size_t(g)]; ++i, ++r)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(bf16_to_f32(x[size_t(r * K + k)])) * bf16_to_f32(w[size_t((g * N + n) * K + k)]);
        ref[size_t(r * N + n)] = acc;
      }
  std::vector<double> hr(static_cast<size_t>(M * I));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t i = 0; i < I; ++i) hr[size_t(r * I + i)] = moe_testutil::silu(ref[size_t(r * N + i)]) * ref[size_t(r * N + I + i)];
  const int all = num_threads();
  for (int threads : {1, all > 1 ? all : 2}) {
    set_num_threads(threads);
    const std::string schedule = threads == 1 ? "split" : "queue";
    const std::string cs = "bf16 E=16 M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=200 threads=" +
                           std::to_string(threads) + " (" + schedule + ")";
    std::vector<float> y(static_cast<size_t>(M * N));
    GroupedMatmulParams p{.x = make_view(x.data(), DType::kBF16, {M, K}), .weights = &pw,
                          .group_offsets = make_view(offs.data(), DType::kI64, {E}), .out = make_view(y.data(), DType::kF32, {M, N})};
    std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
    Status st = packed.ok() ? grouped_matmul(p, {ws.data(), ws.size()}) : packed;
    std::vector<double> got(y.begin(), y.end());
    out.push_back(verify::make_record("grouped_matmul", selected_impl("gemm"), cs, st, testing::compare(got, ref, {1e-4, 1e-4})));
    std::vector<float> h(static_cast<size_t>(M * I));
    GroupedMatmulSwigluParams q{.x = p.x, .weights = &pw, .group_offsets = p.group_offsets, .out = make_view(h.data(), DType::kF32, {M, I})};
    std::vector<uint8_t> ws2(grouped_matmul_swiglu_workspace_size(q));
    st = packed.ok() ? grouped_matmul_swiglu(q, {ws2.data(), ws2.size()}) : packed;
    std::vector<double> hg(h.begin(), h.end());
    out.push_back(verify::make_record("grouped_matmul_swiglu", selected_impl("gemm"), cs, st, testing::compare(hg, hr, {1e-4, 1e-4})));
    std::vector<int8_t> hq(static_cast<size_t>(M * I));
    std::vector<float> hs(static_cast<size_t>(M));
    q.out = make_view(hq.data(), DType::kI8, {M, I});
    q.out_scales = make_view(hs.data(), DType::kF32, {M});
    std::vector<uint8_t> ws3(grouped_matmul_swiglu_workspace_size(q));
    st = packed.ok() ? grouped_matmul_swiglu(q, {ws3.data(), ws3.size()}) : packed;
    std::vector<double> dq(hq.size()), lsb(hq.size());
    for (int64_t r = 0; r < M; ++r)
      for (int64_t i = 0; i < I; ++i) {
        dq[size_t(r * I + i)] = double(hq[size_t(r * I + i)]) * hs[size_t(r)];
        lsb[size_t(r * I + i)] = hs[size_t(r)];
      }
    out.push_back(verify::make_record("grouped_matmul_swiglu", selected_impl("gemm"), cs + " out=i8", st,
                                      testing::compare(dq, hr, {1e-4, 1e-4}, &lsb)));
  }
  set_num_threads(all);
}

void verify_grouped(std::vector<verify::Record>& out) {
  verify_grouped_n(out, 144);
  verify_grouped_n(out, 256);
}

OPTX_REGISTER_VERIFY("grouped_matmul", verify_grouped);

}  // namespace
}  // namespace optx
