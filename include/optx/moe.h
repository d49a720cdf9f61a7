// optx/moe.h — Mixture-of-Experts: gating, routing, grouped matmul (+ SwiGLU), finalize,
// and one call for a whole DeepSeek MoE layer.
#pragma once

#include <cstdint>
#include <vector>

#include "optx/gemm.h"
#include "optx/runtime.h"
#include "optx/status.h"
#include "optx/tensor.h"

namespace optx {

enum class MoeScore : uint8_t { kSoftmax, kSigmoid, kSqrtSoftplus };
enum class MoeGroupScore : uint8_t { kMax, kTop2Sum };

// Router: scores = score_fn(logits) (softmax over experts, or elementwise); selection on
// scores + bias (bias only steers the choice); with n_group > 1, only the topk_group
// groups with the best group score (max, or sum of the top two, of score + bias) are
// eligible; weights = the selected scores, renormalised to sum 1 if asked, times
// routed_scaling_factor. Ties break to the lower expert id.
// topk_then_softmax (softmax scoring only): pick on the logits, softmax over the k picks.
// Non-finite logits and score + bias are clamped to the finite range (NaN to the lowest),
// so NaN counts as -inf and the ids are always k distinct eligible experts.
struct MoeGatingParams {
  TensorView logits;     // [T, E] f32 | bf16
  TensorView bias;       // [E] f32 correction bias; may be empty
  TensorView topk_ids;   // [T, k] i32 (output)
  TensorView topk_weights;  // [T, k] f32 (output)
  MoeScore score = MoeScore::kSoftmax;
  int64_t n_group = 1, topk_group = 1;
  MoeGroupScore group_score = MoeGroupScore::kMax;
  bool renormalize = false;
  bool topk_then_softmax = false;
  float routed_scaling_factor = 1.0f;
};
Status moe_gating_topk(const MoeGatingParams& p, Workspace ws = {});

// The Mixtral / Qwen-MoE router (ops-transformer's moe_gating_top_k_softmax): softmax over
// the experts, the k largest (ties to the lower id), optionally renormalised to sum 1; or
// with topk_then_softmax, the k largest logits and a softmax over those k alone.
struct MoeGatingSoftmaxParams {
  TensorView logits;        // [T, E] f32 | bf16
  TensorView topk_ids;      // [T, k] i32 (output)
  TensorView topk_weights;  // [T, k] f32 (output)
  bool renormalize = false;
  bool topk_then_softmax = false;
};
Status moe_gating_topk_softmax(const MoeGatingSoftmaxParams& p, Workspace ws = {});

// Routing: (token, slot) pairs sorted by expert, stable (token order within an expert).
//   sorted_rows[i]  = x[row_map[i] / k]            (gathered activations, expert order)
//   row_map[i]      = t * k + j of sorted row i
//   inverse[t*k+j]  = i, or -1 when expert ids[t, j] is outside [expert_begin, expert_end)
//   counts[e]       = rows of expert e; offsets[e] = sum of counts[0..e] (end offsets)
// Rows of experts outside the range are dropped (expert parallelism: other ranks own them).
// With sorted_rows of dtype i8 the gathered rows are quantised per row (dynamic per-token
// int8: scale = max|row| / 127, codes rne(row * 127 / max|row|) in [-127, 127]) and the
// scales go to row_scales; otherwise row_scales must be empty.
struct MoeRoutingParams {
  TensorView x;            // [T, H] f32 | bf16
  TensorView topk_ids;     // [T, k] i32
  int64_t num_experts = 0;
  int64_t expert_begin = 0, expert_end = -1;  // -1: num_experts
  TensorView sorted_rows;  // [T*k, H], dtype of x or i8 (rows past the kept count untouched)
  TensorView row_scales;   // [T*k] f32 when sorted_rows is i8
  TensorView row_map;      // [T*k] i32
  TensorView inverse;      // [T*k] i32
  TensorView counts;       // [E] i64
  TensorView offsets;      // [E] i64 (cumulative end offsets)
};
Status moe_init_routing(const MoeRoutingParams& p, Workspace ws = {});

// Per-expert end offsets from expert ids sorted ascending: offsets[e] = #ids <= e.
Status moe_compute_expert_tokens(const TensorView& sorted_ids /*[N] i32*/, const TensorView& offsets /*[E] i64*/);

// Optional schedule accounting for the grouped GEMMs, accumulated over calls: wall time
// and per-thread busy time (the bench reports the imbalance, busy / wall per thread). In
// the split schedule (few groups) each GEMM runs on all threads at once and counts as
// busy on each; in the queue schedule each thread's own items are timed.
struct ScheduleStats {
  double wall_s = 0;
  std::vector<double> busy_s;  // [threads]
};

// Grouped GEMM: rows of x sorted by group; group g's rows [off[g-1], off[g]) times
// weights[g]^T (N x K packed). Rows past the last offset are left untouched.
struct GroupedMatmulParams {
  TensorView x;                  // [M, K] f32 | bf16
  const PackedWeights* weights = nullptr;  // E matrices [N, K]
  TensorView group_offsets;      // [E] i64 cumulative end offsets (or counts, see below)
  bool offsets_are_counts = false;
  TensorView out;                // [M, N] f32 | bf16
  ScheduleStats* stats = nullptr;
};
// Workspace sizes of the grouped GEMMs and moe_forward grow with the thread count: query
// at the num_threads() the call will run with (gemm.h); more threads' size serves fewer.
size_t grouped_matmul_workspace_size(const GroupedMatmulParams& p);
Status grouped_matmul(const GroupedMatmulParams& p, Workspace ws);

// Grouped gate/up + SwiGLU: weights[g] is [2I, K] = [gate; up]; out = silu(gate) * up.
// With I a multiple of 64 SwiGLU is applied to the two f32 tiles in registers before the
// store (GemmActivation::kSwiglu); otherwise through an f32 buffer, per work item.
// out of dtype i8: per-token dynamic int8 (scale = max|row| / 127 into out_scales, codes
// rne(v * 127 / max|row|)), e.g. as the input of a w8a8 down projection.
struct GroupedMatmulSwigluParams {
  TensorView x;                  // [M, K] f32 | bf16
  const PackedWeights* weights = nullptr;  // E matrices [2I, K]
  TensorView group_offsets;      // [E] i64 cumulative end offsets
  TensorView out;                // [M, I] f32 | bf16 | i8 (rows past the total untouched)
  TensorView out_scales;         // [M] f32 when out is i8; else empty
  ScheduleStats* stats = nullptr;
};
size_t grouped_matmul_swiglu_workspace_size(const GroupedMatmulSwigluParams& p);
Status grouped_matmul_swiglu(const GroupedMatmulSwigluParams& p, Workspace ws);

// out[t] = sum_j w[t, j] * y[inverse[t*k+j]] (+ shared[t]) (+ residual[t]); -1 rows skipped.
struct MoeFinalizeParams {
  TensorView y;          // [rows, H] expert outputs in sorted order, f32 | bf16
  TensorView inverse;    // [T*k] i32
  TensorView weights;    // [T, k] f32
  TensorView shared;     // [T, H] f32 | bf16; may be empty
  TensorView residual;   // [T, H] f32 | bf16; may be empty
  TensorView out;        // [T, H] f32 | bf16; may be shared or residual itself (in place), else apart
};
Status moe_finalize_routing(const MoeFinalizeParams& p, Workspace ws = {});

// A whole DeepSeek MoE layer: gating -> routing -> grouped gate/up + SwiGLU -> grouped
// down -> finalize, with the shared experts (one [2 I_s, H] gate/up and one [H, I_s]
// down matrix, I_s = n_shared * I) as one more group over all T rows in the same work
// queues as the routed experts, added at finalize.
struct MoeForwardParams {
  TensorView x;                     // [T, H] bf16 | f32
  TensorView router;                // [E, H] f32 router weights (logits = x . router^T); or
  const PackedMatrix* packed_router = nullptr;  // the same packed once with pack_weights
                                    // (then router stays empty): the unpacked router is
                                    // packed again by every call
  TensorView bias;                  // [E] f32 selection bias; may be empty
  int64_t top_k = 6;
  MoeScore score = MoeScore::kSoftmax;
  int64_t n_group = 1, topk_group = 1;
  MoeGroupScore group_score = MoeGroupScore::kMax;  // DeepSeek-V3: kTop2Sum
  bool renormalize = false;
  float routed_scaling_factor = 1.0f;
  const PackedWeights* gate_up = nullptr;  // E matrices [2I, H]
  const PackedWeights* down = nullptr;     // E matrices [H, I]
  const PackedWeights* shared_gate_up = nullptr;  // 1 matrix [2 I_s, H]; may be null
  const PackedWeights* shared_down = nullptr;     // 1 matrix [H, I_s]
  TensorView out;                   // [T, H], dtype of x; may be x itself (in place), else apart
  ScheduleStats* stats = nullptr;   // routed and shared expert GEMMs
};
size_t moe_forward_workspace_size(const MoeForwardParams& p);
Status moe_forward(const MoeForwardParams& p, Workspace ws);

}  // namespace optx
