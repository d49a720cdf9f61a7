// AMX kernels: bf16 x bf16 with tdpbf16ps (16 x 16 f32 tile += 16 x 32 bf16 tile * 16
// pairs x 16 bf16-pair tile), everything else as the AVX-512 kernels.
//
// One call adds a K block (kc, a multiple of 32) to a 32 x 64 block of C (or 16 x 64,
// amx_block16): for each
// 32-column half, 2 x 2 C tiles (tmm0-3) stay in the tile registers while A (tmm4-5, rows
// 0-15 / 16-31) and B (tmm6-7, columns 0-15 / 16-31 of the half) stream in 32-k steps, so
// each loaded tile feeds two tdpbf16ps. The packed panel [K/2][64][2] is already AMX's B layout: a 16 x 64 B
// tile is 16 pair-rows of 64 bytes, 256 bytes apart. Panels and packed A are zero-padded
// to a multiple of 32 in K, so there is no K tail.
#define OPTX_ISA_NS amx
#include "ops/gemm/gemm_avx512_inl.h"

namespace optx::gemm_detail::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tile configuration is per-thread state; load it once per thread until released.
thread_local bool t_configured = false;
constexpr int kPrefetchSteps = 1;
constexpr int kOtherHalfSteps = 3;  // amx_block: how far ahead a streaming block pulls a step's other half into L2
constexpr int kStreamerSteps = 4;  // amx_block16: how far ahead a page's first line starts the L2 streamer

void configure() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  t_configured = true;
}

