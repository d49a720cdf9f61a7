// rope: validate (including every position) -> dispatch; tokens split across threads.
#include <omp.h>

#include <string>

#include "core/validate.h"
#include "ops/rope/rope_internal.h"

namespace optx {
namespace rope_detail {
namespace {

constexpr const char* kOp = "rope";

Status head_set(const TensorView& v, const char* name, int64_t T, DType dt, int64_t rotary_dim, int64_t offset,
                HeadSet* hs) {
  if (v.empty()) return Status::Ok();
  OPTX_RETURN_IF_ERROR(check_view(kOp, name, v));
  if (v.rank != 3) return Error(StatusCode::kInvalidArgument, kOp, ": ", name, ".rank=", v.rank, " but must be 3 ([T, H, D])");
  if (v.sizes[0] != T) return Error(StatusCode::kInvalidArgument, kOp, ": ", name, ".sizes[0]=", v.sizes[0], " but positions has T=", T);
  if (v.dtype != dt)
    return Error(StatusCode::kInvalidArgument, kOp, ": ", name, ".dtype=", dtype_name(v.dtype), " but q.dtype=", dtype_name(dt));
  if (v.sizes[2] > 1 && v.strides[2] != 1)
    return Error(StatusCode::kInvalidArgument, kOp, ": ", name, ".strides[2]=", v.strides[2], " but must be 1");
  // Rotated in place by several threads: no element may be shared.
  OPTX_RETURN_IF_ERROR(check_disjoint(kOp, name, v));
  if (offset > v.sizes[2] - rotary_dim)  // not offset + rotary_dim: it wraps for offsets near INT64_MAX
    return Error(StatusCode::kInvalidArgument, kOp, ": rotary_offset=", offset, " + rotary_dim=", rotary_dim, " exceeds ", name,
                 ".sizes[2]=", v.sizes[2]);
  hs->x = v.data;
  hs->heads = v.sizes[1];
  hs->st = v.strides[0];
  hs->sh = v.strides[1];
  return Status::Ok();
}

template <const Kernels& (*K)()>
Status run(const Args& a) {
  const auto token = K().token;
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(num_threads(), a.T)));
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t t = 0; t < a.T; ++t) token(a, t);
  return Status::Ok();
}

std::string selected() { return registry().selected_name(); }
[[maybe_unused]] const bool registered = [] {
  dispatch::register_op(kOp, selected);
  return true;
}();

}  // namespace

Status check_positions(const char* op, const TensorView& positions, int64_t T, int64_t P) {
  OPTX_RETURN_IF_ERROR(check_view(op, "positions", positions));
  if (positions.rank != 1 || positions.sizes[0] != T)
    return Error(StatusCode::kInvalidArgument, op, ": positions must be [T=", T, "], got rank ", positions.rank,
                 " sizes[0]=", positions.sizes[0]);
  if (positions.dtype != DType::kI32 && positions.dtype != DType::kI64)
    return Error(StatusCode::kInvalidArgument, op, ": positions.dtype=", dtype_name(positions.dtype), " but must be i32 or i64");
  if (T > 1 && positions.strides[0] != 1)
    return Error(StatusCode::kInvalidArgument, op, ": positions.strides[0]=", positions.strides[0], " but must be 1");
  if (T > 0 && !positions.data) return Error(StatusCode::kInvalidArgument, op, ": positions.data is null");
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = positions.dtype == DType::kI64 ? static_cast<const int64_t*>(positions.data)[t]
                                                     : static_cast<const int32_t*>(positions.data)[t];
    if (p < 0 || p >= P)
      return Error(StatusCode::kInvalidArgument, op, ": positions[", t, "]=", p, " is outside the cos/sin table [0, ", P, ")");
  }
  return Status::Ok();
}

