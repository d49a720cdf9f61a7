// Epilogue shared by every ISA translation unit; included inside that unit's own namespace
// (OPTX_ISA_NS) so each copy is compiled with its unit's flags without ODR clashes.
// Both epilogues are written once over the unit's vector type (OPTX_GEMM_SIMD, from
// src/simd/): SwiGLU's exp is a polynomial, where std::exp per element would not vectorise
// and would cost more than the store it precedes; the affine one is O(M*N) work, but left
// to the compiler it ran at ~1 cycle per element on a C off 64-byte lines (affine_rows).
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

// C = scale * acc + bias (+ beta * C), a vector at a time, with EpilogueArgs' fields read
// into locals first: as far as the compiler knows C's stores may alias them, and the plain
// loops it had vectorised reloaded ncols per vector, went through a row buffer and called
// memcpy per f32 row. With C 16 bytes off 64-byte lines (a std::vector's buffer) a
// one-thread bf16 2048^3 GEMM on the AMX tiles spent 10-14% of its samples there; it now
// runs 1.06-1.12x faster (means, builds in turn; two threads 1.03-1.06x). With C on lines
// that call runs alike, but an output-bound one (4096 x 4096 x 128 with alpha, f32 C, as
// flash's `basic` scores) 1.07-1.18x (best of 20, two threads).
template <class V, class Out>
static void affine_rows(const EpilogueArgs& e, const float* scale, const float* bias, Out* c0) {
  const int m = e.m, ncols = e.ncols;
  const int64_t ldc = e.ldc;
  const float* acc0 = e.acc;
  const float beta_s = e.beta;
  // The identity epilogue (alpha 1, no scales, bias or beta) copies (f32 C) or rounds
  // (bf16 C) acc as it is, a whole panel in whole vectors; a -0.0 stays -0.0 in every panel.
  const bool identity = e.alpha == 1.0f && !e.col_scale && !e.bias && beta_s == 0.0f;
  if (identity && ncols == kNR) {
    for (int r = 0; r < m; ++r) {
#pragma GCC unroll 8
      for (int n = 0; n < kNR; n += V::W) V::store(c0 + r * ldc + n, V::load(acc0 + r * kNR + n));
    }
    return;
  }
  const auto beta = V::set1(beta_s);
  for (int r = 0; r < m; ++r) {
    const float* acc = acc0 + r * kNR;
    Out* c = c0 + r * ldc;
    for (int n = 0; n < ncols; n += V::W) {
      const int w = std::min(V::W, ncols - n);
      const auto load = [&](const auto* p) { return w == V::W ? V::load(p + n) : V::load(p + n, w); };
      auto v = identity ? load(acc) : V::add(V::mul(load(scale), load(acc)), load(bias));
      // beta == 0 must not read C: it may hold NaN or uninitialised memory.
      if (beta_s != 0.0f) v = V::add(v, V::mul(beta, load(c)));
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
  float bias[kNR], scale[kNR];
  for (int n = 0; n < e.ncols; ++n) {
    if (!e.bias) bias[n] = 0.0f;
    else if (e.bias_dtype == DType::kF32) bias[n] = static_cast<const float*>(e.bias)[n];
    else bias[n] = bf16_to_f32(static_cast<const uint16_t*>(e.bias)[n]);
    scale[n] = e.alpha * (e.col_scale ? e.col_scale[n] : 1.0f);
  }
  if (e.c_dtype == DType::kF32) affine_rows<OPTX_GEMM_SIMD>(e, scale, bias, static_cast<float*>(e.c));
  else affine_rows<OPTX_GEMM_SIMD>(e, scale, bias, static_cast<uint16_t*>(e.c));
}

}  // namespace optx::gemm_detail::OPTX_ISA_NS
