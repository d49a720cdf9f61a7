// MoE family: gating (all scorings, bias, groups, ties), routing (stable order, counts,
// expert ranges), grouped GEMMs against per-expert references (empty groups, untouched
// tails), finalize, and the whole layer against a double-precision composition.
#include <gtest/gtest.h>
#include <omp.h>

#include <limits>
#include <sstream>
#include <string>

#include "ops/moe/moe_testutil.h"
#include "testing/alloc_count.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx {
namespace {

using moe_testutil::gating_ref;

// Runs f once per gating implementation this CPU runs, each forced by OPTX_IMPL.
template <class F>
void each_gating_impl(F f) {
  moe_testutil::for_each_gating_impl([&](const std::string& name) {
    ASSERT_EQ(selected_impl("moe_gating_topk"), name);
    ASSERT_EQ(selected_impl("moe_gating_topk_softmax"), name);
    SCOPED_TRACE("implementation " + name);
    f();
  });
}

struct GatingCase {
  MoeScore score;
  int64_t E, k, n_group, topk_group;
  MoeGroupScore gs;
  bool bias, renorm, tks;
  float scaling;
};

TEST(MoeGating, EveryImplementationMatchesReference) {
  each_gating_impl([&] {
  const GatingCase cases[] = {
      {MoeScore::kSoftmax, 8, 2, 1, 1, MoeGroupScore::kMax, false, true, false, 1.0f},
      {MoeScore::kSoftmax, 64, 6, 1, 1, MoeGroupScore::kMax, false, false, false, 1.0f},   // DeepSeek-V2-Lite
      {MoeScore::kSoftmax, 160, 6, 8, 3, MoeGroupScore::kMax, false, false, false, 16.0f}, // V2: group-limited greedy
      {MoeScore::kSigmoid, 256, 8, 8, 4, MoeGroupScore::kTop2Sum, true, true, false, 2.5f}, // V3: noaux_tc
      {MoeScore::kSqrtSoftplus, 64, 6, 1, 1, MoeGroupScore::kMax, true, true, false, 1.5f}, // V4-style scoring
      {MoeScore::kSoftmax, 8, 1, 1, 1, MoeGroupScore::kMax, false, false, true, 1.0f},     // top-k then softmax
      {MoeScore::kSoftmax, 16, 8, 1, 1, MoeGroupScore::kMax, false, true, true, 1.0f},
      // Odd k between the DeepSeek widths (6, 8): the top-k insertion scan with 5 and 7 slots.
      {MoeScore::kSoftmax, 20, 5, 1, 1, MoeGroupScore::kMax, false, true, false, 1.0f},
      {MoeScore::kSigmoid, 64, 7, 8, 4, MoeGroupScore::kTop2Sum, true, true, false, 2.5f},
      {MoeScore::kSqrtSoftplus, 32, 5, 4, 2, MoeGroupScore::kMax, true, false, false, 1.0f},
      {MoeScore::kSoftmax, 48, 7, 6, 2, MoeGroupScore::kMax, false, false, false, 16.0f},
      {MoeScore::kSoftmax, 12, 7, 1, 1, MoeGroupScore::kMax, false, false, true, 1.0f},
      {MoeScore::kSoftmax, 9, 5, 1, 1, MoeGroupScore::kMax, false, true, true, 1.0f},
      // Groups over a width off the vector lanes: ineligible experts in a partial vector.
      {MoeScore::kSoftmax, 36, 4, 6, 2, MoeGroupScore::kMax, false, true, false, 1.0f},
      {MoeScore::kSigmoid, 60, 6, 5, 2, MoeGroupScore::kTop2Sum, true, true, false, 2.5f},
      // More kept groups than the 32 top-k slots: the group pick once wrote past a
      // 32-entry buffer (a crash at topk_group = 40).
      {MoeScore::kSigmoid, 64, 6, 64, 40, MoeGroupScore::kMax, true, true, false, 1.0f},
      {MoeScore::kSoftmax, 128, 8, 64, 33, MoeGroupScore::kTop2Sum, true, false, false, 1.0f},
  };
  for (const GatingCase& c : cases)
    for (int64_t T : {0, 1, 7, 128, 1000}) {
      testing::Rng rng{uint64_t(c.E * 7 + T)};
      std::vector<float> logits(static_cast<size_t>(T * c.E)), bias(static_cast<size_t>(c.E));
      for (auto& x : logits) x = rng.uniform(-4, 4);
      for (auto& x : bias) x = rng.uniform(-0.5f, 0.5f);
      std::vector<int32_t> ids(size_t(T * c.k), -7);
      std::vector<float> w(size_t(T * c.k), NAN);
      MoeGatingParams p{.logits = make_view(logits.data(), DType::kF32, {T, c.E}),
                        .bias = c.bias ? make_view(bias.data(), DType::kF32, {c.E}) : TensorView{},
                        .topk_ids = make_view(ids.data(), DType::kI32, {T, c.k}),
                        .topk_weights = make_view(w.data(), DType::kF32, {T, c.k}), .score = c.score, .n_group = c.n_group,
                        .topk_group = c.topk_group, .group_score = c.gs, .renormalize = c.renorm, .topk_then_softmax = c.tks,
                        .routed_scaling_factor = c.scaling};
      ASSERT_TRUE(moe_gating_topk(p).ok());
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> l(logits.begin() + t * c.E, logits.begin() + (t + 1) * c.E), b;
        if (c.bias) b.assign(bias.begin(), bias.end());
        std::vector<int> rid;
        std::vector<double> rw;
        gating_ref(l, b, p, c.k, rid, rw);
        for (int64_t j = 0; j < c.k; ++j) {
          ASSERT_EQ(ids[size_t(t * c.k + j)], rid[size_t(j)]) << "E=" << c.E << " t=" << t << " j=" << j;
          EXPECT_NEAR(w[size_t(t * c.k + j)], rw[size_t(j)], 1e-5 * std::max(1.0, std::fabs(rw[size_t(j)])));
        }
      }
    }
  });
}

// Group scores that are top-2 sums of selection scores near FLT_MAX (infinities clamp to
// it): summed in float both groups overflowed to inf and tied, so the lower group won
// where the reference implementation's double sums rank them (2 FLT_MAX > FLT_MAX + 1e38).
TEST(MoeGating, GroupSumsNearFltMaxRankAsInReference) {
  each_gating_impl([&] {
    const float inf = INFINITY;
    for (const auto& [bias, want] : {std::pair<std::vector<float>, int32_t>{{inf, 1e38f, inf, inf}, 2},
                                     std::pair<std::vector<float>, int32_t>{{-inf, -inf, -1e38f, -inf}, 2}}) {
      std::vector<float> logits(4, 0.0f), b = bias, w(1);
      std::vector<int32_t> id(1, -7);
      const MoeGatingParams p{.logits = make_view(logits.data(), DType::kF32, {1, 4}), .bias = make_view(b.data(), DType::kF32, {4}),
                              .topk_ids = make_view(id.data(), DType::kI32, {1, 1}),
                              .topk_weights = make_view(w.data(), DType::kF32, {1, 1}), .score = MoeScore::kSigmoid,
                              .n_group = 2, .topk_group = 1, .group_score = MoeGroupScore::kTop2Sum};
      ASSERT_TRUE(moe_gating_topk(p).ok());
      EXPECT_EQ(id[0], want) << "bias[2]=" << b[2];
    }
  });
}

// The softmax router entry point (bf16 logits too) against the same reference, and its
// errors name it.
TEST(MoeGating, TopkSoftmaxEveryImplementationMatchesReference) {
  each_gating_impl([&] {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (bool renorm : {false, true})
      for (bool tks : {false, true})
        for (int64_t k : {4, 5, 7}) {  // 5 and 7: odd widths of the top-k insertion scan
          const int64_t T = 37, E = 60;
          testing::Rng rng{uint64_t(renorm * 2 + tks)};
          std::vector<float> logits(static_cast<size_t>(T * E));
          std::vector<uint16_t> lb(logits.size());
          for (size_t i = 0; i < logits.size(); ++i) {
            lb[i] = f32_to_bf16(rng.uniform(-4, 4));
            logits[i] = bf16_to_f32(lb[i]);  // the same values in either dtype
          }
          std::vector<int32_t> ids(size_t(T * k), -7);
          std::vector<float> w(size_t(T * k), NAN);
          const MoeGatingSoftmaxParams p{
              .logits = make_view(dt == DType::kF32 ? static_cast<void*>(logits.data()) : lb.data(), dt, {T, E}),
              .topk_ids = make_view(ids.data(), DType::kI32, {T, k}), .topk_weights = make_view(w.data(), DType::kF32, {T, k}),
              .renormalize = renorm, .topk_then_softmax = tks};
          ASSERT_TRUE(moe_gating_topk_softmax(p).ok());
          MoeGatingParams rp;
          rp.renormalize = renorm;
          rp.topk_then_softmax = tks;
          for (int64_t t = 0; t < T; ++t) {
            std::vector<double> l(logits.begin() + t * E, logits.begin() + (t + 1) * E);
            std::vector<int> rid;
            std::vector<double> rw;
            gating_ref(l, {}, rp, k, rid, rw);
            for (int64_t j = 0; j < k; ++j) {
              ASSERT_EQ(ids[size_t(t * k + j)], rid[size_t(j)]) << dtype_name(dt) << " k=" << k << " t=" << t << " j=" << j;
              EXPECT_NEAR(w[size_t(t * k + j)], rw[size_t(j)], 1e-5 * std::max(1.0, rw[size_t(j)]));
            }
          }
        }
  std::vector<float> logits(8);
  std::vector<int32_t> ids(9);
  std::vector<float> w(9);
  const Status st = moe_gating_topk_softmax({.logits = make_view(logits.data(), DType::kF32, {1, 8}),
                                             .topk_ids = make_view(ids.data(), DType::kI32, {1, 9}),
                                             .topk_weights = make_view(w.data(), DType::kF32, {1, 9})});
  EXPECT_NE(st.message().find("moe_gating_topk_softmax: top-k=9"), std::string::npos) << st.message();
  });
}

TEST(MoeGating, TiesBreakToLowerExpertId) {
  each_gating_impl([&] {
  std::vector<float> logits = {1, 3, 3, 0, 3, 2};  // experts 1, 2, 4 tie
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  ASSERT_TRUE(moe_gating_topk({.logits = make_view(logits.data(), DType::kF32, {1, 6}), .topk_ids = make_view(ids.data(), DType::kI32, {1, 2}),
                               .topk_weights = make_view(w.data(), DType::kF32, {1, 2})})
                  .ok());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_FLOAT_EQ(w[0], w[1]);
  });
}

// The tie rule (equal selection scores: the lower id first) in each selection the router
// makes: between groups (max and top-2-sum group scores), with sigmoid scores and a bias,
// and in top-k-then-softmax. Expected ids by hand; a tie broken the other way picks a
// different expert in every case.
TEST(MoeGating, TiesBreakToLowerIdInGroupsBiasAndTopkThenSoftmax) {
  struct Case {
    const char* what;
    std::vector<float> logits, bias;
    MoeScore score;
    int64_t n_group, topk_group;
    MoeGroupScore gs;
    bool tks;
    std::vector<int32_t> ids;
  };
  const Case cases[] = {
      // groups {0,1} {2,3} {4,5} {6,7}: groups 1 and 2 tie on their max, one group kept
      {"group max tie", {0, 0, 3, 1, 1, 3, 0, 0}, {}, MoeScore::kSigmoid, 4, 1, MoeGroupScore::kMax, false, {2, 3}},
      // groups 1 and 2 tie on their top-2 sum (2 + 1 against 1 + 2)
      {"group top-2 sum tie", {0, 0, 2, 1, 1, 2, 0, 0}, {}, MoeScore::kSigmoid, 4, 1, MoeGroupScore::kTop2Sum, false, {2, 3}},
      // experts 1-3 tie after the bias lifts them above expert 0
      {"sigmoid + bias tie", {3, 2, 2, 2}, {0, 0.5f, 0.5f, 0.5f}, MoeScore::kSigmoid, 1, 1, MoeGroupScore::kMax, false, {1, 2}},
      // experts 1, 2, 4 tie on the logit
      {"top-k then softmax tie", {1, 3, 3, 0, 3, 2}, {}, MoeScore::kSoftmax, 1, 1, MoeGroupScore::kMax, true, {1, 2}},
  };
  each_gating_impl([&] {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      const int64_t E = int64_t(c.logits.size()), k = int64_t(c.ids.size());
      std::vector<int32_t> ids(size_t(k), -7);
      std::vector<float> w(size_t(k), -7.0f);
      std::vector<float> logits = c.logits, bias = c.bias;
      const MoeGatingParams p{.logits = make_view(logits.data(), DType::kF32, {1, E}),
                              .bias = bias.empty() ? TensorView{} : make_view(bias.data(), DType::kF32, {E}),
                              .topk_ids = make_view(ids.data(), DType::kI32, {1, k}),
                              .topk_weights = make_view(w.data(), DType::kF32, {1, k}),
                              .score = c.score, .n_group = c.n_group, .topk_group = c.topk_group, .group_score = c.gs,
                              .topk_then_softmax = c.tks};
      const Status st = moe_gating_topk(p);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(ids, c.ids);
    }
  });
}

