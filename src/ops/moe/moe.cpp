// MoE family: gating, routing (a stable counting sort) and finalize. The grouped GEMMs
// are in grouped_matmul.cpp, the one-call layer in moe_forward.cpp. Buffers live in the
// caller's workspace.
#include "optx/moe.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "dispatch/registry.h"
#include "core/validate.h"
#include "numerics/quant_i8.h"
#include "ops/moe/moe_internal.h"

namespace optx {
namespace {

using moe_detail::check_1d;
using moe_detail::check_2d;
using moe_detail::describe;
using moe_detail::load_f;

using moe_detail::kMaxExperts;
using moe_detail::kMaxHidden;
using moe_detail::kMaxTopK;

// Top-k of v[0..n) (no NaN: the routers clamp what they select on) among eligible entries,
// descending, ties to the lower index: one ascending scan keeping the best k in order by
// insertion; a value moves ahead only of strictly smaller ones, so an equal later id
// stays behind. O(n) compares when most values fall below the current k-th (was k
// passes over n with a taken-check each: 2x slower than an eager softmax + partial sort
// at E = 64, k = 6). Also picks the kept groups, so k may reach n_group (<= kMaxExperts).
template <class T>
void topk(const T* v, const bool* eligible, int64_t n, int64_t k, int32_t* out) {
  T best[kMaxExperts];
  int64_t cnt = 0;
  for (int64_t e = 0; e < n; ++e) {
    if (eligible && !eligible[e]) continue;
    const T x = v[e];
    if (cnt == k && !(x > best[k - 1])) continue;
    int64_t pos = cnt < k ? cnt++ : k - 1;  // when full, the last one drops out
    for (; pos > 0 && x > best[pos - 1]; --pos) best[pos] = best[pos - 1], out[pos] = out[pos - 1];
    best[pos] = x;
    out[pos] = int32_t(e);
  }
}

}  // namespace

// ---- gating --------------------------------------------------------------------------------
namespace {
// Non-finite logits and selection scores are clamped to the finite range, NaN to the
// lowest: a NaN counts as -inf, softmax over a row of -inf logits is uniform, and the
// top-k always takes k distinct eligible experts (ties, -inf ones included, to the lower
// id). The AVX-512 unit clamps with max_ps / min_ps, which give what these expressions
// do (x > lo ? x : lo is lo for a NaN x), so both paths select the same experts.
inline float clamp_finite(float x) {
  const float lo = x > -FLT_MAX ? x : -FLT_MAX;
  return lo < FLT_MAX ? lo : FLT_MAX;
}

Status check_gating(const char* op, const MoeGatingParams& p) {
  OPTX_RETURN_IF_ERROR(check_2d(op, p.logits, "logits", -1, -1, true));
  const int64_t T = p.logits.sizes[0], E = p.logits.sizes[1];
  if (E < 1 || E > kMaxExperts) return Error(StatusCode::kInvalidArgument, op, ": experts E=", E, " must be in [1, ", kMaxExperts, "]");
  OPTX_RETURN_IF_ERROR(check_2d(op, p.topk_ids, "topk_ids", T, -1, false));
  const int64_t k = p.topk_ids.sizes[1];
  if (p.topk_ids.dtype != DType::kI32) return Error(StatusCode::kInvalidArgument, op, ": topk_ids.dtype=", dtype_name(p.topk_ids.dtype), " but must be i32");
  OPTX_RETURN_IF_ERROR(check_2d(op, p.topk_weights, "topk_weights", T, k, false));
  if (p.topk_weights.dtype != DType::kF32)
    return Error(StatusCode::kInvalidArgument, op, ": topk_weights.dtype=", dtype_name(p.topk_weights.dtype), " but must be f32");
  OPTX_RETURN_IF_ERROR(
      moe_detail::check_router(op, E, p.score, p.group_score, p.routed_scaling_factor, p.n_group, p.topk_group, k, "top-k"));
  if (!p.bias.empty()) OPTX_RETURN_IF_ERROR(check_1d(op, p.bias, "bias", E, DType::kF32));
  if (p.topk_then_softmax && (p.score != MoeScore::kSoftmax || p.n_group > 1 || !p.bias.empty()))
    return Error(StatusCode::kInvalidArgument, op, ": topk_then_softmax takes softmax scoring without groups or bias");
  return check_apart(op, {{"topk_ids", p.topk_ids}, {"topk_weights", p.topk_weights}}, {{"logits", p.logits}, {"bias", p.bias}});
}

// The router over checked arguments; vk (null: the scalar loops): scores, selection scores
// and top-k from a vector unit (the same experts and, to f32 rounding, the same weights).
Status gating_rows(const moe_detail::GatingKernels* vk, const MoeGatingParams& p) {
  const int64_t T = p.logits.sizes[0], E = p.logits.sizes[1], k = p.topk_ids.sizes[1];
  const float* bias = p.bias.empty() ? nullptr : static_cast<const float*>(p.bias.data);
  int32_t* ids = static_cast<int32_t*>(p.topk_ids.data);
  float* wts = static_cast<float*>(p.topk_weights.data);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (T > 16)
  for (int64_t t = 0; t < T; ++t) {
    alignas(64) float logit[kMaxExperts], score[kMaxExperts], sel[kMaxExperts];
    bool ok[kMaxExperts];
    if (vk) {
      vk->load_logits(static_cast<const uint8_t*>(p.logits.data) + size_t(t * E) * dtype_size(p.logits.dtype), p.logits.dtype, E,
                      logit);
    } else {
      for (int64_t e = 0; e < E; ++e) logit[e] = clamp_finite(load_f(p.logits, t * E + e));
    }
    int32_t* id = ids + t * k;
    float* w = wts + t * k;
    if (p.topk_then_softmax) {
      if (vk) vk->topk(logit, nullptr, E, k, id);
      else topk(logit, nullptr, E, k, id);
      const float m = logit[id[0]];
      float s = 0;
      for (int64_t j = 0; j < k; ++j) s += (w[j] = std::exp(logit[id[j]] - m));
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / s * p.routed_scaling_factor;
      continue;
    }
    if (p.score == MoeScore::kSoftmax && vk) {
      vk->softmax_scores(logit, E, score);
    } else if (p.score == MoeScore::kSigmoid && vk) {
      vk->sigmoid_scores(logit, E, score);
    } else if (p.score == MoeScore::kSoftmax) {
      float m = -INFINITY, s = 0;
      for (int64_t e = 0; e < E; ++e) m = std::max(m, logit[e]);
      for (int64_t e = 0; e < E; ++e) s += (score[e] = std::exp(logit[e] - m));
      for (int64_t e = 0; e < E; ++e) score[e] /= s;
    } else if (p.score == MoeScore::kSigmoid) {
      for (int64_t e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-logit[e]));
    } else {  // sqrt(softplus(x)), softplus computed stably
      for (int64_t e = 0; e < E; ++e) {
        const float x = logit[e];
        score[e] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
      }
    }
    if (vk) vk->selection_scores(score, bias, E, sel);
    else
      for (int64_t e = 0; e < E; ++e) sel[e] = clamp_finite(bias ? score[e] + bias[e] : score[e]);
    if (p.n_group > 1) {  // keep the topk_group best groups
      const int64_t gs = E / p.n_group;
      double gscore[kMaxExperts];  // a top-2 sum of two scores near FLT_MAX stays finite and ordered, as in the reference
      const bool top2 = p.group_score != MoeGroupScore::kMax && gs > 1;
      if (vk && vk->group_scores) {
        vk->group_scores(sel, E, p.n_group, top2, gscore);
      } else {
        for (int64_t g = 0; g < p.n_group; ++g) {
          float a = -INFINITY, b = -INFINITY;  // largest two
          for (int64_t e = g * gs; e < (g + 1) * gs; ++e) {
            if (sel[e] > a) b = a, a = sel[e];
            else if (sel[e] > b) b = sel[e];
          }
          gscore[g] = top2 ? double(a) + double(b) : a;
        }
      }
      int32_t keep[kMaxExperts];
      topk(gscore, nullptr, p.n_group, p.topk_group, keep);
      for (int64_t e = 0; e < E; ++e) ok[e] = false;
      for (int64_t g = 0; g < p.topk_group; ++g)
        for (int64_t e = keep[g] * gs; e < (keep[g] + 1) * gs; ++e) ok[e] = true;
    }
    const bool* eligible = p.n_group > 1 ? ok : nullptr;  // ungrouped: every expert
    if (vk) vk->topk(sel, eligible, E, k, id);
    else topk(sel, eligible, E, k, id);
    float s = 0;
    for (int64_t j = 0; j < k; ++j) s += (w[j] = score[id[j]]);
    const float scale = p.routed_scaling_factor / (p.renormalize && s > 0 ? s : 1.0f);
    for (int64_t j = 0; j < k; ++j) w[j] *= scale;
  }
  return Status::Ok();
}

// The router with a vector unit's steps; gating_scalar with moe.cpp's loops.
template <const moe_detail::GatingKernels& (*Kernels)()>
Status gating_with(const MoeGatingParams& p) {
  return gating_rows(&Kernels(), p);
}
Status gating_scalar(const MoeGatingParams& p) { return gating_rows(nullptr, p); }

using GatingFn = Status (*)(const MoeGatingParams&);
dispatch::Registry<GatingFn> gating_registry(const char* op) {
  return dispatch::Registry<GatingFn>(op, {
                                              {"avx512", Isa::kAvx512, gating_with<moe_detail::gating_kernels_avx512>},
                                              {"avx2", Isa::kAvx2, gating_with<moe_detail::gating_kernels_avx2>},
                                              {"scalar", Isa::kScalar, gating_scalar},
                                              {"reference", Isa::kScalar, moe_detail::gating_reference},
                                          });
}
const dispatch::Registry<GatingFn>& topk_registry() {
  static const auto r = gating_registry("moe_gating_topk");
  return r;
}
const dispatch::Registry<GatingFn>& topk_softmax_registry() {
  static const auto r = gating_registry("moe_gating_topk_softmax");
  return r;
}

Status gating(const dispatch::Registry<GatingFn>& reg, const MoeGatingParams& p) {
  OPTX_RETURN_IF_ERROR(check_gating(reg.op(), p));
  const dispatch::Impl<GatingFn>* impl = nullptr;
  OPTX_RETURN_IF_ERROR(reg.select_to_run(&impl));
  return impl->fn(p);
}

// The other ops have one implementation each.
std::string generic_impl() { return "generic"; }
[[maybe_unused]] const bool registered = [] {
  for (const char* op : {"moe_init_routing", "moe_compute_expert_tokens", "grouped_matmul", "grouped_matmul_swiglu",
                         "moe_finalize_routing", "moe_forward"})
    dispatch::register_op(op, generic_impl);
  dispatch::register_op("moe_gating_topk", [] { return topk_registry().selected_name(); });
  dispatch::register_op("moe_gating_topk_softmax", [] { return topk_softmax_registry().selected_name(); });
  return true;
}();
}  // namespace

