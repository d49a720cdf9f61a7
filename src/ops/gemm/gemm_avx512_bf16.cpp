// AVX-512 + AVX512_BF16: as gemm_avx512.cpp, plus vdpbf16ps for bf16 x bf16.
#define OPTX_ISA_NS avx512_bf16
#include "ops/gemm/gemm_avx512_inl.h"

namespace optx::gemm_detail {
const KernelTable& kernels_avx512_bf16() {
  static const KernelTable t = with_avx2_unpacked_paths({.f32b = avx512_bf16::kern_f32,
                                                          .bf16b = avx512_bf16::kern_bf16b,
                                                          .i8b = avx512_bf16::kern_i8b,
                                                          .bf16dp = avx512_bf16::kern_bf16dp,
                                                          .epilogue = avx512_bf16::epilogue,
                                                          .gemv4_f32 = avx512_bf16::gemv4_f32,
                                                          .gemv4_i8b = avx512_bf16::gemv4_i8b,
                                                          .gemv4_bf16b = avx512_bf16::gemv4_bf16b,
                                                          .gemv2_bf16b = {avx512_bf16::gemv2_bf16b<2>, avx512_bf16::gemv2_bf16b<3>},
                                                          .gemv2_i8b = {avx512_bf16::gemv2_i8b<2>, avx512_bf16::gemv2_i8b<3>},
                                                          .f32b_out = avx512_bf16::kern_f32_out,
                                                          .f32_rows_out = avx512_bf16::kern_f32_rows,
                                                          .gemv_rows = avx512_bf16::gemv_rows,
                                                          .pack_a_pairs = avx512_bf16::pack_a_pairs,
                                                          .i8_pairs = avx512_bf16::i8_pairs,
                                                          .l2_runs = true});
  return t;
}
}  // namespace optx::gemm_detail