// A failed status whose message holds `want`.
::testing::AssertionResult fails_with(const Status& st, const std::string& want) {
  if (st.ok()) return ::testing::AssertionFailure() << "returned OK; expected an error with \"" << want << "\"";
  if (st.message().find(want) == std::string::npos)
    return ::testing::AssertionFailure() << "message \"" << st.message() << "\" lacks \"" << want << "\"";
  return ::testing::AssertionSuccess();
}

constexpr int64_t kHuge = int64_t(1) << 62;                    // T = 2^62 tokens, and with k = 4
constexpr int64_t kHugeX4 = int64_t(uint64_t(kHuge) * 4);        // T * k as a caller's int64 wraps it: 0

// Non-finite router values: NaN counts as -inf, and -inf experts are taken only when
// nothing better is left, lowest id first, so the ids are always k distinct valid experts
// (before, the AVX-512 top-k matched no lane for a NaN max and left ids unwritten, and
// took a retired lane again when the max was -inf). Ids and weights are the rule's, by
// hand, on every implementation.
TEST(MoeGating, NonFiniteScoresGiveDistinctValidIdsInEveryImplementation) {
  each_gating_impl([&] {
  const float nan = NAN, inf = INFINITY;
  const auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), e4 = std::exp(-4.0);
  const double s3 = 1 + e1 + e2 + 5 * std::exp(-3.0);  // softmax denominator of {3, 2, 1, 0 x5}, over e^3
  struct Case {
    const char* what;
    std::vector<float> logits, bias;
    MoeScore score;
    bool tks, renorm;
    std::vector<int32_t> ids;
    std::vector<double> w;
  };
  const Case cases[] = {
      {"NaN logits, top-k then softmax", {nan, 1, nan, 3, 2, nan, -1, nan}, {}, MoeScore::kSoftmax, true, false, {3, 4, 1, 6},
       {1 / (1 + e1 + e2 + e4), e1 / (1 + e1 + e2 + e4), e2 / (1 + e1 + e2 + e4), e4 / (1 + e1 + e2 + e4)}},
      {"all NaN logits, top-k then softmax", std::vector<float>(8, nan), {}, MoeScore::kSoftmax, true, false, {0, 1, 2},
       {1.0 / 3, 1.0 / 3, 1.0 / 3}},
      {"all -inf logits, softmax (uniform)", std::vector<float>(8, -inf), {}, MoeScore::kSoftmax, false, false, {0, 1, 2},
       {1.0 / 8, 1.0 / 8, 1.0 / 8}},
      // Finite, but below V::exp's -87: the AVX-512 softmax took its max over the zero
      // padding lanes of E = 8 and divided 0 by 0.
      {"all logits -100, softmax", std::vector<float>(8, -100), {}, MoeScore::kSoftmax, false, false, {0, 1, 2},
       {1.0 / 8, 1.0 / 8, 1.0 / 8}},
      {"all -inf logits, softmax, renormalised", std::vector<float>(20, -inf), {}, MoeScore::kSoftmax, false, true, {0, 1},
       {0.5, 0.5}},
      {"NaN and -inf logits, sigmoid", {-inf, nan, 0.5f, -inf, 2, nan, -inf, nan}, {}, MoeScore::kSigmoid, false, false,
       {4, 2, 0, 1}, {sig(2), sig(0.5), 0, 0}},
      {"+inf logits, softmax", {1, inf, 2, -inf, inf, 0, 0, 0}, {}, MoeScore::kSoftmax, false, false, {1, 4, 0}, {0.5, 0.5, 0}},
      {"NaN bias", {3, 2, 1, 0, 0, 0, 0, 0}, {nan, 0, nan, 0, 0, 0, 0, 0}, MoeScore::kSigmoid, false, true, {1, 3},
       {sig(2) / (sig(2) + 0.5), 0.5 / (sig(2) + 0.5)}},
      {"-inf bias on all but expert 5", {3, 2, 1, 0, 0, 0, 0, 0}, {-inf, -inf, -inf, -inf, -inf, 0, -inf, -inf},
       MoeScore::kSigmoid, false, false, {5, 0}, {0.5, sig(3)}},
      {"-inf bias on all but expert 0", {3, 2, 1, 0, 0, 0, 0, 0}, {0, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
       MoeScore::kSoftmax, false, false, {0, 1}, {1 / s3, e1 / s3}},
  };
  for (const Case& c : cases)
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(c.what) + ", " + dtype_name(dt) + " logits on " + selected_impl("moe_gating_topk"));
      const int64_t E = int64_t(c.logits.size()), k = int64_t(c.ids.size());
      std::vector<float> lf = c.logits, bias = c.bias;
      std::vector<uint16_t> lb(lf.size());
      for (size_t i = 0; i < lb.size(); ++i) lb[i] = f32_to_bf16(lf[i]);  // NaN and +-inf are exact in bf16
      std::vector<int32_t> ids(size_t(k), -7);
      std::vector<float> w(size_t(k), -7.0f);
      const MoeGatingParams p{
          .logits = make_view(dt == DType::kF32 ? static_cast<void*>(lf.data()) : lb.data(), dt, {1, E}),
          .bias = bias.empty() ? TensorView{} : make_view(bias.data(), DType::kF32, {E}),
          .topk_ids = make_view(ids.data(), DType::kI32, {1, k}), .topk_weights = make_view(w.data(), DType::kF32, {1, k}),
          .score = c.score, .renormalize = c.renorm, .topk_then_softmax = c.tks};
      const Status st = moe_gating_topk(p);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(ids, c.ids);
      for (int64_t j = 0; j < k; ++j) EXPECT_NEAR(w[size_t(j)], c.w[size_t(j)], 1e-6) << "slot " << j;
    }
  // The softmax entry point shares the rule.
  std::vector<float> logits(6, -INFINITY);
  std::vector<int32_t> ids(4, -7);
  std::vector<float> w(4);
  ASSERT_TRUE(moe_gating_topk_softmax({.logits = make_view(logits.data(), DType::kF32, {1, 6}),
                                       .topk_ids = make_view(ids.data(), DType::kI32, {1, 4}),
                                       .topk_weights = make_view(w.data(), DType::kF32, {1, 4}), .renormalize = true})
                  .ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float x : w) EXPECT_FLOAT_EQ(x, 0.25f);
  });
}

TEST(MoeRouting, StableSortCountsAndRange) {
  const int64_t T = 7, k = 3, E = 5, H = 9;
  testing::Rng rng(2);
  std::vector<float> x(static_cast<size_t>(T * H));
  for (auto& v : x) v = rng.uniform();
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (auto& v : ids) v = int32_t(rng.below(E));
  for (auto [e0, e1] : {std::pair<int64_t, int64_t>{0, E}, {1, 3}, {4, 4}}) {
    std::vector<float> sorted(size_t(T * k * H), NAN);
    std::vector<int32_t> row_map(static_cast<size_t>(T * k)), inverse(size_t(T * k));
    std::vector<int64_t> counts(static_cast<size_t>(E)), offsets(static_cast<size_t>(E));
    ASSERT_TRUE(moe_init_routing({.x = make_view(x.data(), DType::kF32, {T, H}), .topk_ids = make_view(ids.data(), DType::kI32, {T, k}),
                                  .num_experts = E, .expert_begin = e0, .expert_end = e1,
                                  .sorted_rows = make_view(sorted.data(), DType::kF32, {T * k, H}),
                                  .row_map = make_view(row_map.data(), DType::kI32, {T * k}),
                                  .inverse = make_view(inverse.data(), DType::kI32, {T * k}),
                                  .counts = make_view(counts.data(), DType::kI64, {E}), .offsets = make_view(offsets.data(), DType::kI64, {E})})
                    .ok());
    int64_t pos = 0;
    for (int64_t e = 0; e < E; ++e) {
      const bool kept = e >= e0 && e < e1;
      int64_t n = 0;
      for (int64_t i = 0; i < T * k; ++i)  // (t, j) order within expert e
        if (ids[size_t(i)] == e) {
          if (!kept) {
            EXPECT_EQ(inverse[size_t(i)], -1);
            continue;
          }
          EXPECT_EQ(row_map[size_t(pos)], i);
          EXPECT_EQ(inverse[size_t(i)], pos);
          for (int64_t h = 0; h < H; ++h) ASSERT_EQ(sorted[size_t(pos * H + h)], x[size_t((i / k) * H + h)]);
          ++pos, ++n;
        }
      EXPECT_EQ(counts[size_t(e)], n);
      EXPECT_EQ(offsets[size_t(e)], pos);
    }
    for (int64_t r = pos; r < T * k; ++r) EXPECT_TRUE(std::isnan(sorted[size_t(r * H)])) << "rows past the kept count are untouched";
  }
  std::vector<int32_t> sorted_ids = {0, 0, 2, 2, 2, 4};
  std::vector<int64_t> off(5);
  ASSERT_TRUE(moe_compute_expert_tokens(make_view(sorted_ids.data(), DType::kI32, {6}), make_view(off.data(), DType::kI64, {5})).ok());
  EXPECT_EQ(off, (std::vector<int64_t>{2, 2, 5, 5, 6}));
}

// Worst skew: every token on one expert. Routing keeps token order, the other experts get
// nothing, and the single non-empty group's GEMM matches the reference at any thread count.
TEST(MoeRouting, AllTokensOnOneExpert) {
  const int64_t T = 50, E = 6, H = 20, N = 33;
  testing::Rng rng(4);
  std::vector<float> x(static_cast<size_t>(T * H)), wt(static_cast<size_t>(E * N * H));
  for (auto& v : x) v = rng.uniform();
  for (auto& v : wt) v = rng.uniform();
  std::vector<int32_t> ids(static_cast<size_t>(T), 4);
  std::vector<float> sorted(static_cast<size_t>(T * H));
  std::vector<int32_t> row_map(static_cast<size_t>(T)), inverse(static_cast<size_t>(T));
  std::vector<int64_t> counts(static_cast<size_t>(E)), offsets(static_cast<size_t>(E));
  ASSERT_TRUE(moe_init_routing({.x = make_view(x.data(), DType::kF32, {T, H}), .topk_ids = make_view(ids.data(), DType::kI32, {T, 1}),
                                .num_experts = E, .sorted_rows = make_view(sorted.data(), DType::kF32, {T, H}),
                                .row_map = make_view(row_map.data(), DType::kI32, {T}), .inverse = make_view(inverse.data(), DType::kI32, {T}),
                                .counts = make_view(counts.data(), DType::kI64, {E}), .offsets = make_view(offsets.data(), DType::kI64, {E})})
                  .ok());
  EXPECT_EQ(counts, (std::vector<int64_t>{0, 0, 0, 0, T, 0}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 0, 0, 0, T, T}));
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(row_map[size_t(t)], t);
    EXPECT_EQ(inverse[size_t(t)], t);
  }
  EXPECT_EQ(sorted, x);
  PackedWeights w;
  ASSERT_TRUE(pack_weights({.w = make_view(wt.data(), DType::kF32, {E, N, H})}, &w).ok());
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> y(static_cast<size_t>(T * N));
    GroupedMatmulParams p{.x = make_view(sorted.data(), DType::kF32, {T, H}), .weights = &w,
                          .group_offsets = make_view(offsets.data(), DType::kI64, {E}), .out = make_view(y.data(), DType::kF32, {T, N})};
    std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
    ASSERT_TRUE(grouped_matmul(p, {ws.data(), ws.size()}).ok());
    std::vector<double> got(y.begin(), y.end()), ref;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t h = 0; h < H; ++h) acc += double(x[size_t(t * H + h)]) * wt[size_t((4 * N + n) * H + h)];
        ref.push_back(acc);
      }
    EXPECT_TRUE(testing::compare(got, ref, {1e-5, 1e-5}).pass) << "threads=" << threads;
  }
  set_num_threads(0);
}

