// View checks shared by every op (see validate.h).
#include "core/validate.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace optx {

Status check_view(const char* op, const char* name, const TensorView& t, bool need_data) {
  if (t.rank < 0 || t.rank > kMaxRank)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".rank=", t.rank, " is outside [0, ", kMaxRank, "]");
  if (t.empty()) return Status::Ok();  // not given: whether it may be is the op's call
  // An enum value outside DType (a cast from an integer) has no element size: it would pass
  // the extent check below as zero bytes and then reach every dtype switch of the op.
  if (dtype_size(t.dtype) == 0)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".dtype=", static_cast<int>(t.dtype), " is not a DType");
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
  for (int d = 0; d < t.rank; ++d)  // nothing is written: make_view gives the dims above an empty one stride 0
    if (t.sizes[d] == 0) return Status::Ok();
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

namespace {

// A view as rows: `rows` runs of `row` bytes, `ld` bytes apart (one run if rows == 1).
struct Rows {
  int64_t rows, ld, row;
};

bool as_rows(const TensorView& t, Rows* r) {
  const int64_t es = int64_t(dtype_size(t.dtype));
  if (t.rank == 0) {
    *r = {1, 0, es};
    return true;
  }
  int64_t inner = 1;  // dims 1.. must be dense
  for (int d = t.rank - 1; d >= 1; --d) {
    if (t.sizes[d] > 1 && t.strides[d] != inner) return false;
    inner *= t.sizes[d];
  }
  *r = {t.sizes[0], t.sizes[0] > 1 ? t.strides[0] * es : 0, inner * es};
  if (r->rows > 1 && r->ld == r->row) *r = {1, 0, r->rows * r->row};  // dense: one run
  return true;
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

int64_t span_bytes(const TensorView& t) {
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.sizes[d] - 1) * t.strides[d];
  return (last + 1) * int64_t(dtype_size(t.dtype));
}

}  // namespace

bool views_overlap(const TensorView& a, const TensorView& b) {
  if (a.empty() || b.empty() || a.numel() == 0 || b.numel() == 0) return false;
  // b's first byte minus a's (views are within 2^48 bytes, so the difference of two
  // addresses of one process does not overflow).
  const int64_t d = int64_t(reinterpret_cast<uintptr_t>(b.data) - reinterpret_cast<uintptr_t>(a.data));
  Rows ra, rb;
  if (as_rows(a, &ra) && as_rows(b, &rb) && (ra.rows == 1 || rb.rows == 1 || ra.ld == rb.ld)) {
    // Row i of a starts at i*ld, row j of b at d + j*ld: they meet when x = d + (j - i)*ld
    // lies in (-rb.row, ra.row). x grows with k = j - i, so the first k past the lower
    // bound decides.
    const int64_t ld = ra.rows > 1 ? ra.ld : rb.ld;
    const int64_t k_min = -(ra.rows - 1), k_max = rb.rows - 1;
    if (ld == 0 || k_min == k_max) return d > -rb.row && d < ra.row;
    const int64_t k = std::max(k_min, floor_div(-rb.row - d, ld) + 1);
    return k <= k_max && d + k * ld < ra.row;
  }
  return d < span_bytes(a) && -d < span_bytes(b);
}

Status check_apart(const char* op, std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (auto p = o + 1; p != outputs.end(); ++p)
      if (views_overlap(o->t, p->t))
        return Error(StatusCode::kInvalidArgument, op, ": ", o->name, " and ", p->name, " overlap (outputs must not share memory)");
    for (const NamedView& in : inputs)
      if (views_overlap(o->t, in.t))
        return Error(StatusCode::kInvalidArgument, op, ": ", o->name, " overlaps ", in.name,
                     " (an output must not share memory with an input)");
  }
  return Status::Ok();
}

TensorView workspace_view(Workspace ws, size_t used) {
  const size_t bytes = std::min({ws.bytes, used, size_t(kMaxViewBytes)});
  if (!ws.data || bytes == 0) return {};
  return make_view(ws.data, DType::kI8, {int64_t(bytes)});
}

