// rope and the RoPE tables through optx.h, against C++.
#include <gtest/gtest.h>

#include <cstring>

#include "core/c_api_testutil.h"

namespace optx {
namespace {

using capi_test::Buffers;
using enum DType;

TEST(RopeCApi, MatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(rope), [](Buffers& b) {
    return RopeParams{.q = b.random(kBF16, {3, 2, 16}), .k = b.random(kBF16, {3, 1, 12}), .positions = b.values(kI64, {3}, {0, 5, 2}),
                      .cos = b.random(kF32, {6, 4}), .sin = b.random(kF32, {6, 4}),
                      .rotary_dim = 8, .rotary_offset = 2, .style = RopeStyle::kInterleavedToHalf};
  });
}

// A YaRN table built through C is the C++ one, bit for bit.
TEST(RopeCApi, Table) {
  const RopeTableParams p{.rotary_dim = 12, .max_positions = 40, .theta = 5000.0,
                          .yarn = {.factor = 4.0, .original_max_position_embeddings = 16, .beta_fast = 16.0, .beta_slow = 2.0,
                                   .mscale = 0.75, .mscale_all_dim = 0.5}};
  RopeTable cpp;
  ASSERT_TRUE(RopeTable::build(p, &cpp).ok());
  const capi::CParams<optx_rope_table_params> c(p);
  optx_rope_table* t = nullptr;
  ASSERT_EQ(optx_rope_table_build(&c.c, &t), OPTX_OK) << optx_last_error();
  EXPECT_EQ(optx_rope_table_positions(t), 40);
  EXPECT_EQ(optx_rope_table_half(t), 6);
  EXPECT_EQ(std::memcmp(optx_rope_table_inv_freq(t), cpp.inv_freq().data(), 6 * sizeof(double)), 0);
  optx_tensor cs[2];
  ASSERT_EQ(optx_rope_table_cos(t, &cs[0]), OPTX_OK);
  ASSERT_EQ(optx_rope_table_sin(t, &cs[1]), OPTX_OK);
  for (int i = 0; i < 2; ++i) {
    const TensorView want = i ? cpp.sin() : cpp.cos();
    EXPECT_TRUE(cs[i].dtype == OPTX_F32 && cs[i].rank == 2 && cs[i].sizes[0] == 40 && cs[i].sizes[1] == 6 && cs[i].strides[0] == 6);
    EXPECT_EQ(std::memcmp(cs[i].data, want.data, 40 * 6 * sizeof(float)), 0) << i;
  }
  optx_rope_table_free(t);
  optx_rope_table_free(nullptr);
  EXPECT_EQ(optx_yarn_mscale(4.0, 0.75), yarn_mscale(4.0, 0.75));

  capi_test::expect_create_errors("rope_table", optx_rope_table_build, c.c);
  optx_rope_table_params bad = c.c;
  bad.rotary_dim = 3;
  EXPECT_EQ(optx_rope_table_build(&bad, &t), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(t, nullptr);
  EXPECT_STREQ(optx_last_error(), "rope_table: rotary_dim=3 must be even and in [2, 1024]");
  EXPECT_EQ(optx_rope_table_cos(nullptr, &cs[0]), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_rope_table_cos: the handle and out must be non-null");
  EXPECT_EQ(optx_rope_table_half(nullptr), -1);
  EXPECT_STREQ(optx_last_error(), "optx_rope_table_half: the handle is null");
  EXPECT_EQ(optx_rope_table_inv_freq(nullptr), nullptr);
}

}  // namespace
}  // namespace optx