// Dynamic per-token int8 of the routed rows: codes within 1 LSB of the exact x / scale,
// scale = max|row| / 127 exactly, all-zero rows give scale 0, same order as the plain gather.
TEST(MoeRouting, Int8RowsWithinOneLsbOfDoubleReference) {
  const int64_t T = 9, k = 2, E = 4, H = 37;  // H not a multiple of 16
  testing::Rng rng(5);
  std::vector<uint16_t> xb(static_cast<size_t>(T * H));
  testing::fill_bf16(xb.data(), T * H, rng);
  for (int64_t h = 0; h < H; ++h) xb[size_t(3 * H + h)] = 0;  // token 3: all zero
  std::vector<float> xf(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) xf[i] = bf16_to_f32(xb[i]) * 3.0f;
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  for (auto& v : ids) v = int32_t(rng.below(E));
  for (DType dt : {DType::kBF16, DType::kF32}) {
    void* x = dt == DType::kBF16 ? static_cast<void*>(xb.data()) : static_cast<void*>(xf.data());
    auto xv = [&](int64_t t, int64_t h) {
      return dt == DType::kBF16 ? double(bf16_to_f32(xb[size_t(t * H + h)])) : double(xf[size_t(t * H + h)]);
    };
    std::vector<int8_t> q(static_cast<size_t>(T * k * H));
    std::vector<float> scales(static_cast<size_t>(T * k), -1.0f);
    std::vector<int32_t> row_map(static_cast<size_t>(T * k)), inverse(size_t(T * k));
    std::vector<int64_t> counts(static_cast<size_t>(E)), offsets(static_cast<size_t>(E));
    MoeRoutingParams p{.x = make_view(x, dt, {T, H}), .topk_ids = make_view(ids.data(), DType::kI32, {T, k}), .num_experts = E,
                       .sorted_rows = make_view(q.data(), DType::kI8, {T * k, H}),
                       .row_scales = make_view(scales.data(), DType::kF32, {T * k}),
                       .row_map = make_view(row_map.data(), DType::kI32, {T * k}),
                       .inverse = make_view(inverse.data(), DType::kI32, {T * k}),
                       .counts = make_view(counts.data(), DType::kI64, {E}), .offsets = make_view(offsets.data(), DType::kI64, {E})};
    ASSERT_TRUE(moe_init_routing(p).ok());
    for (int64_t pos = 0; pos < T * k; ++pos) {
      const int64_t t = row_map[size_t(pos)] / k;
      double amax = 0;
      for (int64_t h = 0; h < H; ++h) amax = std::max(amax, std::fabs(xv(t, h)));
      EXPECT_NEAR(scales[size_t(pos)], amax / 127, amax / 127 * 1e-6) << "row " << pos;
      for (int64_t h = 0; h < H; ++h) {
        const int c = q[size_t(pos * H + h)];
        const double exact = amax > 0 ? xv(t, h) * 127 / amax : 0.0;
        ASSERT_LE(std::fabs(c - exact), 1.0) << dtype_name(dt) << " row " << pos << " h " << h;
        ASSERT_GE(c, -127);
      }
    }
    p.row_scales = make_view(scales.data(), DType::kF32, {T * k - 1});
    const Status bad = moe_init_routing(p);
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(bad.message().find("row_scales"), std::string::npos) << bad.message();
  }
}

// x sorted by group, E experts of [N, K]; compare to per-row double dot products.
// 1 thread runs each GEMM in turn; 2 and 3 threads take the expert queue (6 non-empty
// groups, the 300-row one cut into row tiles), so every schedule meets the same reference.
TEST(GroupedMatmul, MatchesPerExpertReferenceWithEmptyGroupsOnSelectedIsa) {
  for (int threads : {1, 2, 3})
  for (DType dt : {DType::kF32, DType::kBF16}) {
    set_num_threads(threads);
    const int64_t E = 8, K = 37, N = 70, I = 35;
    const std::vector<int64_t> counts = {3, 0, 17, 1, 0, 2, 300, 1};
    const int64_t rows = 324, M = rows + 4;  // 4 tail rows past the groups stay untouched
    testing::Rng rng(9);
    std::vector<float> xf(static_cast<size_t>(M * K)), wf(size_t(E * N * K));
    for (auto& v : xf) v = rng.uniform();
    for (auto& v : wf) v = rng.uniform();
    std::vector<uint16_t> xb(xf.size()), wb(wf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]), xf[i] = dt == DType::kBF16 ? bf16_to_f32(xb[i]) : xf[i];
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]), wf[i] = dt == DType::kBF16 ? bf16_to_f32(wb[i]) : wf[i];
    void* xd = dt == DType::kBF16 ? static_cast<void*>(xb.data()) : xf.data();
    PackedWeights w;
    ASSERT_TRUE(pack_weights({.w = make_view(dt == DType::kBF16 ? static_cast<void*>(wb.data()) : wf.data(), dt, {E, N, K})}, &w).ok());
    std::vector<int64_t> offs(static_cast<size_t>(E));
    std::partial_sum(counts.begin(), counts.end(), offs.begin());
    std::vector<float> out(size_t(M * N), NAN);
    GroupedMatmulParams p{.x = make_view(xd, dt, {M, K}), .weights = &w, .group_offsets = make_view(offs.data(), DType::kI64, {E}),
                          .out = make_view(out.data(), DType::kF32, {M, N})};
    std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
    ASSERT_TRUE(grouped_matmul(p, {ws.data(), ws.size()}).ok());
    std::vector<double> got, ref;
    int64_t r = 0;
    for (int64_t g = 0; g < E; ++g)
      for (int64_t i = 0; i < counts[size_t(g)]; ++i, ++r)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0;
          for (int64_t kk = 0; kk < K; ++kk) s += double(xf[size_t(r * K + kk)]) * wf[size_t((g * N + n) * K + kk)];
          ref.push_back(s);
          got.push_back(out[size_t(r * N + n)]);
        }
    EXPECT_TRUE(testing::compare(got, ref, {1e-4, 1e-4}).pass) << dtype_name(dt) << " threads=" << threads;
    for (int64_t t = rows; t < M; ++t) EXPECT_TRUE(std::isnan(out[size_t(t * N)])) << "row " << t << " past the groups was written";
    // counts form of the same call
    std::vector<float> out2(size_t(M * N), NAN);
    GroupedMatmulParams pc = p;
    pc.group_offsets = make_view(const_cast<int64_t*>(counts.data()), DType::kI64, {E});
    pc.offsets_are_counts = true;
    pc.out = make_view(out2.data(), DType::kF32, {M, N});
    ASSERT_TRUE(grouped_matmul(pc, {ws.data(), ws.size()}).ok());
    for (int64_t i = 0; i < rows * N; ++i) ASSERT_EQ(out[size_t(i)], out2[size_t(i)]);
    // SwiGLU: weights [2I, K] = [gate; up] per expert
    std::vector<float> h(size_t(M * I), NAN);
    GroupedMatmulSwigluParams s{.x = p.x, .weights = &w, .group_offsets = p.group_offsets, .out = make_view(h.data(), DType::kF32, {M, I})};
    std::vector<uint8_t> ws2(grouped_matmul_swiglu_workspace_size(s));
    { const Status st = grouped_matmul_swiglu(s, {ws2.data(), ws2.size()}); ASSERT_TRUE(st.ok()) << st.message(); }
    got.clear(), ref.clear();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < I; ++c) {
        ref.push_back(moe_testutil::silu(double(out[size_t(i * N + c)])) * out[size_t(i * N + I + c)]);
        got.push_back(h[size_t(i * I + c)]);
      }
    EXPECT_TRUE(testing::compare(got, ref, {1e-5, 1e-4}).pass) << dtype_name(dt) << " threads=" << threads;
  }
  set_num_threads(0);
}

// K = 0: every output row of a group is an empty sum, exactly 0 (SwiGLU: silu(0) * 0),
// whatever the workspace held before (NaN here). bf16 x with bf16 weights takes the AMX
// path from 4 rows, whose K loop had run no block and left the workspace's bytes in the
// accumulator tile.
TEST(GroupedMatmul, ZeroKGivesZerosWhateverTheWorkspaceHeld) {
  for (int threads : {1, 2})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      set_num_threads(threads);
      const int64_t E = 3, N = 128, I = 64;
      std::vector<int64_t> offs = {5, 5, 45};  // groups of 5, 0 and 40 rows
      const int64_t M = offs.back();
      PackedWeights w;
      std::vector<float> wdummy(1);
      ASSERT_TRUE(pack_weights({.w = make_view(wdummy.data(), dt, {E, N, 0})}, &w).ok());
      std::vector<float> x(1);
      std::vector<float> out(size_t(M * N), NAN), h(size_t(M * I), NAN);
      GroupedMatmulParams p{.x = make_view(x.data(), dt, {M, 0}), .weights = &w, .group_offsets = make_view(offs.data(), DType::kI64, {E}),
                            .out = make_view(out.data(), DType::kF32, {M, N})};
      std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
      std::fill(reinterpret_cast<float*>(ws.data()), reinterpret_cast<float*>(ws.data()) + ws.size() / 4, NAN);
      { const Status st = grouped_matmul(p, {ws.data(), ws.size()}); ASSERT_TRUE(st.ok()) << st.message(); }
      for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f) << dtype_name(dt) << " threads=" << threads << " element " << i;
      GroupedMatmulSwigluParams s{.x = p.x, .weights = &w, .group_offsets = p.group_offsets, .out = make_view(h.data(), DType::kF32, {M, I})};
      std::vector<uint8_t> ws2(grouped_matmul_swiglu_workspace_size(s));
      std::fill(reinterpret_cast<float*>(ws2.data()), reinterpret_cast<float*>(ws2.data()) + ws2.size() / 4, NAN);
      { const Status st = grouped_matmul_swiglu(s, {ws2.data(), ws2.size()}); ASSERT_TRUE(st.ok()) << st.message(); }
      for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h[i], 0.0f) << "swiglu " << dtype_name(dt) << " threads=" << threads << " element " << i;
    }
  set_num_threads(0);
}

// bf16 output of grouped_matmul for each weight kind (f32 x with f32 weights, bf16 with
// bf16 — the AMX path from 4 rows — and bf16 x with int8 per-channel weights), under the
// split (1 thread) and queue (2, 3 threads) schedules. Each element within one bf16
// rounding of the double product plus f32 accumulation (K * eps * sum|a b|); the output
// starts as bf16 NaN, and rows past the groups must keep it.
TEST(GroupedMatmul, Bf16OutputMatchesPerExpertReferenceOnSelectedIsa) {
  const int64_t E = 8, K = 45, N = 70;
  const std::vector<int64_t> counts = {3, 0, 17, 1, 0, 2, 300, 1};
  const int64_t rows = 324, M = rows + 4;
  std::vector<int64_t> offs(counts.size());
  std::partial_sum(counts.begin(), counts.end(), offs.begin());
  enum class Kind { kF32, kBF16, kI8Weights };
  for (Kind kind : {Kind::kF32, Kind::kBF16, Kind::kI8Weights}) {
    testing::Rng rng(40 + uint64_t(kind));
    const DType xdt = kind == Kind::kF32 ? DType::kF32 : DType::kBF16;
    // Values as the op sees them (bf16-rounded where stored as bf16), for the reference.
    std::vector<float> xf(size_t(M * K)), wf(size_t(E * N * K)), scales(size_t(E * N));
    std::vector<uint16_t> xb(xf.size()), wb(wf.size());
    std::vector<int8_t> wq(wf.size());
    for (size_t i = 0; i < xf.size(); ++i) {
      xb[i] = f32_to_bf16(rng.uniform());
      xf[i] = xdt == DType::kBF16 ? bf16_to_f32(xb[i]) : rng.uniform();
    }
    for (auto& s : scales) s = rng.uniform(0.001f, 0.02f);
    for (size_t i = 0; i < wf.size(); ++i) {
      if (kind == Kind::kI8Weights) {
        wq[i] = int8_t(int(rng.below(255)) - 127);
        wf[i] = float(wq[i]);  // the per-channel scale is applied to the sum below
      } else {
        wb[i] = f32_to_bf16(rng.uniform());
        wf[i] = kind == Kind::kBF16 ? bf16_to_f32(wb[i]) : rng.uniform();
      }
    }
    PackedWeights w;
    if (kind == Kind::kI8Weights)
      ASSERT_TRUE(pack_weights({.w = make_view(wq.data(), DType::kI8, {E, N, K}), .scales = make_view(scales.data(), DType::kF32, {E, N})}, &w).ok());
    else
      ASSERT_TRUE(pack_weights({.w = make_view(kind == Kind::kBF16 ? static_cast<void*>(wb.data()) : wf.data(), xdt, {E, N, K})}, &w).ok());
    std::vector<double> ref, extra;
    for (int64_t g = 0, r = 0; g < E; ++g)
      for (int64_t i = 0; i < counts[size_t(g)]; ++i, ++r)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0, mag = 0;
          for (int64_t kk = 0; kk < K; ++kk) {
            const double prod = double(xf[size_t(r * K + kk)]) * wf[size_t((g * N + n) * K + kk)];
            s += prod, mag += std::fabs(prod);
          }
          const double sc = kind == Kind::kI8Weights ? scales[size_t(g * N + n)] : 1.0;
          s *= sc, mag *= sc;
          const double acc_err = double(K + 2) * testing::kEpsF32 * mag;
          ref.push_back(s);
          extra.push_back(acc_err + testing::kEpsBF16 * (std::fabs(s) + acc_err));
        }
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      const std::string what = "kind=" + std::to_string(int(kind)) + " threads=" + std::to_string(threads);
      std::vector<uint16_t> out(size_t(M * N), 0x7fc0);  // bf16 NaN
      GroupedMatmulParams p{.x = make_view(xdt == DType::kBF16 ? static_cast<void*>(xb.data()) : xf.data(), xdt, {M, K}),
                            .weights = &w, .group_offsets = make_view(offs.data(), DType::kI64, {E}),
                            .out = make_view(out.data(), DType::kBF16, {M, N})};
      std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
      const Status st = grouped_matmul(p, {ws.data(), ws.size()});
      ASSERT_TRUE(st.ok()) << what << ": " << st.message();
      std::vector<double> got(size_t(rows * N));
      for (int64_t i = 0; i < rows * N; ++i) got[size_t(i)] = bf16_to_f32(out[size_t(i)]);
      const testing::CompareResult c = testing::compare(got, ref, {0.0, 0.0}, &extra);
      EXPECT_TRUE(c.pass) << what << ": " << c.message;
      for (int64_t i = rows * N; i < M * N; ++i) ASSERT_EQ(out[size_t(i)], 0x7fc0) << what << ": element " << i << " past the groups written";
    }
  }
  set_num_threads(0);
}

