// GEMM: validate -> plan (blocking, thread split, workspace) -> dispatch -> blocked driver.
//
// Loop nest per thread (B panels are 64 columns wide, see PackedMatrix):
//   for each chunk of mc rows of A          (A chunk, mc x K, sized to stay in L2)
//     for each of the thread's panels j     (C chunk mc x 64 accumulates in f32 scratch)
//       for each K block of kc              (B micro-panel kc x 64 <= 32 KiB: stays in L1)
//         for each 6-row slice of the chunk: microkernel 6 x 64 x kc
//       epilogue: alpha, per-channel scale, beta * C, bias, conversion -> C
// The B micro-panel is reused mc/6 times from L1 and each A chunk is read from L2 once per
// panel (units with KernelTable::f32_strip run each K block as four 16-column strips over
// all row slices instead, the slices cut as evenly as the 6-row panels allow: see compute
// in run_thread and RowSlices); every output element is reduced
// over K in the same order whatever the thread count, so results are bitwise independent
// of it.
//
// Threads split the row chunks (M), sized so each thread gets the same number; decode
// (M <= 16) and too-few-chunk cases split the panels (N) instead, so each thread streams
// whole packed panels, the memory-bound case (up to kMR rows the threads claim groups of
// panels as they go rather than fixed halves; see ThreadRange).
#include "ops/gemm/gemm_internal.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <type_traits>
#include <utility>

#include "core/log.h"
#include "core/validate.h"
#include "numerics/denormals.h"
#include "ops/gemm/gemm_kernels.h"

