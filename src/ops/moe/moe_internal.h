// Shared by the MoE family's sources: argument checks, and the grouped GEMMs over several
// weight sets in one schedule (moe_forward runs its routed and shared experts together).
#pragma once

#include <span>

#include "optx/moe.h"

namespace optx::moe_detail {

// Experts per router row: the routers keep a row's scores on the stack.
inline constexpr int64_t kMaxExperts = 1024;

// The routers' per-expert scores and top-k from an AVX-512 unit (moe_gating_avx512.cpp);
// used when the active ISA reaches AVX-512, else the generic scalar loops in moe.cpp.
inline bool router_avx512() { return active_isa() >= Isa::kAvx512; }
void softmax_scores_avx512(const float* logit, int64_t E, float* score);
void sigmoid_scores_avx512(const float* logit, int64_t E, float* score);
void topk_avx512(const float* v, const bool* eligible, int64_t n, int64_t k, int32_t* out);  // n <= kMaxExperts

inline float load_f(const TensorView& t, int64_t i) {
  return t.dtype == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]) : static_cast<const float*>(t.data)[i];
}

inline Status check_2d(const char* op, const TensorView& t, const char* name, int64_t rows, int64_t cols, bool float_types) {
  if (t.rank != 2 || (rows >= 0 && t.sizes[0] != rows) || (cols >= 0 && t.sizes[1] != cols))
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be [", rows, ", ", cols, "], got rank ", t.rank, " [",
                 t.rank > 0 ? t.sizes[0] : -1, ", ", t.rank > 1 ? t.sizes[1] : -1, "]");
  if (float_types && t.dtype != DType::kF32 && t.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".dtype=", dtype_name(t.dtype), " but must be f32 or bf16");
  if (!t.is_contiguous()) return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be contiguous");
  if (t.numel() > 0 && !t.data) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".data is null");
  return Status::Ok();
}

inline Status check_1d(const char* op, const TensorView& t, const char* name, int64_t n, DType dt) {
  if (t.rank != 1 || t.sizes[0] != n || t.dtype != dt || (n > 1 && t.strides[0] != 1) || (n > 0 && !t.data))
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be contiguous ", dtype_name(dt), " [", n, "]");
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

}  // namespace optx::moe_detail