// grouped_matmul_swiglu on both paths (I = 64: SwiGLU in the GEMM epilogue; I = 35:
// through the f32 buffer), f32 / bf16 / per-token int8 output, 1 thread (split) and 2, 3
// (queue), against silu(gate) * up in double from the plain arrays. Int8: scale within
// rounding of max|row| / 127 and codes within 1 LSB; rows past the groups untouched.
// Decode-sized calls (12 rows: the buffer at every I, the queue's items cut into column
// pieces, SwiGLU once the queue is done) with I = 64 and 100 (a partial last panel).
TEST(GroupedMatmulSwiglu, FusedBufferedAndInt8OutputMatchReference) {
  for (const bool decode : {false, true}) {
  const int64_t E = 8, K = 50, rows = decode ? 9 : 330, M = rows + 3;
  const std::vector<int64_t> counts = decode ? std::vector<int64_t>{1, 0, 2, 1, 0, 1, 3, 1} : std::vector<int64_t>{3, 0, 17, 1, 0, 2, 306, 1};
  std::vector<int64_t> offs(counts.size());
  std::partial_sum(counts.begin(), counts.end(), offs.begin());
  testing::Rng rng(33);
  std::vector<uint16_t> x(size_t(M * K));
  testing::fill_bf16(x.data(), M * K, rng);
  for (int64_t I : decode ? std::vector<int64_t>{64, 100} : std::vector<int64_t>{64, 35}) {
    std::vector<uint16_t> w(size_t(E * 2 * I * K));
    testing::fill_bf16(w.data(), int64_t(w.size()), rng);
    PackedWeights pw;
    ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kBF16, {E, 2 * I, K})}, &pw).ok());
    std::vector<double> ref(size_t(rows * I)), amax(size_t(rows), 0.0);
    for (int64_t g = 0, r = 0; g < E; ++g)
      for (int64_t i = 0; i < counts[size_t(g)]; ++i, ++r)
        for (int64_t c = 0; c < I; ++c) {
          double gate = 0, up = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double a = bf16_to_f32(x[size_t(r * K + k)]);
            gate += a * bf16_to_f32(w[size_t((g * 2 * I + c) * K + k)]);
            up += a * bf16_to_f32(w[size_t((g * 2 * I + I + c) * K + k)]);
          }
          ref[size_t(r * I + c)] = moe_testutil::silu(gate) * up;
          amax[size_t(r)] = std::max(amax[size_t(r)], std::fabs(ref[size_t(r * I + c)]));
        }
    for (int threads : {1, 2, 3})
      for (DType od : {DType::kF32, DType::kBF16, DType::kI8}) {
        set_num_threads(threads);
        const std::string what = "I=" + std::to_string(I) + " out=" + dtype_name(od) + " threads=" + std::to_string(threads);
        std::vector<float> of(size_t(M * I), NAN), sc(size_t(M), NAN);
        std::vector<uint16_t> ob(size_t(M * I), 0x7fc0);
        std::vector<int8_t> oq(size_t(M * I), 99);
        void* od_ptr = od == DType::kF32 ? static_cast<void*>(of.data()) : od == DType::kBF16 ? static_cast<void*>(ob.data()) : oq.data();
        GroupedMatmulSwigluParams p{.x = make_view(x.data(), DType::kBF16, {M, K}), .weights = &pw,
                                    .group_offsets = make_view(offs.data(), DType::kI64, {E}),
                                    .out = make_view(od_ptr, od, {M, I})};
        if (od == DType::kI8) p.out_scales = make_view(sc.data(), DType::kF32, {M});
        std::vector<uint8_t> ws(grouped_matmul_swiglu_workspace_size(p));
        const Status st = grouped_matmul_swiglu(p, {ws.data(), ws.size()});
        ASSERT_TRUE(st.ok()) << what << ": " << st.message();
        if (od == DType::kI8) {
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_NEAR(sc[size_t(r)], amax[size_t(r)] / 127, amax[size_t(r)] / 127 * 1e-4) << what << " row " << r;
            for (int64_t c = 0; c < I; ++c) {
              const double exact = ref[size_t(r * I + c)] * 127 / amax[size_t(r)];
              ASSERT_LE(std::fabs(oq[size_t(r * I + c)] - exact), 1.0) << what << " row " << r << " col " << c;
            }
          }
          for (int64_t r = rows; r < M; ++r) {
            EXPECT_TRUE(std::isnan(sc[size_t(r)])) << what << ": scale of row " << r << " past the groups written";
            EXPECT_EQ(oq[size_t(r * I)], 99) << what << ": row " << r << " past the groups written";
          }
          continue;
        }
        std::vector<double> got(size_t(rows * I)), r_(ref.begin(), ref.end());
        for (int64_t i = 0; i < rows * I; ++i) got[size_t(i)] = od == DType::kF32 ? of[size_t(i)] : bf16_to_f32(ob[size_t(i)]);
        const testing::CompareResult c = testing::compare(got, r_, od == DType::kF32 ? testing::Tolerance{1e-5, 1e-4} : testing::Tolerance{1e-2, 1e-2});
        EXPECT_TRUE(c.pass) << what << ": " << c.message;
        for (int64_t r = rows; r < M; ++r) {
          if (od == DType::kF32) EXPECT_TRUE(std::isnan(of[size_t(r * I)])) << what << ": row " << r << " past the groups written";
          else EXPECT_EQ(ob[size_t(r * I)], 0x7fc0) << what << ": row " << r << " past the groups written";
        }
      }
    // Bad arguments name themselves.
    std::vector<float> of(static_cast<size_t>(M * I)), sc(static_cast<size_t>(M));
    GroupedMatmulSwigluParams p{.x = make_view(x.data(), DType::kBF16, {M, K}), .weights = &pw,
                                .group_offsets = make_view(offs.data(), DType::kI64, {E}),
                                .out = make_view(of.data(), DType::kF32, {M, I}), .out_scales = make_view(sc.data(), DType::kF32, {M})};
    std::vector<uint8_t> ws(1 << 22);
    Status st = grouped_matmul_swiglu(p, {ws.data(), ws.size()});
    EXPECT_NE(st.message().find("out_scales given but out.dtype=f32"), std::string::npos) << st.message();
    p.out = make_view(of.data(), DType::kI8, {M, I});
    p.out_scales = {};
    st = grouped_matmul_swiglu(p, {ws.data(), ws.size()});
    EXPECT_NE(st.message().find("out_scales must be contiguous f32"), std::string::npos) << st.message();
  }
  }
  set_num_threads(0);
}

// The workspace never shrinks as the rows grow, across the switch from unfused SwiGLU
// (decode-sized parts, kColumnCutRows) to the fused epilogue: one sized for the longest
// call serves the decode steps.
TEST(GroupedMatmulSwiglu, WorkspaceGrowsWithRows) {
  const int64_t E = 4, K = 96, I = 128;
  std::vector<uint16_t> w(size_t(E * 2 * I * K), 0x3f80);
  PackedWeights pw;
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kBF16, {E, 2 * I, K})}, &pw).ok());
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (DType od : {DType::kBF16, DType::kI8}) {
      size_t prev = 0;
      for (int64_t M = 1; M <= 70; ++M) {
        GroupedMatmulSwigluParams p{.x = make_view(nullptr, DType::kBF16, {M, K}), .weights = &pw,
                                    .out = make_view(nullptr, od, {M, I})};
        if (od == DType::kI8) p.out_scales = make_view(nullptr, DType::kF32, {M});
        const size_t n = grouped_matmul_swiglu_workspace_size(p);
        ASSERT_GT(n, 0u) << "M=" << M;
        EXPECT_GE(n, prev) << dtype_name(od) << " M=" << M << " threads=" << threads;
        prev = n;
      }
    }
  }
  set_num_threads(0);
}

// Weight-only int8 experts (per-output-channel scales) through both schedules, against
// the dequantised weights in double.
TEST(GroupedMatmul, Int8WeightsMatchDequantisedReferenceOnSelectedIsa) {
  const int64_t E = 6, K = 45, N = 67;
  const std::vector<int64_t> counts = {4, 0, 9, 1, 20, 3};
  const int64_t M = 37;
  testing::Rng rng(21);
  std::vector<uint16_t> x(static_cast<size_t>(M * K));
  testing::fill_bf16(x.data(), M * K, rng);
  std::vector<int8_t> q(static_cast<size_t>(E * N * K));
  std::vector<float> sc(static_cast<size_t>(E * N));
  for (auto& v : q) v = int8_t(int(rng.below(255)) - 127);
  for (auto& v : sc) v = rng.uniform(0.001f, 0.02f);
  PackedWeights w;
  ASSERT_TRUE(pack_weights({.w = make_view(q.data(), DType::kI8, {E, N, K}), .scales = make_view(sc.data(), DType::kF32, {E, N})}, &w).ok());
  std::vector<int64_t> offs(counts.size());
  std::partial_sum(counts.begin(), counts.end(), offs.begin());
  std::vector<double> ref;
  for (int64_t g = 0, r = 0; g < E; ++g)
    for (int64_t i = 0; i < counts[size_t(g)]; ++i, ++r)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(bf16_to_f32(x[size_t(r * K + k)])) * q[size_t((g * N + n) * K + k)];
        ref.push_back(acc * sc[size_t(g * N + n)]);
      }
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> y(static_cast<size_t>(M * N));
    GroupedMatmulParams p{.x = make_view(x.data(), DType::kBF16, {M, K}), .weights = &w,
                          .group_offsets = make_view(offs.data(), DType::kI64, {E}), .out = make_view(y.data(), DType::kF32, {M, N})};
    std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
    const Status st = grouped_matmul(p, {ws.data(), ws.size()});
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<double> got(y.begin(), y.end());
    const testing::CompareResult c = testing::compare(got, ref, {1e-5, 1e-4});
    EXPECT_TRUE(c.pass) << "threads=" << threads << ": " << c.message;
  }
  set_num_threads(0);
}

TEST(MoeFinalize, WeightedSumSkipsDroppedRows) {
  const int64_t T = 3, k = 2, H = 5, R = 4;
  std::vector<float> y(static_cast<size_t>(R * H)), shared(size_t(T * H)), res(size_t(T * H)), out(size_t(T * H));
  testing::Rng rng(1);
  for (auto* v : {&y, &shared, &res})
    for (auto& x : *v) x = rng.uniform();
  std::vector<int32_t> inv = {0, 3, -1, 1, 2, -1};
  std::vector<float> w = {0.5f, 0.25f, 0.7f, 0.3f, 1.0f, 2.0f};
  ASSERT_TRUE(moe_finalize_routing({.y = make_view(y.data(), DType::kF32, {R, H}), .inverse = make_view(inv.data(), DType::kI32, {T * k}),
                                    .weights = make_view(w.data(), DType::kF32, {T, k}), .shared = make_view(shared.data(), DType::kF32, {T, H}),
                                    .residual = make_view(res.data(), DType::kF32, {T, H}), .out = make_view(out.data(), DType::kF32, {T, H})})
                  .ok());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double want = shared[size_t(t * H + h)] + res[size_t(t * H + h)];
      for (int64_t j = 0; j < k; ++j)
        if (inv[size_t(t * k + j)] >= 0) want += double(w[size_t(t * k + j)]) * y[size_t(inv[size_t(t * k + j)] * H + h)];
      EXPECT_NEAR(out[size_t(t * H + h)], want, 1e-5);
    }
}

