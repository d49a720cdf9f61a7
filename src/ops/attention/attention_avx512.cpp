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
  // Flash jobs of 192 rows: the GEMM prefill's (attention_gemm_prefill_inl.h). Decode,
  // which comes here only without AVX512_BF16, runs the AVX2 unit's tiles (512-bit where
  // the head dim allows) with its all-heads jobs (see kernels_avx2), and jobs of 16+ rows
  // over one bf16 KV head the GEMM path (gemm_decode_job).
  static const Kernels k{avx512::run_job, true, kMaxFlashRows, kMaxJobRows, kMaxGroupRows, true};
  return k;
}
}  // namespace optx::attn_detail
