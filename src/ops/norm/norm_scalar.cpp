// RMSNorm row kernels instantiated for simd::Scalar.
#include "simd/simd_scalar.h"

#define OPTX_ISA_NS scalar
#include "ops/norm/norm_kernels_inl.h"

namespace optx::norm_detail {
const Kernels& kernels_scalar() {
  static const Kernels k{scalar::rms_norm_rows<simd::Scalar>, scalar::add_rms_norm_rows<simd::Scalar>};
  return k;
}
}  // namespace optx::norm_detail
