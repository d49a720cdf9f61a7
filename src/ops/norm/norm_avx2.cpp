// RMSNorm row kernels instantiated for simd::Avx2.
#include "simd/simd_avx2.h"

#define OPTX_ISA_NS avx2
#include "ops/norm/norm_kernels_inl.h"

namespace optx::norm_detail {
const Kernels& kernels_avx2() {
  static const Kernels k{avx2::rms_norm_rows<simd::Avx2>, avx2::add_rms_norm_rows<simd::Avx2>};
  return k;
}
}  // namespace optx::norm_detail