// A 16-row block (small M, or the last 16 rows of a chunk): one A tile against the four
// 16-column B tiles of the panel, so C is 1 x 4 tiles (tmm0-3) for the whole K block and
// B streams through tmm6-7 twice per k-step. Each A tile feeds four tdpbf16ps; at small M
// the B stream (4 KiB per k-step) comes from DRAM, so the next step's lines are
// prefetched into L1 while this step computes.
// C tiles tmm0-3 from / to the f32 acc block (row stride kNR) at four element offsets:
// the 1 x 4 tiles of a 16-row block or the 2 x 2 of a 32-row block's column half.
OPTX_ALWAYS_INLINE void c_tiles_in(float* c, const int64_t (&off)[4], bool accumulate) {
  if (accumulate) {
    _tile_loadd(0, c + off[0], kNR * 4);
    _tile_loadd(1, c + off[1], kNR * 4);
    _tile_loadd(2, c + off[2], kNR * 4);
    _tile_loadd(3, c + off[3], kNR * 4);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
}
OPTX_ALWAYS_INLINE void c_tiles_out(float* c, const int64_t (&off)[4]) {
  _tile_stored(0, c + off[0], kNR * 4);
  _tile_stored(1, c + off[1], kNR * 4);
  _tile_stored(2, c + off[2], kNR * 4);
  _tile_stored(3, c + off[3], kNR * 4);
}
constexpr int64_t kRow1x4[4] = {0, 16, 32, 48};
constexpr int64_t kHalf2x2[4] = {0, 16, 16 * kNR, 16 * kNR + 16};

void amx_block16(int64_t kc, const uint16_t* a, int64_t lda, const uint8_t* b, float* c, bool accumulate, const char* next) {
  c_tiles_in(c, kRow1x4, accumulate);
  const int64_t lda_bytes = lda * 2;
  // The last steps prefetch the next panel's first, which is not the adjacent one when
  // the caller interleaves panels (SwiGLU's gate and up halves). Where the next panel has
  // fewer than kStreamerSteps steps (K < 128), such an address can lie past the weights:
  // a prefetch of an unrelated or unmapped line, which never faults.
  const auto step_at = [&](int64_t s) {
    return s < kc / 32 || !next ? reinterpret_cast<const char*>(b) + s * 16 * 256 : next + (s - kc / 32) * 16 * 256;
  };
  for (int64_t ks = 0; ks < kc; ks += 32) {
    const uint8_t* bk = b + (ks / 2) * 256;
    // The next step into L1 (tile loads wait for all 16 lines), not a run-ahead 8 steps
    // (32 KiB) on into L2, as the decode GEMVs (gemm_avx512_inl.h): its prefetches held
    // the line fill buffers the next step's lines need. Sapphire Rapids VM (stop 57),
    // 2 threads, packed weights rotated past the LLC, alternating call by call:
    // without it 2816 x 2048 M = 6 / 8 / 16 1.06-1.07x, 4096^2 M = 4 / 8 / 16
    // 1.06-1.11x, moe_forward T = 16 / 128 1.00-1.06x; `optx bench`, old and new builds
    // in turn, two rounds: gemm M = 4 / 16 1.00-1.05x, moe_forward T = 128 1.02-1.04x,
    // T = 16 level. The next step 2 steps ahead, or its 64 prefetches spread between the
    // tile loads, measured as this. Emerald Rapids (stop 43) and this VM class at stop 30
    // measured the run-ahead as a gain: 2816 x 2048 M = 6..16 0.61-0.64 -> 0.51-0.56 ms.
    if (ks + 32 < kc || next)
      for (int l = 0; l < 64; ++l) _mm_prefetch(step_at(ks / 32 + 1) + 64 * l, _MM_HINT_T0);
    // A step is one 4 KiB page, where the L2 streamer stops, and the burst above reaches
    // a page all at once: without a start each of its 64 lines waits on DRAM in a fill
    // buffer. The page's first line, kStreamerSteps ahead, starts the streamer on it, so
    // that burst finds its lines in L2 or on the way. 4096^2 M = 4 / 8 / 12 / 16
    // 1.05 / 1.06-1.07 / 1.08 / 1.06x, 2816 x 2048 M = 12 1.06x, moe_forward T = 128
    // 1.05x, T = 16 level (alternating call by call; 2 or 8 lines, or 8 or 16 steps
    // ahead, alike; 2 steps ahead 1.02-1.03x).
    if (ks + 32 * kStreamerSteps < kc || next) _mm_prefetch(step_at(ks / 32 + kStreamerSteps), _MM_HINT_T0);
    _tile_loadd(4, a + ks, lda_bytes);
    _tile_loadd(6, bk, 256);
    _tile_loadd(7, bk + 64, 256);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(6, bk + 128, 256);
    _tile_loadd(7, bk + 192, 256);
    _tile_dpbf16ps(2, 4, 6);
    _tile_dpbf16ps(3, 4, 7);
  }
  c_tiles_out(c, kRow1x4);
}

void amx_block(int rows, int64_t kc, const uint16_t* a, int64_t lda, const void* bv, float* acc, const Prefetch& pf, bool accumulate) {
  if (!t_configured) configure();
  const uint8_t* b = static_cast<const uint8_t*>(bv);
  if (rows == kAmxTileRows) {
    amx_block16(kc, a, lda, b, acc, accumulate, pf.next_panel);
    return;
  }
  const int64_t lda_bytes = lda * 2;
  // pf.l2_lines lines (a share of the next panel) into L2, spread over this block's
  // 2 x kc / 32 steps (see gemm.cpp's run_thread_amx).
  const int64_t pf_lines = pf.l2_lines, steps = 2 * (kc / 32);
  const int64_t pf_per_step = (pf_lines + steps - 1) / std::max<int64_t>(steps, 1);
  int64_t pf_at = 0;
  const uint16_t* a_lo = a;
  const uint16_t* a_hi = a + 16 * lda;
  for (int h = 0; h < 2; ++h) {
    float* c = acc + h * 32;
    c_tiles_in(c, kHalf2x2, accumulate);
    const uint8_t* bh = b + h * 128;
    for (int64_t ks = 0; ks < kc; ks += 32) {
      const uint8_t* bk = bh + (ks / 2) * 256;
      if (ks + kPrefetchSteps * 32 < kc) {
        // The next steps' B tile rows into L1: a tile load is 16 line loads and tdpbf16ps
        // waits for all of them. Not A's: its 32 rows advance 64 bytes a step, a pattern
        // the hardware's L1 streamer follows, and the prefetches only held fill buffers
        // the B lines needed. Packed bf16, 2 threads, Sapphire Rapids VM, alternating in
        // one process: 2048^3 1.04-1.06x, M = 1024 N = K = 2048 1.04-1.05x, one thread
        // over 64 cold 96 x 2816 x 2048 experts 1.08-1.09x; MoE T = 1024 1.02x.
        const uint8_t* pb = bk + kPrefetchSteps * 16 * 256;
        for (int r = 0; r < 16; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(pb + r * 256), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(pb + r * 256 + 64), _MM_HINT_T0);
        }
      }
      for (int64_t i = 0; i < pf_per_step && pf_at < pf_lines; ++i, ++pf_at)
        _mm_prefetch(pf.l2_next + 64 * pf_at, _MM_HINT_T1);
      // A block that brings its K block in from DRAM (pf.stream) reads only the first half
      // of each 4 KiB step in its first column half; the other half's lines, which its
      // second column half and the later row blocks read, go into L2 kOtherHalfSteps
      // steps ahead rather than wait on DRAM then. Packed bf16 at K = 4096 (two K blocks,
      // no pull), N = 4096, 2 threads, Sapphire Rapids VM, alternating call by call: M =
      // 48 / 64 / 128 / 256 / 1024 1.07-1.08 / 1.07-1.08 / 1.06-1.07 / 1.06 / 1.03-1.04x,
      // N = 11008 M = 128 1.07x, one thread M = 64 1.07x; K = 8192 and 11008 level. Where
      // the next panel is pulled (K <= kAmxKc) it measured level to 0.97x, so it is not
      // asked for there.
      if (pf.stream && h == 0 && ks + 32 * kOtherHalfSteps < kc) {
        const uint8_t* pq = b + (ks / 32 + kOtherHalfSteps) * 16 * 256 + 128;
        for (int r = 0; r < 16; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(pq + r * 256), _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(pq + r * 256 + 64), _MM_HINT_T1);
        }
      }
      _tile_loadd(4, a_lo + ks, lda_bytes);
      _tile_loadd(6, bk, 256);
      _tile_loadd(7, bk + 64, 256);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, a_hi + ks, lda_bytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    c_tiles_out(c, kHalf2x2);
  }
}