// Every dtype mix finalize takes (y, shared, residual and out each f32 or bf16), with the
// shared-expert output and the residual each present or absent, against the sum in double
// of the values as stored. out starts as NaN: a token the op skips (here token 4, whose
// slots are all dropped) fails. Bound: f32 accumulation of k + 2 terms, plus one bf16
// rounding of the result for a bf16 out. T > 4 takes the threaded loop; H = 37 is not a
// multiple of 16.
TEST(MoeFinalize, DtypesAndOptionalInputsMatchDoubleSum) {
  const int64_t T = 9, k = 3, H = 37, R = 20;
  testing::Rng rng(77);
  std::vector<int32_t> inv(static_cast<size_t>(T * k));
  for (auto& v : inv) v = rng.below(6) == 0 ? -1 : int32_t(rng.below(R));  // ~1 slot in 6 dropped
  for (int64_t j = 0; j < k; ++j) inv[size_t(4 * k + j)] = -1;             // token 4: all dropped
  std::vector<float> w(static_cast<size_t>(T * k));
  for (auto& v : w) v = rng.uniform(0.0f, 2.0f);
  // One f32 and one bf16 copy of each input, holding the same (bf16-exact) values.
  struct Input {
    std::vector<float> f;
    std::vector<uint16_t> b;
    void* data(DType dt) { return dt == DType::kF32 ? static_cast<void*>(f.data()) : b.data(); }
  };
  auto make = [&](int64_t n, float a) {
    Input in{std::vector<float>(static_cast<size_t>(n)), std::vector<uint16_t>(static_cast<size_t>(n))};
    for (int64_t i = 0; i < n; ++i) in.b[size_t(i)] = f32_to_bf16(rng.uniform(-a, a)), in.f[size_t(i)] = bf16_to_f32(in.b[size_t(i)]);
    return in;
  };
  Input y = make(R * H, 3.0f), shared = make(T * H, 1.0f), res = make(T * H, 10.0f);
  for (DType ydt : {DType::kF32, DType::kBF16})
    for (DType sdt : {DType::kF32, DType::kBF16})
      for (DType odt : {DType::kF32, DType::kBF16})
        for (bool with_shared : {false, true})
          for (bool with_res : {false, true}) {
            std::vector<float> of(static_cast<size_t>(T * H), NAN);
            std::vector<uint16_t> ob(static_cast<size_t>(T * H), 0x7fc0);
            MoeFinalizeParams p{.y = make_view(y.data(ydt), ydt, {R, H}), .inverse = make_view(inv.data(), DType::kI32, {T * k}),
                                .weights = make_view(w.data(), DType::kF32, {T, k}),
                                .out = make_view(odt == DType::kF32 ? static_cast<void*>(of.data()) : ob.data(), odt, {T, H})};
            if (with_shared) p.shared = make_view(shared.data(sdt), sdt, {T, H});
            if (with_res) p.residual = make_view(res.data(sdt), sdt, {T, H});
            const std::string what = std::string("y=") + dtype_name(ydt) + " shared/residual=" + dtype_name(sdt) +
                                     " out=" + dtype_name(odt) + " shared=" + std::to_string(with_shared) +
                                     " residual=" + std::to_string(with_res);
            const Status st = moe_finalize_routing(p);
            ASSERT_TRUE(st.ok()) << what << ": " << st.message();
            std::vector<double> got, ref, extra;
            moe_testutil::finalize_ref(y.f.data(), inv.data(), w.data(), with_shared ? shared.f.data() : nullptr,
                                       with_res ? res.f.data() : nullptr, T, k, H, odt == DType::kBF16, ref, extra);
            for (int64_t i = 0; i < T * H; ++i) got.push_back(odt == DType::kF32 ? double(of[size_t(i)]) : double(bf16_to_f32(ob[size_t(i)])));
            const testing::CompareResult c = testing::compare(got, ref, {0.0, 0.0}, &extra);
            EXPECT_TRUE(c.pass) << what << ": " << c.message;
          }
}

using moe_testutil::LayerCase;

// moe_forward on random weights against the double evaluation of the same model
// (moe_testutil::run_moe_forward: NaN-poisoned output, bf16 held to 2x the naive bf16
// pipeline's error).
void check_moe_forward(const LayerCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name());
  const moe_testutil::LayerOutcome o = moe_testutil::run_moe_forward(c, seed);
  ASSERT_TRUE(o.status.ok()) << o.status.message();
  EXPECT_TRUE(o.cmp.pass) << o.cmp.message;
}

// The whole layer against a double-precision evaluation of the same model. I = 24 puts
// SwiGLU through the buffered path, I = 64 (shared 128) into the GEMM epilogue; the router
// goes unpacked, or packed once for odd T. Two threads: at T >= 7 the routed and shared
// experts share one queue, at T = 1 the split schedule runs. H = 40 and 56 are not
// multiples of 16 (a vector tail in every GEMM row and in finalize).
TEST(MoeForward, MatchesDoubleCompositionOnSelectedIsa) {
  set_num_threads(2);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t I : {24, 64})
      for (int64_t T : {0, 1, 7, 40, 128, 1000}) {
        LayerCase c;
        c.dt = dt, c.T = T, c.I = I, c.Is = I == 24 ? 32 : 128, c.packed_router = T % 2;
        c.H = T == 128 ? 40 : T == 7 ? 56 : 48;
        check_moe_forward(c, uint64_t(T));
      }
  set_num_threads(0);
}

// The router options moe_gating_topk takes, through the whole layer: DeepSeek-V2's
// group-limited softmax with routed_scaling_factor 16 (not renormalised), V3's sigmoid
// with correction bias, groups, renormalisation and factor 2.5, V4's sqrt-softplus, and a
// layer without shared experts. The bias steers the choice only, so a reference that
// weighted by score + bias, or ignored the groups, would disagree.
TEST(MoeForward, RouterOptionsMatchDoubleCompositionOnSelectedIsa) {
  set_num_threads(2);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t T : {1, 7, 128}) {
      LayerCase v2;  // softmax, 4 groups of 2, keep 2 groups, top-3, x16, no renormalisation
      v2.dt = dt, v2.T = T, v2.H = 40, v2.n_group = 4, v2.topk_group = 2, v2.renorm = false, v2.scaling = 16.0f;
      check_moe_forward(v2, 100 + uint64_t(T));
      LayerCase v3;  // sigmoid + bias, 4 groups of 4, keep 2, top-4, renormalised, x2.5; fused SwiGLU width
      v3.dt = dt, v3.T = T, v3.E = 16, v3.k = 4, v3.I = 64, v3.Is = 64, v3.score = MoeScore::kSigmoid, v3.n_group = 4,
      v3.topk_group = 2, v3.bias = true, v3.scaling = 2.5f;
      check_moe_forward(v3, 200 + uint64_t(T));
      v3.gs = MoeGroupScore::kTop2Sum;  // DeepSeek-V3's group score: the sum of each group's top two
      check_moe_forward(v3, 250 + uint64_t(T));
      LayerCase v4;  // sqrt(softplus) + bias, renormalised, x1.5, no shared experts, H = 56
      v4.dt = dt, v4.T = T, v4.H = 56, v4.score = MoeScore::kSqrtSoftplus, v4.bias = true, v4.scaling = 1.5f, v4.Is = 0;
      check_moe_forward(v4, 300 + uint64_t(T));
      LayerCase sig;  // sigmoid without bias or renormalisation: weights are the raw scores
      sig.dt = dt, sig.T = T, sig.score = MoeScore::kSigmoid, sig.renorm = false, sig.packed_router = true;
      check_moe_forward(sig, 400 + uint64_t(T));
    }
  set_num_threads(0);
}

// Called from the threads of an engine's own parallel region (nesting off): the layer's
// queue, its split decode schedule and the GEMMs inside run on the calling thread, and
// give bitwise what one thread gives.
TEST(MoeForward, CalledFromInsideAParallelRegion) {
  for (int64_t T : {1, 40}) {
    LayerCase c;
    c.dt = DType::kBF16, c.T = T, c.I = 64, c.Is = 128;
    set_num_threads(1);
    const moe_testutil::LayerOutcome want = moe_testutil::run_moe_forward(c, 600 + uint64_t(T));
    set_num_threads(2);
    moe_testutil::LayerOutcome got[2];
#pragma omp parallel num_threads(2)
    got[omp_get_thread_num()] = moe_testutil::run_moe_forward(c, 600 + uint64_t(T));
    set_num_threads(0);
    ASSERT_TRUE(want.status.ok() && want.cmp.pass) << c.name() << ": " << want.cmp.message;
    for (int t = 0; t < 2; ++t) {
      EXPECT_TRUE(got[t].status.ok() && got[t].cmp.pass) << c.name() << ", thread " << t << ": " << got[t].cmp.message;
      EXPECT_EQ(got[t].out, want.out) << c.name() << ", thread " << t;
    }
  }
}

// Worst skew through the layer: a correction bias sends every token to expert 5 (top-1,
// weight = its unbiased softmax score), so one group holds all T rows and the other seven
// are empty; at T = 300 that group is cut into row tiles in the queue.
TEST(MoeForward, AllTokensOnOneExpertOnSelectedIsa) {
  for (int threads : {1, 2})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int64_t T : {1, 7, 300}) {
        set_num_threads(threads);
        LayerCase c;
        c.dt = dt, c.T = T, c.k = 1, c.hot_expert = 5, c.renorm = false, c.H = 40;
        check_moe_forward(c, 500 + uint64_t(T));
      }
  set_num_threads(0);
}

// No heap allocation inside a call (DESIGN.md): every MoE op after a first call (lazy
// registries, the thread pool), on both grouped schedules at two threads: T = 64 over 8
// experts queues its items, T = 1 splits each GEMM; schedule statistics requested with
// their vector already sized. The grouped GEMMs once built their item lists and job
// arrays in std::vectors.
TEST(MoeForward, NoHeapAllocationInsideACall) {
  const int64_t H = 32, E = 8, k = 2, I = 64, Is = 64;
  testing::Rng rng{77};
  auto rnd = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = rng.uniform(-1, 1);
    return v;
  };
  std::vector<float> router = rnd(E * H), gu = rnd(E * 2 * I * H), dn = rnd(E * H * I), sgu = rnd(2 * Is * H), sdn = rnd(H * Is);
  PackedWeights Wgu, Wdn, Sgu, Sdn;
  ASSERT_TRUE(pack_weights({.w = make_view(gu.data(), DType::kF32, {E, 2 * I, H})}, &Wgu).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(dn.data(), DType::kF32, {E, H, I})}, &Wdn).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(sgu.data(), DType::kF32, {2 * Is, H})}, &Sgu).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(sdn.data(), DType::kF32, {H, Is})}, &Sdn).ok());
  for (const int64_t T : {64, 1}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    std::vector<float> x = rnd(size_t(T * H)), out(size_t(T * H)), logits = rnd(size_t(T * E)), w(size_t(T * k)), h(size_t(T * k * I));
    std::vector<float> sorted(size_t(T * k * H)), y(size_t(T * k * H));
    std::vector<int32_t> ids(size_t(T * k)), row_map(size_t(T * k)), inverse(size_t(T * k));
    std::vector<int64_t> counts(E), offsets(E);
    ScheduleStats stats;
    stats.busy_s.resize(2);
    const MoeForwardParams fp{.x = make_view(x.data(), DType::kF32, {T, H}), .router = make_view(router.data(), DType::kF32, {E, H}),
                              .top_k = k, .gate_up = &Wgu, .down = &Wdn, .shared_gate_up = &Sgu, .shared_down = &Sdn,
                              .out = make_view(out.data(), DType::kF32, {T, H}), .stats = &stats};
    const MoeGatingParams gp{.logits = make_view(logits.data(), DType::kF32, {T, E}), .topk_ids = make_view(ids.data(), DType::kI32, {T, k}),
                             .topk_weights = make_view(w.data(), DType::kF32, {T, k})};
    const MoeRoutingParams rp{.x = make_view(x.data(), DType::kF32, {T, H}), .topk_ids = gp.topk_ids, .num_experts = E,
                              .sorted_rows = make_view(sorted.data(), DType::kF32, {T * k, H}),
                              .row_map = make_view(row_map.data(), DType::kI32, {T * k}),
                              .inverse = make_view(inverse.data(), DType::kI32, {T * k}),
                              .counts = make_view(counts.data(), DType::kI64, {E}), .offsets = make_view(offsets.data(), DType::kI64, {E})};
    const GroupedMatmulSwigluParams up{.x = rp.sorted_rows, .weights = &Wgu, .group_offsets = rp.offsets,
                                       .out = make_view(h.data(), DType::kF32, {T * k, I}), .stats = &stats};
    const GroupedMatmulParams down{.x = up.out, .weights = &Wdn, .group_offsets = rp.offsets,
                                   .out = make_view(y.data(), DType::kF32, {T * k, H}), .stats = &stats};
    const MoeFinalizeParams fin{.y = down.out, .inverse = rp.inverse, .weights = gp.topk_weights, .out = fp.out};
    const size_t need = std::max({moe_forward_workspace_size(fp), grouped_matmul_swiglu_workspace_size(up),
                                  grouped_matmul_workspace_size(down)});
    std::vector<uint8_t> ws(need);
    const Workspace wsv{ws.data(), ws.size()};
    auto calls = [&] {
      Status st = moe_gating_topk(gp);
      if (st.ok()) st = moe_gating_topk_softmax({.logits = gp.logits, .topk_ids = gp.topk_ids, .topk_weights = gp.topk_weights});
      if (st.ok()) st = moe_init_routing(rp);
      if (st.ok()) st = grouped_matmul_swiglu(up, wsv);
      if (st.ok()) st = grouped_matmul(down, wsv);
      if (st.ok()) st = moe_finalize_routing(fin);
      if (st.ok()) st = moe_forward(fp, wsv);
      return st;
    };
    testing::expect_no_heap_allocation(calls, "the MoE ops");
    int64_t used = 0;
    for (int64_t c : counts) used += c > 0;
    if (T == 64) {
      EXPECT_GE(used, 4) << "the queue schedule needs >= 2 non-empty groups per thread";
    }
  }
}

