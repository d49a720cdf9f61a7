// Fused cache-write kernels instantiated for simd::Avx512.
#include "simd/simd_avx512.h"

#define OPTX_ISA_NS avx512
#include "ops/kv_cache/kv_cache_kernels_inl.h"

namespace optx::kv_detail {
const Kernels& kernels_avx512() {
  static const Kernels k{avx512::mla_tokens<simd::Avx512>, avx512::qkv_tokens<simd::Avx512>, avx512::write_tokens<simd::Avx512>,
                         avx512::gather_rows<simd::Avx512>};
  return k;
}
}  // namespace optx::kv_detail
