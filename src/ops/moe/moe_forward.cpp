// moe_forward: one DeepSeek MoE layer from the family's ops, all buffers in one workspace:
//   logits = x . router^T (f32)        gating -> ids, weights
//   routing -> expert-sorted rows
//   gate/up + SwiGLU: routed experts on the sorted rows and the shared experts on x, one
//   work queue -> h, sh_h;  down: the same for both -> y, sh_out
//   finalize: out = sum_j w * y + sh_out
#include <algorithm>
#include <array>
#include <cmath>

#include "core/validate.h"
#include "ops/gemm/gemm_internal.h"
#include "ops/moe/moe_internal.h"

namespace optx {
namespace {

struct Layout {
  int64_t T = 0, H = 0, E = 0, k = 0, I = 0, Is = 0;
  size_t xf, logits, ids, wts, sorted, row_map, inverse, counts, offsets, one, h, y, sh_h, sh_out, scratch, total;
};

int64_t num_experts(const MoeForwardParams& p) { return p.packed_router ? p.packed_router->n : p.router.sizes[0]; }

GemmParams router_gemm(const MoeForwardParams& p, void* xf, void* logits) {
  const int64_t T = p.x.sizes[0], H = p.x.sizes[1];
  GemmParams g{.a = make_view(xf, DType::kF32, {T, H}), .c = make_view(logits, DType::kF32, {T, num_experts(p)})};
  if (p.packed_router) g.packed_b = p.packed_router;
  else g.b = p.router;
  return g;
}

Layout layout_of(const MoeForwardParams& p) {
  Layout l;
  l.T = p.x.sizes[0], l.H = p.x.sizes[1], l.E = num_experts(p), l.k = p.top_k;
  l.I = (*p.gate_up)[0].n / 2;
  l.Is = p.shared_gate_up ? (*p.shared_gate_up)[0].n / 2 : 0;
  const size_t es = dtype_size(p.x.dtype), N = size_t(l.T * l.k);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align_up(off + bytes);
    return at;
  };
  l.xf = take(p.x.dtype == DType::kBF16 ? size_t(l.T * l.H) * 4 : 0);  // f32 x is read in place
  l.logits = take(size_t(l.T * l.E) * 4);
  l.ids = take(N * 4);
  l.wts = take(N * 4);
  l.sorted = take(N * size_t(l.H) * es);
  l.row_map = take(N * 4);
  l.inverse = take(N * 4);
  l.counts = take(size_t(l.E) * 8);
  l.offsets = take(size_t(l.E) * 8);
  l.one = take(8);  // the shared experts' single group
  l.h = take(N * size_t(l.I) * es);
  l.y = take(N * size_t(l.H) * es);
  l.sh_h = take(size_t(l.T * l.Is) * es);
  l.sh_out = take(size_t(l.T * l.H) * es);
  // Scratch for the GEMMs: the largest of the grouped / dense calls.
  const DType dt = p.x.dtype;
  const TensorView xs = make_view(nullptr, dt, {int64_t(N), l.H});
  const TensorView hs = make_view(nullptr, dt, {int64_t(N), l.I});
  std::array<GroupedMatmulSwigluParams, 2> up{{{.x = xs, .weights = p.gate_up, .out = make_view(nullptr, dt, {int64_t(N), l.I})},
                                               {.x = make_view(nullptr, dt, {l.T, l.H}), .weights = p.shared_gate_up,
                                                .out = make_view(nullptr, dt, {l.T, l.Is})}}};
  std::array<GroupedMatmulParams, 2> down{{{.x = hs, .weights = p.down, .out = make_view(nullptr, dt, {int64_t(N), l.H})},
                                           {.x = make_view(nullptr, dt, {l.T, l.Is}), .weights = p.shared_down,
                                            .out = make_view(nullptr, dt, {l.T, l.H})}}};
  const size_t parts = p.shared_gate_up ? 2 : 1;
  size_t s = moe_detail::grouped_matmul_swiglu_workspace_size({up.data(), parts});
  s = std::max(s, moe_detail::grouped_matmul_workspace_size({down.data(), parts}));
  s = std::max(s, gemm_workspace_size(router_gemm(p, nullptr, nullptr)));
  l.scratch = take(s + kAlign);
  l.total = off + kAlign;
  return l;
}

// rows x cols elements of es bytes within check_view's bound: layout_of carves buffers of
// these shapes, which the inner ops check as views.
bool fits(int64_t rows, int64_t cols, size_t es) {
  int64_t n = 0;
  return !__builtin_mul_overflow(rows, cols, &n) && !__builtin_mul_overflow(n, int64_t(es), &n) && n <= kMaxViewBytes;
}

// Every argument, before layout_of multiplies the sizes, so that the errors name
// moe_forward and its arguments rather than the inner op that would fail. need_data =
// false for moe_forward_workspace_size, which may size the workspace before x and out exist.
Status validate(const MoeForwardParams& p, bool need_data) {
  using moe_detail::check_1d;
  using moe_detail::check_2d;
  using moe_detail::describe;
  constexpr const char* op = "moe_forward";
  OPTX_RETURN_IF_ERROR(check_2d(op, p.x, "x", -1, -1, true, need_data));
  const int64_t T = p.x.sizes[0], H = p.x.sizes[1];
  if (H < 1 || H > moe_detail::kMaxHidden)
    return Error(StatusCode::kInvalidArgument, op, ": x has H=", H, " but the hidden size must be in [1, ", moe_detail::kMaxHidden, "]");
  OPTX_RETURN_IF_ERROR(check_2d(op, p.out, "out", T, H, true, need_data));
  if (p.out.dtype != p.x.dtype)
    return Error(StatusCode::kInvalidArgument, op, ": out.dtype=", dtype_name(p.out.dtype), " but x.dtype=", dtype_name(p.x.dtype));
  if (p.packed_router) {
    if (!p.router.empty()) return Error(StatusCode::kInvalidArgument, op, ": both router and packed_router given; pass one");
    if (p.packed_router->k != H)
      return Error(StatusCode::kInvalidArgument, op, ": packed_router has K=", p.packed_router->k, " but x has H=", H);
    if (need_data && !p.packed_router->data) return Error(StatusCode::kInvalidArgument, op, ": packed_router->data is null");
    OPTX_RETURN_IF_ERROR(gemm_detail::check_packed_layout(op, "packed_router", *p.packed_router));
  } else {
    OPTX_RETURN_IF_ERROR(check_view(op, "router", p.router, need_data));
    if (p.router.rank != 2 || p.router.dtype != DType::kF32 || p.router.sizes[1] != H)
      return Error(StatusCode::kInvalidArgument, op, ": router must be f32 [E, H=", H, "], got rank ", p.router.rank, " ",
                   describe(p.router));
  }
  const int64_t E = num_experts(p);
  if (E < 1 || E > moe_detail::kMaxExperts)
    return Error(StatusCode::kInvalidArgument, op, ": the router has E=", E, " experts; must be in [1, ", moe_detail::kMaxExperts, "]");
  if (!p.gate_up || !p.down || p.gate_up->count() != E || p.down->count() != E)
    return Error(StatusCode::kInvalidArgument, op, ": gate_up and down must hold E=", E, " packed expert matrices, got ",
                 p.gate_up ? p.gate_up->count() : 0, " and ", p.down ? p.down->count() : 0);
  // pack_weights gives all E matrices of a set one shape: the first speaks for them.
  const PackedMatrix &gu = (*p.gate_up)[0], &dn = (*p.down)[0];
  const int64_t I = dn.k;
  if (gu.k != H || gu.n != 2 * I || dn.n != H || I < 1)
    return Error(StatusCode::kInvalidArgument, op, ": experts are gate_up [", gu.n, ", ", gu.k, "] and down [", dn.n, ", ", dn.k,
                 "]; must be [2I, H=", H, "] and [H, I] with I >= 1");
  if ((p.shared_gate_up == nullptr) != (p.shared_down == nullptr))
    return Error(StatusCode::kInvalidArgument, op, ": shared_gate_up and shared_down come together");
  int64_t Is = 0;
  if (p.shared_gate_up) {
    if (p.shared_gate_up->count() != 1 || p.shared_down->count() != 1)
      return Error(StatusCode::kInvalidArgument, op, ": shared_gate_up and shared_down must hold one matrix each, got ",
                   p.shared_gate_up->count(), " and ", p.shared_down->count());
    const PackedMatrix &sgu = (*p.shared_gate_up)[0], &sdn = (*p.shared_down)[0];
    Is = sgu.n / 2;
    if (sgu.k != H || sgu.n != 2 * Is || sdn.n != H || sdn.k != Is || Is < 1)
      return Error(StatusCode::kInvalidArgument, op, ": shared_gate_up is [", sgu.n, ", ", sgu.k, "] and shared_down [", sdn.n, ", ",
                   sdn.k, "]; must be [2 I_s, H=", H, "] and [H, I_s] with I_s >= 1");
  }
  OPTX_RETURN_IF_ERROR(moe_detail::check_weights_dtype(op, "gate_up", p.x.dtype, *p.gate_up));
  OPTX_RETURN_IF_ERROR(moe_detail::check_weights_dtype(op, "down", p.x.dtype, *p.down));
  if (p.shared_gate_up) {
    OPTX_RETURN_IF_ERROR(moe_detail::check_weights_dtype(op, "shared_gate_up", p.x.dtype, *p.shared_gate_up));
    OPTX_RETURN_IF_ERROR(moe_detail::check_weights_dtype(op, "shared_down", p.x.dtype, *p.shared_down));
  }
  if (!p.bias.empty()) OPTX_RETURN_IF_ERROR(check_1d(op, p.bias, "bias", E, DType::kF32, need_data));
  OPTX_RETURN_IF_ERROR(moe_detail::check_router(op, E, p.score, p.group_score, p.routed_scaling_factor, p.n_group, p.topk_group,
                                                 p.top_k, "top_k"));
  // x's bound keeps T * H in range, but the routed rows are top_k times as many, and I,
  // I_s and E are the weights' own: each buffer must pass check_view in the inner ops.
  const size_t es = dtype_size(p.x.dtype);
  if (!fits(T * p.top_k, std::max(H, I), es) || !fits(T, std::max({H, E, Is}), sizeof(float)))
    return Error(StatusCode::kInvalidArgument, op, ": T=", T, " tokens with top_k=", p.top_k, ", H=", H, ", I=", I, ", I_s=", Is,
                 " and E=", E, " need buffers beyond 2^", kMaxViewLog2, " bytes");
  // The routed rows are indexed by i32 (moe_init_routing's row_map and inverse): checked
  // here, so the query returns 0 and the call fails before routing, naming this op.
  if (T * p.top_k > INT32_MAX)
    return Error(StatusCode::kInvalidArgument, op, ": T*top_k=", T * p.top_k, " routed rows exceed the i32 row indices (", INT32_MAX, ")");
  return Status::Ok();
}

}  // namespace