std::vector<std::string> moe_detail::gating_impl_names() {
  std::vector<std::string> names;
  for (const auto* impl : topk_registry().runnable()) names.emplace_back(impl->name);
  return names;
}

Status moe_gating_topk(const MoeGatingParams& p, Workspace) { return gating(topk_registry(), p); }

Status moe_gating_topk_softmax(const MoeGatingSoftmaxParams& p, Workspace) {
  return gating(topk_softmax_registry(), {.logits = p.logits, .topk_ids = p.topk_ids, .topk_weights = p.topk_weights,
                                          .renormalize = p.renormalize, .topk_then_softmax = p.topk_then_softmax});
}

// ---- routing -------------------------------------------------------------------------------
Status moe_init_routing(const MoeRoutingParams& p, Workspace) {
  constexpr const char* op = "moe_init_routing";
  OPTX_RETURN_IF_ERROR(check_2d(op, p.x, "x", -1, -1, true));
  const int64_t T = p.x.sizes[0], H = p.x.sizes[1], E = p.num_experts;
  if (E < 1 || E > kMaxExperts) return Error(StatusCode::kInvalidArgument, op, ": num_experts=", E, " must be in [1, ", kMaxExperts, "]");
  OPTX_RETURN_IF_ERROR(check_2d(op, p.topk_ids, "topk_ids", T, -1, false));
  if (p.topk_ids.dtype != DType::kI32)
    return Error(StatusCode::kInvalidArgument, op, ": topk_ids.dtype=", dtype_name(p.topk_ids.dtype), " but must be i32");
  // T * k is topk_ids' element count, which check_view bounded: no overflow.
  const int64_t k = p.topk_ids.sizes[1], N = T * k;
  if (N > INT32_MAX)
    return Error(StatusCode::kInvalidArgument, op, ": T*k=", N, " rows exceed the i32 row_map / inverse (", INT32_MAX, ")");
  OPTX_RETURN_IF_ERROR(check_2d(op, p.sorted_rows, "sorted_rows", N, H, false));
  const bool quant = p.sorted_rows.dtype == DType::kI8;
  if (!quant && p.sorted_rows.dtype != p.x.dtype)
    return Error(StatusCode::kInvalidArgument, op, ": sorted_rows.dtype=", dtype_name(p.sorted_rows.dtype), " must be x.dtype=",
                 dtype_name(p.x.dtype), " or i8");
  if (quant) OPTX_RETURN_IF_ERROR(check_1d(op, p.row_scales, "row_scales", N, DType::kF32));
  else if (!p.row_scales.empty())
    return Error(StatusCode::kInvalidArgument, op, ": row_scales is only written when sorted_rows is i8, got ", describe(p.row_scales));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.row_map, "row_map", N, DType::kI32));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.inverse, "inverse", N, DType::kI32));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.counts, "counts", E, DType::kI64));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.offsets, "offsets", E, DType::kI64));
  // The sort writes row_map / inverse while it still reads topk_ids: an overlap would sort
  // ids it had overwritten and place rows outside row_map.
  OPTX_RETURN_IF_ERROR(check_apart(op,
                                   {{"sorted_rows", p.sorted_rows}, {"row_scales", p.row_scales}, {"row_map", p.row_map},
                                    {"inverse", p.inverse}, {"counts", p.counts}, {"offsets", p.offsets}},
                                   {{"x", p.x}, {"topk_ids", p.topk_ids}}));
  // Only -1 stands for num_experts: another negative end is a caller's mistake.
  const int64_t e0 = p.expert_begin, e1 = p.expert_end == -1 ? E : p.expert_end;
  if (e0 < 0 || e1 > E || e0 > e1)
    return Error(StatusCode::kInvalidArgument, op, ": expert range [", e0, ", ", e1, ") must lie in [0, ", E,
                 "] (expert_end -1: num_experts)");
  const int32_t* ids = static_cast<const int32_t*>(p.topk_ids.data);
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] < 0 || ids[i] >= E)
      return Error(StatusCode::kInvalidArgument, op, ": topk_ids[", i / k, "][", i % k, "]=", ids[i], " is outside [0, ", E, ")");
  int64_t* counts = static_cast<int64_t*>(p.counts.data);
  int64_t* offsets = static_cast<int64_t*>(p.offsets.data);
  std::fill(counts, counts + E, 0);
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] >= e0 && ids[i] < e1) ++counts[ids[i]];
  int64_t cursor[kMaxExperts];
  int64_t run = 0;
  for (int64_t e = 0; e < E; ++e) {
    cursor[e] = run;
    run += counts[e];
    offsets[e] = run;
  }
  int32_t* row_map = static_cast<int32_t*>(p.row_map.data);
  int32_t* inverse = static_cast<int32_t*>(p.inverse.data);
  for (int64_t i = 0; i < N; ++i) {  // stable: (t, j) in order within each expert
    const int32_t e = ids[i];
    if (e < e0 || e >= e1) {
      inverse[i] = -1;
      continue;
    }
    const int64_t pos = cursor[e]++;
    row_map[pos] = int32_t(i);
    inverse[i] = int32_t(pos);
  }
  for (int64_t i = run; i < N; ++i) row_map[i] = -1;
  const size_t row_bytes = size_t(H) * dtype_size(p.x.dtype);
  const uint8_t* x = static_cast<const uint8_t*>(p.x.data);
  if (quant) {
    // Each of a token's k copies is quantised on its own: identical codes, and no shared
    // per-token scratch between threads.
    int8_t* q = static_cast<int8_t*>(p.sorted_rows.data);
    float* scales = static_cast<float*>(p.row_scales.data);
    const bool bf16 = p.x.dtype == DType::kBF16;
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (run * H > (1 << 16))
    for (int64_t pos = 0; pos < run; ++pos) {
      const uint8_t* src = x + size_t(row_map[pos] / k) * row_bytes;
      if (bf16) numerics::quantize_row_i8(reinterpret_cast<const uint16_t*>(src), H, q + pos * H, scales + pos);
      else numerics::quantize_row_i8(reinterpret_cast<const float*>(src), H, q + pos * H, scales + pos);
    }
    return Status::Ok();
  }
  uint8_t* out = static_cast<uint8_t*>(p.sorted_rows.data);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (run > 64)
  for (int64_t pos = 0; pos < run; ++pos) std::memcpy(out + size_t(pos) * row_bytes, x + size_t(row_map[pos] / k) * row_bytes, row_bytes);
  return Status::Ok();
}