namespace optx {
namespace gemm_detail {
namespace {

constexpr const char* kOp = "gemm";
constexpr int64_t kDpKc = 2048;  // K block of the packed vdpbf16ps path (see run_thread)
constexpr int64_t kL2Budget = 1 << 20;  // bytes of a packed A chunk: half of a 2 MiB L2
// An unpacked B panel is packed this many bytes of K rows at a time (whole K blocks), not
// a K block (kc = 256: 512 bytes of each of its 64 rows) at a time: the packer reads 8 B
// rows at once, and runs of 512 bytes ended before the prefetchers ramped up. bf16 / f32
// N = 10944, K = 2048 (B from DRAM), 2 threads, alternating in one process: M = 9
// 3.01 -> 2.22 / 6.24 -> 4.85 ms, M = 16 3.59 -> 2.78 / 7.48 -> 6.14; B in L3 (N = 2048)
// level.
constexpr int64_t kPackChunkBytes = 256 << 10;
constexpr int64_t kDecodeRows = 16;
constexpr int64_t kUnpackedOneChunk = 3;  // make_plan: the panel split's row limit for unpacked B, in L2 chunks
constexpr int64_t kUnpackedOneChunkAmx = 6;  // the same for the AMX tiles
constexpr int64_t kI8DpMinRows = 8;  // bf16 A x int8 B on the dot product from this many rows (dp_shape)
constexpr int64_t kAmxMinRows = 4;
constexpr int64_t kGemvRowsAmx = 6;  // unpacked bf16 [N, K] rows the streaming kernels take on AMX hosts (streaming_gemv)

int64_t b_rows_n(const GemmParams& p) {
  if (p.packed_b) return p.packed_b->n;
  return p.b_kn ? p.b.sizes[1] : p.b.sizes[0];
}
DType b_dtype(const GemmParams& p) { return p.packed_b ? p.packed_b->dtype : p.b.dtype; }

// The calls a unit with a dot-product kernel runs on it: bf16 A times bf16 B, or times
// int8 B from kI8DpMinRows rows (each int8 K block widened to bf16 pairs; see run_blocked).
bool dp_shape(const GemmParams& p) {
  const DType bt = b_dtype(p);
  return p.a.dtype == DType::kBF16 && (bt == DType::kBF16 || (bt == DType::kI8 && p.a.sizes[0] >= kI8DpMinRows));
}

// Sizes, strides and extent (check_view); data is checked by validate where the call
// needs it — the workspace query does not.
Status check_strides(const TensorView& t, const char* name) { return check_view(kOp, name, t, /*need_data=*/false); }

struct Plan {
  int64_t M = 0, N = 0, K = 0, panels = 0;
  // SwiGLU pairs gate panel j with up panel j + out_panels; threads split output panels.
  bool swiglu = false;
  int64_t out_panels = 0, n_out = 0;
  int64_t kc = 0, mc = 0, n_ic = 0;
  int64_t kpack = 0;  // unpacked B: K rows packed into bbuf at once (a multiple of kc)
  int64_t mc_ws = 0;  // rows the buffers are sized for: the chunk cap, not the balanced mc
  int threads = 1;
  bool split_n = true;
  int64_t k_even = 0;   // K rounded up to even: packed A is zero-padded to pairs
  bool amx = false;     // AMX blocks: mc in 32-row units, packed A padded to 16 rows and 32 k
  int64_t k32 = 0, lda_amx = 0;
  size_t acc_off = 0, up_off = 0, bbuf_off = 0, wbuf_off = 0, pbuf_off = 0, scale_off = 0, apack_off = 0, per_thread = 0;  // up_off: SwiGLU
};

// Row counts whose K blocks run as 16-column strips over all row slices (KernelTable::
// f32_strip), each strip widened (f32: copied) once into L1: two full slices, or for
// bf16 / i8 weights one full slice and at least two more rows. A 6-row slice plus a
// remainder otherwise widens every block twice, in both slices' FMA loops; one thread,
// bf16 weights N = K = 2048, alternating in one process: M = 10 (6 + 4) +13 to +20%,
// M = 8, 9, 11 -2 to +3%, M = 7 (6 + 1) -13%, and f32 (a plain copy, nothing to save)
// M = 8 / 10 -25% / -32%. With even slices (stop 27), M = 7 as 4 + 3 strips measured -3% to
// +2% against the widening kernel's 6 + 1, so 7 rows stay there.
inline bool strip_rows(DType bt, int64_t rows) { return rows >= 2 * kMR || (bt != DType::kF32 && rows >= kMR + 2); }

// Row counts whose bf16 / int8 K blocks are widened once into an f32 panel for all row
// slices (KernelTable::widen_panel): four slices or more. Packed N = K = 4096, 2 threads,
// Ice Lake, alternating in one process against the in-loop widening: bf16 M = 12 / 16
// 0.85x / 0.90x, 24 / 32 level, 48 / 96 1.10x / 1.12x, 256 1.08x, 2048^3 1.16-1.21x;
// int8 M = 8 / 12 / 16 0.83x / 0.94x / 0.93x, 24 / 64 / 256 1.09x / 1.17x / 1.14x.
inline bool wide_rows(DType bt, int64_t rows) { return bt != DType::kF32 && rows >= 4 * kMR; }

// The workspace size does not depend on the implementation: packed A is sized as f32, or
// as bf16 pairs for a dot-product kernel's plan (dp), whose chunks then hold twice the rows.
// strips: the kernels run widened K blocks as 16-column strips (KernelTable::f32_strip).
// wide: they widen bf16 / int8 K blocks into whole f32 panels (KernelTable::widen_panel).
Plan make_plan(const GemmParams& p, bool amx, bool strips, bool dp = false, bool wide = false) {
  Plan pl;
  pl.amx = amx;
  pl.M = p.a.sizes[0];
  pl.K = p.a.sizes[1];
  pl.N = b_rows_n(p);
  pl.panels = (pl.N + kNR - 1) / kNR;
  pl.swiglu = p.activation == GemmActivation::kSwiglu;
  pl.out_panels = pl.swiglu ? pl.panels / 2 : pl.panels;
  pl.n_out = pl.swiglu ? pl.N / 2 : pl.N;
  const DType bt = b_dtype(p);
  // kc: B micro-panel of kc x 64 elements <= 32 KiB so it stays in a 48 KiB L1D; with
  // strips, a strip of kc x 16 f32 (16 KiB at 256) in a 32 KiB one (f32 2048^3 on Zen 3,
  // alternating in one process: strips at kc = 128 / 192 / 256 / 384 within 2% of each
  // other, 256 the most consistent).
  // wide: f32's block, since the kernel is f32's.
  const bool wide_plan = wide && !amx && !strips && !dp && wide_rows(bt, pl.M);
  int64_t kc = (bt == DType::kF32 || wide_plan) && !strips ? kF32Kc : kStripKc;
  // A single row slice reuses nothing from L1: run the whole K in one call instead, unless
  // B must be packed on the fly (the buffer would grow with K).
  if (pl.M <= kMR && p.packed_b) kc = std::max<int64_t>(pl.K, 1);
  // Strip-layout weights come in K blocks of their own (a kernel without strips rebuilds
  // each as a panel block in bbuf, so it takes the same blocks).
  const int64_t strip_kc = p.packed_b ? p.packed_b->strip_kc : 0;
  if (strip_kc > 0) kc = strip_kc;
  pl.kc = kc;
  pl.k32 = (pl.K + kAmxK - 1) / kAmxK * kAmxK;
  // Packed A row stride for AMX: 64 bytes more than k32 so the 16 rows of an A tile do
  // not share one L1 set (a row stride that is a multiple of 4 KiB puts all 16 in the same
  // 12-way set).
  pl.lda_amx = pl.k32 + kAmxK;
  const int T = std::max(1, num_threads());
  // Row chunks: the largest whose packed A fits the L2 budget, then shrunk so that the
  // chunk count is a multiple of the thread count (equal work per thread).
  auto balanced = [&](int64_t mc_max, int64_t unit) {
    const int64_t per_thread = (pl.M + int64_t(T) * mc_max - 1) / (int64_t(T) * mc_max);
    const int64_t mc = (pl.M + int64_t(T) * per_thread - 1) / (int64_t(T) * per_thread);
    return std::min((mc + unit - 1) / unit * unit, mc_max);
  };
  // The same aim for the AMX plan's 32-row chunks, where rounding up to the unit breaks
  // it: M = 2048 in 224-row chunks is 9 full ones and a 32-row one, 1120 rows on one
  // thread and 928 on the other. Instead the height (a unit multiple up to mc_max) whose
  // busiest thread gets the fewest rows; ties to the taller chunk (B re-streamed less).
  // Packed bf16, 2 threads, Sapphire Rapids VM, old / new builds alternating: 2048^3 224
  // -> 128 rows 1.08-1.15x, M = 1024 N = K = 2048 192 -> 128 1.14-1.18x, M = 1000
  // 1.11-1.15x; N = K = 4096 M = 1024 (96 -> 64), M = 4096 K = 1024 and K = 1408 level.
  auto even_chunks = [&](int64_t mc_max, int64_t unit) {
    int64_t best = mc_max, best_rows = INT64_MAX;
    for (int64_t mc = mc_max; mc >= unit; mc -= unit) {
      const int64_t chunks = (pl.M + mc - 1) / mc, rows = (chunks + T - 1) / T * mc;
      if (rows < best_rows) best = mc, best_rows = rows;
    }
    return best;
  };
  // The panel split (the else branch below says why): all rows in one chunk of m_all where
  // they fit `chunks` L2 chunks of mc rows (a packed B: one) and the panels split evenly
  // enough. The buffers stay sized for that many rows past it, so the workspace never
  // shrinks as M grows.
  auto panel_split = [&](int64_t mc, int64_t m_all, int64_t chunks) {
    const int64_t most = p.packed_b ? mc : chunks * mc;
    if (pl.M <= most && pl.out_panels >= 4 * T) pl.mc = m_all;
    pl.mc_ws = std::min(most, m_all);
  };
  if (amx) {  // packed bf16 A chunk of 1 MiB, 32-row multiples
    int64_t mc = kL2Budget / std::max<int64_t>(pl.lda_amx * 2, 1);
    mc = std::clamp<int64_t>(mc / kAmxRows * kAmxRows, kAmxRows, 8 * kAmxRows);
    const int64_t m16 = (pl.M + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows;
    pl.mc = std::min(even_chunks(mc, kAmxRows), m16);
    // An unpacked B takes the panel split up to kUnpackedOneChunkAmx chunks' rows: the row
    // split's serial pass that packs all of B into the workspace weighs more beside tiles
    // that run the products ~8x faster than the vector units. bf16 N = K = 4096, 2
    // threads, Sapphire Rapids VM, alternating in one process, outputs bitwise equal: M =
    // 64 / 128 / 192 / 256 / 320 / 384 / 512 1.85 / 1.68 / 1.40 / 1.27 / 1.21 / 1.09 /
    // 1.07x; M = 576 level. Packed weights take it up to one chunk's rows, as on the
    // vector plan: the row split had each thread stream all of B. Packed bf16, 2 threads,
    // alternating in one process: cold weights (64 matrices of 2816 x 2048 in turn) M =
    // 64 / 96 / 128 / 200 1.00-1.12 / 1.09-1.11 / 1.24 / 1.09-1.11x, M = 224 and M <= 32
    // level; weights from L3 M = 96 1.48x, N = K = 4096 M = 64 1.30x.
    panel_split(mc, m16, kUnpackedOneChunkAmx);
  } else if (pl.M <= kDecodeRows) {
    pl.mc = pl.mc_ws = std::max<int64_t>(pl.M, 1);
  } else {
    // A chunk of bf16 pairs (dp) holds twice the f32 rows in the same L2 budget: each row
    // chunk streams all of B (the row split), so half as many chunks read B half as often.
    // bf16 N = 4096, 2 threads, alternating in one process: M = 256 K = 4096 / 7168 +9%,
    // int8 weights M = 64 / 256 K = 4096 +14% / +11%, M >= 512 level.
    const int64_t a_bytes = dp ? int64_t(sizeof(uint16_t)) : int64_t(sizeof(float));
    const int64_t m_up = (pl.M + kMR - 1) / kMR * kMR;
    int64_t mc = kL2Budget / std::max<int64_t>(pl.K * a_bytes, 1);
    mc = std::clamp<int64_t>(mc / kMR * kMR, 4 * kMR, 32 * kMR);
    // (Not even_chunks: at a unit of kMR rows its fewest-rows-on-the-busiest-thread rule
    // picks chunks as small as 12 rows, M = 1024, each of which streams all of B.)
    pl.mc = std::min(balanced(mc, kMR), m_up);
    // All rows in one chunk where they fit and the panels split evenly enough: the threads
    // then split N, each streaming only its share of B (and packing each panel of an
    // unpacked B once, into L2), where the row split has every thread stream all of B (an
    // unpacked one packed once per call into the workspace first). N = 2048 / 10944,
    // K = 2048, 2 threads, alternating in one process: packed bf16 M = 32 / 64
    // +10-19% / +11-12%, f32 +11-12%; unpacked bf16 M = 64 +31-44%, f32 M = 32 / 64 +35%
    // / +29%. Balancing the row split needs a multiple of T chunks, which is why this is
    // only for one chunk.
    // An unpacked B takes the panel split up to kUnpackedOneChunk times the L2 budget's
    // rows: A then streams from L3 beside each panel's packed K chunk, 64 flops per byte
    // of A (3.6 GB/s per core at the dot product's rate), where the row split would pack
    // all of B into the workspace first, a serial pass that writes it back to DRAM and
    // reads it again per row chunk. N = 4096, K = 4096, 2 threads, alternating in one
    // process: bf16 M = 128 / 160 / 192 / 256 +17 / +15 / +7 / +7%, f32 M = 64 / 100 /
    // 150 +36 / +24 / +27%; M = 384 / 512 level (the A packing each thread repeats then
    // costs what the row split's pass did). Packed weights gain nothing from it (±3%).
    panel_split(mc, m_up, kUnpackedOneChunk);
  }
  pl.n_ic = (pl.M + pl.mc - 1) / pl.mc;

  // Buffers are sized for mc_ws >= mc: balancing can shrink mc for one M and not for a
  // larger one, and callers that size one workspace for many shapes (grouped GEMM) need
  // the workspace to grow monotonically with M.

  // Split the row chunks when there are enough: each thread packs only its own A and
  // streams all of B from L3 (measured 2 threads, f32 2048^3: 293-299 vs 287-290 GFLOP/s
  // splitting N, where both threads pack every A chunk). Decode splits N: each thread
  // then streams its own contiguous run of weights.
  if (pl.M <= kDecodeRows || pl.n_ic < T) {
    pl.split_n = true;
    pl.threads = int(std::max<int64_t>(1, std::min<int64_t>(T, pl.out_panels)));
  } else {
    pl.split_n = false;
    pl.threads = int(std::min<int64_t>(T, pl.n_ic));
  }

  size_t off = 0;
  // acc tiles of >= 2 kGemv2MaxRows rows (gemv4: 4 panels x 1 row; gemv2: 2 panels x up
  // to kGemv2MaxRows rows); SwiGLU keeps the up tile right after the gate tile.
  const size_t acc_bytes = size_t(std::max<int64_t>(pl.mc_ws, 2 * kGemv2MaxRows)) * kNR * sizeof(float);
  pl.acc_off = off;
  pl.up_off = off + acc_bytes;
  off = align_up(off + acc_bytes * (pl.swiglu ? 2 : 1));
  pl.bbuf_off = off;
  if (strip_kc > 0) {  // strips_to_panel
    off = align_up(off + size_t(std::clamp<int64_t>(pl.K, 1, kc)) * kNR * sizeof(float));
  } else if (!p.packed_b) {
    const int64_t chunk = std::max<int64_t>(1, kPackChunkBytes / (kNR * int64_t(dtype_size(bt))) / kc) * kc;
    pl.kpack = std::min(chunk, (std::max<int64_t>(pl.K, 1) + kc - 1) / kc * kc);
    const int64_t rows = amx ? pl.k32 : pl.kpack + 1;  // AMX packs whole panels
    size_t bytes = size_t(rows) * kNR * dtype_size(bt);
    if (!amx && strips && strip_rows(bt, pl.M)) bytes = std::max(bytes, size_t(pl.kc) * kNR * sizeof(float));  // pack_strips
    off = align_up(off + bytes);
  }
  // A K block's strip widened to f32 (KernelTable::widen_b) when row slices share it
  // (strip_rows: more than kMR rows, so kc is a K block, not all of K).
  pl.wbuf_off = off;
  if (!amx && strips && strip_rows(bt, pl.M)) off = align_up(off + size_t(pl.kc) * 16 * sizeof(float));
  if (wide_plan) off = align_up(off + size_t(pl.kc) * kNR * sizeof(float));  // widen_panel (kc even)
  // An int8 K block as bf16 pairs for the dot-product kernel (KernelTable::i8_pairs).
  pl.pbuf_off = off;
  if (!amx && bt == DType::kI8 && dp_shape(p)) off = align_up(off + size_t(pl.kc + 1) * kNR * sizeof(uint16_t));
  pl.scale_off = off;
  off = align_up(off + kNR * sizeof(float));
  pl.k_even = (pl.K + 1) / 2 * 2;
  pl.apack_off = off;
  if (amx)
    off = align_up(off + size_t(pl.mc_ws) * size_t(pl.lda_amx) * sizeof(uint16_t));
  else
    off = align_up(off + size_t((pl.mc_ws + kMR - 1) / kMR * kMR) * size_t(pl.k_even) * size_t(dp ? sizeof(uint16_t) : sizeof(float)));
  pl.per_thread = off;
  return pl;
}

// AMX runs bf16 x bf16 GEMMs from kAmxMinRows rows (padded to a 16-row tile); everything
// else uses the vector kernels. Measured, packed 2816 x 2048 weights cycling past the
// LLC, 2 threads: at M = 1 the vector GEMV streams faster (0.36-0.44 vs 0.47-0.53 ms),
// at M = 2-4 the two tie, and from M = 6 AMX stays memory-bound (0.51-0.56 ms flat up to
// M = 16) while the widening FMA kernel turns compute-bound (0.57 -> 1.22 ms at M = 16).
bool amx_eligible(const GemmParams& p) {
  return p.a.dtype == DType::kBF16 && b_dtype(p) == DType::kBF16 && p.a.sizes[0] >= kAmxMinRows;
}

// An unpacked f32 / bf16 B whose plan has several row chunks is packed once per call into
// the workspace, in pack_weights' layout, and the call then runs as a packed one:
// otherwise each panel is packed again for every row chunk (measured 2048^3, 2 threads:
// bf16 308 GFLOP/s unpacked vs 716 packed, f32 120 vs 208; gemm PERF_LOG.md). One chunk packs
// each panel once anyway; very large B would make the workspace huge.
constexpr int64_t kPackOnceMaxBytes = int64_t(64) << 20;

// f32 is viewed in the strip layout: the workspace is sized for it whatever the kernels
// (run_blocked packs panels where they do not run strips).
bool pack_once_view(const GemmParams& p, bool amx, bool dp, PackedMatrix* m) {
  if (p.packed_b || (p.b.dtype != DType::kF32 && p.b.dtype != DType::kBF16) || make_plan(p, amx, false, dp).n_ic < 2)
    return false;
  *m = packed_layout(p.b.dtype, b_rows_n(p), p.a.sizes[1], p.b.dtype == DType::kF32 ? kStripKc : 0);
  return m->n_panels() * m->panel_bytes <= kPackOnceMaxBytes;
}

// Sized for either plan so the caller's workspace does not depend on the implementation,
// and for every thread the caller allows (not only those this M keeps busy), so the size
// never shrinks as M grows: grouped GEMMs size one workspace from their largest group.
// + kAlign: the caller's buffer need not be aligned; kernels use aligned loads on B buffers.
size_t plan_workspace_bytes(const GemmParams& p) {
  size_t per = std::max({make_plan(p, false, false).per_thread, make_plan(p, false, true).per_thread,
                         make_plan(p, false, false, false, true).per_thread});
  if (dp_shape(p)) per = std::max(per, make_plan(p, false, false, true).per_thread);
  if (amx_eligible(p)) per = std::max(per, make_plan(p, true, false).per_thread);
  return per * size_t(std::max(1, num_threads())) + kAlign;
}

size_t blocked_workspace_bytes(const GemmParams& p) {
  PackedMatrix m;
  // Whichever plan the implementation that runs makes: FMA, dot product or AMX.
  if (!pack_once_view(p, false, false, &m) && !(dp_shape(p) && pack_once_view(p, false, true, &m)) &&
      !(amx_eligible(p) && pack_once_view(p, true, false, &m)))
    return plan_workspace_bytes(p);
  GemmParams q = p;
  q.b = {};
  q.packed_b = &m;
  // Never below the unpacked size, so the size stays monotonic in M across the switch.
  return std::max(plan_workspace_bytes(p), align_up(size_t(m.n_panels() * m.panel_bytes)) + plan_workspace_bytes(q));
}

// Calls whose A the streaming kernels can read as A^T pairs (KernelTable::gemv_pairs):
// bf16 A and B [N, K], K a multiple of 32.
bool pairs_shape(const GemmParams& p) {
  return p.a.dtype == DType::kBF16 && p.b.dtype == DType::kBF16 && !p.b_kn && p.a.sizes[1] % 32 == 0;
}

// Shapes the streaming decode kernels take where a unit has them (streaming_gemv): up to
// kGemvRowsM rows, or kGemvTileRowsM where A can be read as pairs.
bool streaming_shape(const GemmParams& p) {
  const DType bt = p.b.dtype;
  return !p.packed_b && p.activation == GemmActivation::kNone && p.a.sizes[0] <= (pairs_shape(p) ? kGemvTileRowsM : kGemvRowsM) &&
         p.b.strides[1] == 1 && (bt == DType::kF32 || bt == DType::kBF16);
}

// Row stride (elements) of the per-thread copy of A the [N, K] row kernels read, or 0 to
// read A in place. Each of their steps loads a vector from each of M rows of A beside NB
// rows of B. Rows a multiple of 1 KiB apart fall in 1-4 of the L1's 64 sets; from 4 rows
// on, A's and B's lines in a set outnumber its 8 ways and every step misses to L2 (8 A
// rows 8 KiB apart + 3 B rows on AVX-512). In the copy, rows are one line more than a
// multiple of 1 KiB apart, so they fall in distinct sets. It reads and writes M x K
// elements per thread, against N x K weights read: each thread writes the copy it reads,
// into its own core's caches, and none waits for another (one copy made before the fork
// and read by both: bf16 M = 8 in L3 ~5% slower). Zen 4, 2 threads, alternating in one
// process, K = 4096, N x K = 4M elements in L3: bf16 M = 6 / 8 309 -> 379 GFLOP/s (72% ->
// 88% of the dot peak), f32 M = 6 / 8 155 -> 189 / 59 -> 121; from DRAM (N = K = 4096, 8
// weight copies) bf16 M = 6 / 8 +7% / +10%, f32 M = 8 14.4 -> 24.2 GB/s. ([K, N] B copies
// A a block at a time already.)
int64_t gemv_a_stride(const GemmParams& p) {
  const int64_t M = p.a.sizes[0], es = int64_t(dtype_size(p.a.dtype));
  if (p.b_kn || M < 4 || M > kGemvRowsM || (p.a.strides[0] * es) % 1024 != 0) return 0;  // past 8 rows: the tiles
  const int64_t row = (p.a.sizes[1] * es + 63) / 64 * 64;
  return (row % 1024 == 0 ? row + 64 : row) / es;
}

size_t gemv_a_copy_bytes(const GemmParams& p) {
  return align_up(size_t(gemv_a_stride(p) * p.a.sizes[0]) * dtype_size(p.a.dtype));
}

// Whether this unit's gemv_rows reads A as pairs for the call (the AMX tiles).
bool reads_pairs(const GemmParams& p, const KernelTable& kt) { return kt.gemv_pairs && pairs_shape(p); }

// A^T pairs for gemv_rows kernels that read them (KernelTable::gemv_pairs), else 0.
size_t gemv_pairs_bytes(const GemmParams& p) {
  return pairs_shape(p) ? align_up(size_t((p.a.sizes[0] + 15) / 16) * size_t(p.a.sizes[1]) * 32) : 0;
}

// A thread's share of the streaming kernels' workspace: its copy of A, then its A^T pairs.
size_t gemv_thread_bytes(const GemmParams& p) { return gemv_a_copy_bytes(p) + gemv_pairs_bytes(p); }

// The blocked path's size, or the streaming path's if larger. That is sized at min(M,
// rows) rows for both streaming row limits, so the size never shrinks as M grows past a
// switch (a grouped GEMM sizes one workspace from its largest group).
size_t workspace_bytes(const GemmParams& p) {
  size_t bytes = blocked_workspace_bytes(p);
  for (const int64_t rows : {kGemvRowsM, kGemvTileRowsM}) {
    GemmParams q = p;
    q.a.sizes[0] = std::min(p.a.sizes[0], rows);
    if (streaming_shape(q)) bytes = std::max(bytes, gemv_thread_bytes(q) * size_t(std::max(1, num_threads())) + kAlign);
  }
  return bytes;
}

// A thread's share of the work: panels [p0, p1) of row chunks [ic0, ic1) — or, where a
// cursor is given, claimed from it as the thread goes (shared by the threads). The cores
// of this VM do not run at one speed: a core whose hyperthread sibling (another guest) is
// busy streams slower, and its tdpbf16ps took 10-11 ns against 6.5 on the other core
// (a tile microbenchmark, both threads at once). With fixed halves the call waits on the
// slower core: M = 1 bf16 4096^2 decode ran 6-23% apart per call.
//   panels: decode with one row chunk of at most kMR rows claims groups of panels;
//   chunks: the row split claims row chunks.
struct ThreadRange {
  int64_t p0, p1, ic0, ic1;
  std::atomic<int64_t>* panels = nullptr;
  std::atomic<int64_t>* chunks = nullptr;
};

// Work items [begin, end) a thread takes: its own range in order, or, with a cursor
// shared by the threads, whatever nobody has claimed yet (row chunks, panel groups).
class Claims {
 public:
  Claims(int64_t begin, int64_t end, std::atomic<int64_t>* cursor) : next_(begin), end_(end), cursor_(cursor) {}
  // [i0, i1): the next group of up to n (the last may be short); i0 == i1 when none are left.
  std::pair<int64_t, int64_t> next(int64_t n) {
    const int64_t i = cursor_ ? std::min(cursor_->fetch_add(n, std::memory_order_relaxed), end_) : next_;
    next_ = std::min(i + n, end_);
    return {i, next_};
  }
  // The next single item, or -1 when none is left.
  int64_t next_one() {
    const auto [i0, i1] = next(1);
    return i0 < i1 ? i0 : -1;
  }
  // Whether this thread may take another item after i (a prefetch hint: claimed items
  // can go to another thread).
  bool more(int64_t i) const { return cursor_ ? cursor_->load(std::memory_order_relaxed) < end_ : i + 1 < end_; }
  // The item this thread takes after i where that is known (its own range), else -1: the
  // generic kernel pulls the next panel's first block into L2 while finishing i.
  int64_t after(int64_t i) const { return !cursor_ && i + 1 < end_ ? i + 1 : -1; }

 private:
  int64_t next_, end_;
  std::atomic<int64_t>* cursor_;
};

ThreadRange range_for(const Plan& pl, int t, std::atomic<int64_t>* cursor = nullptr) {
  const int T = pl.threads;
  const int64_t P = pl.out_panels;
  if (cursor) return pl.split_n ? ThreadRange{0, P, 0, pl.n_ic, cursor, nullptr} : ThreadRange{0, P, 0, pl.n_ic, nullptr, cursor};
  if (pl.split_n) return {P * t / T, P * (t + 1) / T, 0, pl.n_ic};
  return {0, P, pl.n_ic * t / T, pl.n_ic * (t + 1) / T};
}

// Turns the finished f32 tile of rows [row0, row0 + m) x output panel j into C (with
// SwiGLU, acc is the gate tile and up the up tile).
// n_out: columns of C (Plan::n_out).
void epilogue_panel(const GemmParams& p, int64_t n_out, const KernelTable& kt, const float* acc,
                    int64_t row0, int m, int64_t j, const float* scales, const float* up = nullptr,
                    const float* up_scales = nullptr) {
  const size_t c_esize = dtype_size(p.c.dtype);
  EpilogueArgs e;
  e.acc = acc;
  e.m = m;
  e.ncols = int(std::min<int64_t>(kNR, n_out - j * kNR));
  e.c = static_cast<uint8_t*>(p.c.data) + (size_t(row0 * p.c.strides[0]) + size_t(j * kNR)) * c_esize;
  e.ldc = p.c.strides[0];
  e.c_dtype = p.c.dtype;
  e.alpha = p.alpha;
  e.beta = p.beta;
  e.bias = p.bias.data ? static_cast<const uint8_t*>(p.bias.data) + size_t(j * kNR) * dtype_size(p.bias.dtype) : nullptr;
  e.bias_dtype = p.bias.dtype;
  e.col_scale = scales;
  e.up = up;
  e.up_scale = up_scales;
  kt.epilogue(e);
}

// Packs rows [row0, row0 + rows) of A into kMR-row micro-panels (layout in gemm_kernels.h),
// widening bf16 to f32 unless the kernel takes bf16 pairs. Rows past `rows` and k past K
// are zero so the kernels need no tails. k-major, so the writes are one contiguous stream
// and a whole slice runs without per-element checks: the row-major order (writes kMR
// apart, a bounds test per element) was 4.5% of a 1-thread f32 2048^3 GEMM.
template <class T, class Src>
OPTX_ALWAYS_INLINE T widen(const Src* row, int64_t k) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Src, uint16_t>) return bf16_to_f32(row[k]);
  else return T(row[k]);
}

// A chunk's row slices, one kMR-row micro-panel each: kMR rows and a remainder, or (even)
// the same count of slices as level as they go, e.g. 8 rows as 4 + 4, 13 as 5 + 4 + 4.
// The strip kernel's time per k hardly falls below 4 rows (2m accumulator chains wait on
// the FMA latency; alone in L1, one core: 1.25 / 1.34 / 1.40 / 1.46 / 1.81 / 2.17 ns per k
// at m = 1 .. 6), so a 1-3-row remainder costs nearly what 4 rows do. In place, 2816 x
// 2048 bf16 weights, two builds alternating in one process (outputs bitwise equal): one
// thread from L3 M = 8 / 9 -10% / -7%; two threads from DRAM M = 14 -12%, 8-20 otherwise
// within +-4% (three slices' A panels and the 16 KiB strip overflow the 32 KiB L1, which
// then sets the pace); moe_forward T = 128 -1 to -2%.
struct RowSlices {
  int total, count, base, extra;
  RowSlices(int rows, bool even)
      : total(rows), count((rows + kMR - 1) / kMR), base(even && count ? rows / count : kMR),
        extra(even && count ? rows % count : 0) {}
  int first(int s) const { return s * base + std::min(s, extra); }
  int rows(int s) const { return std::min(base + (s < extra ? 1 : 0), total - first(s)); }
};

// vec_pairs (KernelTable::pack_a_pairs): the vector packer for whole bf16 pair slices.
template <class T, class Src>
void pack_a_panels(const Src* src, int64_t lda, const RowSlices& sl, int64_t K, int64_t k_even, bool pairs, T* dst,
                   PackAPairsFn vec_pairs = nullptr) {
  for (int sv = 0; sv < sl.count; ++sv) {
    const int rb = sl.first(sv);
    T* d = dst + int64_t(sv) * kMR * k_even;
    const int live = sl.rows(sv);
    const Src* row[kMR];
    for (int r = 0; r < kMR; ++r) row[r] = src + (rb + std::min(r, live - 1)) * lda;
    // Element (k, r) goes to d[idx(k, r)]; both orders below walk idx upwards.
    const auto idx = [&](int64_t k, int r) { return pairs ? ((k / 2) * kMR + r) * 2 + (k & 1) : k * kMR + r; };
    int64_t k = 0;
    if (live == kMR) {
      if (pairs) {
        // Pairs are the dot-product kernel's A, bf16 as it is (never widened): 16 pairs of
        // the six rows per step through the unit's permutes (vec_pairs), the rest one
        // 32-bit move per (pair, row). Packing took 2.1% of a 2-thread bf16 2048^3 GEMM on
        // Zen 4 with two 16-bit moves per pair and row, 1.5% with one 32-bit move, 0.8%
        // with the permutes. Other types leave it all to the tail loop below.
        if constexpr (std::is_same_v<T, uint16_t> && std::is_same_v<Src, uint16_t>) {
          if (vec_pairs) k = 2 * vec_pairs(row, K / 2, d);
          for (; k + 2 <= K; k += 2)
            for (int r = 0; r < kMR; ++r) std::memcpy(d + idx(k, r), row[r] + k, 4);
        }
      } else {
        for (; k < K; ++k)
          for (int r = 0; r < kMR; ++r) d[idx(k, r)] = widen<T>(row[r], k);
      }
    }
    // The tail pair, the zero pad to k_even, and the last (partial) slice.
    for (; k < k_even; ++k)
      for (int r = 0; r < kMR; ++r) d[idx(k, r)] = r < live && k < K ? widen<T>(row[r], k) : T(0);
  }
}

void run_thread(const Plan& pl, const GemmParams& p, const KernelTable& kt, bool use_dp, uint8_t* ws,
                const ThreadRange& r) {
  float* acc = reinterpret_cast<float*>(ws + pl.acc_off);
  float* acc_up = reinterpret_cast<float*>(ws + pl.up_off);
  void* bbuf = ws + pl.bbuf_off;
  float* wbuf = reinterpret_cast<float*>(ws + pl.wbuf_off);
  uint16_t* pbuf = reinterpret_cast<uint16_t*>(ws + pl.pbuf_off);
  float* sbuf = reinterpret_cast<float*>(ws + pl.scale_off);
  void* apack = ws + pl.apack_off;
  const DType bt = b_dtype(p);
  const size_t besize = dtype_size(bt);
  const KernelF32A kern = bt == DType::kF32 ? kt.f32b : bt == DType::kBF16 ? kt.bf16b : kt.i8b;
  const int64_t K = pl.K, lda = p.a.strides[0], ldc = p.c.strides[0];
  // Packed B in the strip layout (pl.kc = its K block): kernels with f32_strip read the
  // strips in place for every row count (no widen_b copy); others rebuild each block as a
  // panel block.
  const bool strip_layout = p.packed_b && p.packed_b->strip_kc > 0;
  const bool b_strips = strip_layout && kt.f32_strip;
  // Row slices that share a K block (strip_rows): it is widened (f32: copied) once, a
  // 16-column strip at a time, and run through f32_strip (see compute).
  auto strips = [&](int mrows) { return b_strips || (kt.widen_b && !use_dp && strip_rows(bt, mrows)); };
  // Row slices that share a bf16 / int8 K block widened once into an f32 panel (wide_rows).
  auto wide = [&](int mrows) { return kt.widen_panel && !use_dp && !strips(mrows) && wide_rows(bt, mrows); };
  // K block of the packed vdpbf16ps path: each block reloads and stores the 6 x 64 f32
  // tile (24 zmm) around its kernel call, so a longer block amortises that; the B block
  // then lives in L2, not L1, which the kernel's four B loads per 24 dot products do not
  // feel. bf16, 2 threads, Zen 4 (32 KiB L1D), builds alternating, both with the
  // direct-to-C last block: 2048^3 kc 256 405-410 GFLOP/s, 1024 393-423, 2048 426-435;
  // K = 7168 all of 256-4096 within 424-439. An unpacked B keeps pl.kc (its per-block
  // pack buffer is sized for it).
  const bool i8_dp = use_dp && bt == DType::kI8;  // int8 blocks become bf16 pairs in pbuf, pl.kc rows at a time
  const int64_t kblock = use_dp && p.packed_b && !i8_dp ? std::max(pl.kc, kDpKc) : pl.kc;
  // An identity epilogue (alpha 1, beta 0, no bias; f32 C from f32 B, bf16 B in strips,
  // or bf16 x bf16 on the dot-product kernel, which also rounds to a bf16 C itself):
  // the last K block stores whole panels straight into C, without the scratch round trip
  // and the epilogue pass (3% of a 1-thread f32 2048^3 GEMM; bf16 2.4%; bf16 C: 2.5% of the
  // samples of a 2-thread bf16 2048^3). Edge panels narrower than 64 keep the epilogue.
  const bool c_bf16 = p.c.dtype == DType::kBF16;
  const bool identity = !pl.swiglu && p.alpha == 1.0f && p.beta == 0.0f && !p.bias.data;
  auto direct_c = [&](int64_t row0, int mrows, int64_t j) -> void* {
    const bool dp_stores = use_dp && !i8_dp;  // f32 or bf16 C
    const bool f32_stores = bt == DType::kF32 ? kt.f32b_out || strips(mrows)
                                              : bt == DType::kBF16 && (strips(mrows) || (wide(mrows) && kt.f32b_out));
    const bool kernel_stores = dp_stores || (!c_bf16 && f32_stores);
    if (!identity || !kernel_stores || (j + 1) * kNR > pl.n_out) return nullptr;
    return static_cast<char*>(p.c.data) + size_t(row0 * ldc + j * kNR) * dtype_size(p.c.dtype);
  };

  Claims chunks(r.ic0, r.ic1, r.chunks);
  for (int64_t ic = chunks.next_one(); ic >= 0; ic = chunks.next_one()) {
    const int64_t row0 = ic * pl.mc;
    const int mrows = int(std::min(pl.mc, pl.M - row0));
    float* af = static_cast<float*>(apack);
    uint16_t* ab = static_cast<uint16_t*>(apack);
    const RowSlices sl(mrows, strips(mrows));  // the strip kernel takes any m: even slices there
    if (use_dp)
      pack_a_panels(static_cast<const uint16_t*>(p.a.data) + row0 * lda, lda, sl, K, pl.k_even, true, ab, kt.pack_a_pairs);
    else if (p.a.dtype == DType::kF32)
      pack_a_panels(static_cast<const float*>(p.a.data) + row0 * lda, lda, sl, K, pl.k_even, false, af);
    else
      pack_a_panels(static_cast<const uint16_t*>(p.a.data) + row0 * lda, lda, sl, K, pl.k_even, false, af);
    const int64_t up = pl.swiglu ? pl.out_panels : 0;  // SwiGLU: up panel of output j is j + up
    auto packed_scales = [&](int64_t jb) { return bt == DType::kI8 ? p.packed_b->scales + jb * kNR : nullptr; };
    // Single-row decode on packed weights: four panels per call (with SwiGLU: gate j, j+1
    // and up j, j+1, so two outputs per call), read as streams the kernel unit chooses
    // (AVX2: each panel as four quarter streams; AVX-512: the four panels in step, one
    // stream each).
    const Gemv4Fn gemv4 = bt == DType::kF32 ? kt.gemv4_f32 : bt == DType::kI8 ? kt.gemv4_i8b : kt.gemv4_bf16b;
    // The decode kernels only for a call whose rows are all in this chunk: they sum K in
    // their own stream order, so a larger call's last chunk of 1-6 rows (whose size
    // depends on the thread count) must take the K-ordered kernels its other chunks take,
    // or its rows would round differently at another thread count (AVX2, bf16 M = 17:
    // 12 + 5 rows at two threads, 23 elements 1 ulp apart from one thread's).
    const bool whole_call = mrows == pl.M;
    const bool use_gemv4 = whole_call && mrows == 1 && p.packed_b && gemv4 && !use_dp && !strip_layout;  // gemv4 reads [K][64] panels
    auto run_gemv4 = [&](int64_t j) {
      Gemv4Args g{.kc = K, .a = af, .b = {}, .acc = acc};
      for (int q = 0; q < 4; ++q) g.b[q] = p.packed_b->panel(pl.swiglu ? j + q % 2 + q / 2 * up : j + q);
      gemv4(g);
      for (int q = 0; q < (pl.swiglu ? 2 : 4); ++q) {
        if (pl.swiglu)
          epilogue_panel(p, pl.n_out, kt, acc + q * kNR, row0, 1, j + q, packed_scales(j + q), acc + (q + 2) * kNR,
                         packed_scales(j + q + up));
        else
          epilogue_panel(p, pl.n_out, kt, acc + q * kNR, row0, 1, j + q, packed_scales(j + q));
      }
    };
    // Two and three rows on packed bf16 (and int8: AVX2 two rows, AVX-512 two and three)
    // weights: two panels per call (with SwiGLU: gate j and up j, one output per call),
    // read as two DRAM streams in step (AVX-512 read them one after another, as its
    // single-row kernel did, until stop 56: gemm_avx512_inl.h has both machines'
    // figures). bf16, serial 2816 x 2048, alternating
    // in one process: M = 2 14.3-14.5 -> 16.5-17.2 GB/s, M = 3 11.9-13.3 -> 13.5-17.2;
    // moe_forward T = 16 (experts of 1-3 rows) uniform -9 to -10%, Zipf -4 to -5%. AVX2
    // (stop 35; the 6-row kernel's pieces before): from DRAM, 2 threads, two builds
    // alternating, M = 2 / 3 1.17-1.29x / 1.17-1.43x; in L3 1.12-1.16x / 1.23-1.26x. Four
    // rows that way (32 accumulators) ran 0.79-0.84x; in passes of two rows over 4 KiB
    // steps (AVX2 M = 4-6, gemm_avx2.cpp) they gain too.
    const auto by_rows = [&](const auto& fns) -> Gemv4Fn {
      return whole_call && mrows >= 2 && size_t(mrows - 2) < std::size(fns) ? fns[mrows - 2] : nullptr;
    };
    const Gemv4Fn gemv2 = !p.packed_b || use_dp ? nullptr
                          : bt == DType::kBF16  ? by_rows(kt.gemv2_bf16b)
                          : bt == DType::kI8    ? by_rows(kt.gemv2_i8b)
                                                : nullptr;
    auto run_gemv2 = [&](int64_t j) {
      Gemv4Args g{.kc = K, .a = af, .b = {p.packed_b->panel(j), p.packed_b->panel(j + (pl.swiglu ? up : 1))}, .acc = acc};
      gemv2(g);
      if (pl.swiglu) {
        epilogue_panel(p, pl.n_out, kt, acc, row0, mrows, j, packed_scales(j), acc + mrows * kNR, packed_scales(j + up));
      } else {
        epilogue_panel(p, pl.n_out, kt, acc, row0, mrows, j, packed_scales(j));
        epilogue_panel(p, pl.n_out, kt, acc + mrows * kNR, row0, mrows, j + 1, packed_scales(j + 1));
      }
    };
    // Reduces B panel jb over all of K into dst (mrows x 64). next_jb is the panel this
    // thread reads after it (-1: none); its first block is pulled into L2 meanwhile.
    // c_out (direct_c): the last K block stores the tile into C there instead of dst (a
    // bf16 C only from the dot-product kernel).
    auto compute = [&](int64_t jb, int64_t next_jb, float* dst, void* c_out = nullptr) {
      const auto c_row = [&](int ir) -> void* { return static_cast<char*>(c_out) + size_t(ir * ldc) * dtype_size(p.c.dtype); };
      const auto c_f32 = [&](int ir) { return static_cast<float*>(c_row(ir)); };
      // K == 0 still runs one (empty) block so the tile is zeroed before the epilogue.
      for (int64_t kb = 0; kb == 0 || kb < K; kb += kblock) {
        const int64_t kcur = std::min(kblock, K - kb);
        const void* bp = bbuf;
        // The block's four [kcur][16] f32 strips when they already exist: packed that way
        // (b_strips), or, for an unpacked B that runs in strips, packed straight into them
        // here (KernelTable::pack_strips; the calls that do not pack B once: a single row
        // chunk, or B past kPackOnceMaxBytes) instead of through pack_panel and a widen_b
        // copy per strip. Null: each strip is widened from the panel into wbuf.
        const float* ready = nullptr;
        if (p.packed_b) {
          bp = p.packed_b->panel(jb) + size_t(kb) * kNR * besize;
          if (b_strips) {
            ready = static_cast<const float*>(bp);
          } else if (strip_layout) {
            strips_to_panel(static_cast<const float*>(bp), kcur, static_cast<float*>(bbuf));
            bp = bbuf;
          }
        } else if (strips(mrows) && kt.pack_strips && kt.pack_strips(p.b, p.b_kn, jb, kb, kcur, static_cast<float*>(bbuf))) {
          ready = static_cast<const float*>(bbuf);
        } else {
          const int64_t kin = kb % pl.kpack;
          if (kin == 0) pack_panel(p.b, p.b_kn, jb, kb, std::min(pl.kpack, K - kb), bbuf, kt.pack_panel_fast);
          bp = static_cast<const char*>(bbuf) + size_t(kin) * kNR * besize;
        }
        // The next B micro-panel (the next K block, or the start of the next panel) is
        // pulled into L2 a slice per row slice, one line per k step inside the kernel, so
        // the first slice of the next block finds it in L2 instead of waiting on L3 —
        // without a burst of prefetches that would stall the fill buffers.
        const char* next_b = nullptr;
        int64_t next_lines = 0;
        if (p.packed_b && mrows > kMR && (kb + kblock < K || next_jb >= 0)) {
          next_b = kb + kblock < K ? static_cast<const char*>(bp) + size_t(kcur) * kNR * besize
                                   : reinterpret_cast<const char*>(p.packed_b->panel(next_jb));
          next_lines = std::min(kblock, K) * kNR * int64_t(besize) / 64;
        }
        // An unpacked B on kernels that walk runs (KernelTable::l2_runs): the source of the
        // next pack_panel (this panel's next kpack rows of K, or the next panel's first), as
        // runs of B's rows, pulled into L2 over all the kernel calls of this pack block.
        // Packing read 64 rows from DRAM with nothing in flight ahead of it, and it took
        // more time than the multiply (bf16 M = 12, N = K = 4096: 42% of the samples
        // against 31%). From DRAM, 2 threads, alternating in one process: bf16 M = 9 / 12 /
        // 16 / 24 / 32 / 64 / 128 -12 / -16 / -16 / -15 / -11 / -7 / -5% time, f32 M = 9 /
        // 16 / 32 / 64 -18 / -19 / -13 / -8%; B in L3 level.
        int64_t run_lines = 0, run_stride = 0, call0 = 0, pack_calls = 1;
        // (K == 0: B has no rows to pull, and its one empty block has no pack calls to
        // share them over.)
        if (!p.packed_b && kt.l2_runs && !i8_dp && mrows > kMR && !ready && !strips(mrows) && K > 0) {
          const int64_t kb0 = kb - kb % pl.kpack, kn0 = kb0 + pl.kpack < K ? kb0 + pl.kpack : 0;
          const int64_t jn = kn0 > 0 ? jb : next_jb;
          if (jn >= 0) {
            const int64_t kk = std::min(pl.kpack, K - kn0), N = p.b_kn ? p.b.sizes[1] : p.b.sizes[0];
            const int64_t cols = std::min<int64_t>(kNR, N - jn * kNR), ld = p.b.strides[0];
            const int64_t runs = p.b_kn ? kk : cols, run_bytes = (p.b_kn ? cols : kk) * int64_t(besize);
            next_b = static_cast<const char*>(p.b.data) + size_t(p.b_kn ? kn0 * ld + jn * kNR : jn * kNR * ld + kn0) * besize;
            run_lines = (run_bytes + 63) / 64 + 1;  // + 1: a run need not start on a line
            run_stride = ld * int64_t(besize);
            next_lines = runs * run_lines;
            const int64_t blocks = (std::min(pl.kpack, K - kb0) + kblock - 1) / kblock;
            call0 = (kb - kb0) / kblock * sl.count, pack_calls = blocks * sl.count;
          }
        }
        // Kernel call `call` of `calls` on this block pulls its share of next_b into L2: of
        // this block's calls, or, for runs, call0 + call of the pack block's pack_calls.
        // One run (run_lines 0) is next_lines long.
        auto l2_share = [&](int64_t call, int64_t calls, bool stream) {
          Prefetch pf{.stream = stream};
          if (next_b && next_lines > 0) {
            const int64_t at = run_lines > 0 ? call0 + call : call, of = run_lines > 0 ? pack_calls : calls;
            const int64_t lo = next_lines * at / of, hi = next_lines * (at + 1) / of;
            pf.l2_lines = hi - lo;
            // One run: no divisions by its length (one kernel call is ~1500 cycles of a
            // 6 x 64 x 128 f32 block, and each 64-bit division ~15).
            if (run_lines > 0) {
              pf.l2_next = next_b + (lo / run_lines) * run_stride + 64 * (lo % run_lines);
              pf.l2_run_lines = run_lines, pf.l2_run_stride = run_stride, pf.l2_run_skip = lo % run_lines;
            } else {
              pf.l2_next = next_b + 64 * lo;
            }
          }
          return pf;
        };
        auto a_off = [&](int sv) { return int64_t(sv) * kMR * pl.k_even + kb * kMR; };  // slice sv's panel; f32 and pairs alike
        const bool to_c = c_out && kb + kcur >= K;  // the last K block stores into C
        // Row slices share this block (strips, strip_rows): widen it once rather than in
        // every slice's FMA loop (bf16 2048^3 on the AVX2 machine: gemm PERF_LOG.md). The block
        // is run a 16-column strip at a time over all row slices, each strip
        // widened (f32: copied) into a 16 KiB buffer (kc = 256) that stays in L1 while the
        // slices read it, where the whole 64 KiB widened block came from L2 for every
        // slice, and f32's 32 KiB block (kc = 128) did not stay in L1 beside A in the
        // VM's noisy phases. Alternating in one process, 2048^3: bf16 1 thread +2.5-4.5%,
        // 2 threads +5-6%; f32 1 thread +4 to +13% in noisy phases, -2% in quiet ones,
        // 2 threads -1 to +10%. (Widening the whole block before its strips: within 1%.)
        if (strips(mrows)) {
          for (int s = 0; s < kNR / 16; ++s) {
            const float* strip = ready ? ready + s * kcur * 16 : wbuf;
            if (!ready) kt.widen_b(bt, kcur, bp, s, wbuf);
            for (int sv = 0; sv < sl.count; ++sv) {
              const int ir = sl.first(sv);
              float* tile = dst + ir * kNR + 16 * s;
              kt.f32_strip(sl.rows(sv), kcur, af + a_off(sv), strip, tile, kb > 0,
                           l2_share(s * sl.count + sv, kNR / 16 * sl.count, false), to_c ? c_f32(ir) + 16 * s : tile,
                           to_c ? ldc : kNR);
            }
          }
          continue;
        }
        const void* dp_b = bp;
        if (i8_dp) {
          kt.i8_pairs(static_cast<const int8_t*>(bp), kcur, pbuf);
          dp_b = pbuf;
        }
        // The block widened once to f32 (wide_rows), L1-resident for every slice's f32 kernel.
        const bool wide_block = wide(mrows);
        if (wide_block) {
          kt.widen_panel(bt, kcur, bp, wbuf);
          bp = wbuf;
        }
        const KernelF32A block_kern = wide_block ? kt.f32b : kern;
        for (int sv = 0; sv < sl.count; ++sv) {
          const int ir = sl.first(sv), m = sl.rows(sv);
          const Prefetch pf = l2_share(sv, sl.count, sv == 0 && !wide_block);
          if (use_dp)
            kt.bf16dp(m, kcur, ab + a_off(sv), dp_b, dst + ir * kNR, kb > 0, pf, to_c ? c_row(ir) : dst + ir * kNR,
                      to_c ? ldc : kNR, to_c && c_bf16);
          else if (to_c)
            kt.f32b_out(m, kcur, af + a_off(sv), bp, dst + ir * kNR, kb > 0, pf, c_f32(ir), ldc);
          else
            block_kern(m, kcur, af + a_off(sv), bp, dst + ir * kNR, kb > 0, pf);
        }
      }
    };
    auto run_panel = [&](int64_t j, int64_t next) {
      if (pl.swiglu) {
        compute(j, j + up, acc);
        compute(j + up, next, acc_up);
        epilogue_panel(p, pl.n_out, kt, acc, row0, mrows, j, packed_scales(j), acc_up, packed_scales(j + up));
        return;
      }
      if (void* c = direct_c(row0, mrows, j)) {
        compute(j, next, acc, c);
        return;
      }
      compute(j, next, acc);
      const float* scales = nullptr;
      if (bt == DType::kI8) {
        if (p.packed_b) {
          scales = packed_scales(j);
        } else {
          pack_scales(p.b_scales, j, sbuf);
          scales = sbuf;
        }
      }
      epilogue_panel(p, pl.n_out, kt, acc, row0, mrows, j, scales);
    };
    // Whole groups go to the decode kernels; a short last group panel by panel.
    const int64_t group = use_gemv4 ? (pl.swiglu ? 2 : 4) : gemv2 ? (pl.swiglu ? 1 : 2) : 1;
    Claims groups(r.p0, r.p1, r.panels);
    for (;;) {
      const auto [j0, j1] = groups.next(group);
      if (j0 == j1) break;
      if (j1 - j0 == group && use_gemv4) {
        run_gemv4(j0);
      } else if (j1 - j0 == group && gemv2) {
        run_gemv2(j0);
      } else {
        for (int64_t j = j0; j < j1; ++j) run_panel(j, groups.after(j));
      }
    }
  }
}

// AMX variant of run_thread: 32-row blocks (a 16-row one last) per K block of kAmxKc, A
// packed row-major bf16.
void run_thread_amx(const Plan& pl, const GemmParams& p, const KernelTable& kt, uint8_t* ws,
                    const ThreadRange& r) {
  float* acc = reinterpret_cast<float*>(ws + pl.acc_off);
  float* acc_up = reinterpret_cast<float*>(ws + pl.up_off);
  void* bbuf = ws + pl.bbuf_off;
  uint16_t* apack = reinterpret_cast<uint16_t*>(ws + pl.apack_off);
  const int64_t K = pl.K, k32 = pl.k32, lda = p.a.strides[0], ldp = pl.lda_amx;
  const uint16_t* a = static_cast<const uint16_t*>(p.a.data);
  Claims chunks(r.ic0, r.ic1, r.chunks);
  for (int64_t ic = chunks.next_one(); ic >= 0; ic = chunks.next_one()) {
    const int64_t row0 = ic * pl.mc;
    const int mrows = int(std::min(pl.mc, pl.M - row0));
    const int mpad = (mrows + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows;
    for (int i = 0; i < mpad; ++i) {
      uint16_t* d = apack + int64_t(i) * ldp;
      if (i < mrows) {
        std::memcpy(d, a + (row0 + i) * lda, size_t(K) * 2);
        std::memset(d + K, 0, size_t(k32 - K) * 2);
      } else {
        std::memset(d, 0, size_t(k32) * 2);
      }
    }
    auto compute = [&](int64_t jb, float* dst, int64_t next) {
      const void* bp;
      if (p.packed_b) {
        bp = p.packed_b->panel(jb);
      } else {
        pack_panel(p.b, p.b_kn, jb, 0, k32, bbuf, kt.pack_panel_fast);
        bp = bbuf;
      }
      // K blocks of kAmxKc: the B block (kAmxKc x 64 bf16 = 256 KiB) stays in L2 for all
      // the chunk's 32-row blocks; each A block (32 x kAmxKc = 128 KiB) is read from L2
      // once per panel and serves both column halves.
      // The next B block (packed weights) is asked into L2 a share per row block, so its
      // stream from DRAM overlaps this block's tiles: a block's first row block otherwise
      // waits on DRAM for all of its 256 KiB while the later ones run from L2. MoE layer
      // T = 1024 (experts of ~96 rows: 3 row blocks per panel, one K block), alternating
      // in one process, three runs: uniform -7 to -10%, Zipf -3 to -5%; bf16 2048^3 (7 row
      // blocks per panel) unchanged. Panels of several K blocks (K > kAmxKc) pull their
      // next K block, then the next panel's first, where the chunk is one 32-row block
      // (17-32 rows). N = K = 4096, 32 weight copies, 2 threads, old and new builds in
      // turn, means of 50-80 calls, two-three rounds: M = 17 / 32 1.61-1.70 / 1.62-2.15 ->
      // 1.35-1.43 / 1.36-1.45 ms (K = 8192 M = 32 1.22x alternating call by call). With
      // more row blocks the pull cost: M = 48 (32 + 16) 0.90x, 64 0.88x, 128 / 1024
      // 0.96-0.98x / 0.97x.
      // Shared among the 32-row blocks only: a trailing 16-row block prefetches the next
      // panel's first step itself (Prefetch::next_panel) and ignores l2_next.
      const int full = mpad / kAmxRows;
      const bool one_k = k32 <= kAmxKc, pull_k = !one_k && mpad == kAmxRows;
      // K == 0 still runs one (empty) block, whose tiles start at zero and are stored: the
      // epilogue reads the accumulator tile, which holds the workspace's old bytes otherwise.
      for (int64_t kb = 0; kb == 0 || kb < k32; kb += kAmxKc) {
        const int64_t kcur = std::min(kAmxKc, k32 - kb);
        const void* bk = static_cast<const uint8_t*>(bp) + kb * kNR * 2;
        // The B block pulled into L2 meanwhile: this panel's next K block, or after the
        // last the next panel's first.
        const char* pull = nullptr;
        int64_t pull_bytes = 0;
        if (p.packed_b && full > 0) {
          if (kb + kAmxKc < k32) {
            if (pull_k) pull = static_cast<const char*>(bk) + kAmxKc * kNR * 2, pull_bytes = std::min(kAmxKc, k32 - kb - kAmxKc) * kNR * 2;
          } else if (next >= 0 && (one_k || pull_k)) {
            pull = reinterpret_cast<const char*>(p.packed_b->panel(next)), pull_bytes = std::min(kAmxKc, k32) * kNR * 2;
          }
        }
        const int64_t share = pull ? (pull_bytes + full - 1) / full / 64 * 64 : 0;
        for (int rb = 0; rb < mpad; rb += kAmxRows) {
          Prefetch pf;
          // The first of several row blocks reads a K block first, from DRAM where no pull
          // brought it into L2 (amx_block then pulls the other column half ahead).
          pf.stream = p.packed_b && !one_k && !pull_k && rb == 0 && mpad > kAmxRows;
          if (next >= 0 && p.packed_b && kb + kcur >= k32) pf.next_panel = reinterpret_cast<const char*>(p.packed_b->panel(next));
          if (pull && rb / kAmxRows < full) {
            const int64_t off = int64_t(rb / kAmxRows) * share;
            pf.l2_next = pull + off;
            pf.l2_lines = std::max<int64_t>(0, std::min(share, pull_bytes - off)) / 64;
          }
          kt.amx_block(std::min(kAmxRows, mpad - rb), kcur, apack + int64_t(rb) * ldp + kb, ldp, bk, dst + rb * kNR, pf, kb > 0);
        }
      }
    };
    for (int64_t j = r.p0; j < r.p1; ++j) {
      const int64_t after = j + 1 < r.p1 ? j + 1 : (chunks.more(ic) ? r.p0 : -1);
      compute(j, acc, pl.swiglu ? j + pl.out_panels : after);
      if (pl.swiglu) {
        compute(j + pl.out_panels, acc_up, after);
        epilogue_panel(p, pl.n_out, kt, acc, row0, mrows, j, nullptr, acc_up, nullptr);
      } else {
        epilogue_panel(p, pl.n_out, kt, acc, row0, mrows, j, nullptr);
      }
    }
  }
  kt.amx_release();
}

// Decode against unpacked f32 / bf16 weights with unit inner stride, up to kGemvRowsM rows
// of A (kGemvTileRowsM on the AMX tiles): packing B first reads and writes every weight once more for a call that uses each
// once. It ran at 1-2 GB/s of [N, K] weights (a panel's 64 rows gathered element by
// element) and 0.8 GB/s of [K, N] ones (gathered a column at a time): M = 1, N = K = 4096
// bf16 took 27.0 / 43.8 ms, now ~2.2 / 2.4. The streaming kernel for B's layout, or null:
//   [N, K] (KernelTable::gemv_rows): each output a row dot product over a contiguous run
//          of B rows; the threads take 64-column panels in order.
//   [K, N] (KernelTable::gemv_kn): each thread a contiguous run of up to kGemvKnCols
//          columns (their accumulators, 64 KiB at 8 rows, on its stack), so it reads one
//          contiguous piece of every B row, in row order.
// Every output is one thread's sum in k order, so results do not depend on the thread count.
using GemvFn = void (*)(const GemvRowsArgs&);
GemvFn streaming_gemv(const GemmParams& p, const KernelTable& kt) {
  if (!streaming_shape(p)) return nullptr;
  // Past kGemvRowsAmx rows a bf16 [N, K] call whose gemv_rows has no A^T pairs (K not a
  // multiple of 32) runs faster on the AMX blocks (each panel packed once into L2, the
  // one-chunk panel split): N = K = 4096, 2 threads, Sapphire Rapids VM, alternating in
  // one process, the blocks' time against the row kernels': M = 5 / 6 1.13 / 1.08x, M = 7
  // / 8 0.86-0.88 / 0.81x. With pairs the AMX unit's gemv_rows streams on the tiles, at
  // the packed GEMV's rate. A [K, N] B keeps gemv_kn: packing its panels costs more (M = 7
  // / 8 on the tiles 3.9 ms against 2.5-2.7).
  const bool pairs = reads_pairs(p, kt);
  if (p.a.sizes[0] > kGemvRowsM && !pairs) return nullptr;  // the row kernels' limit
  if (kt.amx_block && amx_eligible(p) && !p.b_kn && !pairs && p.a.sizes[0] > kGemvRowsAmx) return nullptr;
  return p.b_kn ? kt.gemv_kn : kt.gemv_rows;
}

// bf16 weights run with denormals as zero (numerics/denormals.h), in every kernel: the
// widened-FMA ones take a microcode assist per denormal input otherwise (one bf16 denormal
// in 2000 MoE gate/up weights, 2816 x 2048, two threads: 6 rows 27.5 -> 17.5 GB/s, 16 rows
// 16.4 -> 8.1), and vdpbf16ps / AMX treat them as zero by definition, so every
// implementation agrees on such weights. f32 and int8 weights keep IEEE denormals (int8
// codes are never denormal), except where int8 weights run on vdpbf16ps (bf16 A from
// kI8DpMinRows rows on the AVX512_BF16 unit): it reads denormal A values, and writes
// denormal sums, as zero whatever MXCSR says (such values are below 1.2e-38 in magnitude).
bool bf16_daz(const GemmParams& p) { return b_dtype(p) == DType::kBF16; }

void run_streaming_gemv(const GemmParams& p, const KernelTable& kt, GemvFn gemv, Workspace ws) {
  const int64_t M = p.a.sizes[0], N = p.b_kn ? p.b.sizes[1] : p.b.sizes[0], K = p.a.sizes[1];
  if (M == 0 || N == 0) return;
  const int64_t panels = (N + kNR - 1) / kNR;
  const int64_t per_group = p.b_kn ? std::clamp<int64_t>((panels + num_threads() - 1) / num_threads(), 1, kGemvKnCols / kNR) : 1;
  const int64_t groups = (panels + per_group - 1) / per_group;
  const size_t esize = dtype_size(p.b.dtype);
  // The tiles read A as pairs, the row kernels in place or from a copy (gemv_a_stride).
  // Both are built per thread, into that core's own caches, as the copy's comment says.
  // Not by pack_panel: its panels are 64 columns wide whatever M is, and it fills the
  // columns past the last whole 8 element by element (M = 1: 512 KiB at K = 4096, nearly
  // all of it zeros written one at a time, in a 1.1 ms call).
  const bool use_pairs = reads_pairs(p, kt);
  const int64_t a_stride = use_pairs ? 0 : gemv_a_stride(p);
#pragma omp parallel num_threads(num_threads()) if (groups > 1)
  {
    const numerics::DenormalsAsZero daz(bf16_daz(p));  // once per thread, not per group
    const void* a = p.a.data;
    uint8_t* mine = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data))) +
                    size_t(omp_get_thread_num()) * gemv_thread_bytes(p);  // its copy of A, then its pairs
    if (a_stride > 0) {
      const size_t es = dtype_size(p.a.dtype);
      for (int64_t r = 0; r < M; ++r)
        std::memcpy(mine + size_t(r * a_stride) * es, static_cast<const uint8_t*>(p.a.data) + size_t(r * p.a.strides[0]) * es, size_t(K) * es);
      a = mine;
    }
    const int64_t lda = a_stride > 0 ? a_stride : p.a.strides[0];
    uint16_t* pairs = nullptr;
    if (use_pairs) {
      pairs = reinterpret_cast<uint16_t*>(mine + gemv_a_copy_bytes(p));
      kt.gemv_pairs(static_cast<const uint16_t*>(a), lda, int(M), K, pairs);
    }
#pragma omp for schedule(static)
    for (int64_t q = 0; q < groups; ++q) {
      alignas(64) float acc[kGemvRowsM * kGemvKnCols];  // [N, K]: m (<= kGemvTileRowsM) x kNR
      static_assert(kGemvTileRowsM * kNR <= kGemvRowsM * kGemvKnCols);
      const int64_t j0 = q * per_group, j1 = std::min(panels, j0 + per_group);
      GemvRowsArgs g;
      g.m = int(M), g.nb = int(std::min(N, j1 * kNR) - j0 * kNR), g.K = K;
      g.a = a, g.lda = lda, g.a_dtype = p.a.dtype, g.pairs = pairs;
      // The group's first column: along a B row ([K, N]) or its first B row ([N, K]).
      g.b = static_cast<const uint8_t*>(p.b.data) + size_t(j0 * kNR * (p.b_kn ? 1 : p.b.strides[0])) * esize;
      g.ldb = p.b.strides[0], g.b_dtype = p.b.dtype, g.acc = acc, g.l2_ahead = kt.gemv_l2_ahead;
      gemv(g);
      for (int64_t j = j0; j < j1; ++j) epilogue_panel(p, N, kt, acc + (j - j0) * M * kNR, 0, int(M), j, nullptr);
    }
    if (pairs && kt.amx_release) kt.amx_release();
  }
}