Status moe_detail::validate_moe_forward(const MoeForwardParams& p, bool need_data) { return validate(p, need_data); }

size_t moe_forward_workspace_size(const MoeForwardParams& p) { return validate(p, /*need_data=*/false).ok() ? layout_of(p).total : 0; }

Status moe_forward(const MoeForwardParams& p, Workspace ws) {
  OPTX_RETURN_IF_ERROR(validate(p, /*need_data=*/true));
  const Layout l = layout_of(p);
  OPTX_RETURN_IF_ERROR(check_workspace("moe_forward", "moe_forward_workspace_size", ws, l.total));
  // The workspace holds the routing that places every row; out is written last, by the
  // finalize, once nothing reads x any more: it may replace x in place.
  const TensorView wsv = workspace_view(ws, l.total);
  const TensorView none;
  OPTX_RETURN_IF_ERROR(check_apart("moe_forward", {{"workspace", wsv}, {"out", p.out}},
                                   {{"router", p.router}, {"bias", p.bias},
                                    {"packed_router", p.packed_router ? gemm_detail::packed_bytes(*p.packed_router) : none}}));
  OPTX_RETURN_IF_ERROR(check_apart("moe_forward", {{"workspace", wsv}}, {{"x", p.x}}));
  OPTX_RETURN_IF_ERROR(in_place_or_apart("moe_forward", p.out, "out", p.x, "x"));
  if (l.T == 0) return Status::Ok();
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
  auto at = [&](size_t off) { return static_cast<void*>(base + off); };
  const Workspace scratch{at(l.scratch), l.total - l.scratch - kAlign};
  const DType dt = p.x.dtype;
  const int64_t T = l.T, H = l.H, E = l.E, k = l.k, N = T * k;
  // Router in f32 (DeepSeek computes router logits in f32): bf16 x widened once.
  void* xf = p.x.data;
  if (dt == DType::kBF16) {
    float* w = static_cast<float*>(at(l.xf));
    const uint16_t* xb = static_cast<const uint16_t*>(p.x.data);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (T * H > (1 << 16))
    for (int64_t i = 0; i < T * H; ++i) w[i] = bf16_to_f32(xb[i]);
    xf = w;
  }
  OPTX_RETURN_IF_ERROR(gemm(router_gemm(p, xf, at(l.logits)), scratch));
  OPTX_RETURN_IF_ERROR(moe_gating_topk({.logits = make_view(at(l.logits), DType::kF32, {T, E}), .bias = p.bias,
                                        .topk_ids = make_view(at(l.ids), DType::kI32, {T, k}),
                                        .topk_weights = make_view(at(l.wts), DType::kF32, {T, k}), .score = p.score,
                                        .n_group = p.n_group, .topk_group = p.topk_group, .group_score = p.group_score,
                                        .renormalize = p.renormalize,
                                        .routed_scaling_factor = p.routed_scaling_factor}));
  OPTX_RETURN_IF_ERROR(moe_init_routing({.x = p.x, .topk_ids = make_view(at(l.ids), DType::kI32, {T, k}), .num_experts = E,
                                         .sorted_rows = make_view(at(l.sorted), dt, {N, H}),
                                         .row_map = make_view(at(l.row_map), DType::kI32, {N}),
                                         .inverse = make_view(at(l.inverse), DType::kI32, {N}),
                                         .counts = make_view(at(l.counts), DType::kI64, {E}),
                                         .offsets = make_view(at(l.offsets), DType::kI64, {E})}));
  const TensorView offsets = make_view(at(l.offsets), DType::kI64, {E});
  *static_cast<int64_t*>(at(l.one)) = T;  // the shared experts: one group of all T rows
  const TensorView all = make_view(at(l.one), DType::kI64, {1});
  const size_t parts = p.shared_gate_up ? 2 : 1;
  const std::array<GroupedMatmulSwigluParams, 2> up{
      {{.x = make_view(at(l.sorted), dt, {N, H}), .weights = p.gate_up, .group_offsets = offsets, .out = make_view(at(l.h), dt, {N, l.I})},
       {.x = p.x, .weights = p.shared_gate_up, .group_offsets = all, .out = make_view(at(l.sh_h), dt, {T, l.Is})}}};
  OPTX_RETURN_IF_ERROR(moe_detail::grouped_matmul_swiglu({up.data(), parts}, p.stats, scratch));
  const std::array<GroupedMatmulParams, 2> down{
      {{.x = make_view(at(l.h), dt, {N, l.I}), .weights = p.down, .group_offsets = offsets, .out = make_view(at(l.y), dt, {N, H})},
       {.x = make_view(at(l.sh_h), dt, {T, l.Is}), .weights = p.shared_down, .group_offsets = all,
        .out = make_view(at(l.sh_out), dt, {T, H})}}};
  OPTX_RETURN_IF_ERROR(moe_detail::grouped_matmul({down.data(), parts}, p.stats, scratch));
  const TensorView shared = p.shared_gate_up ? make_view(at(l.sh_out), dt, {T, H}) : TensorView{};
  return moe_finalize_routing({.y = make_view(at(l.y), dt, {N, H}), .inverse = make_view(at(l.inverse), DType::kI32, {N}),
                               .weights = make_view(at(l.wts), DType::kF32, {T, k}), .shared = shared, .out = p.out});
}

}  // namespace optx