Status moe_compute_expert_tokens(const TensorView& sorted_ids, const TensorView& offsets) {
  constexpr const char* op = "moe_compute_expert_tokens";
  OPTX_RETURN_IF_ERROR(check_1d(op, sorted_ids, "sorted_ids", -1, DType::kI32));
  OPTX_RETURN_IF_ERROR(check_1d(op, offsets, "offsets", -1, DType::kI64));
  const int64_t N = sorted_ids.sizes[0], E = offsets.sizes[0];
  if (E < 1) return Error(StatusCode::kInvalidArgument, op, ": offsets has ", E, " experts; needs at least 1");
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"offsets", offsets}}, {{"sorted_ids", sorted_ids}}));
  const int32_t* ids = static_cast<const int32_t*>(sorted_ids.data);
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] < 0 || ids[i] >= E || (i > 0 && ids[i] < ids[i - 1]))
      return Error(StatusCode::kInvalidArgument, op, ": sorted_ids[", i, "]=", ids[i], " is out of [0, ", E, ") or not ascending");
  int64_t* off = static_cast<int64_t*>(offsets.data);
  int64_t i = 0;
  for (int64_t e = 0; e < E; ++e) {
    while (i < N && ids[i] <= e) ++i;
    off[e] = i;
  }
  return Status::Ok();
}