// Unpacked bf16 B [N, K] against up to kGemvTileRowsM bf16 rows of A (KernelTable::
// gemv_rows) on the tiles: C^T = B . A^T, so 16 of B's rows load as one A-operand tile
// straight from memory (64 bytes of k each: no packing pass) against B-operand tiles of
// A^T pairs (gemv_pairs, built once per thread), into C^T [16 B rows][16 A rows] per 16
// rows of A (tmm0-3). A tile product per 16 lines of
// B leaves the core's ports to the stream, where the vdpbf16ps row kernel spends one
// instruction per A row on each line and from 7 rows runs compute-bound. The 16 row
// streams need no software prefetch: the hardware prefetchers follow them (prefetches 128
// B-4 KiB ahead measured level to 0.85x). N = K = 4096, 2 threads, weights rotated past
// the LLC, Sapphire Rapids VM, alternating in one process against the row kernel: M = 1
// / 2 / 3 / 5 level / 1.03x / 1.04-1.07x / 1.03-1.06x, M = 7 / 8 1.43-1.48x (~30 GB/s, as
// the packed GEMV); M = 9-64, which packed each panel for the AMX blocks, 1.34-1.47x.
// Past 64 rows (the tiles hold four C^T tiles beside B's and two pair tiles) each 16 B
// rows take passes of 64, the later ones reading B from L2: M = 65 / 80 / 96 / 128
// 2.06-2.11 / 2.08-2.11 / 2.24-2.31 / 2.81-2.88 ms on the AMX blocks -> 1.54-1.55 /
// 1.58-1.61 / 1.77-1.78 / 2.23-2.24 (best of 60 calls, two rounds). Each pass reads its
// rows' pairs (64 rows x K x 2 bytes) from L2 per 16 B rows, which holds it there.
// Without pairs (f32 A, K not a multiple of 32): this unit's row kernels.
void gemv_rows_tiles(const GemvRowsArgs& g) {
  if (!g.pairs) return gemv_rows(g);
  if (!t_configured) configure();
  const char* b = static_cast<const char*>(g.b);
  const int64_t ldb = g.ldb * 2;
  alignas(64) float ct[16 * 16];
  alignas(64) uint8_t stage[16 * 64];  // a last group's live rows, zeros past them
  for (int n0 = 0; n0 < g.nb; n0 += 16) {
    const int live = std::min(16, g.nb - n0);
    const char* bg = b + n0 * ldb;
    for (int m0 = 0; m0 < g.m; m0 += 64) {  // passes of 64 rows over the same 16 B rows (from L2 after the first)
      const int groups = std::min(4, (g.m - m0 + 15) / 16);  // C^T tiles 0 .. groups - 1: A rows m0 + 16 t ..
      const uint16_t* pt[4];
      for (int t = 0; t < 4; ++t) pt[t] = g.pairs + (m0 / 16 + std::min(t, groups - 1)) * g.K * 16;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < g.K; k += 32) {
        if (live == 16) {
          _tile_loadd(4, bg + k * 2, ldb);
        } else {
          for (int r = 0; r < 16; ++r)
            _mm512_store_si512(stage + 64 * r, r < live ? _mm512_loadu_si512(bg + r * ldb + k * 2) : _mm512_setzero_si512());
          _tile_loadd(4, stage, 64);
        }
        // Pair tiles alternate between tmm6 and tmm7, so a load need not wait for the product
        // that reads the other.
        _tile_loadd(6, pt[0] + k * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (groups > 1) {
          _tile_loadd(7, pt[1] + k * 16, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (groups > 2) {
          _tile_loadd(6, pt[2] + k * 16, 64);
          _tile_dpbf16ps(2, 4, 6);
        }
        if (groups > 3) {
          _tile_loadd(7, pt[3] + k * 16, 64);
          _tile_dpbf16ps(3, 4, 7);
        }
      }
      for (int t = 0; t < groups; ++t) {
        switch (t) {  // tile numbers are immediates
          case 0: _tile_stored(0, ct, 64); break;
          case 1: _tile_stored(1, ct, 64); break;
          case 2: _tile_stored(2, ct, 64); break;
          default: _tile_stored(3, ct, 64); break;
        }
        const int rows = std::min(16, g.m - m0 - 16 * t);
        for (int i = 0; i < live; ++i)
          for (int r = 0; r < rows; ++r) g.acc[(m0 + 16 * t + r) * kNR + n0 + i] = ct[i * 16 + r];
      }
    }
  }
}

// A^T pairs (KernelTable::gemv_pairs): 16 dword pairs of 16 rows per transpose.
void gemv_pairs(const uint16_t* a, int64_t lda, int m, int64_t K, uint16_t* dst) {
  for (int r0 = 0; r0 < m; r0 += 16, dst += K * 16)
    for (int64_t p0 = 0; p0 < K / 2; p0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = r0 + i < m ? _mm512_loadu_si512(a + (r0 + i) * lda + 2 * p0) : _mm512_setzero_si512();
      simd::Avx512::transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_store_si512(dst + (p0 + c) * 32, r[c]);
    }
}

void amx_release() {
  if (t_configured) {
    _tile_release();
    t_configured = false;
  }
}

}  // namespace
}  // namespace optx::gemm_detail::amx

namespace optx::gemm_detail {
const KernelTable& kernels_amx() {
  static const KernelTable t = with_avx2_unpacked_paths({.f32b = amx::kern_f32,
                                                          .bf16b = amx::kern_bf16b,
                                                          .i8b = amx::kern_i8b,
                                                          .bf16dp = nullptr,
                                                          .epilogue = amx::epilogue,
                                                          .amx_block = amx::amx_block,
                                                          .amx_release = amx::amx_release,
                                                          .gemv4_f32 = amx::gemv4_f32,
                                                          .gemv4_i8b = amx::gemv4_i8b,
                                                          .gemv4_bf16b = amx::gemv4_bf16b,
                                                          .gemv2_bf16b = {amx::gemv2_bf16b<2>, amx::gemv2_bf16b<3>},
                                                          .gemv2_i8b = {amx::gemv2_i8b<2>, amx::gemv2_i8b<3>},
                                                          .f32b_out = amx::kern_f32_out,
                                                          .f32_rows_out = amx::kern_f32_rows,
                                                          .gemv_rows = amx::gemv_rows_tiles,
                                                          .gemv_pairs = amx::gemv_pairs,
                                                          .l2_runs = true});
  return t;
}
}  // namespace optx::gemm_detail
