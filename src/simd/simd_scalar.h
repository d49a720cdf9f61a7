// Portable "vector" of one lane: the reference shape of the interface the per-ISA wrappers
// (simd_avx2.h, simd_avx512.h) implement, so an op kernel is written once as a template.
//   W              lanes
//   F              vector of W floats
//   zero, set1, add, sub, mul, div, fmadd, max, reduce (fixed-order horizontal sum), reduce_max
//   exp              e^x, relative error < 2e-7 (polynomial on AVX2/AVX-512); exp(-inf) = 0
//   tanh             relative error < 3e-7 (from exp on AVX2/AVX-512); NaN kept
//   hide(x, m) / hide(x, m, n)  x where the i8 mask m is nonzero, -inf where it is 0 (n < W: m's first n)
//   swap_pairs (W >= 2 only): exchange lanes 2i and 2i+1
//   pair_dup(p) / pair_dup(p, n) (W >= 2 only): lanes 2i and 2i+1 = p[i]; n lanes (even), rest 0
//   neg_even (W >= 2 only): negate lanes 2i
//   load(p) / load(p, n)      from f32 or bf16 (uint16_t) memory; n < W: tail, rest 0
//   store(p, v) / store(p, v, n)  to f32 or bf16 (round to nearest even, NaN kept)
//   stream_copy(dst, src, bytes)  copy with non-temporal stores where dst is aligned
//   stream_fence()                orders those stores before handing data to other threads
//   store_stream2(p, v0, v1)      2W elements with non-temporal stores, p aligned to kStreamAlign
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "optx/tensor.h"

namespace optx::simd {

// Outputs at least this large are written with non-temporal stores by the ops that offer
// them (norm, the fused cache writes): past a core's L2 and most of what the next op would
// still find in cache, while ordinary stores would read every line from DRAM first.
inline constexpr int64_t kStreamMinBytes = int64_t(8) << 20;

// Whether p may take V::store_stream2 (kStreamAlign-aligned).
template <class V, class T>
inline bool stream_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % V::kStreamAlign == 0;
}

struct Scalar {
  static constexpr int W = 1;
  using F = float;
  OPTX_ALWAYS_INLINE static F zero() { return 0.0f; }
  OPTX_ALWAYS_INLINE static F set1(float v) { return v; }
  OPTX_ALWAYS_INLINE static F add(F a, F b) { return a + b; }
  OPTX_ALWAYS_INLINE static F sub(F a, F b) { return a - b; }
  // W == 1 has no pairs inside a vector; kernels needing swap_pairs special-case W == 1.
  OPTX_ALWAYS_INLINE static F max(F a, F b) { return a > b ? a : b; }
  OPTX_ALWAYS_INLINE static float reduce_max(F v) { return v; }
  OPTX_ALWAYS_INLINE static F exp(F x) { return std::exp(x); }
  OPTX_ALWAYS_INLINE static F tanh(F x) { return std::tanh(x); }
  OPTX_ALWAYS_INLINE static F hide(F x, const int8_t* m, int = W) { return *m ? x : -INFINITY; }
  OPTX_ALWAYS_INLINE static F mul(F a, F b) { return a * b; }
  OPTX_ALWAYS_INLINE static F div(F a, F b) { return a / b; }
  OPTX_ALWAYS_INLINE static F fmadd(F a, F b, F c) { return a * b + c; }
  OPTX_ALWAYS_INLINE static float reduce(F v) { return v; }
  OPTX_ALWAYS_INLINE static F load(const float* p) { return *p; }
  OPTX_ALWAYS_INLINE static F load(const float* p, int) { return *p; }
  OPTX_ALWAYS_INLINE static F load(const uint16_t* p) { return bf16_to_f32(*p); }
  OPTX_ALWAYS_INLINE static F load(const uint16_t* p, int) { return bf16_to_f32(*p); }
  OPTX_ALWAYS_INLINE static void store(float* p, F v) { *p = v; }
  OPTX_ALWAYS_INLINE static void store(float* p, F v, int) { *p = v; }
  OPTX_ALWAYS_INLINE static void store(uint16_t* p, F v) { *p = f32_to_bf16(v); }
  OPTX_ALWAYS_INLINE static void store(uint16_t* p, F v, int) { *p = f32_to_bf16(v); }
  OPTX_ALWAYS_INLINE static void stream_copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  OPTX_ALWAYS_INLINE static void stream_fence() {}
  static constexpr int kStreamAlign = 1;
  template <class T>
  OPTX_ALWAYS_INLINE static void store_stream2(T* p, F v0, F v1) {
    store(p, v0);
    store(p + 1, v1);
  }
};

}  // namespace optx::simd