// ---- finalize ---------------------------------------------------------------------------------
Status moe_finalize_routing(const MoeFinalizeParams& p, Workspace) {
  constexpr const char* op = "moe_finalize_routing";
  OPTX_RETURN_IF_ERROR(check_2d(op, p.out, "out", -1, -1, true));
  const int64_t T = p.out.sizes[0], H = p.out.sizes[1];
  if (H > kMaxHidden) return Error(StatusCode::kInvalidArgument, op, ": hidden H=", H, " exceeds ", kMaxHidden);
  OPTX_RETURN_IF_ERROR(check_2d(op, p.weights, "weights", T, -1, false));
  if (p.weights.dtype != DType::kF32)
    return Error(StatusCode::kInvalidArgument, op, ": weights.dtype=", dtype_name(p.weights.dtype), " but must be f32");
  // T * k is weights' element count, which check_view bounded: no overflow.
  const int64_t k = p.weights.sizes[1];
  OPTX_RETURN_IF_ERROR(check_1d(op, p.inverse, "inverse", T * k, DType::kI32));
  OPTX_RETURN_IF_ERROR(check_2d(op, p.y, "y", -1, H, true));
  if (!p.shared.empty()) OPTX_RETURN_IF_ERROR(check_2d(op, p.shared, "shared", T, H, true));
  if (!p.residual.empty()) OPTX_RETURN_IF_ERROR(check_2d(op, p.residual, "residual", T, H, true));
  // Rows of out are written while other rows still read inverse, weights and y (an
  // inverse entry overwritten after its check would address outside y); out may replace
  // shared or residual in place, each element read before it is written.
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"out", p.out}}, {{"weights", p.weights}, {"inverse", p.inverse}, {"y", p.y}}));
  OPTX_RETURN_IF_ERROR(in_place_or_apart(op, p.out, "out", p.shared, "shared"));
  OPTX_RETURN_IF_ERROR(in_place_or_apart(op, p.out, "out", p.residual, "residual"));
  const int32_t* inv = static_cast<const int32_t*>(p.inverse.data);
  for (int64_t i = 0; i < T * k; ++i)
    if (inv[i] < -1 || inv[i] >= p.y.sizes[0])
      return Error(StatusCode::kInvalidArgument, op, ": inverse[", i, "]=", inv[i], " is outside [-1, ", p.y.sizes[0], ")");
  // An out without elements may still claim 2^62 rows (of 0 columns): nothing to loop over.
  if (p.out.numel() == 0) return Status::Ok();
  const float* w = static_cast<const float*>(p.weights.data);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (T > 4)
  for (int64_t t = 0; t < T; ++t) {
    float acc[kMaxHidden];
    for (int64_t h = 0; h < H; ++h) acc[h] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = inv[t * k + j];
      if (row < 0) continue;
      const float wj = w[t * k + j];
      for (int64_t h = 0; h < H; ++h) acc[h] += wj * load_f(p.y, row * H + h);
    }
    for (int64_t h = 0; h < H; ++h) {
      float v = acc[h];
      if (!p.shared.empty()) v += load_f(p.shared, t * H + h);
      if (!p.residual.empty()) v += load_f(p.residual, t * H + h);
      if (p.out.dtype == DType::kBF16) static_cast<uint16_t*>(p.out.data)[t * H + h] = f32_to_bf16(v);
      else static_cast<float*>(p.out.data)[t * H + h] = v;
    }
  }
  return Status::Ok();
}

}  // namespace optx
