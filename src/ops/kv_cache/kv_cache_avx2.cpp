// Fused cache-write kernels instantiated for simd::Avx2.
#include "simd/simd_avx2.h"

#define OPTX_ISA_NS avx2
#include "ops/kv_cache/kv_cache_kernels_inl.h"

namespace optx::kv_detail {
const Kernels& kernels_avx2() {
  static const Kernels k{avx2::mla_tokens<simd::Avx2>, avx2::qkv_tokens<simd::Avx2>, avx2::write_tokens<simd::Avx2>,
                         avx2::gather_rows<simd::Avx2>};
  return k;
}
}  // namespace optx::kv_detail