template <const KernelTable& (*Table)()>
Status run_blocked(const GemmParams& p, Workspace ws) {
  const KernelTable& kt = Table();
  if (const GemvFn gemv = streaming_gemv(p, kt)) {
    run_streaming_gemv(p, kt, gemv, ws);
    return Status::Ok();
  }
  const bool use_amx = kt.amx_block && amx_eligible(p);
  // bf16 A times int8 weights on the dot product (KernelTable::i8_pairs) from kI8DpMinRows
  // rows: each K block is widened to bf16 pairs once for all the chunk's row slices, where
  // the FMA kernel widens every int8 to f32 and runs at the FMA's rate, half the dot
  // product's. N = 4096 / 10944, K = 2048, 2 threads, alternating in one process: M = 8
  // 0.71 -> 0.52 / 1.89 -> 1.62 ms, 16 1.23 -> 0.76 / 3.63 -> 2.36, 64 4.92 -> 2.72, 1024
  // 81.8 -> 44.5 (210 -> 386 GFLOP/s). Below, one slice amortises nothing and the FMA
  // kernel's stream of int8 rows is faster from DRAM (M = 4-6, N = 10944: 1.0-1.2 against
  // 1.6-1.7 ms). The choice is per call, so every row chunk rounds alike.
  const bool use_dp = !use_amx && kt.bf16dp && dp_shape(p) && (b_dtype(p) == DType::kBF16 || kt.i8_pairs);
  PackedMatrix m;
  if (pack_once_view(p, use_amx, use_dp, &m)) {
    uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
    m.data = base;
    const int64_t np = m.n_panels();
    GemmParams q = p;
    q.b = {};
    q.packed_b = &m;
    // f32 B for the strip kernels is packed straight into their strips, a K block at a
    // time (PackLayout::kStrips): the per-strip widen_b copy (6.6% of f32 2048^3 on one
    // thread) goes, and 8 x 8 transposes replace pack_panel's element loop (5.6%). Two
    // builds alternating in one process: 2048^3 one thread +8 / +14%, two threads +5 /
    // +9%; 1024^3 one thread +12%, 512^3 two threads +8%.
    const int64_t kc = m.strip_kc;
    const bool strips = kc > 0 && !use_amx && kt.f32_strip && kt.pack_strips && p.b.strides[1] == 1;  // pack_strips takes it
    if (!strips) m.strip_kc = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (np > 1)
    for (int64_t j = 0; j < np; ++j) {
      uint8_t* panel = base + j * m.panel_bytes;
      if (strips) pack_strip_panel(p.b, p.b_kn, j, kc, reinterpret_cast<float*>(panel), kt.pack_strips);
      else pack_panel(p.b, p.b_kn, j, 0, m.k_padded, panel, kt.pack_panel_fast);
    }
    const size_t used = size_t(base - static_cast<uint8_t*>(ws.data)) + align_up(size_t(np * m.panel_bytes));
    return run_blocked<Table>(q, {static_cast<uint8_t*>(ws.data) + used, ws.bytes - used});
  }
  const Plan pl = make_plan(p, use_amx, kt.f32_strip != nullptr, use_dp, kt.widen_panel != nullptr);
  if (pl.M == 0 || pl.N == 0) return Status::Ok();
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
  // Work claimed as the threads go (ThreadRange): row chunks in the row split; in the
  // panel split only where a thread's next panel does not matter — the decode kernels, and
  // the generic one below kMR rows (it prefetches the next panel only above).
  std::atomic<int64_t> cursor{0};
  const bool claim = pl.threads > 1 && (pl.split_n ? !use_amx && pl.n_ic == 1 && pl.M <= kMR : true);
  std::atomic<int64_t>* shared = claim ? &cursor : nullptr;
  auto body = [&](int t) {
    const numerics::DenormalsAsZero daz(bf16_daz(p));
    uint8_t* w = base + size_t(t) * pl.per_thread;
    if (use_amx) run_thread_amx(pl, p, kt, w, range_for(pl, t, shared));
    else run_thread(pl, p, kt, use_dp, w, range_for(pl, t, shared));
  };
  if (pl.threads == 1) {
    body(0);
    return Status::Ok();
  }
  // The team can be smaller than asked for (a ThreadScope inside a region that cannot fork,
  // OMP_THREAD_LIMIT, dynamic teams): then its threads take the missing shares in turn,
  // which are fixed ranges of C outside the claimed schedules.
#pragma omp parallel num_threads(pl.threads)
  for (int t = omp_get_thread_num(); t < pl.threads; t += omp_get_num_threads()) body(t);
  return Status::Ok();
}

