// The attention ops through optx.h, against C++.
#include <gtest/gtest.h>

#include "core/c_api_testutil.h"

namespace optx {
namespace {

using capi_test::Buffers;
using enum DType;

// Flash attention twice, since causal makes window_right moot and only TND reads
// cu_seqlens: BNSD with both windows, a mask, a bias, sinks and a softcap; then TND, causal.
TEST(AttentionCApi, FlashMatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(flash_attention), [](Buffers& b) {
    return FlashAttentionParams{
        .q = b.random(kBF16, {1, 2, 3, 8}), .k = b.random(kBF16, {1, 1, 5, 8}), .v = b.random(kBF16, {1, 1, 5, 4}),
        .out = b.random(kBF16, {1, 2, 3, 4}), .lse = b.random(kF32, {1, 2, 3}), .layout = AttnLayout::kBNSD,
        .scale = 0.3f, .window_left = 2, .window_right = 1,
        .mask = b.values(kI8, {1, 1, 3, 5}, {1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1}),
        .bias = b.random(kF32, {1, 2, 3, 5}), .sinks = b.random(kF32, {2}), .softcap = 5.0f};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(flash_attention), [](Buffers& b) {
    return FlashAttentionParams{.q = b.random(kF32, {5, 2, 8}), .k = b.random(kF32, {7, 1, 8}), .v = b.random(kF32, {7, 1, 8}),
                                .out = b.random(kF32, {5, 2, 8}), .lse = b.random(kF32, {2, 5}), .layout = AttnLayout::kTND,
                                .cu_seqlens_q = b.values(kI32, {3}, {0, 2, 5}), .cu_seqlens_kv = b.values(kI32, {3}, {0, 3, 7}),
                                .causal = true};
  });
}

// The decode ops on i8 caches (scales in play), two new tokens per sequence.
TEST(AttentionCApi, DecodeMatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(paged_decode_attention), [](Buffers& b) {
    return PagedDecodeParams{
        .q = b.random(kBF16, {2, 2, 2, 8}), .k_cache = b.random(kI8, {16, 8}), .v_cache = b.random(kI8, {16, 4}),
        .k_scales = b.random(kF32, {16}, 0.01f, 0.02f), .v_scales = b.random(kF32, {16}, 0.01f, 0.02f),
        .block_tables = b.values(kI32, {2, 2}, {1, 3, 0, 2}), .seq_lens = b.values(kI32, {2}, {5, 7}), .block_size = 4, .kv_heads = 1,
        .out = b.random(kBF16, {2, 2, 2, 4}), .lse = b.random(kF32, {2, 2, 2}), .scale = 0.2f};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_SIZED_OP(mla_decode_attention), [](Buffers& b) {
    return MlaDecodeParams{.q = b.random(kF32, {1, 2, 2, 24}), .cache = b.random(kI8, {8, 16}),
                           .cache_scales = b.random(kF32, {8}, 0.01f, 0.02f), .rope_cache = b.random(kF32, {8, 8}),
                           .block_tables = b.values(kI32, {1, 2}, {1, 0}), .seq_lens = b.values(kI32, {1}, {6}),
                           .block_size = 4, .kv_lora_rank = 16, .out = b.random(kF32, {1, 2, 2, 16}), .lse = b.random(kF32, {1, 2, 2}),
                           .scale = 0.2f};
  });
}

TEST(AttentionCApi, UpdateMatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(attention_update), [](Buffers& b) {
    return AttentionUpdateParams{
        .outs = b.random(kF32, {3, 4, 8}), .lses = b.random(kF32, {3, 4}), .out = b.random(kBF16, {4, 8}), .lse = b.random(kF32, {4})};
  });
}

}  // namespace
}  // namespace optx
