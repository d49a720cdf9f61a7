// The C API's machinery (optx/optx.h), shared by each family's <family>_c_api.cpp and the
// tests: the thread-local last error, the guard that keeps C++ exceptions out of C, and
// the conversions between optx.h's structs and the C++ ones, driven by one list of field
// names per struct (OPTX_C_MIRROR below, checked against both structs at compile time).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <type_traits>

#include "optx/attention.h"
#include "optx/gemm.h"
#include "optx/kv_cache.h"
#include "optx/moe.h"
#include "optx/norm.h"
#include "optx/optx.h"
#include "optx/rope.h"
#include "optx/runtime.h"

// Handles that C params point to. Each holds its C++ object as its only member, so the two
// are pointer-interconvertible: ToCpp takes the object from a handle, ToC the handle back
// from an object a handle holds (tests build C++ params over handles made through C).
struct optx_packed_weights {
  optx::PackedWeights w;
};
struct optx_schedule_stats {
  optx::ScheduleStats s;
};

namespace optx::capi {

// ---- errors -----------------------------------------------------------------------------------
// s's code; a failing s's message becomes optx_last_error().
optx_status to_c(const Status& s) noexcept;
// optx_last_error() becomes "" (a size query's valid 0).
void clear_error() noexcept;
// A failure found outside Status (an exception, a null handle): "<where>: <what>".
optx_status fail(optx_status code, const char* where, const char* what) noexcept;

// Runs f (returning a Status) so that no exception leaves it: the C API's every entry.
template <class F>
optx_status guarded(const char* where, F&& f) noexcept {
  try {
    return to_c(f());
  } catch (const std::bad_alloc&) {
    return fail(OPTX_OUT_OF_MEMORY, where, "out of memory");
  } catch (const std::exception& e) {
    return fail(OPTX_INTERNAL, where, e.what());
  } catch (...) {
    return fail(OPTX_INTERNAL, where, "unknown exception");
  }
}

// ---- enums: each C enum's C++ enum, name and last value; the values are the C++ ones ---------
template <class E>
struct CEnum;
#define OPTX_C_ENUM(E, CppE, last)            \
  template <>                                 \
  struct CEnum<E> {                           \
    using type = CppE;                        \
    static constexpr const char* name = #E;   \
    static constexpr int max = last;          \
  }
OPTX_C_ENUM(optx_dtype, DType, OPTX_I64);
OPTX_C_ENUM(optx_isa, Isa, OPTX_ISA_AMX);
OPTX_C_ENUM(optx_pack_layout, PackLayout, OPTX_PACK_LAYOUT_STRIPS);
OPTX_C_ENUM(optx_gemm_activation, GemmActivation, OPTX_GEMM_ACTIVATION_SWIGLU);
OPTX_C_ENUM(optx_rope_style, RopeStyle, OPTX_ROPE_STYLE_INTERLEAVED_TO_HALF);
OPTX_C_ENUM(optx_attn_layout, AttnLayout, OPTX_ATTN_LAYOUT_TND);
OPTX_C_ENUM(optx_moe_score, MoeScore, OPTX_MOE_SCORE_SQRT_SOFTPLUS);
OPTX_C_ENUM(optx_moe_group_score, MoeGroupScore, OPTX_MOE_GROUP_SCORE_TOP2_SUM);
#undef OPTX_C_ENUM

template <class C, class Cpp>
constexpr bool same(C c, Cpp cpp) {
  return int(c) == int(cpp);
}
static_assert(same(OPTX_OK, StatusCode::kOk) && same(OPTX_INVALID_ARGUMENT, StatusCode::kInvalidArgument) &&
              same(OPTX_WORKSPACE_TOO_SMALL, StatusCode::kWorkspaceTooSmall) && same(OPTX_UNSUPPORTED, StatusCode::kUnsupported) &&
              same(OPTX_OUT_OF_MEMORY, StatusCode::kOutOfMemory) && same(OPTX_INTERNAL, StatusCode::kInternal));
static_assert(same(OPTX_F32, DType::kF32) && same(OPTX_BF16, DType::kBF16) && same(OPTX_F16, DType::kF16) && same(OPTX_I8, DType::kI8) &&
              same(OPTX_I32, DType::kI32) && same(OPTX_I64, DType::kI64));
static_assert(same(OPTX_ISA_SCALAR, Isa::kScalar) && same(OPTX_ISA_AVX2, Isa::kAvx2) && same(OPTX_ISA_AVX512, Isa::kAvx512) &&
              same(OPTX_ISA_AVX512_BF16, Isa::kAvx512Bf16) && same(OPTX_ISA_AMX, Isa::kAmx));
static_assert(same(OPTX_PACK_LAYOUT_AUTO, PackLayout::kAuto) && same(OPTX_PACK_LAYOUT_PANELS, PackLayout::kPanels) &&
              same(OPTX_PACK_LAYOUT_STRIPS, PackLayout::kStrips));
static_assert(same(OPTX_GEMM_ACTIVATION_NONE, GemmActivation::kNone) && same(OPTX_GEMM_ACTIVATION_SWIGLU, GemmActivation::kSwiglu));
static_assert(same(OPTX_ROPE_STYLE_HALF, RopeStyle::kHalf) && same(OPTX_ROPE_STYLE_INTERLEAVED, RopeStyle::kInterleaved) &&
              same(OPTX_ROPE_STYLE_INTERLEAVED_TO_HALF, RopeStyle::kInterleavedToHalf));
static_assert(same(OPTX_ATTN_LAYOUT_BSND, AttnLayout::kBSND) && same(OPTX_ATTN_LAYOUT_BNSD, AttnLayout::kBNSD) &&
              same(OPTX_ATTN_LAYOUT_TND, AttnLayout::kTND));
static_assert(same(OPTX_MOE_SCORE_SOFTMAX, MoeScore::kSoftmax) && same(OPTX_MOE_SCORE_SIGMOID, MoeScore::kSigmoid) &&
              same(OPTX_MOE_SCORE_SQRT_SOFTPLUS, MoeScore::kSqrtSoftplus));
static_assert(same(OPTX_MOE_GROUP_SCORE_MAX, MoeGroupScore::kMax) && same(OPTX_MOE_GROUP_SCORE_TOP2_SUM, MoeGroupScore::kTop2Sum));

// A C caller's enum is any int: read it as the int it is (loading an out-of-range value as
// the enum type is undefined in C++), and only a checked value is cast: DType's uint8_t
// would wrap 256 onto f32.
template <class E>
int enum_value(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
template <class E>
bool enum_ok(int v) {
  return v >= 0 && v <= CEnum<E>::max;
}

// ---- struct mirrors ---------------------------------------------------------------------------
// moe_compute_expert_tokens takes its two views as arguments in C++: its params struct.
struct ExpertTokensArgs {
  TensorView sorted_ids;
  TensorView offsets;
};
}  // namespace optx::capi

namespace optx {
// The params-and-workspace shape every other op has (what OPTX_C_OP calls).
inline Status moe_compute_expert_tokens(const capi::ExpertTokensArgs& a, Workspace) {
  return moe_compute_expert_tokens(a.sorted_ids, a.offsets);
}
}  // namespace optx

namespace optx::capi {

// Members an aggregate has: the most initialisers it takes.
struct AnyField {
  template <class T>
  operator T() const;  // never defined: only asked about in requires-expressions
};
template <class T, class... A>
constexpr size_t field_count() {
  if constexpr (requires { T{A{}..., AnyField{}}; })
    return field_count<T, A..., AnyField>();
  else
    return sizeof...(A);
}
template <size_t N>
constexpr bool ascending(const size_t (&v)[N]) {
  return std::is_sorted(std::begin(v), std::end(v)) && std::adjacent_find(std::begin(v), std::end(v)) == std::end(v);
}

// One field list per C struct and its C++ twin. The asserts make the list every member of
// both, in the order both declare them: a member one side lacks, or the C header's order
// drifting from C++'s, fails the build.
template <class C>
struct Mirror;

#define OPTX_C_PARENS ()
#define OPTX_C_EXPAND(...) OPTX_C_EXPAND3(OPTX_C_EXPAND3(OPTX_C_EXPAND3(OPTX_C_EXPAND3(__VA_ARGS__))))
#define OPTX_C_EXPAND3(...) OPTX_C_EXPAND2(OPTX_C_EXPAND2(OPTX_C_EXPAND2(OPTX_C_EXPAND2(__VA_ARGS__))))
#define OPTX_C_EXPAND2(...) OPTX_C_EXPAND1(OPTX_C_EXPAND1(OPTX_C_EXPAND1(OPTX_C_EXPAND1(__VA_ARGS__))))
#define OPTX_C_EXPAND1(...) __VA_ARGS__
#define OPTX_C_FOR_EACH(m, ...) __VA_OPT__(OPTX_C_EXPAND(OPTX_C_FOR_EACH_(m, __VA_ARGS__)))
#define OPTX_C_FOR_EACH_(m, a, ...) m(a) __VA_OPT__(OPTX_C_FOR_EACH_AGAIN OPTX_C_PARENS(m, __VA_ARGS__))
#define OPTX_C_FOR_EACH_AGAIN() OPTX_C_FOR_EACH_
#define OPTX_C_VISIT(f) visit(#f, c.f, p.f);
#define OPTX_C_OFFSET(f) offsetof(C, f),
#define OPTX_CPP_OFFSET(f) offsetof(Cpp, f),

#define OPTX_C_MIRROR(C_, Cpp_, ...)                                                                          \
  template <>                                                                                                 \
  struct Mirror<C_> {                                                                                         \
    using C = C_;                                                                                             \
    using Cpp = Cpp_;                                                                                         \
    template <class V, class CT, class PT>                                                                    \
    static void each(V& visit, CT& c, PT& p) {                                                                \
      OPTX_C_FOR_EACH(OPTX_C_VISIT, __VA_ARGS__)                                                              \
    }                                                                                                         \
    static constexpr size_t c_offsets[] = {OPTX_C_FOR_EACH(OPTX_C_OFFSET, __VA_ARGS__)};                      \
    static constexpr size_t cpp_offsets[] = {OPTX_C_FOR_EACH(OPTX_CPP_OFFSET, __VA_ARGS__)};                  \
  };                                                                                                          \
  static_assert(std::is_standard_layout_v<Cpp_> && field_count<C_>() == std::size(Mirror<C_>::c_offsets) &&   \
                    field_count<Cpp_>() == std::size(Mirror<C_>::c_offsets) && ascending(Mirror<C_>::c_offsets) && \
                    ascending(Mirror<C_>::cpp_offsets),                                                       \
                "the field list of " #C_ " must name every member of it and of " #Cpp_ ", in order")

OPTX_C_MIRROR(optx_packed_matrix, PackedMatrix, dtype, n, k, k_padded, panel_bytes, strip_kc, data, scales);
OPTX_C_MIRROR(optx_pack_weights_params, PackWeightsParams, w, scales, kn, layout);
OPTX_C_MIRROR(optx_gemm_params, GemmParams, a, b, packed_b, b_scales, bias, c, alpha, beta, b_kn, activation);
OPTX_C_MIRROR(optx_rms_norm_params, RmsNormParams, x, weight, out, eps);
OPTX_C_MIRROR(optx_add_rms_norm_params, AddRmsNormParams, x, residual, weight, out, eps);
OPTX_C_MIRROR(optx_rope_params, RopeParams, q, k, positions, cos, sin, rotary_dim, rotary_offset, style);
OPTX_C_MIRROR(optx_yarn_scaling, YarnScaling, factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim);
OPTX_C_MIRROR(optx_rope_table_params, RopeTableParams, rotary_dim, max_positions, theta, yarn);
OPTX_C_MIRROR(optx_kv_pool_config, KvPoolConfig, num_blocks, block_size, row, planes, dtype);
OPTX_C_MIRROR(optx_kv_cache_write_params, KvCacheWriteParams, k, v, slots, k_cache, v_cache, k_scales, v_scales);
OPTX_C_MIRROR(optx_gather_pa_kv_cache_params, GatherKvParams, k_cache, v_cache, k_scales, v_scales, block_tables, seq_lens, block_size,
              k_out, v_out, k_scales_out, v_scales_out);
OPTX_C_MIRROR(optx_kv_rms_norm_rope_cache_params, KvRmsNormRopeCacheParams, kv, weight, positions, cos, sin, slots, cache, cache_scales,
              rope_cache, kv_lora_rank, eps, style);
OPTX_C_MIRROR(optx_qkv_rope_cache_params, QkvRopeCacheParams, qkv, q_heads, kv_heads, head_dim, positions, cos, sin, rotary_dim, style,
              slots, k_cache, v_cache, q_out);
OPTX_C_MIRROR(optx_flash_attention_params, FlashAttentionParams, q, k, v, out, lse, layout, cu_seqlens_q, cu_seqlens_kv, scale, causal,
              window_left, window_right, mask, bias, sinks, softcap);
OPTX_C_MIRROR(optx_paged_decode_attention_params, PagedDecodeParams, q, k_cache, v_cache, k_scales, v_scales, block_tables, seq_lens,
              block_size, kv_heads, out, lse, scale);
OPTX_C_MIRROR(optx_mla_decode_attention_params, MlaDecodeParams, q, cache, cache_scales, rope_cache, block_tables, seq_lens, block_size,
              kv_lora_rank, out, lse, scale);
OPTX_C_MIRROR(optx_attention_update_params, AttentionUpdateParams, outs, lses, out, lse);
OPTX_C_MIRROR(optx_moe_gating_topk_params, MoeGatingParams, logits, bias, topk_ids, topk_weights, score, n_group, topk_group, group_score,
              renormalize, topk_then_softmax, routed_scaling_factor);
OPTX_C_MIRROR(optx_moe_gating_topk_softmax_params, MoeGatingSoftmaxParams, logits, topk_ids, topk_weights, renormalize, topk_then_softmax);
OPTX_C_MIRROR(optx_moe_init_routing_params, MoeRoutingParams, x, topk_ids, num_experts, expert_begin, expert_end, sorted_rows, row_scales,
              row_map, inverse, counts, offsets);
OPTX_C_MIRROR(optx_moe_compute_expert_tokens_params, ExpertTokensArgs, sorted_ids, offsets);
OPTX_C_MIRROR(optx_grouped_matmul_params, GroupedMatmulParams, x, weights, group_offsets, offsets_are_counts, out, stats);
OPTX_C_MIRROR(optx_grouped_matmul_swiglu_params, GroupedMatmulSwigluParams, x, weights, group_offsets, out, out_scales, stats);
OPTX_C_MIRROR(optx_moe_finalize_routing_params, MoeFinalizeParams, y, inverse, weights, shared, residual, out);
OPTX_C_MIRROR(optx_moe_forward_params, MoeForwardParams, x, router, packed_router, bias, top_k, score, n_group, topk_group, group_score,
              renormalize, routed_scaling_factor, gate_up, down, shared_gate_up, shared_down, out, stats);

template <class T>
concept Mirrored = requires { typename Mirror<T>::Cpp; };
template <class T>
concept CEnumType = requires { typename CEnum<T>::type; };

// Packed matrices a params struct may point to (gemm's packed_b, moe_forward's
// packed_router): converted copies live beside the converted params.
inline constexpr int kMaxPackedPointers = 1;

// ---- C -> C++ -----------------------------------------------------------------------------------
// Converts field by field and stops at the first field it refuses, naming op and field.
class ToCpp {
 public:
  ToCpp(const char* op, PackedMatrix* mats) : op_(op), mats_(mats) {}
  const Status& status() const { return status_; }

  void operator()(const char* name, const optx_tensor& c, TensorView& p) {
    if (!status_.ok()) return;
    const int d = enum_value(c.dtype);
    if (!enum_ok<optx_dtype>(d)) return refuse(name, ".dtype=", d, " is not an optx_dtype");
    p = TensorView{};
    p.data = c.data;
    p.dtype = DType(d);
    p.rank = c.rank;  // as given: check_view names a bad rank with its value
    for (int i = 0; i < std::min(c.rank, kMaxRank); ++i) {
      p.sizes[i] = c.sizes[i];
      p.strides[i] = c.strides[i];
    }
  }
  template <CEnumType E>
  void operator()(const char* name, const E& c, typename CEnum<E>::type& p) {
    if (!status_.ok()) return;
    const int v = enum_value(c);
    if (!enum_ok<E>(v)) return refuse(name, "=", v, " is not an ", CEnum<E>::name);
    p = typename CEnum<E>::type(v);
  }
  void operator()(const char*, int c, bool& p) { p = c != 0; }
  template <class T>
    requires std::is_arithmetic_v<T>
  void operator()(const char*, T c, T& p) {
    p = c;
  }
  template <class T>
  void operator()(const char*, const T* c, const T*& p) {  // plain data pointers
    p = c;
  }
  void operator()(const char*, const optx_packed_weights* c, const PackedWeights*& p) { p = c ? &c->w : nullptr; }
  void operator()(const char*, optx_schedule_stats* c, ScheduleStats*& p) { p = c ? &c->s : nullptr; }
  void operator()(const char* name, const optx_packed_matrix* c, const PackedMatrix*& p) {
    p = nullptr;
    if (!c || !status_.ok()) return;
    if (used_mats_ == kMaxPackedPointers)  // a struct with more such pointers needs a larger CppParams
      return void(status_ = Error(StatusCode::kInternal, op_, ": ", name, ": more packed matrices than ", kMaxPackedPointers));
    PackedMatrix* m = mats_ + used_mats_++;
    nested(name, *c, *m);
    p = m;
  }
  template <Mirrored C>
  void operator()(const char* name, const C& c, typename Mirror<C>::Cpp& p) {
    nested(name, c, p);
  }

 private:
  template <class C>
  void nested(const char* name, const C& c, typename Mirror<C>::Cpp& p) {
    const char* outer = outer_;
    outer_ = name;  // one level: no mirrored struct nests two deep
    Mirror<C>::each(*this, c, p);
    outer_ = outer;
  }
  template <class... Args>
  void refuse(const char* name, const Args&... parts) {
    status_ = Error(StatusCode::kInvalidArgument, op_, ": ", outer_ ? outer_ : "", outer_ ? "." : "", name, parts...);
  }

  const char* op_;
  const char* outer_ = nullptr;
  PackedMatrix* mats_;
  int used_mats_ = 0;
  Status status_;
};

// The C++ params of a C struct, with the packed matrices its pointers name.
template <class C>
struct CppParams {
  typename Mirror<C>::Cpp p;
  PackedMatrix mats[kMaxPackedPointers];

  CppParams() = default;
  CppParams(const CppParams&) = delete;  // p points into mats
  CppParams& operator=(const CppParams&) = delete;
};

// What every entry checks before the C struct may be used: non-null, and each enum in range.
template <class C>
Status to_cpp(const char* op, const C* c, CppParams<C>* out) {
  if (!c) return Error(StatusCode::kInvalidArgument, op, ": params is null");
  ToCpp conv(op, out->mats);
  Mirror<C>::each(conv, *c, out->p);
  return conv.status();
}

// ---- C++ -> C (the _default() functions; tests) ------------------------------------------------
class ToC {
 public:
  explicit ToC(optx_packed_matrix* mats) : mats_(mats) {}

  void operator()(const char*, optx_tensor& c, const TensorView& p) {
    c = optx_tensor{};
    c.data = p.data;
    c.dtype = optx_dtype(p.dtype);
    c.rank = p.rank;
    for (int i = 0; i < std::clamp(p.rank, 0, kMaxRank); ++i) {
      c.sizes[i] = p.sizes[i];
      c.strides[i] = p.strides[i];
    }
  }
  template <CEnumType E>
  void operator()(const char*, E& c, const typename CEnum<E>::type& p) {
    c = E(p);
  }
  void operator()(const char*, int& c, bool p) { c = p; }
  template <class T>
    requires std::is_arithmetic_v<T>
  void operator()(const char*, T& c, T p) {
    c = p;
  }
  template <class T>
  void operator()(const char*, const T*& c, const T* p) {
    c = p;
  }
  void operator()(const char*, const optx_packed_weights*& c, const PackedWeights* p) {
    c = reinterpret_cast<const optx_packed_weights*>(p);  // p is a handle's (see the handles above)
  }
  void operator()(const char*, optx_schedule_stats*& c, ScheduleStats* p) { c = reinterpret_cast<optx_schedule_stats*>(p); }
  void operator()(const char*, const optx_packed_matrix*& c, const PackedMatrix* p) {
    c = nullptr;
    if (!p || used_mats_ == kMaxPackedPointers) return;
    optx_packed_matrix* m = mats_ + used_mats_++;
    Mirror<optx_packed_matrix>::each(*this, *m, *p);
    c = m;
  }
  template <Mirrored C>
  void operator()(const char*, C& c, const typename Mirror<C>::Cpp& p) {
    Mirror<C>::each(*this, c, p);
  }

 private:
  optx_packed_matrix* mats_;
  int used_mats_ = 0;
};
static_assert(std::is_standard_layout_v<optx_packed_weights> && std::is_standard_layout_v<optx_schedule_stats>);

// The C struct of C++ params, with the packed matrices its pointers name.
template <class C>
struct CParams {
  C c{};
  optx_packed_matrix mats[kMaxPackedPointers] = {};

  explicit CParams(const typename Mirror<C>::Cpp& p) {
    ToC conv(mats);
    Mirror<C>::each(conv, c, p);
  }
  CParams(const CParams&) = delete;  // c points into mats
  CParams& operator=(const CParams&) = delete;
};

// ---- the entry points of optx.h's ops ------------------------------------------------------------
template <class C, class Fn>
optx_status run(const char* op, const C* p, void* ws, size_t ws_bytes, Fn fn) noexcept {
  return guarded(op, [&] {
    CppParams<C> cpp;
    OPTX_RETURN_IF_ERROR(to_cpp(op, p, &cpp));
    return fn(cpp.p, Workspace{ws, ws_bytes});
  });
}

// A valid call may need no workspace, so 0 alone cannot say the params were refused: a
// refusal also sets optx_last_error(), to why(params), the message the op would return,
// and a valid 0 sets it to "" (an earlier call's message would read as this one's). A
// query that returns bytes leaves the last error alone.
template <class C, class SizeFn, class WhyFn>
size_t workspace_size(const char* op, const C* p, SizeFn size, WhyFn why) noexcept {
  size_t bytes = 0;
  guarded(op, [&] {
    CppParams<C> cpp;
    OPTX_RETURN_IF_ERROR(to_cpp(op, p, &cpp));
    const size_t n = size(cpp.p);
    if (n == 0) {
      Status st = why(cpp.p);
      if (st.ok()) clear_error();
      return st;
    }
    bytes = n;
    return Status::Ok();
  });
  return bytes;
}

// For ops whose size query never refuses (it returns 0 for any params).
template <class P>
Status never_refused(const P&) {
  return Status::Ok();
}

// A handle made by make(H&) -> Status; *out is null unless that succeeds.
template <class H, class Make>
optx_status create(const char* op, H** out, Make make) noexcept {
  if (!out) return fail(OPTX_INVALID_ARGUMENT, op, "out is null");
  *out = nullptr;
  return guarded(op, [&] {
    auto h = std::make_unique<H>();
    OPTX_RETURN_IF_ERROR(make(*h));
    *out = h.release();
    return Status::Ok();
  });
}

// A handle made from a params struct: make(C++ params, H&) -> Status.
template <class C, class H, class Make>
optx_status create_from(const char* op, const C* p, H** out, Make make) noexcept {
  return create(op, out, [&](H& h) {
    CppParams<C> cpp;
    OPTX_RETURN_IF_ERROR(to_cpp(op, p, &cpp));
    return make(cpp.p, h);
  });
}

// A getter's handle: non-null, else the getter returns `none` with the message set.
template <class H, class T, class Get>
T get(const char* fn, const H* h, T none, Get g) noexcept {
  if (!h) return fail(OPTX_INVALID_ARGUMENT, fn, "the handle is null"), none;
  return g(*h);
}

// A view a handle gives out, g(handle), as an optx_tensor.
template <class H, class Get>
optx_status view_of(const char* fn, const H* h, optx_tensor* out, Get g) noexcept {
  if (!h || !out) return fail(OPTX_INVALID_ARGUMENT, fn, "the handle and out must be non-null");
  return guarded(fn, [&] {
    ToC conv(nullptr);
    conv("", *out, g(*h));
    return Status::Ok();
  });
}

}  // namespace optx::capi

// Each op's C entry points; the C++ function of the same name does the work.
#define OPTX_C_OP(op)                                                                                       \
  optx_status optx_##op(const optx_##op##_params* p, void* workspace, size_t workspace_bytes) {             \
    return ::optx::capi::run(#op, p, workspace, workspace_bytes,                                            \
                             [](const auto& q, ::optx::Workspace ws) { return ::optx::op(q, ws); });        \
  }
#define OPTX_C_SIZED_OP(op, why)                                                                            \
  OPTX_C_OP(op)                                                                                             \
  size_t optx_##op##_workspace_size(const optx_##op##_params* p) {                                          \
    return ::optx::capi::workspace_size(#op, p, [](const auto& q) { return ::optx::op##_workspace_size(q); }, why); \
  }
// optx_<s>_default(): the C++ struct's defaults.
// No C++ default points anywhere, so nothing points into the temporary CParams' matrices.
#define OPTX_C_DEFAULT(s) \
  optx_##s optx_##s##_default(void) { return ::optx::capi::CParams<optx_##s>(::optx::capi::Mirror<optx_##s>::Cpp{}).c; }