TEST(MoeBadInput, MessagesNameTheArgument) {
  std::vector<float> logits(2 * 8);
  std::vector<int32_t> ids(2 * 3);
  std::vector<float> w(2 * 3);
  MoeGatingParams p{.logits = make_view(logits.data(), DType::kF32, {2, 8}), .topk_ids = make_view(ids.data(), DType::kI32, {2, 3}),
                    .topk_weights = make_view(w.data(), DType::kF32, {2, 3}), .n_group = 3};
  EXPECT_NE(moe_gating_topk(p).message().find("n_group=3 must divide E=8"), std::string::npos);
  p.n_group = 4, p.topk_group = 1;
  EXPECT_NE(moe_gating_topk(p).message().find("top-k=3 must be in [1, min(32, experts in the kept groups = 2)]"), std::string::npos)
      << moe_gating_topk(p).message();
  std::vector<int32_t> bad = {0, 9};
  std::vector<int64_t> off(4);
  EXPECT_NE(moe_compute_expert_tokens(make_view(bad.data(), DType::kI32, {2}), make_view(off.data(), DType::kI64, {4})).message().find(
                "sorted_ids[1]=9"),
            std::string::npos);
  // moe_forward: one router only, and its K must match x.
  const int64_t T = 2, H = 4, E = 2, I = 2;
  std::vector<float> x(T * H), router(E * H), gu(E * 2 * I * H), dn(E * H * I), out(T * H);
  PackedWeights Wgu, Wdn, Wr, Wbad;
  ASSERT_TRUE(pack_weights({.w = make_view(gu.data(), DType::kF32, {E, 2 * I, H})}, &Wgu).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(dn.data(), DType::kF32, {E, H, I})}, &Wdn).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(router.data(), DType::kF32, {E, H})}, &Wr).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(router.data(), DType::kF32, {E, H - 1})}, &Wbad).ok());
  MoeForwardParams f{.x = make_view(x.data(), DType::kF32, {T, H}), .router = make_view(router.data(), DType::kF32, {E, H}),
                     .packed_router = &Wr[0], .top_k = 1, .gate_up = &Wgu, .down = &Wdn, .out = make_view(out.data(), DType::kF32, {T, H})};
  std::vector<uint8_t> ws(1 << 20);
  EXPECT_NE(moe_forward(f, {ws.data(), ws.size()}).message().find("both router and packed_router"), std::string::npos);
  f.router = {};
  f.packed_router = &Wbad[0];
  EXPECT_NE(moe_forward(f, {ws.data(), ws.size()}).message().find("packed_router has K=3 but x has H=4"), std::string::npos);
  f.packed_router = &Wr[0];
  ASSERT_LE(moe_forward_workspace_size(f), ws.size());
  EXPECT_TRUE(moe_forward(f, {ws.data(), moe_forward_workspace_size(f)}).ok());
}

// A valid tiny layer (T = 2, H = 4, E = 4 experts of I = 2, f32) the bad-input tests break
// one argument of at a time.
struct TinyLayer {
  static constexpr int64_t T = 2, H = 4, E = 4, I = 2;
  std::vector<float> x = std::vector<float>(T * H, 0.5f), router = std::vector<float>(E * H, 0.25f),
                     gu = std::vector<float>(E * 2 * I * H, 0.1f), dn = std::vector<float>(E * H * I, 0.1f),
                     out = std::vector<float>(T * H);
  PackedWeights Wgu, Wdn;
  MoeForwardParams p;
  TinyLayer() {
    EXPECT_TRUE(pack_weights({.w = make_view(gu.data(), DType::kF32, {E, 2 * I, H})}, &Wgu).ok());
    EXPECT_TRUE(pack_weights({.w = make_view(dn.data(), DType::kF32, {E, H, I})}, &Wdn).ok());
    p = {.x = make_view(x.data(), DType::kF32, {T, H}), .router = make_view(router.data(), DType::kF32, {E, H}), .top_k = 2,
         .gate_up = &Wgu, .down = &Wdn, .out = make_view(out.data(), DType::kF32, {T, H})};
  }
};

// Routing buffers for T tokens of k slots over E experts, H wide (f32).
struct RoutingBufs {
  std::vector<float> x, sorted;
  std::vector<int32_t> ids, row_map, inverse;
  std::vector<int64_t> counts, offsets;
  MoeRoutingParams p;
  RoutingBufs(int64_t T, int64_t k, int64_t E, int64_t H)
      : x(size_t(T * H), 1.0f), sorted(size_t(T * k * H)), ids(size_t(T * k), 0), row_map(size_t(T * k)), inverse(size_t(T * k)),
        counts(size_t(E)), offsets(size_t(E)) {
    p = {.x = make_view(x.data(), DType::kF32, {T, H}), .topk_ids = make_view(ids.data(), DType::kI32, {T, k}), .num_experts = E,
         .sorted_rows = make_view(sorted.data(), DType::kF32, {T * k, H}), .row_map = make_view(row_map.data(), DType::kI32, {T * k}),
         .inverse = make_view(inverse.data(), DType::kI32, {T * k}), .counts = make_view(counts.data(), DType::kI64, {E}),
         .offsets = make_view(offsets.data(), DType::kI64, {E})};
  }
};

// Outputs are written while the inputs that place them are still read: an overlap is an
// error naming both views. (Found by a fuzzer: init_routing with row_map over topk_ids
// sorted ids it had overwritten and wrote past row_map; finalize with out over inverse
// read y at row indices made of float bits.) out may replace shared / residual in place.
TEST(MoeBadInput, OutputsApartFromInputsOrInPlace) {
  auto err = [](const Status& st) { return st.ok() ? std::string("ok") : st.message(); };
  const int64_t T = 6, k = 1, H = 2, E = 2;
  std::vector<int32_t> ids = {1, 1, 1, 0, 0, 0}, row_map(T * k), inverse(T * k);
  std::vector<float> x(T * H, 1.0f), sorted(T * k * H);
  std::vector<int64_t> counts(E), offsets(E);
  MoeRoutingParams r{.x = make_view(x.data(), DType::kF32, {T, H}), .topk_ids = make_view(ids.data(), DType::kI32, {T, k}),
                     .num_experts = E, .sorted_rows = make_view(sorted.data(), DType::kF32, {T * k, H}),
                     .row_map = make_view(row_map.data(), DType::kI32, {T * k}), .inverse = make_view(inverse.data(), DType::kI32, {T * k}),
                     .counts = make_view(counts.data(), DType::kI64, {E}), .offsets = make_view(offsets.data(), DType::kI64, {E})};
  EXPECT_EQ(err(moe_init_routing(r)), "ok");
  r.row_map = make_view(ids.data(), DType::kI32, {T * k});
  EXPECT_EQ(err(moe_init_routing(r)), "moe_init_routing: row_map overlaps topk_ids (an output must not share memory with an input)");
  r.row_map = make_view(row_map.data(), DType::kI32, {T * k});
  r.counts = make_view(inverse.data() + 2, DType::kI64, {E});
  EXPECT_EQ(err(moe_init_routing(r)), "moe_init_routing: inverse and counts overlap (outputs must not share memory)");
  r.counts = make_view(counts.data(), DType::kI64, {E});
  EXPECT_EQ(err(moe_compute_expert_tokens(make_view(offsets.data(), DType::kI32, {2}), make_view(offsets.data(), DType::kI64, {E}))),
            "moe_compute_expert_tokens: offsets overlaps sorted_ids (an output must not share memory with an input)");

  std::vector<float> logits(T * E), wts(T * k);
  MoeGatingParams g{.logits = make_view(logits.data(), DType::kF32, {T, E}), .topk_ids = make_view(ids.data(), DType::kI32, {T, k}),
                    .topk_weights = make_view(logits.data(), DType::kF32, {T, k})};
  EXPECT_EQ(err(moe_gating_topk(g)), "moe_gating_topk: topk_weights overlaps logits (an output must not share memory with an input)");

  // finalize: out over inverse is an error; out as residual itself is the sum in place.
  std::vector<int32_t> inv = {0, 1, 0, 0};  // inverse is the first two; out may cover all four
  std::vector<float> w = {0.5f, 2.0f}, y = {1, 2, 3, 4}, res = {10, 20, 30, 40};
  MoeFinalizeParams f{.y = make_view(y.data(), DType::kF32, {2, 2}), .inverse = make_view(inv.data(), DType::kI32, {2}),
                      .weights = make_view(w.data(), DType::kF32, {2, 1}), .residual = make_view(res.data(), DType::kF32, {2, 2}),
                      .out = make_view(inv.data(), DType::kF32, {2, 2})};
  f.residual = {};
  EXPECT_EQ(err(moe_finalize_routing(f)), "moe_finalize_routing: out overlaps inverse (an output must not share memory with an input)");
  f.residual = make_view(res.data(), DType::kF32, {2, 2});
  f.out = make_view(res.data() + 1, DType::kF32, {2, 2}, {2, 1});
  f.out.sizes[0] = 1;  // one token's row, shifted into the residual's
  f.weights = make_view(w.data(), DType::kF32, {1, 1});
  f.inverse = make_view(inv.data(), DType::kI32, {1});
  f.residual = make_view(res.data(), DType::kF32, {1, 2});
  EXPECT_EQ(err(moe_finalize_routing(f)),
            "moe_finalize_routing: out overlaps residual without being residual itself (same data, dtype and strides)");
  f = {.y = make_view(y.data(), DType::kF32, {2, 2}), .inverse = make_view(inv.data(), DType::kI32, {2}),
       .weights = make_view(w.data(), DType::kF32, {2, 1}), .residual = make_view(res.data(), DType::kF32, {2, 2}),
       .out = make_view(res.data(), DType::kF32, {2, 2})};
  EXPECT_EQ(err(moe_finalize_routing(f)), "ok");
  EXPECT_EQ(res, (std::vector<float>{10.5f, 21.0f, 36.0f, 48.0f}));  // res + w[t] * y[inv[t]]
  f.out = make_view(res.data(), DType::kBF16, {2, 2});  // same bytes, another dtype: not in place
  EXPECT_NE(err(moe_finalize_routing(f)).find("out overlaps residual without being residual itself"), std::string::npos);

  // grouped_matmul: out over x, or inside the workspace.
  const int64_t M = 4, K = 8, N = 4;
  std::vector<float> gx(M * K, 1.0f), gw(2 * N * K, 0.5f), gout(M * N);
  std::vector<int64_t> goff = {2, 4};
  PackedWeights W;
  ASSERT_TRUE(pack_weights({.w = make_view(gw.data(), DType::kF32, {2, N, K})}, &W).ok());
  GroupedMatmulParams gm{.x = make_view(gx.data(), DType::kF32, {M, K}), .weights = &W,
                         .group_offsets = make_view(goff.data(), DType::kI64, {2}), .out = make_view(gout.data(), DType::kF32, {M, N})};
  std::vector<uint8_t> ws(grouped_matmul_workspace_size(gm) + 4096);
  EXPECT_EQ(err(grouped_matmul(gm, {ws.data(), ws.size()})), "ok");
  gm.out = make_view(gx.data() + 8, DType::kF32, {M, N});
  EXPECT_EQ(err(grouped_matmul(gm, {ws.data(), ws.size()})), "grouped_matmul: out overlaps x (an output must not share memory with an input)");
  gm.out = make_view(ws.data() + 64, DType::kF32, {M, N});
  EXPECT_EQ(err(grouped_matmul(gm, {ws.data(), ws.size()})), "grouped_matmul: out and workspace overlap (outputs must not share memory)");
}

