// Internal interface between the GEMM driver (gemm.cpp: blocking, threads, epilogue order)
// and the per-ISA microkernels (gemm_<isa>.cpp).
//
// A microkernel computes an m x 64 tile (m <= kMR) over kc steps of K:
//   acc[r][0..64) (+)= sum_k A[r][k] * Bpanel[k][0..64)
// acc is an f32 scratch tile with row stride 64 in the caller's workspace; `accumulate`
// says whether to add to it (later K blocks) or overwrite it (first K block). The epilogue
// then turns the finished tile into C: alpha * scale[n] * acc + beta * C + bias[n].
#pragma once

#include <cstdint>

#include "optx/tensor.h"

namespace optx::gemm_detail {

inline constexpr int kNR = 64;  // panel width = PackedMatrix::kPanel
inline constexpr int kMR = 6;   // rows per microkernel call: 6 x 4 zmm = 24 accumulators
// K block of the strip kernels (KernelTable::f32_strip) and of PackLayout::kStrips: a
// 16-column f32 strip of 256 rows is 16 KiB, half of a 32 KiB L1D (gemm.cpp, make_plan).
inline constexpr int64_t kStripKc = 256;
// The strip layout of one K block of kc rows x 64 columns: four 16-column strips [kc][16]
// one after another (what f32_strip reads as b, strip s at s * kc * 16). Element (k, n).
constexpr int64_t strip_index(int64_t kc, int64_t k, int64_t n) { return (n / 16) * kc * 16 + k * 16 + n % 16; }
inline constexpr int kAmxRows = 32;  // rows per AMX block: 2 x 16-row tiles
inline constexpr int kAmxTileRows = 16;  // a chunk's last block may be one 16-row tile
inline constexpr int kAmxK = 32;     // k per AMX step: one 64-byte bf16 tile row
// AMX K block: B block 2048 x 64 bf16 = 256 KiB (L2). Measured against 1024, alternating
// call by call in one process: one C tile round trip fewer per 2048 of K gains 1-2% on
// packed bf16 GEMMs; 4096 and 8192 no better (gemm README, AMX).
inline constexpr int64_t kAmxKc = 2048;

// A arrives packed by the driver, one micro-panel per kMR rows, so the kernel's broadcasts
// read one contiguous stream (unpacked rows lda apart alias in the same L1 sets when lda is
// a multiple of 4 KiB, and cost the prefetcher kMR streams):
//   f32:  a[k * kMR + r]                (rows past m are zero)
//   bf16: a[((k / 2) * kMR + r) * 2 + (k & 1)]   (pairs, as vdpbf16ps broadcasts them)
// Both are zero-padded to an even K, so an odd kc may read one pair past K.
// Prefetch hints for one call:
//   stream    this call is the first to read the B micro-panel (it comes from DRAM / L3),
//             so the kernel prefetches ahead along it;
//   l2_next   `l2_lines` cache lines the driver wants pulled into L2 (a slice of the next
//             B micro-panel, or of the rows an unpacked B packs next), spread evenly over
//             the call's steps (L2Lines). All of them: at one line per step, a call of
//             2-3 row slices (7-18 rows) had shares of up to 2x its steps, and the rest
//             of the next panel came from DRAM on demand (AVX-512, 2816 x 2048 from
//             DRAM, 2 threads, alternating in one process: bf16 M = 12 / 16 0.390 /
//             0.464 -> 0.346 / 0.437 ms, f32 M = 8 / 12 / 16 1.38x / 1.33x / 1.19x;
//             2048^3 level).
struct Prefetch {
  bool stream = false;
  const char* l2_next = nullptr;
  int64_t l2_lines = 0;
  const char* next_panel = nullptr;  // AMX 16-row blocks: the panel whose first step their last one prefetches
  // l2_next as runs of l2_run_lines lines l2_run_stride bytes apart (an unpacked B's rows
  // for the next panel block; the first run starts l2_run_skip lines in); 0: one run.
  int64_t l2_run_lines = 0, l2_run_stride = 0, l2_run_skip = 0;
};

// A kernel's walk over its Prefetch::l2_next lines into L2, all of them, spread evenly
// over its `steps` steps.
class L2Lines {
 public:
  L2Lines(const Prefetch& pf, int64_t steps)
      : p_(pf.l2_next), run_(pf.l2_next - 64 * pf.l2_run_skip), left_(pf.l2_lines),
        run_left_(pf.l2_run_lines > 0 ? pf.l2_run_lines - pf.l2_run_skip : pf.l2_lines), run_lines_(pf.l2_run_lines),
        stride_(pf.l2_run_stride), per_(steps > 0 ? (pf.l2_lines + steps - 1) / steps : 0) {}
  OPTX_ALWAYS_INLINE void step() {
    for (int64_t i = 0; i < per_ && left_ > 0; ++i, --left_) {
      __builtin_prefetch(p_, 0, 2);
      p_ += 64;
      if (--run_left_ == 0) run_ += stride_, p_ = run_, run_left_ = run_lines_;
    }
  }

