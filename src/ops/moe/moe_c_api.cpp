// C API of the moe family (optx.h): the MoE ops and the grouped GEMMs' schedule stats.
#include "core/c_api_internal.h"
#include "ops/moe/moe_internal.h"

namespace {
namespace md = optx::moe_detail;
using Stats = optx_schedule_stats;

optx::Status grouped_why(const optx::GroupedMatmulParams& p) { return md::validate_grouped_matmul(p, /*need_data=*/false); }
optx::Status swiglu_why(const optx::GroupedMatmulSwigluParams& p) { return md::validate_grouped_matmul_swiglu(p, /*need_data=*/false); }
optx::Status forward_why(const optx::MoeForwardParams& p) { return md::validate_moe_forward(p, /*need_data=*/false); }
}  // namespace

using optx::capi::get;

extern "C" {

OPTX_C_DEFAULT(moe_gating_topk_params)
OPTX_C_DEFAULT(moe_gating_topk_softmax_params)
OPTX_C_DEFAULT(moe_init_routing_params)
OPTX_C_DEFAULT(moe_compute_expert_tokens_params)
OPTX_C_DEFAULT(grouped_matmul_params)
OPTX_C_DEFAULT(grouped_matmul_swiglu_params)
OPTX_C_DEFAULT(moe_finalize_routing_params)
OPTX_C_DEFAULT(moe_forward_params)
OPTX_C_OP(moe_gating_topk)
OPTX_C_OP(moe_gating_topk_softmax)
OPTX_C_OP(moe_init_routing)
OPTX_C_OP(moe_compute_expert_tokens)
OPTX_C_SIZED_OP(grouped_matmul, grouped_why)
OPTX_C_SIZED_OP(grouped_matmul_swiglu, swiglu_why)
OPTX_C_OP(moe_finalize_routing)
OPTX_C_SIZED_OP(moe_forward, forward_why)

optx_status optx_schedule_stats_create(Stats** out) {
  return optx::capi::create("optx_schedule_stats_create", out, [](Stats&) { return optx::Status::Ok(); });
}
void optx_schedule_stats_free(Stats* s) { delete s; }
optx_status optx_schedule_stats_reset(Stats* s) {
  if (!s) return optx::capi::fail(OPTX_INVALID_ARGUMENT, "optx_schedule_stats_reset", "the handle is null");
  s->s = optx::ScheduleStats{};
  return OPTX_OK;
}
double optx_schedule_stats_wall_s(const Stats* s) {
  return get("optx_schedule_stats_wall_s", s, -1.0, [](const Stats& h) { return h.s.wall_s; });
}
int optx_schedule_stats_threads(const Stats* s) {
  return get("optx_schedule_stats_threads", s, -1, [](const Stats& h) { return int(h.s.busy_s.size()); });
}
double optx_schedule_stats_busy_s(const Stats* s, int i) {
  constexpr const char* fn = "optx_schedule_stats_busy_s";
  if (s && (i < 0 || size_t(i) >= s->s.busy_s.size())) {
    optx::capi::guarded(fn, [&] {
      return optx::Error(optx::StatusCode::kInvalidArgument, fn, ": i=", i, " but the stats have ", s->s.busy_s.size(), " threads");
    });
    return -1.0;
  }
  return get(fn, s, -1.0, [i](const Stats& h) { return h.s.busy_s[size_t(i)]; });
}

}  // extern "C"
