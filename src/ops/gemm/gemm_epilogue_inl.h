// Epilogue shared by every ISA translation unit; included inside that unit's own namespace
// (OPTX_ISA_NS) so each copy is compiled with its unit's flags without ODR clashes.
// O(M*N) work against the O(M*N*K) main loop, so plain loops the compiler vectorises are
// enough here.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including gemm_epilogue_inl.h"
#endif

namespace optx::gemm_detail::OPTX_ISA_NS {

static void epilogue(const EpilogueArgs& e) {
  float bias[kNR];
  for (int n = 0; n < e.ncols; ++n) {
    if (!e.bias) bias[n] = 0.0f;
    else if (e.bias_dtype == DType::kF32) bias[n] = static_cast<const float*>(e.bias)[n];
    else bias[n] = bf16_to_f32(static_cast<const uint16_t*>(e.bias)[n]);
  }
  float scale[kNR];
  for (int n = 0; n < e.ncols; ++n) scale[n] = e.alpha * (e.col_scale ? e.col_scale[n] : 1.0f);

  for (int r = 0; r < e.m; ++r) {
    const float* acc = e.acc + r * kNR;
    float row[kNR];
    for (int n = 0; n < e.ncols; ++n) row[n] = scale[n] * acc[n] + bias[n];
    if (e.c_dtype == DType::kF32) {
      float* c = static_cast<float*>(e.c) + r * e.ldc;
      // beta == 0 must not read C: it may hold NaN or uninitialised memory.
      if (e.beta != 0.0f)
        for (int n = 0; n < e.ncols; ++n) c[n] = row[n] + e.beta * c[n];
      else
        for (int n = 0; n < e.ncols; ++n) c[n] = row[n];
    } else {
      uint16_t* c = static_cast<uint16_t*>(e.c) + r * e.ldc;
      if (e.beta != 0.0f)
        for (int n = 0; n < e.ncols; ++n) c[n] = f32_to_bf16(row[n] + e.beta * bf16_to_f32(c[n]));
      else
        for (int n = 0; n < e.ncols; ++n) c[n] = f32_to_bf16(row[n]);
    }
  }
}

}  // namespace optx::gemm_detail::OPTX_ISA_NS
