// RoPE kernels instantiated for simd::Scalar.
#include "simd/simd_scalar.h"

#define OPTX_ISA_NS scalar
#include "ops/rope/rope_kernels_inl.h"

namespace optx::rope_detail {
const Kernels& kernels_scalar() {
  static const Kernels k{scalar::rope_token<simd::Scalar>};
  return k;
}
}  // namespace optx::rope_detail
