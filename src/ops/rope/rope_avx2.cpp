// RoPE kernels instantiated for simd::Avx2.
#include "simd/simd_avx2.h"

#define OPTX_ISA_NS avx2
#include "ops/rope/rope_kernels_inl.h"

namespace optx::rope_detail {
const Kernels& kernels_avx2() {
  static const Kernels k{avx2::rope_token<simd::Avx2>};
  return k;
}
}  // namespace optx::rope_detail
