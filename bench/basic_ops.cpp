// The basic ops' loops (declared and described in basic_ops.h), each compiled for
// AVX-512, AVX2 and the baseline with the one the CPU runs picked at load time.
//
// This file alone is built with -fno-trapping-math (tools/CMakeLists.txt): with FP traps
// assumed possible, GCC keeps a float compare-and-select (a clamp, a max) as a branch and
// leaves the loop scalar — the softmax's exp ran at 0.7x a scalar libm loop. Results are
// unchanged; it only lets the compiler write the loops as a framework's vectorised kernels
// are written.
#include "bench/basic_ops.h"

#include <cmath>
#include <cstring>

#include "optx/tensor.h"

namespace optx::bench::basic {
namespace {

// Reductions keep kLanes partial results, as a framework's reduction kernels do: a float
// sum or max in one accumulator is a chain the compiler must keep in order. The sums then
// vectorise; the maxes stay scalar here but as kLanes independent chains.
constexpr int kLanes = 16;

// e^x as a plain-C polynomial (2^k * 2^f, f in [-0.5, 0.5]) that the compiler vectorises,
// as a framework's vectorised exp is; x below -87 gives ~0.
[[gnu::always_inline]] inline float exp_poly(float x) {
  const float t = (x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f) * 1.44269504f;
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
  return p * two_k;
}

}  // namespace

#define OPTX_BASIC_OP [[gnu::target_clones("avx512f", "avx2", "default")]]

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
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) part[k] += x[i + k];
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (float v : part) s += v;
  return s / float(n);
}
OPTX_BASIC_OP void scale_f32(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}
OPTX_BASIC_OP void mul_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(bf16_to_f32(x[i]) * bf16_to_f32(w[i]));
}
OPTX_BASIC_OP void dequant_i8_to_bf16(const int8_t* x, float s, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(float(x[i]) * s);
}
OPTX_BASIC_OP void mul_bf16_f32(const uint16_t* x, const float* c, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(bf16_to_f32(x[i]) * c[i]);
}
OPTX_BASIC_OP void rotate_half_bf16(const uint16_t* x, uint16_t* y, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) y[i] = uint16_t(x[h + i] ^ 0x8000u);
  for (int64_t i = 0; i < h; ++i) y[h + i] = x[i];
}
OPTX_BASIC_OP void gather_cos_row(const float* table, int64_t half, float* row) {
  for (int64_t i = 0; i < half; ++i) row[i] = row[half + i] = table[i];
}
OPTX_BASIC_OP void deinterleave_bf16(const uint16_t* x, uint16_t* y, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) y[i] = x[2 * i], y[h + i] = x[2 * i + 1];
}
OPTX_BASIC_OP void silu_mul_f32_to_bf16(const float* g, const float* u, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(g[i] / (1.0f + exp_poly(-g[i])) * u[i]);
}
OPTX_BASIC_OP void softmax_f32(const float* x, float* y, int64_t n) {
  float part[kLanes];
  for (float& v : part) v = -INFINITY;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) part[k] = x[j + k] > part[k] ? x[j + k] : part[k];
  float m = -INFINITY;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  for (float v : part) m = v > m ? v : m;
  for (float& v : part) v = 0.0f;
  for (j = 0; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) part[k] += (y[j + k] = exp_poly(x[j + k] - m));
  float l = 0;
  for (; j < n; ++j) l += (y[j] = exp_poly(x[j] - m));
  for (float v : part) l += v;
  const float inv = 1.0f / l;
  for (j = 0; j < n; ++j) y[j] *= inv;
}
OPTX_BASIC_OP void axpy_bf16_f32(float w, const uint16_t* y, float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w * bf16_to_f32(y[i]);
}
OPTX_BASIC_OP void add_f32_bf16_to_bf16(const float* a, const uint16_t* b, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(a[i] + bf16_to_f32(b[i]));
}
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
