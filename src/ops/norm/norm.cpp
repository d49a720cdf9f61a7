// rms_norm / add_rms_norm: validate -> rows -> dispatch. Rows are independent, so threads
// take contiguous row ranges and results do not depend on the thread count.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/parallel.h"
#include "core/validate.h"
#include "ops/norm/norm_internal.h"

namespace optx {
namespace norm_detail {
namespace {

Status check_matrix(const char* op, const TensorView& t, const char* name, int64_t T, int64_t H, DType dt) {
  // Extents first: a row stride near 2^62 wrapped the last row's offset to before the data.
  OPTX_RETURN_IF_ERROR(check_view(op, name, t, /*need_data=*/false));
  if (t.rank != 2) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".rank=", t.rank, " but must be 2 ([T, H])");
  if (t.sizes[0] != T || t.sizes[1] != H)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".sizes=[", t.sizes[0], ", ", t.sizes[1], "] but must be [T=", T,
                 ", H=", H, "]");
  if (t.dtype != dt)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".dtype=", dtype_name(t.dtype), " but x.dtype=", dtype_name(dt));
  if (t.strides[0] < 0 || t.strides[1] < 0)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides=[", t.strides[0], ", ", t.strides[1], "] must not be negative");
  if (H > 1 && t.strides[1] != 1)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[1]=", t.strides[1], " but must be 1");
  if (T > 1 && t.strides[0] < H)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[0]=", t.strides[0], " but must be >= H=", H);
  if (T > 0 && H > 0 && !t.data) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".data is null");
  return Status::Ok();
}

Status check_common(const char* op, const TensorView& x, const TensorView& w, const TensorView& out, float eps, Rows* r) {
  if (x.rank != 2) return Error(StatusCode::kInvalidArgument, op, ": x.rank=", x.rank, " but must be 2 ([T, H])");
  if (x.dtype != DType::kF32 && x.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": x.dtype=", dtype_name(x.dtype), " but must be f32 or bf16");
  const int64_t T = x.sizes[0], H = x.sizes[1];
  if (T < 0 || H < 0) return Error(StatusCode::kInvalidArgument, op, ": x.sizes=[", T, ", ", H, "] must not be negative");
  if (T > 0 && H == 0) return Error(StatusCode::kInvalidArgument, op, ": x.sizes[1]=0: the hidden size must be >= 1");
  OPTX_RETURN_IF_ERROR(check_matrix(op, x, "x", T, H, x.dtype));
  OPTX_RETURN_IF_ERROR(check_matrix(op, out, "out", T, H, x.dtype));
  OPTX_RETURN_IF_ERROR(in_place_or_apart(op, out, "out", x, "x"));
  OPTX_RETURN_IF_ERROR(check_view(op, "weight", w, /*need_data=*/false));
  if (w.rank != 1 || w.sizes[0] != H)
    return Error(StatusCode::kInvalidArgument, op, ": weight must be [H=", H, "], got rank ", w.rank, " sizes[0]=", w.sizes[0]);
  if (w.dtype != x.dtype)
    return Error(StatusCode::kInvalidArgument, op, ": weight.dtype=", dtype_name(w.dtype), " but x.dtype=", dtype_name(x.dtype));
  if (H > 1 && w.strides[0] != 1)
    return Error(StatusCode::kInvalidArgument, op, ": weight.strides[0]=", w.strides[0], " but must be 1");
  if (H > 0 && !w.data) return Error(StatusCode::kInvalidArgument, op, ": weight.data is null");
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"out", out}}, {{"weight", w}}));  // rows written while weight is still read
  // eps = inf would turn every output into 0 without a word.
  if (!(eps >= 0.0f) || std::isinf(eps)) return Error(StatusCode::kInvalidArgument, op, ": eps=", eps, " must be finite and >= 0");
  r->T = T;
  r->H = H;
  r->bf16 = x.dtype == DType::kBF16;
  r->x = x.data;
  r->ldx = x.strides[0];
  r->weight = w.data;
  r->out = out.data;
  r->ldo = out.strides[0];
  r->eps = eps;
  r->stream_out = T * H * int64_t(dtype_size(x.dtype)) >= simd::kStreamMinBytes;
  return Status::Ok();
}

