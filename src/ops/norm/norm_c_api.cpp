// C API of the norm family (optx.h).
#include "core/c_api_internal.h"

using optx::capi::never_refused;

extern "C" {

OPTX_C_DEFAULT(rms_norm_params)
OPTX_C_DEFAULT(add_rms_norm_params)
OPTX_C_SIZED_OP(rms_norm, never_refused<optx::RmsNormParams>)
OPTX_C_SIZED_OP(add_rms_norm, never_refused<optx::AddRmsNormParams>)

}  // extern "C"
