#include "optx/tensor.h"

#include <array>
#include <cstdio>

namespace optx {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI8: return "i8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  // A value outside the enum (cast from an integer) is named by its number, from a table
  // built once, so that every name stays a static string.
  static const auto names = [] {
    std::array<std::array<char, 16>, 256> n{};
    for (unsigned i = 0; i < 256u; ++i) std::snprintf(n[i].data(), n[i].size(), "DType(%u)", i);
    return n;
  }();
  return names[static_cast<uint8_t>(t)].data();
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kI8: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

int64_t TensorView::numel() const {
  if (rank < 0 || rank > kMaxRank) return INT64_MAX;  // invalid, and not empty
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (sizes[i] == 0) return 0;
  }
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(n, sizes[i], &n)) return INT64_MAX;
  return n;
}

// Also asked of views not yet through check_view: an element count past int64 is not
// contiguous, and a rank past kMaxRank reads no sizes beyond the arrays.
bool TensorView::is_contiguous() const {
  if (rank < 0 || rank > kMaxRank) return false;
  bool none = false;  // no elements: nothing to lay out (np.empty((2, 0, 4)) has strides of its own)
  for (int i = 0; i < rank; ++i) {
    if (sizes[i] < 0) return false;
    none |= sizes[i] == 0;
  }
  if (none) return true;
  int64_t expect = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (sizes[i] != 1 && strides[i] != expect) return false;
    if (__builtin_mul_overflow(expect, sizes[i], &expect)) return false;
  }
  return true;
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = int(sizes.size() > size_t(kMaxRank) ? kMaxRank : sizes.size());
  int i = 0;
  for (int64_t s : sizes) {
    if (i == v.rank) break;
    v.sizes[i++] = s;
  }
  // Saturating: sizes whose product passes int64 give strides that check_view rejects,
  // not a signed overflow here.
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.strides[d] = stride;
    if (__builtin_mul_overflow(stride, v.sizes[d], &stride)) stride = INT64_MAX;
  }
  return v;
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes,
                     std::initializer_list<int64_t> strides) {
  TensorView v = make_view(data, dtype, sizes);
  int i = 0;
  for (int64_t s : strides) {
    if (i == v.rank) break;
    v.strides[i++] = s;
  }
  return v;
}

}  // namespace optx
