// C API of the gemm family (optx.h): packed weights and gemm.
#include "core/c_api_internal.h"
#include "ops/gemm/gemm_internal.h"

namespace {
// gemm_workspace_size refuses exactly what this refuses.
optx::Status gemm_why(const optx::GemmParams& p) { return optx::gemm_detail::validate(p, /*need_data=*/false); }
}  // namespace

extern "C" {

OPTX_C_DEFAULT(packed_matrix)
OPTX_C_DEFAULT(pack_weights_params)
OPTX_C_DEFAULT(gemm_params)
OPTX_C_SIZED_OP(gemm, gemm_why)

optx_status optx_pack_weights(const optx_pack_weights_params* p, optx_packed_weights** out) {
  return optx::capi::create_from("pack_weights", p, out,
                                 [](const optx::PackWeightsParams& q, optx_packed_weights& h) { return optx::pack_weights(q, &h.w); });
}
void optx_packed_weights_free(optx_packed_weights* w) { delete w; }

int64_t optx_packed_weights_count(const optx_packed_weights* w) {
  return optx::capi::get("optx_packed_weights_count", w, int64_t(-1), [](const optx_packed_weights& h) { return h.w.count(); });
}
size_t optx_packed_weights_bytes(const optx_packed_weights* w) {
  return optx::capi::get("optx_packed_weights_bytes", w, size_t(0), [](const optx_packed_weights& h) { return h.w.bytes(); });
}

optx_status optx_packed_weights_matrix(const optx_packed_weights* w, int64_t e, optx_packed_matrix* out) {
  constexpr const char* fn = "optx_packed_weights_matrix";
  if (!w || !out) return optx::capi::fail(OPTX_INVALID_ARGUMENT, fn, "the handle and out must be non-null");
  return optx::capi::guarded(fn, [&] {
    if (e < 0 || e >= w->w.count())
      return optx::Error(optx::StatusCode::kInvalidArgument, fn, ": e=", e, " but the weights hold ", w->w.count(), " matrices");
    *out = optx::capi::CParams<optx_packed_matrix>(w->w[e]).c;
    return optx::Status::Ok();
  });
}

}  // extern "C"
