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
  // Flash jobs of 96 rows: each K / V block is loaded (widened, transposed) once for 96
  // rows instead of 32, and a head's K / V is read from L3 a third as often (S = 4096,
  // alternating in one process: +11% over 32 rows; 144 rows -5%, 192 no better).
  // All-heads decode jobs of up to 96 rows, 12 per KV head, bf16 or f32: speculative
  // decoding (Sq = 2, 3 over 32 / 8 heads) and f32 caches stream whole cache rows in address
  // order as bf16 Sq = 1 does, where per-head jobs read a head's slices a slot apart (from
  // DRAM, alternating with the previous build: Sq = 2 B = 1 ctx 8k / 32k +64% / +86%, B = 8
  // +48%; f32 Sq = 1 +154-169%).
  static const Kernels k{avx2::run_job, true, kMaxJobRows, kMaxJobRows, kMaxGroupRows, true};
  return k;
}
}  // namespace optx::attn_detail