// Negative sizes used to pass the family's 2-D checks: x and sorted_rows [T, -1] made
// moe_init_routing memcpy 2^64 - 4 bytes per row, and T = -1 (or H = -1) returned OK.
TEST(MoeBadInput, NegativeSizesAreErrors) {
  RoutingBufs r(2, 2, 4, 4);
  MoeRoutingParams rp = r.p;
  rp.x = make_view(r.x.data(), DType::kF32, {2, -1});
  rp.sorted_rows = make_view(r.sorted.data(), DType::kF32, {4, -1});
  EXPECT_TRUE(fails_with(moe_init_routing(rp), "moe_init_routing: x.sizes[1]=-1 is negative"));
  rp = r.p;
  rp.x = make_view(r.x.data(), DType::kF32, {-1, 4});
  rp.topk_ids = make_view(r.ids.data(), DType::kI32, {-1, 2});
  EXPECT_TRUE(fails_with(moe_init_routing(rp), "moe_init_routing: x.sizes[0]=-1 is negative"));

  std::vector<float> logits(16), w(4), y(16), out(8);
  std::vector<int32_t> ids(4), inv(4, 0);
  EXPECT_TRUE(fails_with(moe_gating_topk({.logits = make_view(logits.data(), DType::kF32, {-1, 8}),
                                          .topk_ids = make_view(ids.data(), DType::kI32, {-1, 2}),
                                          .topk_weights = make_view(w.data(), DType::kF32, {-1, 2})}),
                         "moe_gating_topk: logits.sizes[0]=-1 is negative"));
  MoeFinalizeParams f{.y = make_view(y.data(), DType::kF32, {4, 4}), .inverse = make_view(inv.data(), DType::kI32, {4}),
                      .weights = make_view(w.data(), DType::kF32, {2, 2}), .out = make_view(out.data(), DType::kF32, {2, 4})};
  ASSERT_TRUE(moe_finalize_routing(f).ok());
  f.out = make_view(out.data(), DType::kF32, {-1, 4});
  f.weights = make_view(w.data(), DType::kF32, {-1, 2});
  EXPECT_TRUE(fails_with(moe_finalize_routing(f), "moe_finalize_routing: out.sizes[0]=-1 is negative"));
  f.out = make_view(out.data(), DType::kF32, {2, -1});
  f.weights = make_view(w.data(), DType::kF32, {2, 2});
  f.y = make_view(y.data(), DType::kF32, {4, -1});
  EXPECT_TRUE(fails_with(moe_finalize_routing(f), "moe_finalize_routing: out.sizes[1]=-1 is negative"));
  std::vector<int64_t> off(4);
  EXPECT_TRUE(fails_with(moe_compute_expert_tokens(make_view(ids.data(), DType::kI32, {-3}), make_view(off.data(), DType::kI64, {4})),
                         "moe_compute_expert_tokens: sorted_ids.sizes[0]=-3 is negative"));
}

// T = 2^62 tokens with k = 4: T * k wraps to 0, so the [T * k] views matched empty
// buffers. Every view now goes through check_view before T * k is formed (finalize wrote
// 2^62 rows of out; routing returned OK over a null topk_ids).
TEST(MoeBadInput, TokenCountsPastTheViewBoundAreErrors) {
  std::vector<float> buf(64);
  std::vector<int32_t> ibuf(64);
  std::vector<int64_t> lbuf(8);
  for (bool null_data : {false, true}) {
    SCOPED_TRACE(null_data ? "null data" : "small buffers");
    void* f = null_data ? nullptr : buf.data();
    void* i = null_data ? nullptr : ibuf.data();
    EXPECT_TRUE(fails_with(moe_finalize_routing({.y = make_view(buf.data(), DType::kF32, {4, 1}),
                                                 .inverse = make_view(i, DType::kI32, {kHugeX4}),
                                                 .weights = make_view(f, DType::kF32, {kHuge, 4}),
                                                 .out = make_view(f, DType::kF32, {kHuge, 1})}),
                           "moe_finalize_routing: out [4611686018427387904, 1] spans more than 2^48"));
    EXPECT_TRUE(fails_with(moe_finalize_routing({.y = make_view(buf.data(), DType::kF32, {4, 0}),
                                                 .inverse = make_view(i, DType::kI32, {kHugeX4}),
                                                 .weights = make_view(f, DType::kF32, {kHuge, 4}),
                                                 .out = make_view(f, DType::kF32, {kHuge, 0})}),
                           "moe_finalize_routing: weights [4611686018427387904, 4] spans more than 2^48"));
    EXPECT_TRUE(fails_with(moe_init_routing({.x = make_view(f, DType::kF32, {kHuge, 0}), .topk_ids = make_view(i, DType::kI32, {kHuge, 4}),
                                             .num_experts = 4, .sorted_rows = make_view(f, DType::kF32, {kHugeX4, 0}),
                                             .row_map = make_view(i, DType::kI32, {kHugeX4}),
                                             .inverse = make_view(i, DType::kI32, {kHugeX4}),
                                             .counts = make_view(lbuf.data(), DType::kI64, {4}),
                                             .offsets = make_view(lbuf.data() + 4, DType::kI64, {4})}),
                           "moe_init_routing: topk_ids [4611686018427387904, 4] spans more than 2^48"));
  }
  // 2^62 tokens of width 0 with no slots: valid and empty, done without a 2^62-step loop.
  EXPECT_TRUE(moe_finalize_routing({.y = make_view(buf.data(), DType::kF32, {4, 0}), .inverse = make_view(ibuf.data(), DType::kI32, {0}),
                                    .weights = make_view(buf.data(), DType::kF32, {kHuge, 0}),
                                    .out = make_view(buf.data(), DType::kF32, {kHuge, 0})})
                  .ok());
  // Within the view bound but past the i32 row_map / inverse.
  const int64_t T = int64_t(1) << 31;
  EXPECT_TRUE(fails_with(moe_init_routing({.x = make_view(buf.data(), DType::kF32, {T, 0}), .topk_ids = make_view(ibuf.data(), DType::kI32, {T, 2}),
                                           .num_experts = 4, .sorted_rows = make_view(buf.data(), DType::kF32, {2 * T, 0}),
                                           .row_map = make_view(ibuf.data(), DType::kI32, {2 * T}),
                                           .inverse = make_view(ibuf.data(), DType::kI32, {2 * T}),
                                           .counts = make_view(lbuf.data(), DType::kI64, {4}),
                                           .offsets = make_view(lbuf.data() + 4, DType::kI64, {4})}),
                         "moe_init_routing: T*k=4294967296 rows exceed the i32 row_map / inverse"));
}

// Enums out of range, an expert_end below -1 and a NaN scaling factor were accepted.
TEST(MoeBadInput, EnumsExpertRangeAndScalingAreChecked) {
  std::vector<float> logits(2 * 8, 0.5f), w(2 * 2);
  std::vector<int32_t> ids(2 * 2);
  MoeGatingParams g{.logits = make_view(logits.data(), DType::kF32, {2, 8}), .topk_ids = make_view(ids.data(), DType::kI32, {2, 2}),
                    .topk_weights = make_view(w.data(), DType::kF32, {2, 2})};
  ASSERT_TRUE(moe_gating_topk(g).ok());
  g.score = MoeScore(9);
  EXPECT_TRUE(fails_with(moe_gating_topk(g), "moe_gating_topk: score=9 is not a MoeScore"));
  g.score = MoeScore::kSigmoid;
  g.group_score = MoeGroupScore(9);
  EXPECT_TRUE(fails_with(moe_gating_topk(g), "moe_gating_topk: group_score=9 is not a MoeGroupScore"));
  g.group_score = MoeGroupScore::kTop2Sum;
  g.routed_scaling_factor = NAN;
  EXPECT_TRUE(fails_with(moe_gating_topk(g), "moe_gating_topk: routed_scaling_factor=nan must be finite"));
  g.routed_scaling_factor = INFINITY;
  EXPECT_TRUE(fails_with(moe_gating_topk(g), "routed_scaling_factor=inf must be finite"));

  RoutingBufs r(2, 2, 4, 4);
  r.p.expert_end = -7;
  EXPECT_TRUE(fails_with(moe_init_routing(r.p), "moe_init_routing: expert range [0, -7) must lie in [0, 4]"));
  r.p.expert_end = -1;  // -1 alone stands for num_experts
  EXPECT_TRUE(moe_init_routing(r.p).ok());

  TinyLayer l;
  std::vector<uint8_t> ws(1 << 20);
  l.p.score = MoeScore(9);
  EXPECT_TRUE(fails_with(moe_forward(l.p, {ws.data(), ws.size()}), "moe_forward: score=9 is not a MoeScore"));
  l.p.score = MoeScore::kSoftmax;
  l.p.group_score = MoeGroupScore(9);
  EXPECT_TRUE(fails_with(moe_forward(l.p, {ws.data(), ws.size()}), "moe_forward: group_score=9 is not a MoeGroupScore"));
  l.p.group_score = MoeGroupScore::kMax;
  l.p.routed_scaling_factor = NAN;
  EXPECT_TRUE(fails_with(moe_forward(l.p, {ws.data(), ws.size()}), "moe_forward: routed_scaling_factor=nan must be finite"));
  EXPECT_EQ(moe_forward_workspace_size(l.p), 0u);
}

