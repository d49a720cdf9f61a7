// C API of the attention family (optx.h).
#include "core/c_api_internal.h"
#include "ops/attention/attention_internal.h"

extern "C" {

OPTX_C_DEFAULT(flash_attention_params)
OPTX_C_DEFAULT(paged_decode_attention_params)
OPTX_C_DEFAULT(mla_decode_attention_params)
OPTX_C_DEFAULT(attention_update_params)
OPTX_C_SIZED_OP(flash_attention, optx::attn_detail::flash_check)
OPTX_C_SIZED_OP(paged_decode_attention, optx::attn_detail::paged_check)
OPTX_C_SIZED_OP(mla_decode_attention, optx::attn_detail::mla_check)
OPTX_C_OP(attention_update)

}  // extern "C"
