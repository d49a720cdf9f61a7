// Shared by the MoE family's sources: argument checks, and the grouped GEMMs over several
// weight sets in one schedule (moe_forward runs its routed and shared experts together).
#pragma once

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/validate.h"
#include "optx/moe.h"

namespace optx::moe_detail {

// Experts per router row: the routers keep a row's scores on the stack.
inline constexpr int64_t kMaxExperts = 1024;
// Top-k slots per token: the generic top-k keeps them on the stack.
inline constexpr int64_t kMaxTopK = 32;
// Hidden size finalize accumulates on the stack.
inline constexpr int64_t kMaxHidden = 16384;

// The gating implementations this host runs under OPTX_MAX_ISA, best first (both gating
// ops register the same list): what tests and `optx verify` force in turn.
std::vector<std::string> gating_impl_names();

// The gating semantics in double, sorting instead of selecting (arguments checked).
Status gating_reference(const MoeGatingParams& p);

// A vector unit's router steps (moe_gating_avx512.cpp, moe_gating_avx2.cpp): the gating
// registry's "avx512" / "avx2" entries; "scalar" runs moe.cpp's loops, "reference"
// moe_ref.cpp's. topk takes finite values only (it marks taken and ineligible lanes -inf,
// which must stay below every candidate): the routers clamp what they select on, with the
// same clamp in every implementation (moe.cpp's clamp_finite).
struct GatingKernels {
  void (*load_logits)(const void* row, DType dt, int64_t E, float* logit);             // clamped
  void (*selection_scores)(const float* score, const float* bias, int64_t E, float* sel);  // clamped score + bias
  void (*softmax_scores)(const float* logit, int64_t E, float* score);
  void (*sigmoid_scores)(const float* logit, int64_t E, float* score);
  void (*topk)(const float* v, const bool* eligible, int64_t n, int64_t k, int32_t* out);  // n <= kMaxExperts
  // Optional: out[g] = the max of group g's selection scores sel[g gs, (g + 1) gs), gs =
  // E / n_group, or with top2 the sum of its two largest (one value twice if it occurs
  // twice) in double, as moe.cpp's loop.
  void (*group_scores)(const float* sel, int64_t E, int64_t n_group, bool top2, double* out) = nullptr;
};
const GatingKernels& gating_kernels_avx512();
const GatingKernels& gating_kernels_avx2();

inline float load_f(const TensorView& t, int64_t i) {
  return t.dtype == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]) : static_cast<const float*>(t.data)[i];
}

// "f32 [2, 4] strides [8, 1]": what a view was, for the errors.
inline std::string describe(const TensorView& t) {
  std::string s = std::string(dtype_name(t.dtype)) + " [";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.sizes[d]);
  s += "] strides [";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.strides[d]);
  return s + "]";
}

// A contiguous [rows, cols] view (-1: any size), f32 | bf16 when float_types.
inline Status check_2d(const char* op, const TensorView& t, const char* name, int64_t rows, int64_t cols, bool float_types,
                       bool need_data = true) {
  OPTX_RETURN_IF_ERROR(check_view(op, name, t, need_data));
  if (t.rank != 2 || (rows >= 0 && t.sizes[0] != rows) || (cols >= 0 && t.sizes[1] != cols))
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be [", rows >= 0 ? std::to_string(rows) : "*", ", ",
                 cols >= 0 ? std::to_string(cols) : "*", "], got rank ", t.rank, " ", describe(t));
  if (float_types && t.dtype != DType::kF32 && t.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".dtype=", dtype_name(t.dtype), " but must be f32 or bf16");
  if (!t.is_contiguous()) return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be contiguous, got ", describe(t));
  return Status::Ok();
}

