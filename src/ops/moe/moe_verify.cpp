// `optx verify` cases for the MoE family: routers of DeepSeek V2 / V3 / V4 kinds against
// the independent reference (exact ids, weights to 1e-5).
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
  };
  const C cases[] = {{"softmax E=64 k=6", MoeScore::kSoftmax, 64, 6, 1, 1, MoeGroupScore::kMax, false, false, 1.0f},
                     {"softmax E=160 k=6 groups=8/3 max", MoeScore::kSoftmax, 160, 6, 8, 3, MoeGroupScore::kMax, false, false, 16.0f},
                     {"sigmoid E=256 k=8 groups=8/4 top2 bias renorm", MoeScore::kSigmoid, 256, 8, 8, 4, MoeGroupScore::kTop2Sum, true, true, 2.5f},
                     {"sqrt_softplus E=64 k=6 bias renorm", MoeScore::kSqrtSoftplus, 64, 6, 1, 1, MoeGroupScore::kMax, true, true, 1.5f}};
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
                      .routed_scaling_factor = c.scaling};
    const Status st = moe_gating_topk(p);
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
    out.push_back(verify::make_record("moe_gating_topk", "generic", std::string("T=300 ") + c.name, st, cmp));
  }
}

OPTX_REGISTER_VERIFY("moe_gating_topk", verify_gating);

}  // namespace
}  // namespace optx