std::string selected_name();

const dispatch::Registry<GemmFn>& make_registry() {
  // Which of avx512 (bf16 widened to f32 in registers, then FMA) and avx512_bf16
  // (vdpbf16ps) comes first depends on the core, on measurement. Where vdpbf16ps issues on
  // one port against two for FMA (Intel; 80 vs 160 GFLOP/s per core measured) widening
  // wins 215-256 vs 112-138 GFLOP/s on bf16 2048^3; where it retires at the FMA's rate
  // (AMD Zen 4 / 5: cpu_features().fast_bf16_dot) vdpbf16ps does twice the FLOPs and wins
  // 814 vs 457 GFLOP/s (Zen 5, two threads). OPTX_IMPL=gemm=<name> still selects either.
  static const dispatch::Registry<GemmFn> r = [] {
    const dispatch::Impl<GemmFn> widen{"avx512", Isa::kAvx512, run_blocked<kernels_avx512>};
    const dispatch::Impl<GemmFn> dot{"avx512_bf16", Isa::kAvx512Bf16, run_blocked<kernels_avx512_bf16>};
    const bool dot_first = cpu_features().fast_bf16_dot;
    return dispatch::Registry<GemmFn>(kOp, {
                                               {"amx", Isa::kAmx, run_blocked<kernels_amx>},
                                               dot_first ? dot : widen,
                                               dot_first ? widen : dot,
                                               {"avx2", Isa::kAvx2, run_blocked<kernels_avx2>},
                                               {"scalar", Isa::kScalar, run_blocked<kernels_scalar>},
                                               {"reference", Isa::kScalar, gemm_reference},
                                           });
  }();
  return r;
}

