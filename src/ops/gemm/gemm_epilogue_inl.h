// Epilogue shared by every ISA translation unit; included inside that unit's own namespace
// (OPTX_ISA_NS) so each copy is compiled with its unit's flags without ODR clashes.
// O(M*N) work against the O(M*N*K) main loop, so plain loops the compiler vectorises are
// enough here.
// The SwiGLU epilogue is written once over the unit's vector type (OPTX_GEMM_SIMD, from
// src/simd/): its exp is a polynomial, where std::exp per element would not vectorise and
// would cost more than the store it precedes.
#include <algorithm>

#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including gemm_epilogue_inl.h"
#endif
#ifndef OPTX_GEMM_SIMD
#error "define OPTX_GEMM_SIMD (a src/simd vector type) before including gemm_epilogue_inl.h"
#endif

namespace optx::gemm_detail::OPTX_ISA_NS {

template <class V, class Out>
static void swiglu_rows(const EpilogueArgs& e, Out* c0) {
  float gs[kNR], us[kNR];
  for (int n = 0; n < e.ncols; ++n) {
    gs[n] = e.col_scale ? e.col_scale[n] : 1.0f;
    us[n] = e.up_scale ? e.up_scale[n] : 1.0f;
  }
  const typename V::F one = V::set1(1.0f), zero = V::zero();
  for (int r = 0; r < e.m; ++r) {
    const float* g = e.acc + r * kNR;
    const float* u = e.up + r * kNR;
    Out* c = c0 + r * e.ldc;
    for (int n = 0; n < e.ncols; n += V::W) {
      const int w = std::min(V::W, e.ncols - n);
      const auto load = [&](const float* p) { return w == V::W ? V::load(p + n) : V::load(p + n, w); };
      const auto gv = V::mul(load(g), load(gs)), uv = V::mul(load(u), load(us));
      const auto v = V::mul(V::div(gv, V::add(one, V::exp(V::sub(zero, gv)))), uv);
      if (w == V::W) V::store(c + n, v);
      else V::store(c + n, v, w);
    }
  }
}

static void epilogue(const EpilogueArgs& e) {
  if (e.up) {
    if (e.c_dtype == DType::kF32) swiglu_rows<OPTX_GEMM_SIMD>(e, static_cast<float*>(e.c));
    else swiglu_rows<OPTX_GEMM_SIMD>(e, static_cast<uint16_t*>(e.c));
    return;
  }
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
