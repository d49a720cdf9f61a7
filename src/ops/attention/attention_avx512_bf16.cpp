// Attention job kernel instantiated for simd::Avx512Bf16, plus the few-row bf16 decode
// kernel (attention_decode_inl.h).
#include "simd/simd_avx512_bf16.h"

namespace optx::attn_detail::avx512_bf16 {
namespace {
using simd_type = simd::Avx512Bf16;
}
}  // namespace optx::attn_detail::avx512_bf16

#define OPTX_ISA_NS avx512_bf16
#include "ops/attention/attention_kernels_inl.h"
#include "ops/attention/attention_decode_inl.h"

namespace optx::attn_detail {
const Kernels& kernels_avx512_bf16() {
  static const Kernels k{avx512_bf16::run_job_bf16, true};
  return k;
}
}  // namespace optx::attn_detail
