#include "optx/tensor.h"

#include <string>
#include <utility>

#include "core/validate.h"

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
  return "?";
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
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (sizes[i] == 0) return 0;
  }
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(n, sizes[i], &n)) return INT64_MAX;
  return n;
}

Status check_view(const char* op, const char* name, const TensorView& t, bool need_data) {
  if (t.rank < 0 || t.rank > kMaxRank)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".rank=", t.rank, " is outside [0, ", kMaxRank, "]");
  if (t.empty()) return Status::Ok();  // not given: whether it may be is the op's call
  for (int d = 0; d < t.rank; ++d)
    if (t.sizes[d] < 0)
      return Error(StatusCode::kInvalidArgument, op, ": ", name, ".sizes[", d, "]=", t.sizes[d], " is negative");
  for (int d = 0; d < t.rank; ++d)
    if (t.strides[d] < 0)
      return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[", d, "]=", t.strides[d],
                   " is negative (negative strides are not supported)");
  const int64_t n = t.numel();
  if (n == 0) return Status::Ok();
  // Elements and the bytes from the first to the last element: both must stay far from
  // int64's end so that no size, offset or product an op computes from them overflows.
  int64_t last = 0;
  bool wrap = n > kMaxViewElements;
  for (int d = 0; d < t.rank && !wrap; ++d) {
    int64_t off = 0;
    wrap = __builtin_mul_overflow(t.sizes[d] - 1, t.strides[d], &off) || __builtin_add_overflow(last, off, &last);
  }
  int64_t bytes = 0;
  if (!wrap) wrap = __builtin_mul_overflow(last + 1, int64_t(dtype_size(t.dtype)), &bytes) || bytes > kMaxViewBytes;
  if (wrap) {
    std::string shape;
    for (int d = 0; d < t.rank; ++d) shape += (d ? ", " : "") + std::to_string(t.sizes[d]);
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " [", shape, "] spans more than 2^", kMaxViewLog2,
                 " elements or bytes");
  }
  if (need_data && !t.data) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".data is null");
  return Status::Ok();
}

Status check_disjoint(const char* op, const char* name, const TensorView& t) {
  int dims[kMaxRank];
  int n = 0;
  for (int d = 0; d < t.rank; ++d)
    if (t.sizes[d] > 1) dims[n++] = d;
  for (int i = 1; i < n; ++i)  // insertion sort by stride (at most kMaxRank dims)
    for (int j = i; j > 0 && t.strides[dims[j]] < t.strides[dims[j - 1]]; --j) std::swap(dims[j], dims[j - 1]);
  int64_t span = 0;  // elements from the first to the last along the dims so far
  for (int i = 0; i < n; ++i) {
    const int d = dims[i];
    if (t.strides[d] == 0)
      return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[", d, "]=0 repeats its elements along dim ", d,
                   " (size ", t.sizes[d], ")");
    if (t.strides[d] <= span)
      return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[", d, "]=", t.strides[d],
                   " makes elements overlap (it must exceed ", span, ", the span of the dims with smaller strides)");
    span += (t.sizes[d] - 1) * t.strides[d];  // no overflow after check_view
  }
  return Status::Ok();
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (sizes[i] != 1 && strides[i] != expect) return false;
    expect *= sizes[i];
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
