// "Basic ops" for the bench's `basic` rows: the elementwise and reduction kernels an eager
// framework launches one at a time (each a full pass over its operands, intermediates
// materialised). Each loop is compiled for the best ISA the CPU has (target_clones, in
// basic_ops.cpp), so a pass runs at memory speed and a ratio against it measures fusion,
// not vectorisation. Callers preallocate every intermediate outside the timed region.
#pragma once

#include <cstdint>

namespace optx::bench::basic {

void add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n);
void bf16_to_f32_op(const uint16_t* x, float* y, int64_t n);
void f32_to_bf16_op(const float* x, uint16_t* y, int64_t n);
void square_f32(const float* x, float* y, int64_t n);
// Mean of x[0, n).
float mean_f32(const float* x, int64_t n);
void scale_f32(float* x, float s, int64_t n);
// y = x * w elementwise (w broadcast over rows by the caller).
void mul_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t n);
void mul_bf16_f32(const uint16_t* x, const float* c, uint16_t* y, int64_t n);
// rotate_half: [-x2, x1] (negation is a sign flip, exact).
void rotate_half_bf16(const uint16_t* x, uint16_t* y, int64_t d);
// HF's cos/sin rows: the table row [d/2] repeated twice -> [d].
void gather_cos_row(const float* table, int64_t half, float* row);
// De-interleave (HF DeepSeek's view/transpose of the rope dims): [x0 x2 ... | x1 x3 ...].
void deinterleave_bf16(const uint16_t* x, uint16_t* y, int64_t d);

// y = silu(g) * u to bf16 (what a framework's silu and mul kernels compute).
void silu_mul_f32_to_bf16(const float* g, const float* u, uint16_t* y, int64_t n);

// y = softmax(x) over one row of n (y may be x): a softmax kernel's max, exp and sum, and
// normalise passes, the row in cache between them.
void softmax_f32(const float* x, float* y, int64_t n);
// acc += w * y (one routed row added into its token's f32 accumulator).
void axpy_bf16_f32(float w, const uint16_t* y, float* acc, int64_t n);
// y = bf16(a + b) with a f32 and b bf16.
void add_f32_bf16_to_bf16(const float* a, const uint16_t* b, uint16_t* y, int64_t n);
// y = bf16(x * s): an int8 row dequantised with its scale (a cast and a multiply, one pass).
void dequant_i8_to_bf16(const int8_t* x, float s, uint16_t* y, int64_t n);

// int8 quantisation as eager ops: abs-max per row, x / scale into f32, round and clamp in
// place, cast to int8. Written to vectorise without fast-math, as a framework's kernels
// are: the abs-max on the bit patterns (an integer max reduction; finite rows), rounding
// by adding and subtracting 1.5 * 2^23 (nearest even for |x| < 2^22).
float absmax_bf16(const uint16_t* x, int64_t n);
void div_bf16_to_f32(const uint16_t* x, float s, float* y, int64_t n);
void round_clamp_f32(float* x, float lo, float hi, int64_t n);
void f32_to_i8(const float* x, int8_t* y, int64_t n);

}  // namespace optx::bench::basic
