// Attention job kernel instantiated for simd::Avx2.
#include "simd/simd_avx2.h"

namespace optx::attn_detail::avx2 {
namespace {
using simd_type = simd::Avx2;
}
}  // namespace optx::attn_detail::avx2

#define OPTX_ISA_NS avx2
#include "ops/attention/attention_kernels_inl.h"

namespace optx::attn_detail {
const Kernels& kernels_avx2() {
  static const Kernels k{avx2::run_job, true};
  return k;
}
}  // namespace optx::attn_detail
