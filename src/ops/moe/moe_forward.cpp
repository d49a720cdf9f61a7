// moe_forward: one DeepSeek MoE layer from the family's ops, all buffers in one workspace:
//   logits = x . router^T (f32)        gating -> ids, weights
//   routing -> expert-sorted rows      grouped gate/up + SwiGLU -> h      grouped down -> y
//   shared experts: dense SwiGLU MLP   finalize: out = sum_j w * y + shared
#include <algorithm>
#include <cstring>

#include "optx/moe.h"

namespace optx {
namespace {

struct Layout {
  int64_t T = 0, H = 0, E = 0, k = 0, I = 0, Is = 0;
  size_t xf, logits, ids, wts, sorted, row_map, inverse, counts, offsets, one, h, y, sh_h, sh_out, scratch, total;
};

Layout layout_of(const MoeForwardParams& p) {
  Layout l;
  l.T = p.x.sizes[0], l.H = p.x.sizes[1], l.E = p.router.sizes[0], l.k = p.top_k;
  l.I = (*p.gate_up)[0].n / 2;
  l.Is = p.shared_gate_up ? (*p.shared_gate_up)[0].n / 2 : 0;
  const size_t es = dtype_size(p.x.dtype), N = size_t(l.T * l.k);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align_up(off + bytes);
    return at;
  };
  l.xf = take(size_t(l.T * l.H) * 4);
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
  size_t s = grouped_matmul_swiglu_workspace_size({.x = xs, .weights = p.gate_up});
  s = std::max(s, grouped_matmul_workspace_size({.x = hs, .weights = p.down, .out = make_view(nullptr, dt, {int64_t(N), l.H})}));
  if (p.shared_gate_up) {
    s = std::max(s, grouped_matmul_swiglu_workspace_size({.x = make_view(nullptr, dt, {l.T, l.H}), .weights = p.shared_gate_up}));
    s = std::max(s, grouped_matmul_workspace_size({.x = make_view(nullptr, dt, {l.T, l.Is}), .weights = p.shared_down,
                                                   .out = make_view(nullptr, dt, {l.T, l.H})}));
  }
  GemmParams router{.a = make_view(reinterpret_cast<void*>(64), DType::kF32, {l.T, l.H}), .b = p.router,
                    .c = make_view(reinterpret_cast<void*>(64), DType::kF32, {l.T, l.E})};
  s = std::max(s, gemm_workspace_size(router));
  l.scratch = take(s + kAlign);
  l.total = off + kAlign;
  return l;
}

Status validate(const MoeForwardParams& p) {
  constexpr const char* op = "moe_forward";
  if (p.x.rank != 2 || (p.x.dtype != DType::kF32 && p.x.dtype != DType::kBF16) || !p.x.is_contiguous())
    return Error(StatusCode::kInvalidArgument, op, ": x must be contiguous f32 | bf16 [T, H]");
  if (p.router.rank != 2 || p.router.dtype != DType::kF32 || p.router.sizes[1] != p.x.sizes[1] || !p.router.data)
    return Error(StatusCode::kInvalidArgument, op, ": router must be f32 [E, H=", p.x.sizes[1], "]");
  const int64_t E = p.router.sizes[0];
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
  // Router in f32 (DeepSeek computes router logits in f32).
  float* xf = static_cast<float*>(at(l.xf));
  for (int64_t i = 0; i < T * H; ++i)
    xf[i] = dt == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(p.x.data)[i]) : static_cast<const float*>(p.x.data)[i];
  OPTX_RETURN_IF_ERROR(gemm({.a = make_view(xf, DType::kF32, {T, H}), .b = p.router, .c = make_view(at(l.logits), DType::kF32, {T, E})},
                            scratch));
  OPTX_RETURN_IF_ERROR(moe_gating_topk({.logits = make_view(at(l.logits), DType::kF32, {T, E}), .bias = p.bias,
                                        .topk_ids = make_view(at(l.ids), DType::kI32, {T, k}),
                                        .topk_weights = make_view(at(l.wts), DType::kF32, {T, k}), .score = p.score,
                                        .n_group = p.n_group, .topk_group = p.topk_group, .renormalize = p.renormalize,
                                        .routed_scaling_factor = p.routed_scaling_factor}));
  OPTX_RETURN_IF_ERROR(moe_init_routing({.x = p.x, .topk_ids = make_view(at(l.ids), DType::kI32, {T, k}), .num_experts = E,
                                         .sorted_rows = make_view(at(l.sorted), dt, {N, H}),
                                         .row_map = make_view(at(l.row_map), DType::kI32, {N}),
                                         .inverse = make_view(at(l.inverse), DType::kI32, {N}),
                                         .counts = make_view(at(l.counts), DType::kI64, {E}),
                                         .offsets = make_view(at(l.offsets), DType::kI64, {E})}));
  const TensorView offsets = make_view(at(l.offsets), DType::kI64, {E});
  OPTX_RETURN_IF_ERROR(grouped_matmul_swiglu({.x = make_view(at(l.sorted), dt, {N, H}), .weights = p.gate_up,
                                              .group_offsets = offsets, .out = make_view(at(l.h), dt, {N, l.I}), .stats = p.stats},
                                             scratch));
  OPTX_RETURN_IF_ERROR(grouped_matmul({.x = make_view(at(l.h), dt, {N, l.I}), .weights = p.down, .group_offsets = offsets,
                                       .out = make_view(at(l.y), dt, {N, H}), .stats = p.stats},
                                      scratch));
  TensorView shared;
  if (p.shared_gate_up) {
    *static_cast<int64_t*>(at(l.one)) = T;  // one group: all T rows
    const TensorView all = make_view(at(l.one), DType::kI64, {1});
    OPTX_RETURN_IF_ERROR(grouped_matmul_swiglu({.x = p.x, .weights = p.shared_gate_up, .group_offsets = all,
                                                .out = make_view(at(l.sh_h), dt, {T, l.Is}), .stats = p.stats},
                                               scratch));
    OPTX_RETURN_IF_ERROR(grouped_matmul({.x = make_view(at(l.sh_h), dt, {T, l.Is}), .weights = p.shared_down, .group_offsets = all,
                                         .out = make_view(at(l.sh_out), dt, {T, H}), .stats = p.stats},
                                        scratch));
    shared = make_view(at(l.sh_out), dt, {T, H});
  }
  return moe_finalize_routing({.y = make_view(at(l.y), dt, {N, H}), .inverse = make_view(at(l.inverse), DType::kI32, {N}),
                               .weights = make_view(at(l.wts), DType::kF32, {T, k}), .shared = shared, .out = p.out});
}

}  // namespace optx