std::string selected_name() { return make_registry().selected_name(); }

// Each implementation's kernel table, to ask the selected one (runnable here) what it runs.
struct TableOf {
  GemmFn fn;
  const KernelTable& (*table)();
};
constexpr TableOf kTables[] = {{run_blocked<kernels_amx>, kernels_amx},
                               {run_blocked<kernels_avx512>, kernels_avx512},
                               {run_blocked<kernels_avx512_bf16>, kernels_avx512_bf16},
                               {run_blocked<kernels_avx2>, kernels_avx2},
                               {run_blocked<kernels_scalar>, kernels_scalar}};

[[maybe_unused]] const bool registered = [] {
  dispatch::register_op(kOp, selected_name);
  return true;
}();

}  // namespace

const dispatch::Registry<GemmFn>& registry() { return make_registry(); }

const KernelTable* selected_table() {
  const dispatch::Impl<GemmFn>* impl = nullptr;
  if (!registry().select(&impl).ok()) return nullptr;
  for (const TableOf& t : kTables)
    if (t.fn == impl->fn) return &t.table();
  return nullptr;  // the reference reads any layout
}

Status validate(const GemmParams& p, bool need_data) {
  const TensorView& a = p.a;
  if (a.rank != 2) return Error(StatusCode::kInvalidArgument, kOp, ": a.rank=", a.rank, " but must be 2 ([M, K])");
  OPTX_RETURN_IF_ERROR(check_strides(a, "a"));
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, kOp, ": a.dtype=", dtype_name(a.dtype), " but must be f32 or bf16");
  const int64_t M = a.sizes[0], K = a.sizes[1];
  if (need_data && M > 0 && K > 0 && !a.data) return Error(StatusCode::kInvalidArgument, kOp, ": a.data is null");
  if (K > 1 && a.strides[1] != 1)
    return Error(StatusCode::kInvalidArgument, kOp, ": a.strides[1]=", a.strides[1], " but must be 1 (rows contiguous)");
  if (M > 1 && a.strides[0] < K)
    return Error(StatusCode::kInvalidArgument, kOp, ": a.strides[0]=", a.strides[0], " but must be >= K=", K);

  if (p.packed_b && !p.b.empty())
    return Error(StatusCode::kInvalidArgument, kOp, ": both b and packed_b given; pass one");
  DType bt;
  int64_t N, Kb;
  if (p.packed_b) {
    if (need_data && !p.packed_b->data && p.packed_b->n > 0 && p.packed_b->k > 0)
      return Error(StatusCode::kInvalidArgument, kOp, ": packed_b->data is null");
    bt = p.packed_b->dtype;
    N = p.packed_b->n;
    Kb = p.packed_b->k;
    if (p.packed_b->strip_kc < 0 || (p.packed_b->strip_kc > 0 && bt != DType::kF32))
      return Error(StatusCode::kInvalidArgument, kOp, ": packed_b->strip_kc=", p.packed_b->strip_kc, " with dtype ",
                   dtype_name(bt), ": the strip layout is f32 only (0: panels)");
    if (bt == DType::kI8 && !p.packed_b->scales && N > 0)
      return Error(StatusCode::kInvalidArgument, kOp, ": packed_b is i8 but has no scales");
    OPTX_RETURN_IF_ERROR(check_packed_layout(kOp, "packed_b", *p.packed_b));
  } else {
    const TensorView& b = p.b;
    if (b.rank != 2) return Error(StatusCode::kInvalidArgument, kOp, ": b.rank=", b.rank, " but must be 2 ([N, K] or [K, N])");
    OPTX_RETURN_IF_ERROR(check_strides(b, "b"));
    bt = b.dtype;
    N = p.b_kn ? b.sizes[1] : b.sizes[0];
    Kb = p.b_kn ? b.sizes[0] : b.sizes[1];
    if (need_data && N > 0 && Kb > 0 && !b.data) return Error(StatusCode::kInvalidArgument, kOp, ": b.data is null");
  }
  if (bt != DType::kF32 && bt != DType::kBF16 && bt != DType::kI8)
    return Error(StatusCode::kInvalidArgument, kOp, ": b.dtype=", dtype_name(bt), " but must be f32, bf16 or i8");
  // Empty views pass check_view whatever their other sizes; the plan multiplies these.
  if (K > kMaxViewElements || N > kMaxViewElements)
    return Error(StatusCode::kInvalidArgument, kOp, ": K=", K, " or N=", N, " exceeds 2^", kMaxViewLog2);
  if (Kb != K)
    return Error(StatusCode::kInvalidArgument, kOp, ": b has K=", Kb, (p.b_kn ? " (b.sizes[0])" : " (b.sizes[1])"),
                 " but a.sizes[1]=", K, ": K must match");
  if (a.dtype == DType::kBF16 && bt == DType::kF32)
    return Error(StatusCode::kInvalidArgument, kOp, ": a.dtype=bf16 with b.dtype=f32 is not supported (use f32 a or bf16 b)");
  if (bt == DType::kI8 && !p.packed_b) {
    const TensorView& s = p.b_scales;
    if (need_data && !s.data) return Error(StatusCode::kInvalidArgument, kOp, ": b_scales.data is null but b is i8 (per-channel scales required)");
    if (s.rank != 1 || s.sizes[0] != N || s.dtype != DType::kF32)
      return Error(StatusCode::kInvalidArgument, kOp, ": b_scales must be f32 [N=", N, "], got rank ", s.rank,
                   " sizes[0]=", s.sizes[0], " dtype ", dtype_name(s.dtype));
    OPTX_RETURN_IF_ERROR(check_strides(s, "b_scales"));
  } else if (!p.b_scales.empty()) {
    return Error(StatusCode::kInvalidArgument, kOp, ": b_scales given but b is not an unpacked i8 matrix");
  }

  const bool swiglu = p.activation == GemmActivation::kSwiglu;
  if (swiglu) {
    if (!p.packed_b)
      return Error(StatusCode::kInvalidArgument, kOp, ": activation=swiglu needs packed_b ([gate; up] packed with pack_weights)");
    if (N % (2 * kNR) != 0)
      return Error(StatusCode::kInvalidArgument, kOp, ": activation=swiglu needs N=2I with I a multiple of ", kNR,
                   ", got N=", N);
    if (p.alpha != 1.0f || p.beta != 0.0f || !p.bias.empty())
      return Error(StatusCode::kInvalidArgument, kOp, ": activation=swiglu takes alpha=1, beta=0 and no bias, got alpha=",
                   p.alpha, " beta=", p.beta, p.bias.empty() ? "" : " and a bias");
  } else if (p.activation != GemmActivation::kNone) {
    return Error(StatusCode::kInvalidArgument, kOp, ": activation=", int(p.activation), " is not a known GemmActivation");
  }
  const int64_t Nc = swiglu ? N / 2 : N;  // columns of C

  const TensorView& c = p.c;
  if (c.rank != 2) return Error(StatusCode::kInvalidArgument, kOp, ": c.rank=", c.rank, " but must be 2 ([M, N])");
  OPTX_RETURN_IF_ERROR(check_strides(c, "c"));
  if (c.sizes[0] != M || c.sizes[1] != Nc)
    return Error(StatusCode::kInvalidArgument, kOp, ": c.sizes=[", c.sizes[0], ", ", c.sizes[1], "] but must be [M=", M,
                 swiglu ? ", N/2=" : ", N=", Nc, "]");
  if (c.dtype != DType::kF32 && c.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, kOp, ": c.dtype=", dtype_name(c.dtype), " but must be f32 or bf16");
  if (need_data && M > 0 && N > 0 && !c.data) return Error(StatusCode::kInvalidArgument, kOp, ": c.data is null");
  if (N > 1 && c.strides[1] != 1)
    return Error(StatusCode::kInvalidArgument, kOp, ": c.strides[1]=", c.strides[1], " but must be 1 (rows contiguous)");
  if (M > 1 && c.strides[0] < Nc)
    return Error(StatusCode::kInvalidArgument, kOp, ": c.strides[0]=", c.strides[0], " but must be >= ", Nc,
                 " (columns of C)");

  if (!p.bias.empty()) {
    const TensorView& bias = p.bias;
    if (need_data && !bias.data && N > 0) return Error(StatusCode::kInvalidArgument, kOp, ": bias.data is null");
    if (bias.rank != 1 || bias.sizes[0] != N)
      return Error(StatusCode::kInvalidArgument, kOp, ": bias must be [N=", N, "], got rank ", bias.rank, " sizes[0]=",
                   bias.sizes[0]);
    if (bias.dtype != DType::kF32 && bias.dtype != DType::kBF16)
      return Error(StatusCode::kInvalidArgument, kOp, ": bias.dtype=", dtype_name(bias.dtype), " but must be f32 or bf16");
    if (N > 1 && bias.strides[0] != 1)
      return Error(StatusCode::kInvalidArgument, kOp, ": bias.strides[0]=", bias.strides[0], " but must be 1");
  }
  return Status::Ok();
}

}  // namespace gemm_detail

