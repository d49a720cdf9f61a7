// Attention job kernel instantiated for simd::Scalar.
#include "simd/simd_scalar.h"

namespace optx::attn_detail::scalar {
namespace {
using simd_type = simd::Scalar;
}
}  // namespace optx::attn_detail::scalar

#define OPTX_ISA_NS scalar
#include "ops/attention/attention_kernels_inl.h"

namespace optx::attn_detail {
const Kernels& kernels_scalar() {
  static const Kernels k{scalar::run_job};
  return k;
}
}  // namespace optx::attn_detail
