// moe_forward: one DeepSeek MoE layer from the family's ops, all buffers in one workspace:
//   logits = x . router^T (f32)        gating -> ids, weights
//   routing -> expert-sorted rows
//   gate/up + SwiGLU: routed experts on the sorted rows and the shared experts on x, one
//   work queue -> h, sh_h;  down: the same for both -> y, sh_out
//   finalize: out = sum_j w * y + sh_out
#include <algorithm>
#include <array>

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

Status validate(const MoeForwardParams& p) {
  constexpr const char* op = "moe_forward";
  if (p.x.rank != 2 || (p.x.dtype != DType::kF32 && p.x.dtype != DType::kBF16) || !p.x.is_contiguous())
    return Error(StatusCode::kInvalidArgument, op, ": x must be contiguous f32 | bf16 [T, H]");
  if (p.packed_router) {
    if (!p.router.empty()) return Error(StatusCode::kInvalidArgument, op, ": both router and packed_router given; pass one");
    if (p.packed_router->k != p.x.sizes[1])
      return Error(StatusCode::kInvalidArgument, op, ": packed_router has K=", p.packed_router->k, " but x has H=", p.x.sizes[1]);
  } else if (p.router.rank != 2 || p.router.dtype != DType::kF32 || p.router.sizes[1] != p.x.sizes[1] || !p.router.data) {
    return Error(StatusCode::kInvalidArgument, op, ": router must be f32 [E, H=", p.x.sizes[1], "]");
  }
  const int64_t E = num_experts(p);
  if (!p.gate_up || !p.down || p.gate_up->count() != E || p.down->count() != E)
    return Error(StatusCode::kInvalidArgument, op, ": gate_up and down must hold E=", E, " packed expert matrices");
  if ((*p.gate_up)[0].k != p.x.sizes[1] || (*p.down)[0].n != p.x.sizes[1] || (*p.down)[0].k * 2 != (*p.gate_up)[0].n)
    return Error(StatusCode::kInvalidArgument, op, ": expert shapes must be gate_up [2I, H] and down [H, I]");
  if ((p.shared_gate_up == nullptr) != (p.shared_down == nullptr))
    return Error(StatusCode::kInvalidArgument, op, ": shared_gate_up and shared_down come together");
  if (p.shared_gate_up && ((*p.shared_gate_up)[0].k != p.x.sizes[1] || (*p.shared_down)[0].n != p.x.sizes[1] ||
                           (*p.shared_down)[0].k * 2 != (*p.shared_gate_up)[0].n))
    return Error(StatusCode::kInvalidArgument, op, ": shared expert shapes must be [2 I_s, H] and [H, I_s]");
  if (p.out.rank != 2 || p.out.sizes[0] != p.x.sizes[0] || p.out.sizes[1] != p.x.sizes[1] || p.out.dtype != p.x.dtype ||
      !p.out.is_contiguous())
    return Error(StatusCode::kInvalidArgument, op, ": out must be contiguous like x");
  return Status::Ok();
}

}  // namespace

size_t moe_forward_workspace_size(const MoeForwardParams& p) { return validate(p).ok() ? layout_of(p).total : 0; }

Status moe_forward(const MoeForwardParams& p, Workspace ws) {
  OPTX_RETURN_IF_ERROR(validate(p));
  const Layout l = layout_of(p);
  if (ws.bytes < l.total || !ws.data)
    return Error(StatusCode::kWorkspaceTooSmall, "moe_forward: workspace.bytes=", ws.bytes, " but moe_forward_workspace_size()=", l.total);
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
