// rms_norm and add_rms_norm through optx.h, against C++.
#include <gtest/gtest.h>

#include "core/c_api_testutil.h"

namespace optx {
namespace {

using capi_test::Buffers;
using enum DType;

TEST(NormCApi, MatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(rms_norm), [](Buffers& b) {
    return RmsNormParams{.x = b.random(kBF16, {3, 40}), .weight = b.random(kBF16, {40}), .out = b.random(kBF16, {3, 40}), .eps = 0.25f};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(add_rms_norm), [](Buffers& b) {
    return AddRmsNormParams{.x = b.random(kF32, {2, 24}), .residual = b.random(kF32, {2, 24}), .weight = b.random(kF32, {24}),
                            .out = b.random(kF32, {2, 24}), .eps = 0.5f};
  });
}

}  // namespace
}  // namespace optx
