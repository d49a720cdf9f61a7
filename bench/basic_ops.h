// "Basic ops" for the bench's `basic` rows: the elementwise and reduction kernels an eager
// framework launches one at a time (each a full pass over its operands, intermediates
// materialised). Each loop is compiled for the best ISA the CPU has (target_clones), so a
// pass runs at memory speed and a ratio against it measures fusion, not vectorisation.
// Callers preallocate every intermediate outside the timed region.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "optx/tensor.h"

namespace optx::bench::basic {

#define OPTX_BASIC_OP [[gnu::target_clones("avx512f", "avx2", "default")]] static inline

OPTX_BASIC_OP void add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}
OPTX_BASIC_OP void bf16_to_f32_op(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}
OPTX_BASIC_OP void f32_to_bf16_op(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}
OPTX_BASIC_OP void square_f32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i];
}
OPTX_BASIC_OP float mean_f32(const float* x, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s / float(n);
}
OPTX_BASIC_OP void scale_f32(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}
// y = x * w elementwise (w broadcast over rows by the caller).
OPTX_BASIC_OP void mul_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(bf16_to_f32(x[i]) * bf16_to_f32(w[i]));
}
OPTX_BASIC_OP void mul_bf16_f32(const uint16_t* x, const float* c, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(bf16_to_f32(x[i]) * c[i]);
}
// rotate_half: [-x2, x1] (negation is a sign flip, exact).
OPTX_BASIC_OP void rotate_half_bf16(const uint16_t* x, uint16_t* y, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) y[i] = uint16_t(x[h + i] ^ 0x8000u);
  for (int64_t i = 0; i < h; ++i) y[h + i] = x[i];
}
// HF's cos/sin rows: the table row [d/2] repeated twice -> [d].
OPTX_BASIC_OP void gather_cos_row(const float* table, int64_t half, float* row) {
  for (int64_t i = 0; i < half; ++i) row[i] = row[half + i] = table[i];
}
// De-interleave (HF DeepSeek's view/transpose of the rope dims): [x0 x2 ... | x1 x3 ...].
OPTX_BASIC_OP void deinterleave_bf16(const uint16_t* x, uint16_t* y, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) y[i] = x[2 * i], y[h + i] = x[2 * i + 1];
}

// y = silu(g) * u to bf16 (what a framework's silu and mul kernels compute), with e^x as
// a plain-C polynomial the compiler vectorises, as a framework's vectorised silu is.
OPTX_BASIC_OP void silu_mul_f32_to_bf16(const float* g, const float* u, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = -g[i];
    const float t = std::fmin(std::fmax(x, -87.0f), 88.0f) * 1.44269504f;
    const float k = std::nearbyint(t), f = t - k;
    float p = 1.3398874e-3f;
    p = p * f + 9.6184373e-3f;
    p = p * f + 5.5503325e-2f;
    p = p * f + 2.4022648e-1f;
    p = p * f + 6.9314720e-1f;
    p = p * f + 1.0f;
    const uint32_t bits = uint32_t(int32_t(k) + 127) << 23;
    float two_k;
    std::memcpy(&two_k, &bits, 4);
    y[i] = f32_to_bf16(g[i] / (1.0f + p * two_k) * u[i]);
  }
}
// acc += w * y (one routed row added into its token's f32 accumulator).
OPTX_BASIC_OP void axpy_bf16_f32(float w, const uint16_t* y, float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w * bf16_to_f32(y[i]);
}
// y = bf16(a + b) with a f32 and b bf16.
OPTX_BASIC_OP void add_f32_bf16_to_bf16(const float* a, const uint16_t* b, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(a[i] + bf16_to_f32(b[i]));
}

// int8 quantisation as eager ops: abs-max per row, x / scale into f32, round and clamp in
// place, cast to int8. Written to vectorise without fast-math, as a framework's kernels
// are: the abs-max on the bit patterns (an integer max reduction; finite rows), rounding
// by adding and subtracting 1.5 * 2^23 (nearest even for |x| < 2^22).
OPTX_BASIC_OP float absmax_bf16(const uint16_t* x, int64_t n) {
  uint16_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = m > uint16_t(x[i] & 0x7fff) ? m : uint16_t(x[i] & 0x7fff);
  return bf16_to_f32(m);
}
OPTX_BASIC_OP void div_bf16_to_f32(const uint16_t* x, float s, float* y, int64_t n) {
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]) * inv;
}
OPTX_BASIC_OP void round_clamp_f32(float* x, float lo, float hi, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = (x[i] + 12582912.0f) - 12582912.0f;
    const float a = r > lo ? r : lo;
    x[i] = a < hi ? a : hi;
  }
}
OPTX_BASIC_OP void f32_to_i8(const float* x, int8_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = int8_t(x[i]);
}
#undef OPTX_BASIC_OP

}  // namespace optx::bench::basic
