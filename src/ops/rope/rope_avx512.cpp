// RoPE kernels instantiated for simd::Avx512.
#include "simd/simd_avx512.h"

#define OPTX_ISA_NS avx512
#include "ops/rope/rope_kernels_inl.h"

namespace optx::rope_detail {
const Kernels& kernels_avx512() {
  static const Kernels k{avx512::rope_token<simd::Avx512>};
  return k;
}
}  // namespace optx::rope_detail
