// optx/tensor.h — dtypes, scalar conversions and non-owning strided tensor views.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace optx {

enum class DType : uint8_t { kF32, kBF16, kF16, kI8, kI32, kI64 };

const char* dtype_name(DType t);
size_t dtype_size(DType t);

// ---- scalar conversions ---------------------------------------------------------------
// always_inline: these helpers are also used inside per-ISA translation units; forcing
// inlining keeps the linker from picking an AVX-512-compiled out-of-line copy for a
// scalar code path (an ODR hazard of mixing ISA flags).
#define OPTX_ALWAYS_INLINE [[gnu::always_inline]] inline

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

OPTX_ALWAYS_INLINE float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quietened, sign kept) instead of rounding to Inf.
OPTX_ALWAYS_INLINE uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

OPTX_ALWAYS_INLINE float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // Inf / NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal half: normalise
    exp = 113u;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, with correct overflow to Inf, subnormals, and NaN preserved.
OPTX_ALWAYS_INLINE uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (a >= 0x38800000u) {  // normal half
    uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return uint16_t(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;  // below half the smallest subnormal: +-0
  // subnormal half: shift the implicit-1 mantissa into place, round to nearest even
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

// ---- views ------------------------------------------------------------------------------
inline constexpr int kMaxRank = 6;

// A non-owning strided view. Strides are in elements and may be 0 (broadcast) but never
// negative. An "empty" view (data == nullptr and rank == 0) means "argument not given".
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  int64_t sizes[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};

  bool empty() const { return data == nullptr && rank == 0; }
  // Product of the sizes; INT64_MAX where it overflows, so `numel() > 0 && !data` still
  // catches a null view whose sizes multiply past int64.
  int64_t numel() const;
  // Row-major and dense (dims of size 1 may carry any stride); a view with no elements
  // (a size of 0, none negative) is contiguous whatever its strides, as numpy's are.
  bool is_contiguous() const;
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// Contiguous (row-major) view.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes);
// View with explicit strides (elements).
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes,
                     std::initializer_list<int64_t> strides);

}  // namespace optx
