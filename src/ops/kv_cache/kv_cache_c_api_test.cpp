// The KV cache ops and the block pool through optx.h, against C++.
#include <gtest/gtest.h>

#include "core/c_api_testutil.h"

namespace optx {
namespace {

using capi_test::Buffers;
using enum DType;

// i8 caches, so that the scales are in play too; slot -1 skips a token.
TEST(KvCacheCApi, MatchesCpp) {
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(kv_cache_write), [](Buffers& b) {
    return KvCacheWriteParams{.k = b.random(kBF16, {3, 8}), .v = b.random(kBF16, {3, 8}), .slots = b.values(kI32, {3}, {5, -1, 2}),
                              .k_cache = b.random(kI8, {8, 8}), .v_cache = b.random(kI8, {8, 8}),
                              .k_scales = b.random(kF32, {8}), .v_scales = b.random(kF32, {8})};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(gather_pa_kv_cache), [](Buffers& b) {
    return GatherKvParams{.k_cache = b.random(kI8, {12, 8}), .v_cache = b.random(kI8, {12, 8}),
                          .k_scales = b.random(kF32, {12}), .v_scales = b.random(kF32, {12}),
                          .block_tables = b.values(kI32, {2, 2}, {2, 0, 1, 2}), .seq_lens = b.values(kI32, {2}, {5, 3}), .block_size = 4,
                          .k_out = b.random(kI8, {8, 8}), .v_out = b.random(kI8, {8, 8}),
                          .k_scales_out = b.random(kF32, {8}), .v_scales_out = b.random(kF32, {8})};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(kv_rms_norm_rope_cache), [](Buffers& b) {
    return KvRmsNormRopeCacheParams{
        .kv = b.random(kBF16, {2, 24}), .weight = b.random(kBF16, {16}), .positions = b.values(kI32, {2}, {3, 1}),
        .cos = b.random(kF32, {5, 4}), .sin = b.random(kF32, {5, 4}), .slots = b.values(kI64, {2}, {4, 0}),
        .cache = b.random(kI8, {6, 16}), .cache_scales = b.random(kF32, {6}), .rope_cache = b.random(kBF16, {6, 8}),
        .kv_lora_rank = 16, .eps = 0.125f, .style = RopeStyle::kHalf};
  });
  capi_test::expect_c_matches_cpp(OPTX_TEST_OP(qkv_rope_cache), [](Buffers& b) {
    return QkvRopeCacheParams{.qkv = b.random(kF32, {2, 32}), .q_heads = 2, .kv_heads = 1, .head_dim = 8,
                              .positions = b.values(kI64, {2}, {2, 0}), .cos = b.random(kF32, {4, 2}), .sin = b.random(kF32, {4, 2}),
                              .rotary_dim = 4, .style = RopeStyle::kInterleaved, .slots = b.values(kI32, {2}, {3, -1}),
                              .k_cache = b.random(kF32, {4, 8}), .v_cache = b.random(kF32, {4, 8}), .q_out = b.random(kF32, {2, 2, 8})};
  });
}

// The pool hands out the blocks C++'s does, its planes are C++'s views, and each refusal
// is a status with the message.
TEST(KvCacheCApi, BlockPool) {
  const KvPoolConfig cfg{.num_blocks = 3, .block_size = 4, .row = 8, .planes = 2, .dtype = kI8};
  KvBlockPool cpp;
  ASSERT_TRUE(KvBlockPool::create(cfg, &cpp).ok());
  const capi::CParams<optx_kv_pool_config> c_cfg(cfg);
  optx_kv_block_pool* pool = nullptr;
  ASSERT_EQ(optx_kv_block_pool_create(&c_cfg.c, &pool), OPTX_OK) << optx_last_error();
  optx_kv_pool_config got;
  ASSERT_EQ(optx_kv_block_pool_config(pool, &got), OPTX_OK);
  EXPECT_TRUE(got.num_blocks == 3 && got.block_size == 4 && got.row == 8 && got.planes == 2 && got.dtype == OPTX_I8);
  EXPECT_EQ(optx_kv_block_pool_num_slots(pool), 12);
  for (int p = 0; p < 2; ++p) {
    optx_tensor plane, scales;
    ASSERT_EQ(optx_kv_block_pool_plane(pool, p, &plane), OPTX_OK);
    ASSERT_EQ(optx_kv_block_pool_scales(pool, p, &scales), OPTX_OK);
    EXPECT_TRUE(plane.dtype == OPTX_I8 && plane.rank == 2 && plane.sizes[0] == 12 && plane.sizes[1] == 8 && plane.data);
    EXPECT_TRUE(scales.dtype == OPTX_F32 && scales.rank == 1 && scales.sizes[0] == 12 && scales.data && scales.data != plane.data);
  }
  optx_tensor none;
  EXPECT_EQ(optx_kv_block_pool_plane(pool, 2, &none), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_kv_block_pool_plane: p=2 but the pool has 2 planes");
  EXPECT_EQ(optx_kv_block_pool_scales(pool, -1, &none), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_kv_block_pool_scales: p=-1 but the pool has 2 planes");

  int32_t want[2], ids[2];
  ASSERT_TRUE(cpp.allocate(2, want).ok());
  ASSERT_EQ(optx_kv_block_pool_allocate(pool, 2, ids), OPTX_OK);
  EXPECT_TRUE(ids[0] == want[0] && ids[1] == want[1]);
  EXPECT_EQ(optx_kv_block_pool_free_blocks(pool), 1);
  EXPECT_EQ(optx_kv_block_pool_allocate(pool, 2, ids), OPTX_OUT_OF_MEMORY);
  EXPECT_STREQ(optx_last_error(), "kv_pool.allocate: requested 2 blocks but only 1 of 3 are free");
  EXPECT_EQ(optx_kv_block_pool_release(pool, ids, 2), OPTX_OK);
  EXPECT_EQ(optx_kv_block_pool_free_blocks(pool), 3);
  EXPECT_EQ(optx_kv_block_pool_release(pool, ids, 1), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(optx_last_error()).rfind("kv_pool.release: blocks[0]=", 0), 0u) << optx_last_error();
  optx_kv_block_pool_free(pool);
  optx_kv_block_pool_free(nullptr);

  // A pool of planes of f32: no scales.
  optx_kv_pool_config f32 = c_cfg.c;
  f32.dtype = OPTX_F32;
  f32.planes = 1;
  ASSERT_EQ(optx_kv_block_pool_create(&f32, &pool), OPTX_OK);
  optx_tensor scales;
  ASSERT_EQ(optx_kv_block_pool_scales(pool, 0, &scales), OPTX_OK);
  EXPECT_TRUE(scales.data == nullptr && scales.rank == 0);
  optx_kv_block_pool_free(pool);

  capi_test::expect_create_errors("kv_pool", optx_kv_block_pool_create, c_cfg.c);
  optx_kv_pool_config empty = c_cfg.c;
  empty.num_blocks = 0;
  pool = reinterpret_cast<optx_kv_block_pool*>(&pool);
  EXPECT_EQ(optx_kv_block_pool_create(&empty, &pool), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(pool, nullptr);
  EXPECT_STREQ(optx_last_error(), "kv_pool: num_blocks=0 must be in [1, 2^31)");
  EXPECT_EQ(optx_kv_block_pool_free_blocks(nullptr), -1);
  EXPECT_STREQ(optx_last_error(), "optx_kv_block_pool_free_blocks: the handle is null");
  EXPECT_EQ(optx_kv_block_pool_num_slots(nullptr), -1);
  EXPECT_EQ(optx_kv_block_pool_allocate(nullptr, 1, ids), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_kv_block_pool_allocate: the handle is null");
  EXPECT_EQ(optx_kv_block_pool_release(nullptr, ids, 1), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(optx_kv_block_pool_config(nullptr, &got), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(optx_kv_block_pool_plane(nullptr, 0, &none), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_kv_block_pool_plane: the handle and out must be non-null");
}

}  // namespace
}  // namespace optx
