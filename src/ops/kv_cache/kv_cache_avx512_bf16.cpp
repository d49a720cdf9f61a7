// Fused cache-write kernels instantiated for simd::Avx512Bf16 (native f32 -> bf16 conversion).
#include "simd/simd_avx512_bf16.h"

#define OPTX_ISA_NS avx512_bf16
#include "ops/kv_cache/kv_cache_kernels_inl.h"

namespace optx::kv_detail {
const Kernels& kernels_avx512_bf16() {
  static const Kernels k{avx512_bf16::mla_tokens<simd::Avx512Bf16>, avx512_bf16::qkv_tokens<simd::Avx512Bf16>, avx512_bf16::write_tokens<simd::Avx512Bf16>,
                         avx512_bf16::gather_rows<simd::Avx512Bf16>};
  return k;
}
}  // namespace optx::kv_detail