// moe_forward checks its own arguments before it sizes anything: top_k = -2 wrapped the
// routed-row count and the router GEMM wrote past the workspace, top_k = -1 reported
// "gemm: workspace too small", INT64_MAX / MIN overflowed; null x / out data reached the
// kernels; T = -1 sized a workspace of 2^64 - 256 bytes; inner ops' names leaked out.
TEST(MoeBadInput, ForwardChecksItsOwnArgumentsFirst) {
  TinyLayer l;
  std::vector<uint8_t> ws(1 << 20);
  const Workspace w{ws.data(), ws.size()};
  const size_t need = moe_forward_workspace_size(l.p);
  ASSERT_GT(need, 0u);
  ASSERT_LE(need, ws.size());
  ASSERT_TRUE(moe_forward(l.p, w).ok());
  for (int64_t k : {int64_t(-2), int64_t(-1), int64_t(0), int64_t(5), INT64_MAX, INT64_MIN}) {
    MoeForwardParams p = l.p;
    p.top_k = k;
    EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: top_k=" + std::to_string(k) +
                                                  " must be in [1, min(32, experts in the kept groups = 4)]"));
    EXPECT_EQ(moe_forward_workspace_size(p), 0u) << "top_k=" << k;
  }
  // Found by review: T * top_k past i32 (moe_init_routing's row indices) passed the
  // layer's own checks, so the query sized a call that could only fail, and the call ran
  // the router over every token before failing in moe_init_routing.
  {
    MoeForwardParams big = l.p;
    big.top_k = 2;
    const int64_t T = int64_t(1) << 30;  // x [2^30, 4] f32 spans 2^34 bytes: within the view bound
    big.x = make_view(l.x.data(), DType::kF32, {T, l.H});
    big.out = make_view(l.out.data(), DType::kF32, {T, l.H});
    EXPECT_EQ(moe_forward_workspace_size(big), 0u);
    EXPECT_TRUE(fails_with(moe_forward(big, w), "moe_forward: T*top_k=2147483648 routed rows exceed the i32 row indices"));
  }
  MoeForwardParams p = l.p;
  p.x.data = nullptr;
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: x.data is null"));
  EXPECT_EQ(moe_forward_workspace_size(p), need) << "sizing needs shapes only";
  std::vector<uint16_t> xb(l.x.size()), ob(l.out.size());
  p = l.p;
  p.x = make_view(nullptr, DType::kBF16, {l.T, l.H});
  p.out = make_view(ob.data(), DType::kBF16, {l.T, l.H});
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: x.data is null"));
  p.x.data = xb.data();
  p.out.data = nullptr;
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: out.data is null"));
  p.out.data = ob.data();  // bf16 activations against the layer's f32 experts
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: gate_up[0].dtype=f32 but x.dtype=bf16; bf16 activations take bf16 or i8 weights"));
  EXPECT_EQ(moe_forward_workspace_size(p), 0u);
  p = l.p;
  p.x = make_view(l.x.data(), DType::kF32, {-1, l.H});
  EXPECT_EQ(moe_forward_workspace_size(p), 0u);
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: x.sizes[0]=-1 is negative"));
  p = l.p;
  std::vector<float> bias(3);
  p.bias = make_view(bias.data(), DType::kF32, {3});
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: bias must be contiguous f32 [4], got rank 1 f32 [3] strides [1]"));
  p = l.p;
  p.x = make_view(l.x.data(), DType::kF32, {l.T, l.H - 1}, {l.H, 1});
  p.out = make_view(l.out.data(), DType::kF32, {l.T, l.H - 1}, {l.H, 1});
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: x must be contiguous, got f32 [2, 3] strides [4, 1]"));
  p = l.p;
  p.router = make_view(l.router.data(), DType::kF32, {l.E, l.H + 1});
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: router must be f32 [E, H=4], got rank 2 f32 [4, 5]"));
  p = l.p;
  std::vector<float> dn2(l.E * l.H * (l.I + 1));
  PackedWeights Wdn2;
  ASSERT_TRUE(pack_weights({.w = make_view(dn2.data(), DType::kF32, {l.E, l.H, l.I + 1})}, &Wdn2).ok());
  p.down = &Wdn2;
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: experts are gate_up [4, 4] and down [4, 3]; must be [2I, H=4] and [H, I]"));
  p = l.p;
  p.shared_gate_up = &l.Wgu;  // E = 4 matrices where one shared expert set belongs
  p.shared_down = &l.Wdn;
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: shared_gate_up and shared_down must hold one matrix each, got 4 and 4"));
  PackedWeights Wr;
  ASSERT_TRUE(pack_weights({.w = l.p.router}, &Wr).ok());
  PackedMatrix no_data = Wr[0];
  no_data.data = nullptr;
  p = l.p;
  p.router = {};
  p.packed_router = &no_data;
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: packed_router->data is null"));
  PackedMatrix unaligned = Wr[0];
  unaligned.data = static_cast<const uint8_t*>(Wr[0].data) + 4;
  p.packed_router = &unaligned;
  EXPECT_TRUE(fails_with(moe_forward(p, w), "is not 64-byte aligned"));
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: packed_router->data="));
  // Experts and hidden size past what gating and finalize keep on the stack: named here,
  // not by the inner op.
  {
    const int64_t E = 1025;
    std::vector<float> router(E * l.H), gu(E * 2 * l.I * l.H), dn(E * l.H * l.I);
    PackedWeights Wgu, Wdn;
    ASSERT_TRUE(pack_weights({.w = make_view(gu.data(), DType::kF32, {E, 2 * l.I, l.H})}, &Wgu).ok());
    ASSERT_TRUE(pack_weights({.w = make_view(dn.data(), DType::kF32, {E, l.H, l.I})}, &Wdn).ok());
    p = l.p;
    p.router = make_view(router.data(), DType::kF32, {E, l.H});
    p.gate_up = &Wgu, p.down = &Wdn;
    EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: the router has E=1025 experts; must be in [1, 1024]"));
  }
  {
    const int64_t H = 16385;
    std::vector<float> x(l.T * H), router(l.E * H), gu(l.E * 2 * l.I * H), dn(l.E * H * l.I), out(l.T * H);
    PackedWeights Wgu, Wdn;
    ASSERT_TRUE(pack_weights({.w = make_view(gu.data(), DType::kF32, {l.E, 2 * l.I, H})}, &Wgu).ok());
    ASSERT_TRUE(pack_weights({.w = make_view(dn.data(), DType::kF32, {l.E, H, l.I})}, &Wdn).ok());
    p = l.p;
    p.x = make_view(x.data(), DType::kF32, {l.T, H}), p.out = make_view(out.data(), DType::kF32, {l.T, H});
    p.router = make_view(router.data(), DType::kF32, {l.E, H});
    p.gate_up = &Wgu, p.down = &Wdn;
    std::vector<uint8_t> big(std::max<size_t>(moe_forward_workspace_size(p), 1 << 22));
    EXPECT_TRUE(fails_with(moe_forward(p, {big.data(), big.size()}), "moe_forward: x has H=16385 but the hidden size must be in [1, 16384]"));
  }
  // x within the view bound, but top_k = 2 routed copies of it are not: 2^44 tokens of
  // H = 4 f32 (2^48 bytes) need a [2^45, 4] buffer.
  p = l.p;
  p.x = make_view(l.x.data(), DType::kF32, {int64_t(1) << 44, l.H});
  p.out = make_view(l.out.data(), DType::kF32, {int64_t(1) << 44, l.H});
  EXPECT_EQ(moe_forward_workspace_size(p), 0u);
  EXPECT_TRUE(fails_with(moe_forward(p, w), "moe_forward: T=17592186044416 tokens with top_k=2, H=4, I=2, I_s=0 and E=4 need buffers beyond 2^48 bytes"));
  // The workspace: too small, or enough bytes at a null address.
  EXPECT_TRUE(fails_with(moe_forward(l.p, {ws.data(), need - 1}),
                         "moe_forward: workspace.bytes=" + std::to_string(need - 1) + " but moe_forward_workspace_size()="));
  EXPECT_TRUE(fails_with(moe_forward(l.p, {nullptr, need}), "moe_forward: workspace.data is null"));
}

// Group counts whose running sum overflows int64 (rejected before, through the wrapped
// sum: UB, and the message showed the wrapped value), and grouped_matmul_swiglu sized
// M * 2I for x.sizes[0] = 2^62 before any check (UB, a wrapped size).
TEST(MoeBadInput, GroupSizesThatWouldOverflowAreErrors) {
  const int64_t E = 3, K = 8, N = 4, M = 3;
  std::vector<float> x(M * K), wt(E * N * K), y(M * N);
  PackedWeights w;
  ASSERT_TRUE(pack_weights({.w = make_view(wt.data(), DType::kF32, {E, N, K})}, &w).ok());
  std::vector<int64_t> counts = {1, INT64_MAX, 1};
  GroupedMatmulParams p{.x = make_view(x.data(), DType::kF32, {M, K}), .weights = &w,
                        .group_offsets = make_view(counts.data(), DType::kI64, {E}), .offsets_are_counts = true,
                        .out = make_view(y.data(), DType::kF32, {M, N})};
  std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
  EXPECT_TRUE(fails_with(grouped_matmul(p, {ws.data(), ws.size()}),
                         "grouped_matmul: group_offsets[1]=9223372036854775807 (a count) is negative or runs past x's 3 rows (1 taken"));
  counts = {1, -1, 1};
  EXPECT_TRUE(fails_with(grouped_matmul(p, {ws.data(), ws.size()}), "group_offsets[1]=-1 (a count)"));

  std::vector<float> wt2(E * 2 * N * K);
  PackedWeights w2;
  ASSERT_TRUE(pack_weights({.w = make_view(wt2.data(), DType::kF32, {E, 2 * N, K})}, &w2).ok());
  std::vector<int64_t> offs = {1, 2, 3};
  GroupedMatmulSwigluParams q{.x = make_view(x.data(), DType::kF32, {kHuge, K}), .weights = &w2,
                              .group_offsets = make_view(offs.data(), DType::kI64, {E}),
                              .out = make_view(y.data(), DType::kF32, {kHuge, N})};
  EXPECT_EQ(grouped_matmul_swiglu_workspace_size(q), 0u);
  EXPECT_TRUE(fails_with(grouped_matmul_swiglu(q, {ws.data(), ws.size()}),
                         "grouped_matmul_swiglu: x [4611686018427387904, 8] spans more than 2^48"));
  q.x = make_view(x.data(), DType::kF32, {M, K});
  q.out = make_view(y.data(), DType::kF32, {M, N});
  EXPECT_GT(grouped_matmul_swiglu_workspace_size(q), 0u);
  q.x = make_view(nullptr, DType::kF32, {M, K});
  EXPECT_GT(grouped_matmul_swiglu_workspace_size(q), 0u) << "sizing needs shapes only";
}

// Errors name the op the caller called, its own workspace function, and the values.
TEST(MoeBadInput, MessagesNameTheOpAndGiveTheValues) {
  const int64_t E = 3, K = 8, N = 4, M = 3;
  std::vector<float> x(M * K), wt(E * N * K), y(M * N);
  PackedWeights w;
  ASSERT_TRUE(pack_weights({.w = make_view(wt.data(), DType::kF32, {E, N, K})}, &w).ok());
  std::vector<int64_t> offs = {1, 2, 3};
  GroupedMatmulParams p{.x = make_view(x.data(), DType::kF32, {M, K}), .weights = &w,
                        .group_offsets = make_view(offs.data(), DType::kI64, {E}), .out = make_view(y.data(), DType::kF32, {M, N})};
  const size_t need = grouped_matmul_workspace_size(p);
  EXPECT_TRUE(fails_with(grouped_matmul(p, {}), "grouped_matmul: workspace.bytes=0 but grouped_matmul_workspace_size()=" +
                                                    std::to_string(need)));
  EXPECT_TRUE(fails_with(grouped_matmul(p, {nullptr, need}), "grouped_matmul: workspace.data is null"));
  // bf16 activations against f32 weights: no gemm takes the pair; the op says so itself.
  std::vector<uint16_t> xb(M * K), yb(M * 2 * N);
  GroupedMatmulParams pb = p;
  pb.x = make_view(xb.data(), DType::kBF16, {M, K});
  const std::string mixed = "weights[0].dtype=f32 but x.dtype=bf16; bf16 activations take bf16 or i8 weights";
  EXPECT_TRUE(fails_with(grouped_matmul(pb, {}), "grouped_matmul: " + mixed));
  EXPECT_EQ(grouped_matmul_workspace_size(pb), 0u);
  const GroupedMatmulSwigluParams ps{.x = pb.x, .weights = &w, .group_offsets = p.group_offsets,
                                     .out = make_view(yb.data(), DType::kBF16, {M, N / 2})};
  EXPECT_TRUE(fails_with(grouped_matmul_swiglu(ps, {}), "grouped_matmul_swiglu: " + mixed));
  EXPECT_EQ(grouped_matmul_swiglu_workspace_size(ps), 0u);

  RoutingBufs r(2, 2, 4, 4);
  MoeRoutingParams rp = r.p;
  rp.x = make_view(r.x.data(), DType::kF32, {2, 3}, {4, 1});
  rp.sorted_rows = make_view(r.sorted.data(), DType::kF32, {4, 3});
  EXPECT_TRUE(fails_with(moe_init_routing(rp), "moe_init_routing: x must be contiguous, got f32 [2, 3] strides [4, 1]"));
  rp = r.p;
  rp.topk_ids = make_view(r.ids.data(), DType::kI32, {4});
  EXPECT_TRUE(fails_with(moe_init_routing(rp), "moe_init_routing: topk_ids must be [2, *], got rank 1 i32 [4] strides [1]"));
  rp.topk_ids = make_view(r.ids.data(), DType::kI64, {2, 1});
  EXPECT_TRUE(fails_with(moe_init_routing(rp), "moe_init_routing: topk_ids.dtype=i64 but must be i32"));
  rp = r.p;
  rp.sorted_rows.dtype = DType::kBF16;
  EXPECT_TRUE(fails_with(moe_init_routing(rp), "moe_init_routing: sorted_rows.dtype=bf16 must be x.dtype=f32 or i8"));
  rp = r.p;
  std::vector<float> scales(4);
  rp.row_scales = make_view(scales.data(), DType::kF32, {4});
  EXPECT_TRUE(fails_with(moe_init_routing(rp), "moe_init_routing: row_scales is only written when sorted_rows is i8, got f32 [4]"));

  std::vector<float> logits(16), wts(4);
  std::vector<int32_t> ids(4);
  EXPECT_TRUE(fails_with(moe_gating_topk({.logits = make_view(logits.data(), DType::kF32, {2, 8}),
                                          .topk_ids = make_view(ids.data(), DType::kI32, {2, 2}, {1, 2}),
                                          .topk_weights = make_view(wts.data(), DType::kF32, {2, 2})}),
                         "moe_gating_topk: topk_ids must be contiguous, got i32 [2, 2] strides [1, 2]"));
}

}  // namespace
}  // namespace optx
