// AVX-512 F/BW/VL/DQ kernels (bf16 weights widened in registers).
#define OPTX_ISA_NS avx512
#include "ops/gemm/gemm_avx512_inl.h"

namespace optx::gemm_detail {
const KernelTable& kernels_avx512() {
  static const KernelTable t = with_avx2_unpacked_paths({.f32b = avx512::kern_f32,
                                                          .bf16b = avx512::kern_bf16b,
                                                          .i8b = avx512::kern_i8b,
                                                          .bf16dp = nullptr,
                                                          .epilogue = avx512::epilogue,
                                                          .gemv4_f32 = avx512::gemv4_f32,
                                                          .gemv4_i8b = avx512::gemv4_i8b,
                                                          .gemv4_bf16b = avx512::gemv4_bf16b,
                                                          .gemv2_bf16b = {avx512::gemv2_bf16b<2>, avx512::gemv2_bf16b<3>},
                                                          .gemv2_i8b = {avx512::gemv2_i8b<2>, avx512::gemv2_i8b<3>},
                                                          .f32b_out = avx512::kern_f32_out,
                                                          .f32_rows_out = avx512::kern_f32_rows,
                                                          .gemv_rows = avx512::gemv_rows,
                                                          .l2_runs = true,
                                                          .widen_panel = avx512::widen_panel});
  return t;
}
}  // namespace optx::gemm_detail
