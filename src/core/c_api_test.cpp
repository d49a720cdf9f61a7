// C API: the runtime functions, every struct's defaults, the exception guard, and optx.h
// from a C translation unit (c_api_smoke.c). Each family's <family>_c_api_test.cpp checks
// its ops against C++.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/c_api_testutil.h"
#include "optx/optx.h"

extern "C" int optx_c_smoke(void);

namespace optx {
namespace {

TEST(CApi, CallsFromC) {
  EXPECT_EQ(optx_c_smoke(), 0) << "c_api_smoke.c: the check at this line failed; last error: " << optx_last_error();
}

// Each field of a C struct's default, converted to C++, against the C++ default.
struct SameAsDefault {
  void operator()(const char* name, const TensorView& got, const TensorView& want) {
    EXPECT_TRUE(got.data == want.data && got.dtype == want.dtype && got.rank == want.rank) << name;
  }
  template <class T>
  void operator()(const char* name, const T& got, const T& want) {
    EXPECT_TRUE(std::memcmp(&got, &want, sizeof got) == 0) << name;
  }
};

template <class C>
void expect_default(C (*fn)(void), const char* name) {
  SCOPED_TRACE(name);
  using Cpp = typename capi::Mirror<C>::Cpp;
  const C c = fn();
  capi::CppParams<C> got;
  ASSERT_TRUE(capi::to_cpp(name, &c, &got).ok());
  const Cpp want{};
  SameAsDefault same;
  capi::Mirror<C>::each(same, got.p, want);
}

TEST(CApi, DefaultsAreTheCppDefaults) {
#define OPTX_EXPECT_DEFAULT(s) expect_default(optx_##s##_default, #s);
  OPTX_C_FOR_EACH(OPTX_EXPECT_DEFAULT, packed_matrix, pack_weights_params, gemm_params, rms_norm_params, add_rms_norm_params, rope_params,
                  yarn_scaling, rope_table_params, kv_pool_config, kv_cache_write_params, gather_pa_kv_cache_params,
                  kv_rms_norm_rope_cache_params, qkv_rope_cache_params, flash_attention_params, paged_decode_attention_params,
                  mla_decode_attention_params, attention_update_params, moe_gating_topk_params, moe_gating_topk_softmax_params,
                  moe_init_routing_params, moe_compute_expert_tokens_params, grouped_matmul_params, grouped_matmul_swiglu_params,
                  moe_finalize_routing_params, moe_forward_params)
#undef OPTX_EXPECT_DEFAULT
  // The ones a zeroed struct would get wrong, by value.
  EXPECT_EQ(optx_gemm_params_default().alpha, 1.0f);
  EXPECT_EQ(optx_flash_attention_params_default().window_left, -1);
  EXPECT_EQ(optx_flash_attention_params_default().window_right, -1);
  EXPECT_EQ(optx_moe_init_routing_params_default().expert_end, -1);
  EXPECT_EQ(optx_moe_forward_params_default().top_k, 6);
  EXPECT_EQ(optx_mla_decode_attention_params_default().kv_lora_rank, 512);
  EXPECT_EQ(optx_kv_pool_config_default().dtype, OPTX_BF16);
  EXPECT_EQ(optx_kv_rms_norm_rope_cache_params_default().style, OPTX_ROPE_STYLE_INTERLEAVED);
  EXPECT_EQ(optx_rope_table_params_default().yarn.original_max_position_embeddings, 4096);
}

TEST(CApi, Runtime) {
  EXPECT_STREQ(optx_version(), version());
  int two_threads = 0;
  {
    const ThreadScope two(2);
    two_threads = num_threads();
  }
  optx_set_num_threads(1);
  EXPECT_EQ(optx_num_threads(), 1);
  optx_thread_scope* outer = nullptr;
  optx_thread_scope* inner = nullptr;
  ASSERT_EQ(optx_thread_scope_create(2, &outer), OPTX_OK);
  EXPECT_EQ(num_threads(), two_threads);
  ASSERT_EQ(optx_thread_scope_create(1, &inner), OPTX_OK);
  EXPECT_EQ(optx_num_threads(), 1);
  optx_thread_scope_free(inner);
  EXPECT_EQ(num_threads(), two_threads);
  optx_thread_scope_free(outer);
  EXPECT_EQ(optx_num_threads(), 1);
  optx_thread_scope_free(nullptr);
  EXPECT_EQ(optx_thread_scope_create(1, nullptr), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_thread_scope_create: out is null");
  optx_set_num_threads(0);

  EXPECT_EQ(int(optx_detected_isa()), int(detected_isa()));
  EXPECT_EQ(int(optx_active_isa()), int(active_isa()));
  EXPECT_STREQ(optx_isa_name(OPTX_ISA_AVX512_BF16), "avx512_bf16");
  EXPECT_STREQ(optx_isa_name(optx_isa(OPTX_ISA_AMX + 1)), "?");
  EXPECT_STREQ(optx_last_error(), "optx_isa_name: isa=5 is not an optx_isa");

  const std::vector<std::string> ops = registered_ops();
  ASSERT_EQ(optx_registered_op_count(), ops.size());
  char buf[64];
  for (size_t i = 0; i < ops.size(); ++i) {
    ASSERT_EQ(optx_registered_op(i, buf, sizeof buf), OPTX_OK);
    EXPECT_EQ(ops[i], buf);
    ASSERT_EQ(optx_selected_impl(buf, buf, sizeof buf), OPTX_OK) << optx_last_error();
    EXPECT_EQ(selected_impl(ops[i]), buf);
  }
  EXPECT_EQ(optx_registered_op(ops.size(), buf, sizeof buf), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(optx_last_error(), "optx_registered_op: i=" + std::to_string(ops.size()) + " but " + std::to_string(ops.size()) +
                                   " ops are registered");
  EXPECT_EQ(optx_selected_impl(nullptr, buf, sizeof buf), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_selected_impl: op and buf must be non-null, buf_size > 0");
  EXPECT_EQ(optx_registered_op(0, buf, 0), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "optx_registered_op: buf must be non-null, buf_size > 0");
  char two[2];
  ASSERT_EQ(optx_registered_op(0, two, sizeof two), OPTX_OK);  // truncated, terminated
  EXPECT_EQ(two[0], ops[0][0]);
  EXPECT_EQ(two[1], '\0');
}

// No exception crosses the C boundary: each becomes a status and a message.
TEST(CApi, ExceptionsBecomeStatuses) {
  EXPECT_EQ(capi::guarded("op", []() -> Status { throw std::bad_alloc(); }), OPTX_OUT_OF_MEMORY);
  EXPECT_STREQ(optx_last_error(), "op: out of memory");
  EXPECT_EQ(capi::guarded("op", []() -> Status { throw std::runtime_error("boom"); }), OPTX_INTERNAL);
  EXPECT_STREQ(optx_last_error(), "op: boom");
  EXPECT_EQ(capi::guarded("op", []() -> Status { throw 42; }), OPTX_INTERNAL);
  EXPECT_STREQ(optx_last_error(), "op: unknown exception");
  EXPECT_EQ(capi::guarded("op", [] { return Status::Ok(); }), OPTX_OK);
  EXPECT_STREQ(optx_last_error(), "op: unknown exception");  // a success leaves it alone
}

}  // namespace
}  // namespace optx
