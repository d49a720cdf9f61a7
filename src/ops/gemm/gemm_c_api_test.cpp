// gemm and packed weights through optx.h, against C++.
#include <gtest/gtest.h>

#include <cstring>

#include "core/c_api_testutil.h"

namespace optx {
namespace {

using capi_test::Buffers;
using enum DType;

// Every field in play: an unpacked i8 B laid out [K, N] with its scales, a bias, alpha and
// beta (C is read); then a packed B with the fused SwiGLU.
TEST(GemmCApi, MatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(gemm), [](Buffers& b) {
    return GemmParams{.a = b.random(kF32, {3, 8}), .b = b.random(kI8, {8, 5}), .b_scales = b.random(kF32, {5}, 0.01f, 0.02f),
                      .bias = b.random(kBF16, {5}), .c = b.random(kBF16, {3, 5}), .alpha = 0.75f, .beta = 0.5f, .b_kn = true};
  });
  Buffers wb;
  const capi_test::Packed w({.w = wb.random(kBF16, {128, 16})});
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(gemm), [&](Buffers& b) {
    return GemmParams{
        .a = b.random(kBF16, {2, 16}), .packed_b = &(*w.get())[0], .c = b.random(kF32, {2, 64}), .activation = GemmActivation::kSwiglu};
  });
}

// pack_weights through C packs the same bytes as C++ (two i8 experts [K, N] with scales,
// panel layout), and the handle's matrices are the C++ ones.
TEST(GemmCApi, PackedWeights) {
  Buffers b;
  const PackWeightsParams p{
      .w = b.random(kI8, {2, 24, 70}), .scales = b.random(kF32, {2, 70}), .kn = true, .layout = PackLayout::kPanels};
  PackedWeights cpp;
  ASSERT_TRUE(pack_weights(p, &cpp).ok());
  const capi_test::Packed c(p);
  const optx_packed_weights* h = c.handle();
  ASSERT_EQ(optx_packed_weights_count(h), 2);
  ASSERT_EQ(optx_packed_weights_bytes(h), cpp.bytes());
  for (int64_t e = 0; e < 2; ++e) {
    optx_packed_matrix m;
    ASSERT_EQ(optx_packed_weights_matrix(h, e, &m), OPTX_OK);
    const PackedMatrix& want = cpp[e];
    EXPECT_TRUE(m.dtype == OPTX_I8 && m.n == want.n && m.k == want.k && m.k_padded == want.k_padded &&
                m.panel_bytes == want.panel_bytes && m.strip_kc == want.strip_kc);
    EXPECT_EQ(m.data, (*c.get())[e].data);
    EXPECT_EQ(std::memcmp(m.data, want.data, size_t(want.n_panels() * want.panel_bytes)), 0);
    EXPECT_EQ(std::memcmp(m.scales, want.scales, size_t(want.n_panels() * PackedMatrix::kPanel) * sizeof(float)), 0);
  }
  optx_packed_matrix m;
  EXPECT_EQ(optx_packed_weights_matrix(h, 2, &m), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_packed_weights_matrix: e=2 but the weights hold 2 matrices");
  EXPECT_EQ(optx_packed_weights_matrix(nullptr, 0, &m), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_packed_weights_matrix: the handle and out must be non-null");
  EXPECT_EQ(optx_packed_weights_count(nullptr), -1);
  EXPECT_STREQ(optx_last_error(), "optx_packed_weights_count: the handle is null");
  EXPECT_EQ(optx_packed_weights_bytes(nullptr), 0u);
  EXPECT_STREQ(optx_last_error(), "optx_packed_weights_bytes: the handle is null");
  optx_packed_weights_free(nullptr);

  const capi::CParams<optx_pack_weights_params> valid(p);
  capi_test::expect_create_errors("pack_weights", optx_pack_weights, valid.c);
  optx_pack_weights_params bad = valid.c;
  bad.w.rank = 1;  // refused by C++, with its message
  optx_packed_weights* out = nullptr;
  EXPECT_EQ(optx_pack_weights(&bad, &out), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_STREQ(optx_last_error(), "pack_weights: w.rank=1 but must be 2 ([N, K]) or 3 ([E, N, K])");
}

}  // namespace
}  // namespace optx
