// Fused cache-write kernels instantiated for simd::Scalar.
#include "simd/simd_scalar.h"

#define OPTX_ISA_NS scalar
#include "ops/kv_cache/kv_cache_kernels_inl.h"

namespace optx::kv_detail {
const Kernels& kernels_scalar() {
  static const Kernels k{scalar::mla_tokens<simd::Scalar>, scalar::qkv_tokens<simd::Scalar>, scalar::write_tokens<simd::Scalar>,
                         scalar::gather_rows<simd::Scalar>};
  return k;
}
}  // namespace optx::kv_detail