 private:
  const char* p_;
  const char* run_;
  int64_t left_, run_left_, run_lines_, stride_, per_;
};
using KernelF32A = void (*)(int m, int64_t kc, const float* a, const void* b, float* acc,
                            bool accumulate, const Prefetch& pf);
// As KernelF32A for B f32, but the finished tile is stored to c (row stride ldc) instead
// of acc: the last K block of a GEMM whose epilogue is the identity (see gemm.cpp). acc
// stays the scratch tile: a kernel that walks kc in pieces keeps its partial sums there.
using KernelF32Out = void (*)(int m, int64_t kc, const float* a, const void* b, float* acc,
                              bool accumulate, const Prefetch& pf, float* c, int64_t ldc);
// As KernelF32Out with A as bf16 pairs; c is acc itself (ldc 64) except in a GEMM's
// direct-to-C last block, where C may be bf16 (c_bf16: the tile rounded as the epilogue
// rounds, ldc in elements).
using KernelBf16A = void (*)(int m, int64_t kc, const uint16_t* a, const void* b, float* acc,
                             bool accumulate, const Prefetch& pf, void* c, int64_t ldc, bool c_bf16);
// The first `pairs` bf16 pairs of kMR rows as the dot-product kernel's A micro-panel
// (dword p * kMR + r = row r's pair p); returns how many it wrote (the caller packs the
// rest).
using PackAPairsFn = int64_t (*)(const uint16_t* const* rows, int64_t pairs, uint16_t* dst);

struct EpilogueArgs {
  const float* acc;        // m x 64, row stride 64
  int m, ncols;            // valid rows / columns of the tile
  void* c;                 // C at (row0, col0)
  int64_t ldc;
  DType c_dtype;
  float alpha, beta;
  const void* bias;        // at col0, or nullptr
  DType bias_dtype;
  const float* col_scale;  // 64 per-column scales (i8 weights), or nullptr
  // kSwiglu: the up projection's finished tile (same layout as acc) and its scales; C
  // gets silu(scale * acc) * (up_scale * up). alpha, beta and bias are unused then.
  const float* up = nullptr;
  const float* up_scale = nullptr;
};

// Decode: one row of A against four whole panels at once (see gemm_avx512_inl.h), the
// full K in one call; acc receives 4 x 64 results. Optional per ISA.
struct Gemv4Args {
  int64_t kc;
  const float* a;     // packed A micro-panel [k][kMR], row 0 used
  const void* b[4];   // four panels
  float* acc;         // 4 x 64
};
using Gemv4Fn = void (*)(const Gemv4Args&);

// Decode against unpacked weights (gemm.cpp, run_streaming_gemv): rows r < m of A (<=
// kGemvRowsM, or kGemvTileRowsM with pairs) times nb (<= kNR) rows of B ([N, K] with unit
// K stride, f32 or bf16), each dot product over the whole K, into acc[r * kNR + n]. B
// rows are read whole and in address order, so no packing pass runs for a call that
// reads each weight once.
// gemv_kn takes the same arguments for B [K, N] with unit N stride (b: element (k, n0) at
// b + k * ldb): nb <= kGemvKnCols columns, the 64-column panel q of them in acc + q * m *
// kNR (row stride kNR). Each output sums over k in order.
inline constexpr int kGemvRowsM = 8;
inline constexpr int kGemvTileRowsM = 128;  // rows a gemv_rows given A^T pairs takes (passes of four C^T tiles of 16)
inline constexpr int kGemvKnCols = 32 * kNR;
struct GemvRowsArgs {
  int m, nb;
  int64_t K;
  const void* a;  // row r at a + r * lda elements
  int64_t lda;
  DType a_dtype;
  const void* b;  // row n at b + n * ldb elements
  int64_t ldb;
  DType b_dtype;
  float* acc;     // m x kNR
  bool l2_ahead = false;  // prefetch the next rows (gemv_rows) or wide blocks (gemv_kn) into L2 (KernelTable::gemv_l2_ahead)
  const uint16_t* pairs = nullptr;  // A^T in bf16 pairs [ceil(m/16)][K/2][16][2] where KernelTable::gemv_pairs built them, else null
};

// The gemv_rows kernels' group of NB B rows from row n0 of the call: b[j] is row n0 + j,
// rows past the call repeating its last (loaded, never stored); nb the live ones; ahead
// the rows after the group, within the call, to run into L2 (0 unless l2).
template <int NB, class TB>
struct GemvRowGroup {
  const TB* b[NB];
  int nb, ahead;
  GemvRowGroup(const GemvRowsArgs& g, int n0, bool l2) : nb(NB < g.nb - n0 ? NB : g.nb - n0) {
    for (int j = 0; j < NB; ++j) b[j] = static_cast<const TB*>(g.b) + (n0 + (j < nb ? j : nb - 1)) * g.ldb;
    const int rest = g.nb - n0 - NB;
    ahead = !l2 || rest < 0 ? 0 : rest < NB ? rest : NB;
  }
  // At element k of the group's rows: as their loads cross a line, the same line of each
  // of the `ahead` rows after them into L2.
  OPTX_ALWAYS_INLINE void run_ahead(int64_t k, int64_t ldb) const {
    constexpr int64_t kLine = 64 / int64_t(sizeof(TB));  // B elements per cache line
    if (k % kLine == 0)
      for (int j = 0; j < ahead; ++j) __builtin_prefetch(b[j] + NB * ldb + k, 0, 2);
  }
};

inline constexpr int kGemv2MaxRows = 6;  // rows of the two-panel decode kernels (KernelTable)

struct KernelTable {
  KernelF32A f32b;      // B f32   [kc][64]
  KernelF32A bf16b;     // B bf16  [kc/2][64][2]
  KernelF32A i8b;       // B i8    [kc][64]
  KernelBf16A bf16dp;   // A bf16 x B bf16 with a dot-product instruction; may be nullptr
  void (*epilogue)(const EpilogueArgs&);
  // AMX (may be nullptr): adds A[rows x kc] * B[kc x 64] to the rows x 64 f32 block acc
  // (rows 16 or 32; row stride 64; overwritten unless accumulate), bf16 x bf16, kc a
  // multiple of 32. a: packed rows, row-major with stride lda, zero-padded past K; b: the panel at the
  // block's first pair row (pair rows are zero-padded to a multiple of 16). pf.l2_next /
  // l2_lines: lines to pull into L2 during the block (the 32-row kernel; 16-row blocks
  // run ahead along their own panel).
  void (*amx_block)(int rows, int64_t kc, const uint16_t* a, int64_t lda, const void* b, float* acc, const Prefetch& pf,
                    bool accumulate) = nullptr;
  void (*amx_release)() = nullptr;  // frees the calling thread's tile state
  Gemv4Fn gemv4_f32 = nullptr, gemv4_i8b = nullptr, gemv4_bf16b = nullptr;
  // 2 to kGemv2MaxRows (bf16) or 2-3 (int8) rows of A against two panels (b[0], b[1])
  // into acc: panel q's rows at acc + q * rows * 64 (row stride 64; int8 unscaled). Index:
  // rows - 2. Any entry may be null.
  Gemv4Fn gemv2_bf16b[kGemv2MaxRows - 1] = {};
  Gemv4Fn gemv2_i8b[2] = {};
  KernelF32Out f32b_out = nullptr;  // optional
  // Optional: as f32b_out with A as m rows lda apart (a[r * lda + k]) instead of a packed
  // micro-panel; acc, accumulate, c and ldc as there.
  void (*f32_rows_out)(int m, int64_t kc, const float* a, int64_t lda, const float* b, float* acc, bool accumulate, float* c,
                       int64_t ldc) = nullptr;
  // Optional, both or neither: for ISAs that widen bf16 / i8 weights inside the FMA loop
  // (no dot-product instruction) and whose L1 does not hold a whole f32 K block beside A.
  // widen_b writes 16-column strip s (columns 16 s .. 16 s + 15) of a K block of kc rows
  // of a B micro-panel (f32, bf16 pairs or i8) as f32 [kc][16], once for all row slices
  // that share it; f32_strip adds such a strip (b) times A's m rows to the tile's 16
  // columns at acc (row stride 64, as f32b) and stores the result to c (row stride ldc;
  // acc itself in all but a GEMM's direct-to-C last block). The values are exact in f32
  // and the sums keep f32b's k order, so results are bitwise those of bf16b / i8b.
  void (*widen_b)(DType bt, int64_t kc, const void* b, int s, float* dst) = nullptr;
  KernelF32Out f32_strip = nullptr;
  // Optional, with f32_strip: the K block (rows k0 .. k0 + kc) of panel j of an unpacked
  // f32 or bf16 B ([N, K], or [K, N] with kn) written straight into the four strips
  // f32_strip reads (strip s at dst + s * kc * 16; columns past N and rows past K zero):
  // what pack_panel and widen_b produce together, in one pass. Other dtypes or strides:
  // returns false and writes nothing.
  bool (*pack_strips)(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, float* dst) = nullptr;
  void (*gemv_rows)(const GemvRowsArgs&) = nullptr;  // optional
  // Optional, for a gemv_rows that reads A as pairs (GemvRowsArgs::pairs): writes the m
  // (<= kGemvTileRowsM) bf16 rows of A (lda apart, K a multiple of 32) in groups of 16 as
  // [ceil(m/16)][K/2][16][2], rows past m zero.
  void (*gemv_pairs)(const uint16_t* a, int64_t lda, int m, int64_t K, uint16_t* dst) = nullptr;
  bool gemv_l2_ahead = false;  // gemv_rows / gemv_kn run the next B rows into L2 ahead of their loads
  void (*gemv_kn)(const GemvRowsArgs&) = nullptr;    // optional
  // Optional: pack_panel for an unpacked bf16 or f32 B with unit inner stride, the same
  // bytes; other dtypes or strides: returns false and writes nothing.
  bool (*pack_panel_fast)(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, void* dst) = nullptr;
  PackAPairsFn pack_a_pairs = nullptr;  // optional, with bf16dp
  // Optional, with bf16dp: an int8 K block of a panel ([kc][64], row stride 64) as the bf16
  // pairs [ceil(kc/2)][64][2] bf16dp reads (a missing odd row zero). Every int8 is exact
  // in bf16, so bf16 A times int8 B runs on the dot product at the bf16 path's rounding.
  void (*i8_pairs)(const int8_t* b, int64_t kc, uint16_t* dst) = nullptr;
  // The K-block kernels (f32b, bf16b, i8b, f32b_out, bf16dp) walk Prefetch::l2_next as
  // runs (L2Lines), so an unpacked B's next rows can go to L2 while they run.
  bool l2_runs = false;
  // Optional, for an ISA without a bf16 dot product whose L1 holds a whole f32 K block of
  // kF32Kc rows beside A (AVX-512 without AVX512_BF16, 48 KiB L1D): a K block of kc rows
  // of a bf16 (pairs) or int8 B micro-panel as the f32 panel [kc, bf16: rounded up to
  // even][64] f32b reads, widened once for all row slices that share it. bf16b / i8b
  // widen inside the FMA loop instead, on the FMA ports: bf16 8 shifts / ands per 48 FMAs,
  // int8 8 conversions per 24. Exact, and f32b sums in their k order, so results are
  // bitwise theirs (int8 unscaled, as i8b's).
  void (*widen_panel)(DType bt, int64_t kc, const void* b, float* dst) = nullptr;
};
// K block of the f32 kernel (f32b): 128 x 64 f32 = 32 KiB, L1-resident beside A; the
// widened bf16 / int8 path (widen_panel) runs it too.
inline constexpr int64_t kF32Kc = 128;

// Column panel j of B ([N, K], or [K, N] with kn) as the packers read it: value(n, k) is
// element (n0 + n, k) of the weights, zero past N and past K.
template <class T>
struct PanelSource {
  const T* src;
  int64_t K, sn, sk, n0, ncols;
  PanelSource(const TensorView& b, bool kn, int64_t j)
      : src(static_cast<const T*>(b.data)), K(kn ? b.sizes[0] : b.sizes[1]), sn(kn ? b.strides[1] : b.strides[0]),
        sk(kn ? b.strides[0] : b.strides[1]), n0(j * kNR) {
    const int64_t N = kn ? b.sizes[1] : b.sizes[0];
    ncols = N - n0 < kNR ? N - n0 : kNR;
  }
  T value(int64_t n, int64_t k) const { return n < ncols && k < K ? src[(n0 + n) * sn + k * sk] : T(0); }
};

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();
const KernelTable& kernels_avx512_bf16();
const KernelTable& kernels_amx();

// t with the AVX2 unit's unpacked-B paths (gemv_rows unless t has its own, gemv_kn,
// pack_panel_fast), for the wider units: every AVX-512 CPU runs AVX2 code, and without them
// a call against unpacked weights packed B element by element first (~1 GB/s). On these
// hosts gemv_rows and gemv_kn also run the next B rows into L2 (Emerald Rapids, bf16
// M = 1 / 2 / 4, N = K = 4096, alternating: [N, K] 25.4 -> 30.6, 25.0 -> 29.3, 19.4 -> 28.0
// GB/s; [K, N] 21.4 -> 26.8, 21.7 -> 25.5, 21.0 -> 24.8).
inline KernelTable with_avx2_unpacked_paths(KernelTable t) {
  const KernelTable& a = kernels_avx2();
  if (!t.gemv_rows) t.gemv_rows = a.gemv_rows;
  t.gemv_l2_ahead = true;
  t.gemv_kn = a.gemv_kn;
  t.pack_panel_fast = a.pack_panel_fast;
  return t;
}

}  // namespace optx::gemm_detail