Status table_args(const char* op, const TensorView& positions, const TensorView& cos, const TensorView& sin,
                  int64_t rd, RopeStyle style, int64_t T, Args* a) {
  if (rd < 2 || rd % 2 || rd > kMaxRotaryDim)
    return Error(StatusCode::kInvalidArgument, op, ": rotary_dim=", rd, " must be even and in [2, ", kMaxRotaryDim, "]");
  if (style != RopeStyle::kHalf && style != RopeStyle::kInterleaved && style != RopeStyle::kInterleavedToHalf)
    return Error(StatusCode::kInvalidArgument, op, ": style=", int(style), " is not a RopeStyle");
  for (const auto* t : {&cos, &sin}) {
    const char* name = t == &cos ? "cos" : "sin";
    OPTX_RETURN_IF_ERROR(check_view(op, name, *t));
    if (t->rank != 2 || t->sizes[1] != rd / 2 || t->dtype != DType::kF32)
      return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be f32 [P, rotary_dim/2=", rd / 2, "], got rank ", t->rank,
                   " sizes[1]=", t->rank > 1 ? t->sizes[1] : -1, " dtype ", dtype_name(t->dtype));
    if (t->strides[1] != 1 || t->strides[0] < rd / 2)
      return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides=[", t->strides[0], ", ", t->strides[1],
                   "] but rows must be contiguous (strides [>= ", rd / 2, ", 1])");
    if (!t->data) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".data is null");
  }
  if (cos.sizes[0] != sin.sizes[0] || cos.strides[0] != sin.strides[0])
    return Error(StatusCode::kInvalidArgument, op, ": cos [", cos.sizes[0], "] rows, stride ", cos.strides[0], " and sin [",
                 sin.sizes[0], "] rows, stride ", sin.strides[0], " must have the same shape and strides");
  OPTX_RETURN_IF_ERROR(check_positions(op, positions, T, cos.sizes[0]));
  a->T = T;
  a->positions = positions.data;
  a->pos64 = positions.dtype == DType::kI64;
  a->cos = static_cast<const float*>(cos.data);
  a->sin = static_cast<const float*>(sin.data);
  a->cs_stride = cos.strides[0];
  a->rotary_dim = rd;
  a->style = style;
  return Status::Ok();
}

Status to_args(const RopeParams& p, Args* a) {
  const TensorView& first = p.q.empty() ? p.k : p.q;
  const char* first_name = p.q.empty() ? "k" : "q";
  if (first.empty()) return Error(StatusCode::kInvalidArgument, kOp, ": q and k are both empty");
  if (first.dtype != DType::kF32 && first.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, kOp, ": ", first_name, ".dtype=", dtype_name(first.dtype), " but must be f32 or bf16");
  OPTX_RETURN_IF_ERROR(check_view(kOp, first_name, first));
  // Checked before rotary_dim = 0 resolves to the head size: a [T, D] q would otherwise be
  // reported as rotary_dim=0 being out of range.
  if (first.rank != 3)
    return Error(StatusCode::kInvalidArgument, kOp, ": ", first_name, ".rank=", first.rank, " but must be 3 ([T, heads, head_dim])");
  const int64_t T = first.sizes[0];
  const int64_t D = first.sizes[2];
  const int64_t rd = p.rotary_dim == 0 ? D : p.rotary_dim;
  if (p.rotary_offset < 0) return Error(StatusCode::kInvalidArgument, kOp, ": rotary_offset=", p.rotary_offset, " is negative");
  OPTX_RETURN_IF_ERROR(table_args(kOp, p.positions, p.cos, p.sin, rd, p.style, T, a));
  a->bf16 = first.dtype == DType::kBF16;
  OPTX_RETURN_IF_ERROR(head_set(p.q, "q", T, first.dtype, rd, p.rotary_offset, &a->q));
  OPTX_RETURN_IF_ERROR(head_set(p.k, "k", T, first.dtype, rd, p.rotary_offset, &a->k));
  // q and k are rotated in place by several threads; positions are read after rows are written.
  OPTX_RETURN_IF_ERROR(check_apart(kOp, {{"q", p.q}, {"k", p.k}}, {{"positions", p.positions}, {"cos", p.cos}, {"sin", p.sin}}));
  a->rotary_offset = p.rotary_offset;
  return Status::Ok();
}

const dispatch::Registry<RopeFn>& registry() {
  static const dispatch::Registry<RopeFn> r(kOp, {
                                                     {"avx512_bf16", Isa::kAvx512Bf16, run<kernels_avx512_bf16>},
                                                     {"avx512", Isa::kAvx512, run<kernels_avx512>},
                                                     {"avx2", Isa::kAvx2, run<kernels_avx2>},
                                                     {"scalar", Isa::kScalar, run<kernels_scalar>},
                                                     {"reference", Isa::kScalar, rope_reference},
                                                 });
  return r;
}

}  // namespace rope_detail

size_t rope_workspace_size(const RopeParams&) { return 0; }

Status rope(const RopeParams& p, Workspace) {
  rope_detail::Args a;
  OPTX_RETURN_IF_ERROR(rope_detail::to_args(p, &a));
  const dispatch::Impl<rope_detail::RopeFn>* impl = nullptr;
  OPTX_RETURN_IF_ERROR(rope_detail::registry().select_to_run(&impl));
  return impl->fn(a);
}

}  // namespace optx