size_t gemm_workspace_size(const GemmParams& p) {
  if (!gemm_detail::validate(p, /*need_data=*/false).ok()) return 0;
  return gemm_detail::workspace_bytes(p);
}

namespace gemm_detail {
Status run_impl(const dispatch::Impl<GemmFn>& impl, const GemmParams& p, Workspace ws) {
  OPTX_RETURN_IF_ERROR(validate(p));
  // C's tiles are stored while other threads still read A and B (and the workspace holds
  // packed pieces of both); a packed B may be a caller's own PackedMatrix.
  const size_t need = impl.fn != gemm_reference ? workspace_bytes(p) : 0;
  const TensorView none;
  OPTX_RETURN_IF_ERROR(check_apart(kOp, {{"c", p.c}, {"workspace", workspace_view(ws, need)}},
                                   {{"a", p.a}, {"b", p.b}, {"b_scales", p.b_scales}, {"bias", p.bias},
                                    {"packed_b", p.packed_b ? packed_bytes(*p.packed_b) : none},
                                    {"packed_b->scales", p.packed_b ? packed_scales(*p.packed_b) : none}}));
  if (impl.fn != gemm_reference) {
    OPTX_RETURN_IF_ERROR(check_workspace(kOp, "gemm_workspace_size", ws, need));
  }
  return impl.fn(p, ws);
}
}  // namespace gemm_detail

Status gemm(const GemmParams& p, Workspace ws) {
  const dispatch::Impl<gemm_detail::GemmFn>* impl = nullptr;
  OPTX_RETURN_IF_ERROR(gemm_detail::registry().select(&impl));
  if (verbose()) {
    static const bool once = [&] {
      log_verbose(std::string("gemm: running implementation '") + impl->name + "'");
      return true;
    }();
    (void)once;
  }
  return gemm_detail::run_impl(*impl, p, ws);
}

}  // namespace optx
