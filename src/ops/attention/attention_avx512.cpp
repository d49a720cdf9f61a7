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
namespace avx512 {
namespace {
void run_job_or_avx2_prefill(const Config& c, const Job& j, float* scratch) {
  if (avx2_prefill(c, j)) return kernels_avx2().run_job(c, j, scratch);
  run_job(c, j, scratch);
}
}  // namespace
}  // namespace avx512

const Kernels& kernels_avx512() {
  // Flash jobs of 96 rows, as the AVX2 unit's prefill that runs them.
  static const Kernels k{avx512::run_job_or_avx2_prefill, false, kMaxJobRows};
  return k;
}
}  // namespace optx::attn_detail
