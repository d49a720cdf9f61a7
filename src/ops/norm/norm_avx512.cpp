// RMSNorm row kernels instantiated for simd::Avx512.
#include "simd/simd_avx512.h"

#define OPTX_ISA_NS avx512
#include "ops/norm/norm_kernels_inl.h"

namespace optx::norm_detail {
const Kernels& kernels_avx512() {
  static const Kernels k{avx512::rms_norm_rows<simd::Avx512>, avx512::add_rms_norm_rows<simd::Avx512>};
  return k;
}
}  // namespace optx::norm_detail
