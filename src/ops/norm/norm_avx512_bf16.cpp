// RMSNorm row kernels instantiated for simd::Avx512Bf16 (native f32 -> bf16 conversion).
#include "simd/simd_avx512_bf16.h"

#define OPTX_ISA_NS avx512_bf16
#include "ops/norm/norm_kernels_inl.h"

namespace optx::norm_detail {
const Kernels& kernels_avx512_bf16() {
  static const Kernels k{avx512_bf16::rms_norm_rows<simd::Avx512Bf16>, avx512_bf16::add_rms_norm_rows<simd::Avx512Bf16>};
  return k;
}
}  // namespace optx::norm_detail
