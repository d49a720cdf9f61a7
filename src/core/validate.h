// Checks every op runs on each of its tensor views before it looks at their shapes.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "optx/runtime.h"
#include "optx/status.h"
#include "optx/tensor.h"

namespace optx {

// A view may span at most 2^kMaxViewLog2 elements and bytes: far from int64's end, so
// the sizes, offsets and products an op computes from it (rows x heads, tokens x top-k,
// bytes per panel) cannot overflow.
inline constexpr int kMaxViewLog2 = 48;
inline constexpr int64_t kMaxViewElements = int64_t(1) << kMaxViewLog2;
inline constexpr int64_t kMaxViewBytes = int64_t(1) << kMaxViewLog2;

// A rank in [0, kMaxRank], sizes and strides >= 0, an element count and a byte extent
// (first to last element) within 2^kMaxViewLog2, and data unless the view has no
// elements. An empty view (not given) passes: whether an argument is optional is the
// op's to check. The error names op, the argument and the offending value. need_data
// false: the shape alone (workspace-size queries take views without data).
Status check_view(const char* op, const char* name, const TensorView& t, bool need_data = true);

// For outputs (after check_view): no two elements share an address, so threads writing
// different elements never race. Sufficient test: with the dims of size > 1 in order of
// stride, each stride exceeds the span of the dims inside it.
Status check_disjoint(const char* op, const char* name, const TensorView& t);

// Whether two checked views may share a byte. Exact when each view's dims after the first
// are dense (rows of a buffer, also column slices of one buffer: k and v heads of a fused
// qkv row, or the halves of a [T, 2H] buffer, with one row stride); otherwise by the byte
// spans from first to last element, which may also report views that only interleave.
bool views_overlap(const TensorView& a, const TensorView& b);

// A named argument of check_apart.
struct NamedView {
  const char* name;
  const TensorView& t;
};

// Each output shares no byte with another output or with an input (empty views skipped):
// outputs are written by several threads while the inputs, index tensors among them, are
// still being read, so an overlap would race or read what was already written (an index
// overwritten after its check could address outside the output). The error names both.
Status check_apart(const char* op, std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs);

// The workspace the caller sized with size_fn (named in the message): fewer bytes than the
// call needs (kWorkspaceTooSmall), or a null address for a need of any bytes.
Status check_workspace(const char* op, const char* size_fn, Workspace ws, size_t need);

// The first `used` bytes of the caller's workspace (the bytes the call writes, at most what
// its size query asks for) as a byte view for check_apart, empty without data: an op writes
// them while its inputs are read and its outputs written, so they count as an output. Bytes
// past them are the caller's (an arena that also holds the outputs).
TensorView workspace_view(Workspace ws, size_t used);

// dst written in place over src (same data, strides and dtype: element i of dst replaces
// element i of src after that is read), or apart from it. The error names both.
Status in_place_or_apart(const char* op, const TensorView& dst, const char* dst_name, const TensorView& src, const char* src_name);

// A paged cache's tables: block_tables i32 [B, max_blocks] with contiguous, non-overlapping
// rows (B < 0: taken from block_tables), seq_lens contiguous i32 [B], block_size >= 1;
// every length in [min_len, max_blocks * block_size] (min_name: what the lower bound is,
// for the error) and every block id a sequence uses in [0, num_slots / block_size).
// Checked before any kernel reads a table, so no id can address outside the cache.
// total: the sum of the lengths, if not null.
Status check_block_tables(const char* op, const TensorView& tables, const TensorView& lens, int64_t B, int64_t block_size,
                          int64_t num_slots, int64_t min_len, const char* min_name, int64_t* total = nullptr);

}  // namespace optx
