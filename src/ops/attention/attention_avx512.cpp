// Attention job kernel instantiated for simd::Avx512.
#include "simd/simd_avx512.h"

namespace optx::attn_detail::avx512 {
namespace {
using simd_type = simd::Avx512;
}
}  // namespace optx::attn_detail::avx512

#define OPTX_ISA_NS avx512
#include "ops/attention/attention_kernels_inl.h"

namespace optx::attn_detail {
const Kernels& kernels_avx512() {
  // Flash jobs of 192 rows: the GEMM prefill's (attention_gemm_prefill_inl.h). Decode
  // runs the AVX2 unit's tiles (this unit is chosen only without AVX512_BF16), with its
  // all-heads jobs (see kernels_avx2).
  static const Kernels k{avx512::run_job, true, kMaxFlashRows, kMaxJobRows, kMaxGroupRows, true};
  return k;
}
}  // namespace optx::attn_detail