// The router's options over E experts, with k picks (k_name: the argument that gives k):
// the gating ops and moe_forward check the same rules.
inline Status check_router(const char* op, int64_t E, MoeScore score, MoeGroupScore group_score, float scaling, int64_t n_group,
                           int64_t topk_group, int64_t k, const char* k_name) {
  if (score != MoeScore::kSoftmax && score != MoeScore::kSigmoid && score != MoeScore::kSqrtSoftplus)
    return Error(StatusCode::kInvalidArgument, op, ": score=", int(score), " is not a MoeScore (0 softmax, 1 sigmoid, 2 sqrt-softplus)");
  if (group_score != MoeGroupScore::kMax && group_score != MoeGroupScore::kTop2Sum)
    return Error(StatusCode::kInvalidArgument, op, ": group_score=", int(group_score), " is not a MoeGroupScore (0 max, 1 top-2 sum)");
  if (!std::isfinite(scaling))
    return Error(StatusCode::kInvalidArgument, op, ": routed_scaling_factor=", scaling, " must be finite");
  if (n_group < 1 || E % n_group || topk_group < 1 || topk_group > n_group)
    return Error(StatusCode::kInvalidArgument, op, ": n_group=", n_group, " must divide E=", E, " and topk_group=", topk_group,
                 " be in [1, n_group]");
  const int64_t eligible_max = E / n_group * topk_group;
  if (k < 1 || k > kMaxTopK || k > eligible_max)
    return Error(StatusCode::kInvalidArgument, op, ": ", k_name, "=", k, " must be in [1, min(", kMaxTopK,
                 ", experts in the kept groups = ", eligible_max, ")]");
  return Status::Ok();
}

// Weights a gemm can take with activations of x_dtype: f32 x with f32, bf16 or int8
// weights, bf16 x with bf16 or int8 ones. Checked by the MoE ops so that the error names
// them and the matrix set rather than the inner gemm.
inline Status check_weights_dtype(const char* op, const char* name, DType x_dtype, const PackedWeights& w) {
  for (int64_t g = 0; g < w.count(); ++g)
    if (x_dtype == DType::kBF16 && w[g].dtype == DType::kF32)
      return Error(StatusCode::kInvalidArgument, op, ": ", name, "[", g, "].dtype=f32 but x.dtype=bf16; bf16 activations take bf16 or i8 weights");
  return Status::Ok();
}

// A contiguous [n] view of dtype dt (n = -1: any length).
inline Status check_1d(const char* op, const TensorView& t, const char* name, int64_t n, DType dt, bool need_data = true) {
  OPTX_RETURN_IF_ERROR(check_view(op, name, t, need_data));
  if (t.rank != 1 || (n >= 0 && t.sizes[0] != n) || t.dtype != dt || !t.is_contiguous())
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be contiguous ", dtype_name(dt), " [",
                 n >= 0 ? std::to_string(n) : "*", "], got rank ", t.rank, " ", describe(t));
  return Status::Ok();
}

// Several grouped GEMMs (each as its single-call params) as one work list on one queue:
// no barrier between them, and the longest items of all start first. stats: the
// schedule's accounting (the parts' own stats pointers are ignored). Workspace sizes
// follow the single-call functions.
size_t grouped_matmul_workspace_size(std::span<const GroupedMatmulParams> parts);
Status grouped_matmul(std::span<const GroupedMatmulParams> parts, ScheduleStats* stats, Workspace ws);
size_t grouped_matmul_swiglu_workspace_size(std::span<const GroupedMatmulSwigluParams> parts);
Status grouped_matmul_swiglu(std::span<const GroupedMatmulSwigluParams> parts, ScheduleStats* stats, Workspace ws);

// What the single-call size queries refuse (grouped_matmul / grouped_matmul_swiglu /
// moe_forward_workspace_size give 0 exactly when these fail, with need_data = false): the
// C API's message for a refused query.
Status validate_grouped_matmul(const GroupedMatmulParams& p, bool need_data);
Status validate_grouped_matmul_swiglu(const GroupedMatmulSwigluParams& p, bool need_data);
Status validate_moe_forward(const MoeForwardParams& p, bool need_data);

}  // namespace optx::moe_detail