Status in_place_or_apart(const char* op, const TensorView& dst, const char* dst_name, const TensorView& src, const char* src_name) {
  if (!views_overlap(dst, src)) return Status::Ok();
  bool same = dst.data == src.data && dst.dtype == src.dtype && dst.rank == src.rank;
  for (int i = 0; same && i < dst.rank; ++i) same = dst.sizes[i] == src.sizes[i] && (dst.sizes[i] == 1 || dst.strides[i] == src.strides[i]);
  if (same) return Status::Ok();
  return Error(StatusCode::kInvalidArgument, op, ": ", dst_name, " overlaps ", src_name, " without being ", src_name,
               " itself (same data, dtype and strides)");
}

Status check_block_tables(const char* op, const TensorView& tables, const TensorView& lens, int64_t B, int64_t block_size,
                          int64_t num_slots, int64_t min_len, const char* min_name, int64_t* total) {
  OPTX_RETURN_IF_ERROR(check_view(op, "block_tables", tables));
  OPTX_RETURN_IF_ERROR(check_view(op, "seq_lens", lens));
  const std::string b_str = B < 0 ? std::string("B") : "B=" + std::to_string(B);
  if (B < 0) B = tables.sizes[0];
  if (tables.rank != 2 || tables.dtype != DType::kI32 || tables.sizes[0] != B || (tables.sizes[1] > 1 && tables.strides[1] != 1) ||
      (B > 1 && tables.strides[0] < tables.sizes[1]))
    return Error(StatusCode::kInvalidArgument, op, ": block_tables must be i32 [", b_str, ", max_blocks] with contiguous rows, got ",
                 dtype_name(tables.dtype), " rank ", tables.rank, " sizes [", tables.sizes[0], ", ", tables.sizes[1], "] strides [",
                 tables.strides[0], ", ", tables.strides[1], "]");
  if (lens.rank != 1 || lens.dtype != DType::kI32 || lens.sizes[0] != B || (B > 1 && lens.strides[0] != 1))
    return Error(StatusCode::kInvalidArgument, op, ": seq_lens must be contiguous i32 [B=", B, "], got ", dtype_name(lens.dtype),
                 " rank ", lens.rank, " sizes[0]=", lens.sizes[0], " strides[0]=", lens.strides[0]);
  if (block_size < 1) return Error(StatusCode::kInvalidArgument, op, ": block_size=", block_size, " must be >= 1");
  const int64_t num_blocks = num_slots / block_size, max_blocks = tables.sizes[1];
  const int32_t* t = static_cast<const int32_t*>(tables.data);
  const int32_t* l = static_cast<const int32_t*>(lens.data);
  int64_t sum = 0;
  for (int64_t b = 0; b < B; ++b) {
    // In blocks: max_blocks * block_size may pass int64 for a huge block_size.
    if (l[b] < min_len || l[b] / block_size + (l[b] % block_size != 0) > max_blocks)
      return Error(StatusCode::kInvalidArgument, op, ": seq_lens[", b, "]=", l[b], " must be >= ", min_name, *min_name ? "=" : "",
                   min_len, " and fit max_blocks=", max_blocks, " blocks of block_size=", block_size);
    for (int64_t j = 0; j * block_size < l[b]; ++j) {
      const int32_t id = t[b * tables.strides[0] + j];
      if (id < 0 || id >= num_blocks)
        return Error(StatusCode::kInvalidArgument, op, ": block_tables[", b, "][", j, "]=", id, " is outside [0, ", num_blocks,
                     ") (num_slots=", num_slots, " / block_size=", block_size, ")");
    }
    sum += l[b];
  }
  if (total) *total = sum;
  return Status::Ok();
}

Status check_workspace(const char* op, const char* size_fn, Workspace ws, size_t need) {
  if (ws.bytes < need)
    return Error(StatusCode::kWorkspaceTooSmall, op, ": workspace.bytes=", ws.bytes, " but ", size_fn, "()=", need, " (at ", num_threads(),
                 " threads)");
  if (need > 0 && !ws.data) return Error(StatusCode::kInvalidArgument, op, ": workspace.data is null (workspace.bytes=", ws.bytes, ")");
  return Status::Ok();
}

}  // namespace optx
