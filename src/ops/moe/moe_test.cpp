// MoE family: gating (all scorings, bias, groups, ties), routing (stable order, counts,
// expert ranges), grouped GEMMs against per-expert references (empty groups, untouched
// tails), finalize, and the whole layer against a double-precision composition.
#include <gtest/gtest.h>

#include <limits>
#include <sstream>
#include <string>

#include "ops/moe/moe_testutil.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx {
namespace {

using moe_testutil::gating_ref;

struct GatingCase {
  MoeScore score;
  int64_t E, k, n_group, topk_group;
  MoeGroupScore gs;
  bool bias, renorm, tks;
  float scaling;
};

TEST(MoeGating, MatchesReferenceOnSelectedIsa) {
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
}

// The softmax router entry point (bf16 logits too) against the same reference, and its
// errors name it.
TEST(MoeGating, TopkSoftmaxMatchesReferenceOnSelectedIsa) {
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
}

TEST(MoeGating, TiesBreakToLowerExpertId) {
  std::vector<float> logits = {1, 3, 3, 0, 3, 2};  // experts 1, 2, 4 tie
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  ASSERT_TRUE(moe_gating_topk({.logits = make_view(logits.data(), DType::kF32, {1, 6}), .topk_ids = make_view(ids.data(), DType::kI32, {1, 2}),
                               .topk_weights = make_view(w.data(), DType::kF32, {1, 2})})
                  .ok());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_FLOAT_EQ(w[0], w[1]);
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
TEST(GroupedMatmulSwiglu, FusedBufferedAndInt8OutputMatchReference) {
  const int64_t E = 8, K = 50, rows = 330, M = rows + 3;
  const std::vector<int64_t> counts = {3, 0, 17, 1, 0, 2, 306, 1};
  std::vector<int64_t> offs(counts.size());
  std::partial_sum(counts.begin(), counts.end(), offs.begin());
  testing::Rng rng(33);
  std::vector<uint16_t> x(size_t(M * K));
  testing::fill_bf16(x.data(), M * K, rng);
  for (int64_t I : {64, 35}) {
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

}  // namespace
}  // namespace optx