template <const Kernels& (*K)(), bool kAdd>
Status run_rows(const Rows& r) {
  const auto rows = kAdd ? K().add_rms_norm_rows : K().rms_norm_rows;
  // Contiguous row ranges: each thread pipelines its rows (see norm_kernels_inl.h).
  parallel_ranges(r.T, [&](int64_t t0, int64_t t1) { rows(r, t0, t1); });
  return Status::Ok();
}

std::string rms_selected() { return rms_norm_registry().selected_name(); }
std::string add_selected() { return add_rms_norm_registry().selected_name(); }
[[maybe_unused]] const bool registered = [] {
  dispatch::register_op("rms_norm", rms_selected);
  dispatch::register_op("add_rms_norm", add_selected);
  return true;
}();

template <class P>
Status run(const dispatch::Registry<NormFn>& reg, const P& p) {
  Rows r;
  OPTX_RETURN_IF_ERROR(to_rows(p, &r));
  const dispatch::Impl<NormFn>* impl = nullptr;
  OPTX_RETURN_IF_ERROR(reg.select_to_run(&impl));
  return impl->fn(r);
}

}  // namespace

const dispatch::Registry<NormFn>& rms_norm_registry() {
  static const dispatch::Registry<NormFn> r("rms_norm", {
                                                            {"avx512_bf16", Isa::kAvx512Bf16, run_rows<kernels_avx512_bf16, false>},
                                                            {"avx512", Isa::kAvx512, run_rows<kernels_avx512, false>},
                                                            {"avx2", Isa::kAvx2, run_rows<kernels_avx2, false>},
                                                            {"scalar", Isa::kScalar, run_rows<kernels_scalar, false>},
                                                            {"reference", Isa::kScalar, rms_norm_reference},
                                                        });
  return r;
}
const dispatch::Registry<NormFn>& add_rms_norm_registry() {
  static const dispatch::Registry<NormFn> r("add_rms_norm", {
                                                                {"avx512_bf16", Isa::kAvx512Bf16, run_rows<kernels_avx512_bf16, true>},
                                                                {"avx512", Isa::kAvx512, run_rows<kernels_avx512, true>},
                                                                {"avx2", Isa::kAvx2, run_rows<kernels_avx2, true>},
                                                                {"scalar", Isa::kScalar, run_rows<kernels_scalar, true>},
                                                                {"reference", Isa::kScalar, add_rms_norm_reference},
                                                            });
  return r;
}

Status to_rows(const RmsNormParams& p, Rows* r) { return check_common("rms_norm", p.x, p.weight, p.out, p.eps, r); }

Status to_rows(const AddRmsNormParams& p, Rows* r) {
  constexpr const char* op = "add_rms_norm";
  OPTX_RETURN_IF_ERROR(check_common(op, p.x, p.weight, p.out, p.eps, r));
  OPTX_RETURN_IF_ERROR(check_matrix(op, p.residual, "residual", r->T, r->H, p.x.dtype));
  if (views_overlap(p.residual, p.out))
    return Error(StatusCode::kInvalidArgument, op, ": out overlaps residual; residual must keep the sum (out may alias x)");
  OPTX_RETURN_IF_ERROR(in_place_or_apart(op, p.residual, "residual", p.x, "x"));
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"residual", p.residual}}, {{"weight", p.weight}}));
  r->residual = p.residual.data;
  r->ldr = p.residual.strides[0];
  return Status::Ok();
}

}  // namespace norm_detail

size_t rms_norm_workspace_size(const RmsNormParams&) { return 0; }
size_t add_rms_norm_workspace_size(const AddRmsNormParams&) { return 0; }
Status rms_norm(const RmsNormParams& p, Workspace) { return norm_detail::run(norm_detail::rms_norm_registry(), p); }
Status add_rms_norm(const AddRmsNormParams& p, Workspace) {
  return norm_detail::run(norm_detail::add_rms_norm_registry(), p);
}

}  // namespace optx
