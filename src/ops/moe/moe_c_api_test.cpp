// The MoE ops and the grouped GEMMs' schedule stats through optx.h, against C++.
#include <gtest/gtest.h>

#include "core/c_api_testutil.h"

namespace optx {
namespace {

using capi_test::Buffers;
using enum DType;

// Stats made through optx.h: C++ params name their ScheduleStats.
class Stats {
 public:
  Stats() { EXPECT_EQ(optx_schedule_stats_create(&h_), OPTX_OK); }
  ~Stats() { optx_schedule_stats_free(h_); }
  Stats(const Stats&) = delete;
  Stats& operator=(const Stats&) = delete;
  ScheduleStats* get() { return &h_->s; }
  optx_schedule_stats* handle() { return h_; }

 private:
  optx_schedule_stats* h_ = nullptr;
};

// Grouped sigmoid routing with a bias, renormalised and scaled; the softmax router with
// its pick-then-softmax.
TEST(MoeCApi, GatingMatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(moe_gating_topk), [](Buffers& b) {
    return MoeGatingParams{.logits = b.random(kF32, {3, 8}), .bias = b.random(kF32, {8}), .topk_ids = b.random(kI32, {3, 2}),
                           .topk_weights = b.random(kF32, {3, 2}), .score = MoeScore::kSigmoid, .n_group = 4, .topk_group = 2,
                           .group_score = MoeGroupScore::kTop2Sum, .renormalize = true, .routed_scaling_factor = 2.5f};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(moe_gating_topk_softmax), [](Buffers& b) {
    return MoeGatingSoftmaxParams{.logits = b.random(kBF16, {3, 6}), .topk_ids = b.random(kI32, {3, 2}),
                                  .topk_weights = b.random(kF32, {3, 2}), .topk_then_softmax = true};
  });
}

// Routing of an expert range into quantised rows, expert offsets, and the finalize with
// both a shared and a residual term.
TEST(MoeCApi, RoutingMatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(moe_init_routing), [](Buffers& b) {
    return MoeRoutingParams{.x = b.random(kBF16, {3, 8}), .topk_ids = b.values(kI32, {3, 2}, {0, 2, 3, 1, 2, 0}),
                            .num_experts = 4, .expert_begin = 1, .expert_end = 3,
                            .sorted_rows = b.random(kI8, {6, 8}), .row_scales = b.random(kF32, {6}), .row_map = b.random(kI32, {6}),
                            .inverse = b.random(kI32, {6}), .counts = b.random(kI64, {4}), .offsets = b.random(kI64, {4})};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(moe_compute_expert_tokens), [](Buffers& b) {
    return capi::ExpertTokensArgs{.sorted_ids = b.values(kI32, {5}, {0, 0, 2, 3, 3}), .offsets = b.random(kI64, {4})};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(moe_finalize_routing), [](Buffers& b) {
    return MoeFinalizeParams{.y = b.random(kBF16, {5, 8}), .inverse = b.values(kI32, {6}, {0, -1, 4, 2, 1, 3}),
                             .weights = b.random(kF32, {3, 2}), .shared = b.random(kBF16, {3, 8}), .residual = b.random(kBF16, {3, 8}),
                             .out = b.random(kBF16, {3, 8})};
  });
}

// Counts instead of offsets (rows past them untouched), i8 SwiGLU output; both with stats.
TEST(MoeCApi, GroupedMatmulMatchesCpp) {
  Buffers wb;
  const capi_test::Packed w({.w = wb.random(kBF16, {3, 8, 16})});
  const capi_test::Packed gate_up({.w = wb.random(kF32, {2, 16, 16})});
  Stats stats;
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(grouped_matmul), [&](Buffers& b) {
    return GroupedMatmulParams{.x = b.random(kBF16, {6, 16}), .weights = w.get(), .group_offsets = b.values(kI64, {3}, {2, 0, 3}),
                               .offsets_are_counts = true, .out = b.random(kBF16, {6, 8}), .stats = stats.get()};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(grouped_matmul_swiglu), [&](Buffers& b) {
    return GroupedMatmulSwigluParams{.x = b.random(kF32, {5, 16}), .weights = gate_up.get(), .group_offsets = b.values(kI64, {2}, {2, 4}),
                                     .out = b.random(kI8, {5, 8}), .out_scales = b.random(kF32, {5}), .stats = stats.get()};
  });
  optx_schedule_stats* s = stats.handle();
  ASSERT_GT(optx_schedule_stats_threads(s), 0);
  EXPECT_GT(optx_schedule_stats_wall_s(s), 0.0);
  const int threads = optx_schedule_stats_threads(s);
  for (int i = 0; i < threads; ++i) EXPECT_EQ(optx_schedule_stats_busy_s(s, i), stats.get()->busy_s[size_t(i)]);
  EXPECT_EQ(optx_schedule_stats_busy_s(s, threads), -1.0);
  EXPECT_EQ(optx_last_error(), "optx_schedule_stats_busy_s: i=" + std::to_string(threads) + " but the stats have " +
                                   std::to_string(threads) + " threads");
  EXPECT_EQ(optx_schedule_stats_reset(s), OPTX_OK);
  EXPECT_EQ(optx_schedule_stats_threads(s), 0);
  EXPECT_EQ(optx_schedule_stats_wall_s(s), 0.0);
  EXPECT_EQ(optx_schedule_stats_reset(nullptr), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_schedule_stats_reset: the handle is null");
  EXPECT_EQ(optx_schedule_stats_wall_s(nullptr), -1.0);
  EXPECT_STREQ(optx_last_error(), "optx_schedule_stats_wall_s: the handle is null");
  EXPECT_EQ(optx_schedule_stats_threads(nullptr), -1);
  EXPECT_EQ(optx_schedule_stats_busy_s(nullptr, 0), -1.0);
  EXPECT_EQ(optx_schedule_stats_create(nullptr), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_schedule_stats_create: out is null");
  optx_schedule_stats_free(nullptr);
}

// A whole layer: packed router, grouped sigmoid routing with a bias, shared experts, stats;
// then the unpacked router without shared experts.
TEST(MoeCApi, ForwardMatchesCpp) {
  Buffers wb;
  const capi_test::Packed router({.w = wb.random(kF32, {4, 16})});
  const capi_test::Packed gate_up({.w = wb.random(kBF16, {4, 16, 16})});
  const capi_test::Packed down({.w = wb.random(kBF16, {4, 16, 8})});
  const capi_test::Packed shared_gate_up({.w = wb.random(kBF16, {16, 16})});
  const capi_test::Packed shared_down({.w = wb.random(kBF16, {16, 8})});
  Stats stats;
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(moe_forward), [&](Buffers& b) {
    return MoeForwardParams{.x = b.random(kBF16, {3, 16}), .packed_router = &(*router.get())[0], .bias = b.random(kF32, {4}),
                            .top_k = 2, .score = MoeScore::kSigmoid, .n_group = 2, .topk_group = 1,
                            .group_score = MoeGroupScore::kTop2Sum, .renormalize = true, .routed_scaling_factor = 1.5f,
                            .gate_up = gate_up.get(), .down = down.get(),
                            .shared_gate_up = shared_gate_up.get(), .shared_down = shared_down.get(),
                            .out = b.random(kBF16, {3, 16}), .stats = stats.get()};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(moe_forward), [&](Buffers& b) {
    return MoeForwardParams{.x = b.random(kF32, {2, 16}), .router = b.random(kF32, {4, 16}), .top_k = 3, .gate_up = gate_up.get(),
                            .down = down.get(), .out = b.random(kF32, {2, 16})};
  });
}

}  // namespace
}  // namespace optx
