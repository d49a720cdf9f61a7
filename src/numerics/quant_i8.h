// Symmetric per-row int8 quantisation shared by every op that emits i8 rows (the i8 KV
// cache, routed MoE rows) and by their references, so op and reference agree bit for bit:
// scale = max|x| / 127, q = clamp(rne(x * (127 / max|x|)), -127, 127). -128 is never used,
// which keeps the code range symmetric; an all-zero row gets scale 0 and all-zero codes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "optx/tensor.h"

namespace optx::numerics {
// Unnamed namespace: ISA units instantiate this with their own flags (AVX-512 ones
// vectorise it with zmm registers); with external linkage the linker would keep one
// instantiation for all units, possibly an AVX-512 build for the scalar / AVX2 paths.
namespace {

template <class T>
void quantize_row_i8(const T* x, int64_t n, int8_t* q, float* scale) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t>, "f32 or bf16 rows");
  auto f = [](T v) { return std::is_same_v<T, float> ? float(v) : bf16_to_f32(uint16_t(v)); };
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(f(x[i])));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(f(x[i]) * inv);  // default rounding mode: nearest even
    q[i] = int8_t(std::clamp(r, -127.0f, 127.0f));
  }
  *scale = amax / 127.0f;
}

}  // namespace
}  // namespace optx::numerics
