// Internal pieces of the GEMM family shared by the driver, packing, tests and tools.
#pragma once

#include <cstdint>

#include "dispatch/registry.h"
#include "optx/gemm.h"

namespace optx::gemm_detail {

// Writes rows [k0, k0 + kc) of column panel j of B into dst in the packed panel format
// (see PackedMatrix), zero-filling columns past N and, for bf16, the odd half of a final
// incomplete pair. k0 is even for bf16. b is [N, K] or, with kn, [K, N].
// fast: the kernels' vector packer for bf16 and f32 (KernelTable::pack_panel_fast), tried first.
using PackPanelFn = bool (*)(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, void* dst);
void pack_panel(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, void* dst, PackPanelFn fast = nullptr);
// The packed layout of an N x K matrix of dtype (no data): K padded to whole AMX k-steps
// for bf16 so tile loads never leave a panel; strip_kc > 0 (f32): the strip layout.
PackedMatrix packed_layout(DType dtype, int64_t n, int64_t k, int64_t strip_kc = 0);
// A packed matrix the caller built (weights packed once and stored, then mapped back):
// its k_padded and panel_bytes must be packed_layout's for its dtype, n and k, and data
// kAlign-aligned, since the kernels read k rows inside each k_padded-row panel with
// aligned vector loads. Errors name op and the argument `name`.
Status check_packed_layout(const char* op, const char* name, const PackedMatrix& m);

// A checked packed matrix's panels, and its i8 scales (64 per panel; empty otherwise), as
// byte / f32 views for check_apart.
TensorView packed_bytes(const PackedMatrix& m);
TensorView packed_scales(const PackedMatrix& m);
// One K block of kc rows of a strip-layout f32 panel (four [kc][16] strips at src) as a
// [kc][64] panel block at dst: for kernels that do not run strips.
void strips_to_panel(const float* src, int64_t kc, float* dst);
// Panel j of an f32 B in the strip layout (K blocks of kc rows): each block through
// `fast` (KernelTable::pack_strips, vector loads and transposes) where it takes B's
// strides, else an element loop.
using PackStripsFn = bool (*)(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, float* dst);
void pack_strip_panel(const TensorView& b, bool kn, int64_t j, int64_t kc, float* dst, PackStripsFn fast);
struct KernelTable;
// The kernel table of the gemm implementation selected on this CPU (null for the
// reference): what pack_weights' kAuto layout and its strip packing follow.
const KernelTable* selected_table();
// 64 per-column scales of panel j (zero past N).
void pack_scales(const TensorView& scales, int64_t j, float* dst);

// Validation shared by gemm() and gemm_workspace_size().
// need_data = false checks shapes, dtypes and strides only (workspace size queries).
Status validate(const GemmParams& p, bool need_data = true);

using GemmFn = Status (*)(const GemmParams&, Workspace);
const dispatch::Registry<GemmFn>& registry();
// Validates, checks the workspace, and runs one given implementation (tests, verify, bench).
Status run_impl(const dispatch::Impl<GemmFn>& impl, const GemmParams& p, Workspace ws);

// Reference: double accumulation, reads B through its unpacked view or PackedMatrix::at.
Status gemm_reference(const GemmParams& p, Workspace ws);

}  // namespace optx::gemm_detail
