// AVX2 + FMA microkernels. 16 ymm registers allow 6 rows x 2 ymm = 12 accumulators, so a
// 64-wide panel is processed as four 16-column sub-panels; the 6 x kc slice of A is
// re-read from L1 for each of them.
#include <immintrin.h>

#include <algorithm>

#include "ops/gemm/gemm_kernels.h"

#include "simd/simd_avx2.h"
#include "simd/simd_scalar.h"
#define OPTX_ISA_NS avx2
#define OPTX_GEMM_SIMD ::optx::simd::Avx2
#include "ops/gemm/gemm_epilogue_inl.h"

namespace optx::gemm_detail::avx2 {
namespace {

// How far ahead of its loads a decode stream prefetches (see kern_one_m; gemv_panels does
// not: see there).
constexpr int64_t kAheadBytes = 4096;

// Widens 16 columns of the current k (or k-pair) of the sub-panel into two ymm of f32.
// kChunkBytes / kAheadBytes: kern_one_m's pieces and prefetch distance (see there).
struct LoadF32 {
  static constexpr int64_t kRowBytes = kNR * 4, kChunkBytes = 32 * 1024, kAheadBytes = avx2::kAheadBytes;
  OPTX_ALWAYS_INLINE static void even(const void* b, int64_t k, int s, __m256 (&v)[2]) {
    const float* p = static_cast<const float*>(b) + k * kNR + s * 16;
    v[0] = _mm256_load_ps(p);
    v[1] = _mm256_load_ps(p + 8);
  }
};
// A bf16 pair dword (even k | odd k << 16) of 8 columns -> the even and the odd k as f32.
OPTX_ALWAYS_INLINE void widen_pairs(__m256i v, __m256& even, __m256& odd) {
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
}
struct LoadI8 {
  static constexpr int64_t kRowBytes = kNR, kChunkBytes = 2 * 1024, kAheadBytes = avx2::kAheadBytes;
  OPTX_ALWAYS_INLINE static void even(const void* b, int64_t k, int s, __m256 (&v)[2]) {
    const int8_t* p = static_cast<const int8_t*>(b) + k * kNR + s * 16;
    // Each half sign-extended straight from memory (vpmovsxbd ymm, m64). One 16-byte load
    // split by vpunpckhqdq added a shuffle and a register form of vpmovsxbd per half: the
    // 2-6-row int8 kernels ran at ~50% of the FMA peak with B in cache; two builds
    // alternating in one process, in cache one thread M = 2 / 4 / 6 1.23x / 1.37x / 1.26x,
    // 4096 x 4096 two threads 1.17x / 1.30x / 1.23x.
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
  }
};

// a: packed A micro-panel, [k][kMR].
// c: M rows x NV vectors (8 NV columns) of accumulators.
template <int M, int NV = 2>
OPTX_ALWAYS_INLINE void fma_rows(__m256 (&c)[M][NV], const __m256 (&b)[NV], const float* a,
                                 int64_t k) {
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
    const __m256 av = _mm256_broadcast_ss(a + k * kMR + r);
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) c[r][i] = _mm256_fmadd_ps(av, b[i], c[r][i]);
  }
}

template <int M, int NV = 2>
OPTX_ALWAYS_INLINE void begin(__m256 (&c)[M][NV], const float* acc, bool accumulate) {
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
    for (int i = 0; i < NV; ++i)
      c[r][i] = accumulate ? _mm256_loadu_ps(acc + r * kNR + 8 * i) : _mm256_setzero_ps();
}

template <int M, int NV = 2>
OPTX_ALWAYS_INLINE void end(__m256 (&c)[M][NV], float* out, int64_t ldo = kNR) {
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(out + r * ldo + 8 * i, c[r][i]);
}

// The four 16-column passes read one line in four of each k row, an access the
// prefetchers follow poorly from DRAM: with Prefetch::stream (the first reader of the
// panel), the first pass prefetches whole rows Load::kAheadBytes ahead, and the passes run
// over Load::kChunkBytes of the panel at a time, so the later passes find it in L1 / L2.
// (Decode M = 2-6 runs the whole K in one call; each pass fetched a quarter of a 512 KiB
// panel.) M = 2, 3, 6, N = K = 4096 bf16 from DRAM, 2 threads, alternating in one process:
// 4.3 -> 3.4 -> 3.1, 5.1 -> 3.8 -> 3.2, 6.1 -> 4.1 -> 3.8 ms (prefetch, then chunks).
// (bf16 weights now stream as in kern_bf16b_m.) int8 weights (64-byte k rows) take 2 KiB
// pieces for the reason given there: memory must not sit idle while the later passes
// run. 2816 x 2048 int8 from DRAM, two builds alternating in one process, 2 threads,
// against 32 KiB pieces: M = 2 / 3 / 4 / 5 / 6 +28-32 / +27-32 / +18-25 / +16-23 / +11-22%;
// 4 KiB pieces 2-10% behind 2 KiB, 8 KiB 5-11% behind 4; 8 KiB ahead within 4% of 4.
OPTX_ALWAYS_INLINE void prefetch_row(const void* b, int64_t row, int64_t row_bytes, int64_t ahead) {
  const char* p = static_cast<const char*>(b) + row * row_bytes + ahead;
  for (int64_t l = 0; l < row_bytes; l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
}
// One line of the driver's next B micro-panel into L2 per k row of the first pass
// (pf.l2_next). Without it each K block's first row slice waited on the new 32 KiB
// micro-panel from L3 / DRAM: f32 2048^3, alternating in one process, 1 thread 67.9 ->
// 77.2 GFLOP/s, 2 threads 125 -> 134; bf16 (bound by its widening, not by memory) 58.1 ->
// 60.0.
OPTX_ALWAYS_INLINE void prefetch_l2_next(const Prefetch& pf, int64_t row) {
  if (row < pf.l2_lines) _mm_prefetch(pf.l2_next + 64 * row, _MM_HINT_T1);
}
// Pass 0's prefetches at k row `row`: the stream ahead (first reader) and pf.l2_next.
OPTX_ALWAYS_INLINE void prefetch_ahead(const Prefetch& pf, const void* b, int64_t row, int64_t row_bytes, int64_t ahead) {
  if (pf.stream) prefetch_row(b, row, row_bytes, ahead);
  prefetch_l2_next(pf, row);
}

// out / ldo: where the last chunk stores the tile (acc, or C for KernelF32Out); earlier
// chunks keep it in acc.
template <class Load, int M>
void kern_one_m(int64_t kc, const float* a, const void* b, float* acc,
                bool accumulate, const Prefetch& pf, float* out, int64_t ldo) {
  const int64_t chunk = Load::kChunkBytes / Load::kRowBytes;
  for (int64_t k0 = 0; k0 < kc || k0 == 0; k0 += chunk) {
    const int64_t k1 = std::min(kc, k0 + chunk);
    float* o = k1 == kc ? out : acc;
    const int64_t lo = k1 == kc ? ldo : kNR;
    for (int s = 0; s < 4; ++s) {
      __m256 c[M][2];
      begin<M>(c, acc + 16 * s, accumulate || k0 > 0);
      // Pass 0 (which prefetches) and the others as separate loops, each unrolled by 4: one
      // loop with the pass test in it, not unrolled, spent ~6 instructions per 12 FMAs on
      // its own control. 2048^3, alternating in one process, five runs: f32 1 thread +2 to
      // +8% (84.7-90.4 -> 88.7-92.5 GFLOP/s; OpenBLAS's Zen kernel 92.9-94.3 in the bench),
      // 2 threads +4 to +17% (noisier); bf16 through widen_b +3%.
      const auto step = [&](int64_t k) {
        __m256 bb[2];
        Load::even(b, k, s, bb);
        fma_rows<M>(c, bb, a, k);
      };
      if (s == 0) {
#pragma GCC unroll 4
        for (int64_t k = k0; k < k1; ++k) prefetch_ahead(pf, b, k, Load::kRowBytes, Load::kAheadBytes), step(k);
      } else {
#pragma GCC unroll 4
        for (int64_t k = k0; k < k1; ++k) step(k);
      }
      end<M>(c, o + 16 * s, lo);
    }
  }
}

// bf16 pairs: a 32-bit lane is (even k | odd k << 16) of one column. M rows x 8 NV
// columns per pass, 8 / NV passes over each kBf16ChunkBytes piece of the panel (up to four
// rows take NV = 4, at most two rows a pass: bf16b_pass4). The first reader's first pass
// prefetches whole k rows kBf16AheadBytes ahead, in address order; the later passes find
// the piece in L1 and issue no prefetches, so a piece is kept small (4 KiB, a few hundred
// ns of work) and the lines already in flight, two pieces ahead, keep memory busy through
// them (with 32 KiB pieces and the same first-pass prefetch, memory sat idle during the
// later passes; 16 KiB pieces with each pass asking for its own lines one piece ahead
// were the answer until stop 26). bf16 from DRAM (a new copy every call), two
// library builds alternating call by call in one process, 16 KiB against 4 KiB pieces:
// 2816 x 2048, one thread M = 2 / 3 / 4 / 5 / 6 +29 / +19-23 / +7-8 / +17-22 / +5-14%,
// two threads +23-33 / +25-33 / +20-23 / +47-62 / +33-36%; 2048 x 1408 and 4096 x 4096
// likewise (two threads M = 2-6 +14% to +50%). Against 4 KiB pieces 8 KiB ahead, one
// thread: 2 KiB pieces equal (-5 to +4%), 3 KiB 0-9% slower, 8 KiB 14-31% slower; a
// distance of 4 KiB equal to 8 (two threads 0-10% behind it), 6 KiB 11-20% slower, 2 KiB
// slower than the old kernel; each pass asking for its own lines (4 / 4 KiB) 3-15% slower
// at M = 3-6. (f32 weights, tried with per-pass prefetches in kern_one_m, lost 9-21%: 4 B
// per value leaves no compute to hide behind.)
constexpr int64_t kBf16ChunkBytes = 4 * 1024;
constexpr int64_t kBf16AheadBytes = 8 * 1024;

// One 32-column pass (pass s of a 64-column panel) of R <= 2 rows over pair rows [k0, k1):
// R x 4 accumulators, the 2R broadcasts of A held across the pass's four B vectors, each
// vector widened right before its FMAs (at most 15 registers live). Four rows at once
// held 16 accumulators beside the 8 widened vectors and kept them on the stack, each FMA
// a load, an add and a store in its chain: M = 4 ran at ~45% of the FMA peak with B in
// cache. The rows' second pair re-reads the piece from L1. pf: the first reader of the
// piece, which prefetches ahead.
template <int R>
OPTX_ALWAYS_INLINE void bf16b_pass4(const uint16_t* b, int s, const float* a, int64_t k0, int64_t k1, float* acc,
                                    bool load_acc, const Prefetch* pf) {
  __m256 c[R][4];
  begin<R, 4>(c, acc, load_acc);
  // An odd kc reads one pair past K: zero in both packed A and B.
  for (int64_t k = k0; k < k1; k += 2) {
    const uint16_t* p = b + k * kNR + s * 64;
    if (pf) prefetch_ahead(*pf, b, k / 2, kNR * 4, kBf16AheadBytes);  // whole pair rows
    __m256 ae[R], ao[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      ae[r] = _mm256_broadcast_ss(a + k * kMR + r);
      ao[r] = _mm256_broadcast_ss(a + (k + 1) * kMR + r);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      __m256 ev, od;
      widen_pairs(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 16 * i)), ev, od);
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) c[r][i] = _mm256_fmadd_ps(ao[r], od, _mm256_fmadd_ps(ae[r], ev, c[r][i]));
    }
  }
  end<R, 4>(c, acc);
}

template <int M, int NV = 2>
void kern_bf16b_m(int64_t kc, const float* a, const void* bv, float* acc,
                  bool accumulate, const Prefetch& pf) {
  const uint16_t* b = static_cast<const uint16_t*>(bv);
  const int64_t chunk = 2 * kBf16ChunkBytes / (kNR * 4);  // k values, even
  // Pieces in K order, as every other kernel sums K: a row's result must not depend on
  // the slice it lands in, and slices follow the thread count's row chunks. (Up to three
  // rows used to alternate pieces between K's two halves, two DRAM streams: M = 2 / 3 -4
  // to -9% / -3 to -5% time at 2816 x 2048 on two threads, when this kernel ran decode;
  // packed decode of 2-6 rows now streams pairs of panels in gemv_bf16b / gemv_bf16b_passes,
  // and this path keeps a thread's lone last panel and prefill slices, where the other
  // order made bf16 results depend on the thread count by an ulp.)
  const int64_t pieces = std::max<int64_t>(1, (kc + chunk - 1) / chunk);
  for (int64_t j = 0; j < pieces; ++j) {
    const int64_t k0 = j * chunk;
    const int64_t k1 = std::min(kc, k0 + chunk);
    for (int s = 0; s < 8 / NV; ++s) {
      // Three rows keep one pass of 3 x 4 accumulators (a few on the stack): two rows and
      // then one re-reading the piece ran 0.82-0.90x from DRAM on two threads.
      if constexpr (NV == 4 && M != 3) {
        constexpr int R = M == 1 ? 1 : 2;  // M is 1, 2 or 4 here
        static_assert(M % R == 0);
        for (int r0 = 0; r0 < M; r0 += R)
          bf16b_pass4<R>(b, s, a + r0, k0, k1, acc + r0 * kNR + 32 * s, accumulate || k0 > 0,
                         s == 0 && r0 == 0 ? &pf : nullptr);
        continue;
      }
      __m256 c[M][NV];
      begin<M, NV>(c, acc + 8 * NV * s, accumulate || k0 > 0);
      // An odd kc reads one pair past K: zero in both packed A and B.
      for (int64_t k = k0; k < k1; k += 2) {
        const uint16_t* p = b + k * kNR + s * 16 * NV;
        if (s == 0) prefetch_ahead(pf, b, k / 2, kNR * 4, kBf16AheadBytes);  // whole pair rows
        __m256 ev[NV], od[NV];
#pragma GCC unroll 4
        for (int i = 0; i < NV; ++i) widen_pairs(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 16 * i)), ev[i], od[i]);
        fma_rows<M, NV>(c, ev, a, k);
        fma_rows<M, NV>(c, od, a, k + 1);
      }
      end<M, NV>(c, acc + 8 * NV * s);
    }
  }
}

// One 16-column strip of a widened K block (b: [kc][16], see KernelTable::widen_b) for
// M rows into the tile's 16 columns at acc, stored to out (row stride ldo). pf: its share
// of the next block (the driver splits a block over 4 x slices calls), pulled into L2 a
// line every kc / l2_lines k steps. Issued at the start, the 32-64 lines of a decode
// call (8-16 rows) waited on the core's miss buffers and the FMAs behind them. 2816 x
// 2048 weights from DRAM (a new copy every call), two library builds alternating in one
// process, three runs: bf16 one thread M = 8-12 +7-39%, 13-16 +2-27%; two threads M = 8-16
// +5-16%; f32 M = 12 +78%; f32 2048^3 (a dozen lines per call) ±1%.
template <int M>
void kern_strip_m(int64_t kc, const float* a, const float* b, float* acc, bool accumulate, const Prefetch& pf, float* out, int64_t ldo) {
  const int64_t every = std::max<int64_t>(1, kc / std::max<int64_t>(pf.l2_lines, 1));
  __m256 c[M][2];
  begin<M>(c, acc, accumulate);
  const auto steps = [&](int64_t k0, int64_t k1) {
#pragma GCC unroll 4
    for (int64_t k = k0; k < k1; ++k) {
      const __m256 bb[2] = {_mm256_load_ps(b + 16 * k), _mm256_load_ps(b + 16 * k + 8)};
      fma_rows<M>(c, bb, a, k);
    }
  };
  int64_t k = 0;
  for (int64_t l = 0; l < pf.l2_lines; ++l) {  // no test per k step
    _mm_prefetch(pf.l2_next + 64 * l, _MM_HINT_T1);
    const int64_t k1 = std::min(kc, k + every);
    steps(k, k1);
    k = k1;
  }
  steps(k, kc);
  end<M>(c, out, ldo);
}

// Single-row decode (M = 1): the 6-row kernel walks a panel as four 16-column passes, so
// each pass reads one line in four of the panel (512 KiB at K = 4096, bf16) and the
// panel comes from DRAM four times over or is fetched in pieces the prefetchers do not
// follow. Here each panel's k rows are read whole and in address order (8 accumulators
// for 64 columns), one panel after the other, as four streams: the four quarters of the
// panel's rows in step, which the hardware prefetchers follow side by side. One stream
// per core read 80% of what an 8-stream read loop does in the same process, two 88%
// (4096 x 4096 bf16, 17 rotated copies, 2 threads). Those streams also prefetched 4 KiB
// ahead in software; without it (stop 35, two builds alternating, from DRAM, 2 threads)
// bf16 4096 x 4096 +7-9% and +23% in a faster phase, 2816 x 2048 +9%, int8 weights +1-5%,
// f32 panels +4-26%: with several streams the prefetchers run further ahead than 4 KiB,
// and the prefetches took L1 miss buffers the loads then waited for. Four streams against
// two without prefetches: within +-3%; four kept for int8 (64-byte rows), which lost 2-5%
// at two. Row: widens one k row (or bf16 k pair) into the accumulators.
constexpr int kGemvStreams = 4;
// Panel rows [0, rows) in the streams' order, visit(q) for row q: for i in [i0, i1) row i
// of each quarter in turn (the quarters are `part` rows long); tail: the rows % 4 left over
// after the quarters, in order.
template <class Visit>
OPTX_ALWAYS_INLINE void stream_rows(int64_t part, int64_t i0, int64_t i1, Visit&& visit) {
  for (int64_t i = i0; i < i1; ++i)
    for (int s = 0; s < kGemvStreams; ++s) visit(s * part + i);
}
template <class Visit>
OPTX_ALWAYS_INLINE void stream_tail(int64_t part, int64_t rows, Visit&& visit) {
  for (int64_t q = kGemvStreams * part; q < rows; ++q) visit(q);
}

// R rows of A against P panels (acc: panel q's rows at acc + q * R * 64).
template <int R, int P, class Row>
OPTX_ALWAYS_INLINE void gemv_panels(const Gemv4Args& g, int64_t step, int64_t row_bytes, Row row) {
  for (int p = 0; p < P; ++p) {
    __m256 c[R][8];
    for (auto& cr : c)
      for (auto& x : cr) x = _mm256_setzero_ps();
    const char* b = static_cast<const char*>(g.b[p]);
    const int64_t rows = (g.kc + step - 1) / step, part = rows / kGemvStreams;
    const auto visit = [&](int64_t q) { row(b + q * row_bytes, q * step, c); };
    stream_rows(part, 0, part, visit);
    stream_tail(part, rows, visit);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(g.acc + (p * R + r) * kNR + 8 * i, c[r][i]);
  }
}

void gemv4_f32(const Gemv4Args& g) {
  gemv_panels<1, 4>(g, 1, kNR * 4, [&](const char* bk, int64_t k, __m256 (&c)[1][8]) {
    const __m256 av = _mm256_broadcast_ss(g.a + k * kMR);
    const float* b = reinterpret_cast<const float*>(bk);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) c[0][i] = _mm256_fmadd_ps(av, _mm256_load_ps(b + 8 * i), c[0][i]);
  });
}

// One 64-column pair row bk into R rows' accumulators; a: the rows' A values at its even
// k. A pair row holds one dword (even k | odd k << 16) per column, in column order: the
// 32-byte piece i is columns 8i .. 8i + 7. The rows take their A values as broadcasts from
// memory at each use: 2 or 3 rows hold 16 / 24 accumulators, so some live on the stack,
// which a weight stream from DRAM has the time for (2 rows do 32 FMAs per 256-byte pair
// row that takes ~3x as long to arrive).
template <int R>
OPTX_ALWAYS_INLINE void fma_pair_row(const char* bk, const float* a, __m256 (&c)[R][8]) {
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    __m256 even, odd;
    widen_pairs(_mm256_load_si256(reinterpret_cast<const __m256i*>(bk + 32 * i)), even, odd);
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) {
      c[r][i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r), even, c[r][i]);
      c[r][i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + kMR + r), odd, c[r][i]);
    }
  }
}
template <int R, int P>
void gemv_bf16b(const Gemv4Args& g) {
  gemv_panels<R, P>(g, 2, kNR * 4, [&](const char* bk, int64_t k, __m256 (&c)[R][8]) {  // k even; odd K reads the zero pad
    fma_pair_row<R>(bk, g.a + k * kMR, c);
  });
}
void gemv4_bf16b(const Gemv4Args& g) { gemv_bf16b<1, 4>(g); }

// Four to six decode rows against two panels in the same four streams: the rows go in
// passes of two over steps of kStepRows pair rows per stream (4 KiB of the panel, read
// from DRAM by the first pass and from L1 by the others), each pass's 16 accumulators
// loaded from and stored back to acc between steps. Against the 6-row kernel's 4 KiB
// pieces with software prefetches (stop 35, two builds alternating, from DRAM, 2
// threads): M = 4 / 5 / 6 1.23-1.25x / 1.01-1.05x / 1.18-1.19x; with one copy in L3,
// M = 4 0.95x. Steps of 2 / 8 KiB within +-3% of 4, 16 KiB 3-8% behind.
template <int M, int P>
void gemv_bf16b_passes(const Gemv4Args& g) {
  constexpr int64_t kStepRows = 4, kRowBytes = kNR * 4;
  for (int p = 0; p < P; ++p) {
    float* acc = g.acc + p * M * kNR;
    for (int i = 0; i < M * kNR; ++i) acc[i] = 0.0f;
    const char* b = static_cast<const char*>(g.b[p]);
    const int64_t rows = (g.kc + 1) / 2, part = rows / kGemvStreams;
    const auto pass = [&]<int R>(int r0, auto&& each_row) {
      __m256 c[R][8];
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < 8; ++i) c[r][i] = _mm256_loadu_ps(acc + (r0 + r) * kNR + 8 * i);
      each_row([&](int64_t q) { fma_pair_row<R>(b + q * kRowBytes, g.a + 2 * q * kMR + r0, c); });  // pair row q
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(acc + (r0 + r) * kNR + 8 * i, c[r][i]);
    };
    const auto all_passes = [&](auto&& each_row) {
      for (int r0 = 0; r0 + 1 < M; r0 += 2) pass.template operator()<2>(r0, each_row);
      if constexpr (M % 2) pass.template operator()<1>(M - 1, each_row);
    };
    for (int64_t i0 = 0; i0 < part; i0 += kStepRows) {
      const int64_t i1 = std::min(part, i0 + kStepRows);
      all_passes([&](auto&& row) { stream_rows(part, i0, i1, row); });
    }
    all_passes([&](auto&& row) { stream_tail(part, rows, row); });
  }
}

// int8 weights carry twice the FMAs per byte of bf16: two rows against two panels (16
// accumulators) from DRAM 1.05-1.12x the 6-row kernel's pieces (two builds alternating,
// 2 threads); three rows (24, a third on the stack) turned compute-bound, 0.68-0.79x,
// and keep the 6-row kernel.
template <int R, int P>
void gemv_i8b(const Gemv4Args& g) {
  gemv_panels<R, P>(g, 1, kNR, [&](const char* bk, int64_t k, __m256 (&c)[R][8]) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bk + 8 * i))));
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) c[r][i] = _mm256_fmadd_ps(_mm256_broadcast_ss(g.a + k * kMR + r), b, c[r][i]);
    }
  });
}
void gemv4_i8b(const Gemv4Args& g) { gemv_i8b<1, 4>(g); }

// bf16 2048^3 on Zen 3: the bf16b kernel's two widening ops per 16 columns and k pair
// held it at 60-66% of the FMA peak even with B in L1; widened once per K block (64 KiB
// at kc = 256), the widening is amortised over all the block's row slices. Alternating in
// one process: 1 thread 61.8 -> 82.4 GFLOP/s, 2 threads 115 -> 142 (then +3-6% from the
// strips, see gemm.cpp). f32 blocks are copied likewise.
void widen_b(DType bt, int64_t kc, const void* bv, int s, float* dst) {
  if (bt == DType::kBF16) {
    // Pair row q holds k = 2q and 2q + 1 of each column; strip s is its 64 bytes from 64 s.
    // An odd kc writes only the even row of its last pair.
    const uint16_t* b = static_cast<const uint16_t*>(bv) + 32 * s;
    for (int64_t k = 0; k < kc; k += 2)
      for (int i = 0; i < 2; ++i) {
        __m256 even, odd;
        widen_pairs(_mm256_load_si256(reinterpret_cast<const __m256i*>(b + k * kNR + 16 * i)), even, odd);
        _mm256_store_ps(dst + k * 16 + 8 * i, even);
        if (k + 1 < kc) _mm256_store_ps(dst + k * 16 + 16 + 8 * i, odd);
      }
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m256 v[2];
    if (bt == DType::kF32) LoadF32::even(bv, k, s, v);
    else LoadI8::even(bv, k, s, v);
    _mm256_store_ps(dst + k * 16, v[0]);
    _mm256_store_ps(dst + k * 16 + 8, v[1]);
  }
}

// An unpacked B block straight into f32 strips (KernelTable::pack_strips): one pass of
// 8 x 8 transposes ([N, K] B) or row copies ([K, N]) where pack_panel's element loop and
// widen_b's strip copy took 5.6% and 6.6% of f32 2048^3 on one thread. kStrips false: an
// f32 B into pack_panel's [kc][64] panel instead (KernelTable::pack_panel_fast), for the
// kernels that take panels: the element loop moved ~2.5 GB/s, so f32 M = 16 against
// unpacked 2048 x 2048 weights spent 82% of its 6.8 ms packing.
template <class T, bool kStrips = true>
void pack_f32_t(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, float* dst) {
  const PanelSource<T> in(b, kn, j);
  const T* src = in.src;
  const int64_t sn = in.sn, sk = in.sk, n0 = in.n0, ncols = in.ncols, krows = std::min(kc, in.K - k0);
  auto at = [&](int64_t kk, int64_t n) { return kStrips ? dst + strip_index(kc, kk, n) : dst + kk * kNR + n; };
  auto scalar = [&](int64_t kk, int64_t n) {
    const T x = in.value(n, k0 + kk);
    if constexpr (sizeof(T) == 4) *at(kk, n) = x;
    else *at(kk, n) = bf16_to_f32(x);
  };
  int64_t kv = 0;  // rows done by vectors
  if (kn) {
    if (ncols == kNR) {
      for (; kv < krows; ++kv)
        for (int64_t n = 0; n < kNR; n += 8) _mm256_storeu_ps(at(kv, n), simd::Avx2::load(src + (k0 + kv) * sk + n0 + n));
    }
  } else {
    // Eight B rows at a time along K (eight streams the prefetchers follow), not all 64
    // rows 8 elements at a time (64 streams 4 KiB apart, each line a demand miss): f32
    // M = 16 against unpacked 10944 x 2048 weights from DRAM, 2 threads, 10.2 -> 7.6-7.8 ms.
    if (ncols >= 8) kv = krows / 8 * 8;
    for (int64_t n = 0; n + 8 <= ncols; n += 8)
      for (int64_t k8 = 0; k8 < kv; k8 += 8) {
        __m256 x[8];
        for (int i = 0; i < 8; ++i) x[i] = simd::Avx2::load(src + (n0 + n + i) * sn + k0 + k8);
        simd::Avx2::transpose8(x);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(at(k8 + i, n), x[i]);
      }
    for (int64_t kk = 0; kk < kv; ++kk)  // those rows' partial 8-column group and zero columns
      for (int64_t n = ncols / 8 * 8; n < kNR; ++n) scalar(kk, n);
  }
  for (int64_t kk = kv; kk < kc; ++kk)
    for (int64_t n = 0; n < kNR; ++n) scalar(kk, n);
}

// An unpacked bf16 B block into a pair panel [kc/2][64][2] (KernelTable::pack_panel_fast): the
// element loop of pack_panel moved 0.8 GB/s, so a call with unpacked weights and M of a
// few tens spent more time packing than multiplying. [K, N]: rows k and k + 1 interleaved
// by 16-bit unpacks; [N, K]: a (k, k + 1) pair is one dword of B's row, so the panel is the
// [N, K/2] dword matrix transposed, 8 x 8 at a time.
void pack_pairs_t(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, uint16_t* dst) {
  const PanelSource<uint16_t> in(b, kn, j);
  const uint16_t* src = in.src;
  const int64_t sn = in.sn, sk = in.sk, n0 = in.n0, ncols = in.ncols;
  const int64_t kpairs = (kc + 1) / 2;
  const int64_t full = std::max<int64_t>(0, std::min(kc, in.K - k0)) / 2;  // pairs with both k inside B
  auto at = [&](int64_t pr, int64_t n) { return dst + pr * 2 * kNR + 2 * n; };
  int64_t pv = 0, nv = 0;  // pairs x columns done by vectors
  if (kn) {
    nv = ncols / 16 * 16;
    for (; pv < full; ++pv) {
      const uint16_t* r0 = src + (k0 + 2 * pv) * sk + n0;
      for (int64_t n = 0; n < nv; n += 16) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + n));
        const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + sk + n));
        const __m256i lo = _mm256_unpacklo_epi16(a, c), hi = _mm256_unpackhi_epi16(a, c);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at(pv, n)), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at(pv, n + 8)), _mm256_permute2x128_si256(lo, hi, 0x31));
      }
    }
  } else {
    nv = ncols / 8 * 8;
    if (nv > 0) pv = full / 8 * 8;  // eight B rows at a time along K, as pack_f32_t (bf16 M = 16: 5.1 -> 3.6-3.8 ms)
    for (int64_t n = 0; n < nv; n += 8)
      for (int64_t p8 = 0; p8 < pv; p8 += 8) {
        __m256 x[8];
        for (int i = 0; i < 8; ++i) x[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + (n0 + n + i) * sn + k0 + 2 * p8));
        simd::Avx2::transpose8(x);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(reinterpret_cast<float*>(at(p8 + i, n)), x[i]);
      }
  }
  auto scalar = [&](int64_t pr, int64_t n) {
    at(pr, n)[0] = in.value(n, k0 + 2 * pr);
    at(pr, n)[1] = in.value(n, k0 + 2 * pr + 1);
  };
  for (int64_t pr = 0; pr < pv; ++pr)  // those pairs' remaining and zero columns
    for (int64_t n = nv; n < kNR; ++n) scalar(pr, n);
  for (int64_t pr = pv; pr < kpairs; ++pr)
    for (int64_t n = 0; n < kNR; ++n) scalar(pr, n);
}

bool pack_panel_fast(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, void* dst) {
  if (b.strides[1] != 1) return false;
  if (b.dtype == DType::kBF16) pack_pairs_t(b, kn, j, k0, kc, static_cast<uint16_t*>(dst));
  else if (b.dtype == DType::kF32) pack_f32_t<float, false>(b, kn, j, k0, kc, static_cast<float*>(dst));
  else return false;
  return true;
}

bool pack_strips(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, float* dst) {
  if (b.strides[1] != 1) return false;  // the vector loads read along K ([N, K]) or N ([K, N])
  if (b.dtype == DType::kF32) pack_f32_t<float>(b, kn, j, k0, kc, dst);
  else if (b.dtype == DType::kBF16) pack_f32_t<uint16_t>(b, kn, j, k0, kc, dst);
  else return false;
  return true;
}

// M rows of A against NB rows of B at a time (M x NB accumulators of 8 lanes: the B rows
// stream from DRAM, and 4 of them in flight keep one core's prefetchers busy). Each A row
// is loaded once per NB B rows, so 5-6 rows take two (12 accumulators + 3 of the 16
// registers): with one, A's loads bound them (stop 51, this unit on Zen 4, N = K = 4096
// over 8 copies: f32 / bf16 M = 5-6 1.5-1.6x / 1.4-1.5x, in cache 1.8-3.6x / 1.4-1.6x).
// 7-8 rows do not fit beside two: they run as 4 rows and then the other 3-4 against each
// group of three B rows, whose lines the second half reads from L1. One B row per pass,
// as before, left 8 A loads per 8 FMAs and a single B stream (stop 52, Zen 4, alternating
// in one process: f32 / bf16 M = 7-8 from DRAM 1.5-1.6x / 1.37-1.45x, N = 1024 in L3
// 1.45-1.57x / 1.36-1.57x; M = 5-6 split so measured 3-12% slower).
// Each dot product sums 8 lanes over K in k order, then the lanes, then the K % 8 tail.
// kAhead (AVX-512 hosts, KernelTable::gemv_l2_ahead): the call's next NB rows go into L2
// a line per row as this group's loads cross one, so the L2 holds more lines in flight
// than the L1 fill buffers alone (the packed decode kernels' run-ahead; gemm PERF_LOG.md, stop 43).
// Zen 3, where this unit is the whole path, keeps the hardware prefetchers alone.
constexpr int kRowsOnce = 6;

// Rows r0 .. r0 + M - 1 of A against one group of B rows.
template <int M, int NB, bool kAhead, class TA, class TB>
OPTX_ALWAYS_INLINE void gemv_rows_group(const GemvRowsArgs& g, const GemvRowGroup<NB, TB>& grp, int r0, int n0) {
  const TA* a = static_cast<const TA*>(g.a) + r0 * g.lda;
  const int64_t K8 = g.K / 8 * 8;
  const auto& b = grp.b;
  const int nb = grp.nb;
  __m256 c[M][NB];
#pragma GCC unroll 8
  for (auto& row : c)
#pragma GCC unroll 4
    for (auto& x : row) x = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    if (kAhead) grp.run_ahead(k, g.ldb);
    __m256 bv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) bv[j] = simd::Avx2::load(b[j] + k);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      const __m256 av = simd::Avx2::load(a + r * g.lda + k);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) c[r][j] = _mm256_fmadd_ps(av, bv[j], c[r][j]);
    }
  }
  // Constant bounds, so c stays in registers (an index bound by nb spills it every step).
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      if (j >= nb) continue;
      float sum = simd::Avx2::reduce(c[r][j]);
      for (int64_t k = K8; k < g.K; ++k) sum += simd::Scalar::load(a + r * g.lda + k) * simd::Scalar::load(b[j] + k);
      g.acc[(r0 + r) * kNR + n0 + j] = sum;
    }
}

template <int M, int NB, bool kAhead, class TA, class TB>
void gemv_rows_pass(const GemvRowsArgs& g) {
  for (int n0 = 0; n0 < g.nb; n0 += NB) {
    const GemvRowGroup<NB, TB> grp(g, n0, kAhead);
    if constexpr (M > kRowsOnce) {
      gemv_rows_group<4, NB, kAhead, TA, TB>(g, grp, 0, n0);
      gemv_rows_group<M - 4, NB, false, TA, TB>(g, grp, 4, n0);  // the group's B rows from L1
    } else {
      gemv_rows_group<M, NB, kAhead, TA, TB>(g, grp, 0, n0);
    }
  }
}

template <int M, int NB, class TA, class TB>
void gemv_rows_t(const GemvRowsArgs& g) {
  if (g.l2_ahead) gemv_rows_pass<M, NB, true, TA, TB>(g);
  else gemv_rows_pass<M, NB, false, TA, TB>(g);
}

template <class TA, class TB>
void gemv_rows_m(const GemvRowsArgs& g) {
  switch (g.m) {
    case 1: return gemv_rows_t<1, 4, TA, TB>(g);
    case 2: return gemv_rows_t<2, 4, TA, TB>(g);
    case 3: return gemv_rows_t<3, 2, TA, TB>(g);
    case 4: return gemv_rows_t<4, 2, TA, TB>(g);
    case 5: return gemv_rows_t<5, 2, TA, TB>(g);
    case 6: return gemv_rows_t<6, 2, TA, TB>(g);
    case 7: return gemv_rows_t<7, 3, TA, TB>(g);
    default: return gemv_rows_t<8, 3, TA, TB>(g);
  }
}

// f(A element, B element) with value-initialised stand-ins of the GEMV's element types
// (f32 or bf16 each).
template <class F>
void by_gemv_types(const GemvRowsArgs& g, F&& f) {
  const bool af = g.a_dtype == DType::kF32, bf = g.b_dtype == DType::kF32;
  if (af && bf) f(float{}, float{});
  else if (af) f(float{}, uint16_t{});
  else if (bf) f(uint16_t{}, float{});
  else f(uint16_t{}, uint16_t{});
}

void gemv_rows(const GemvRowsArgs& g) {
  by_gemv_types(g, [&](auto a, auto b) { gemv_rows_m<decltype(a), decltype(b)>(g); });
}

// B [K, N] (gemv_kn): B rows are read along N, so each k contributes one broadcast of
// A[r][k] against NV vectors of B's row, M x NV accumulators (<= 12: the FMA latency of 4
// cycles needs 8 independent chains to keep both FMA ports busy, and 16 registers hold
// at most 12 beside B's vectors and the broadcast). K runs in blocks of kKnBlock rows:
// A's block is widened to f32 once for every tile of the group, and the tiles walk the
// group's piece of the block's 16 rows left to right, 16 streams in address order. (With
// 32- or 64-row blocks bf16 M = 1, N = K = 4096 ran 2.8-3x slower than with 16, which
// matches the [N, K] path; 8 rows was within noise of 16.)
constexpr int64_t kKnBlock = 16;

template <int M, int NV, class TB, int W = 8 * NV>
OPTX_ALWAYS_INLINE void gemv_kn_tile(const float* af, int64_t kcur, int64_t kpf, const TB* b, int64_t ldb, float* acc, bool first, bool l2 = false) {
  __m256 c[M][NV];
  for (int r = 0; r < M; ++r)
    for (int i = 0; i < NV; ++i) c[r][i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * kNR + 8 * i);
  for (int64_t k = 0; k < kcur; ++k) {
    if (k < kpf) {
      const char* next = reinterpret_cast<const char*>(b + (k + kKnBlock) * ldb);
      for (int l = 0; l < W * int(sizeof(TB)); l += 64) l2 ? _mm_prefetch(next + l, _MM_HINT_T1) : _mm_prefetch(next + l, _MM_HINT_T0);
    }
    // Whichever of B's NV vectors or the M broadcasts is fewer stays live across the
    // other loop (M x NV + min(M, NV) + 1 registers).
    if constexpr (M > NV) {
      __m256 bv[NV];
      for (int i = 0; i < NV; ++i) bv[i] = simd::Avx2::load(b + k * ldb + 8 * i);
      for (int r = 0; r < M; ++r) {
        const __m256 a = _mm256_broadcast_ss(af + r * kKnBlock + k);
        for (int i = 0; i < NV; ++i) c[r][i] = _mm256_fmadd_ps(a, bv[i], c[r][i]);
      }
    } else {
      __m256 a[M];
      for (int r = 0; r < M; ++r) a[r] = _mm256_broadcast_ss(af + r * kKnBlock + k);
      for (int i = 0; i < NV; ++i) {
        const __m256 bv = simd::Avx2::load(b + k * ldb + 8 * i);
        for (int r = 0; r < M; ++r) c[r][i] = _mm256_fmadd_ps(a[r], bv, c[r][i]);
      }
    }
  }
  for (int r = 0; r < M; ++r)
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(acc + r * kNR + 8 * i, c[r][i]);
}

template <int M, int NV, class TA, class TB>
void gemv_kn_t(const GemvRowsArgs& g) {
  const TA* a = static_cast<const TA*>(g.a);
  const TB* b = static_cast<const TB*>(g.b);
  constexpr int W = 8 * NV;  // columns per tile; divides kNR
  const int full = g.nb / W * W, vec = g.nb / 8 * 8;
  alignas(32) float af[M * kKnBlock];
  // A narrow group (decode's P V over one head's V slice: 128 bytes a row, rows 2 KiB
  // apart) gives the hardware prefetchers a line or two per page, and every row waited on
  // DRAM: its tiles prefetch the next block's rows (2 KiB, still in L1 when read). A wide
  // group streams, and its next block (64 KiB of 4 KiB rows) does not fit in L1: that
  // prefetch cost 19-32%. From DRAM, alternating in one process, M = 4, N = 128, K = 8192,
  // rows 2 KiB apart: 624-759 -> 339-403 us. On AVX-512 hosts (l2_ahead) a wide group
  // prefetches the next block into L2 instead, where 64 KiB fits: Emerald Rapids, bf16
  // N = K = 4096, alternating, M = 1 21.4 -> 26.8 GB/s, M = 2 21.7 -> 25.5, M = 4 21.0 -> 24.8.
  const bool narrow = int64_t(g.nb) * int64_t(sizeof(TB)) * kKnBlock <= 16 * 1024;
  const bool l2 = !narrow && g.l2_ahead;
  const bool prefetch = narrow || l2;
  auto acc_at = [&](int col) { return g.acc + (col / kNR) * g.m * kNR + col % kNR; };  // column col's tile
  for (int64_t kb = 0; kb < g.K || kb == 0; kb += kKnBlock) {  // K = 0: one empty block zeroes acc
    const int64_t kcur = std::min(kKnBlock, g.K - kb);
    for (int r = 0; r < M; ++r)
      for (int64_t k = 0; k < kcur; ++k) af[r * kKnBlock + k] = simd::Scalar::load(a + r * g.lda + kb + k);
    const TB* bk = b + kb * g.ldb;
    const bool first = kb == 0;
    const int64_t kpf = prefetch ? std::min(kKnBlock, g.K - kb - kKnBlock) : 0;  // next block's rows
    for (int col = 0; col < full; col += W) gemv_kn_tile<M, NV>(af, kcur, kpf, bk + col, g.ldb, acc_at(col), first, l2);
    for (int col = full; col < vec; col += 8) gemv_kn_tile<M, 1>(af, kcur, kpf, bk + col, g.ldb, acc_at(col), first, l2);
    for (int col = vec; col < g.nb; ++col)  // the last < 8 columns
      for (int r = 0; r < M; ++r) {
        float* o = acc_at(col) + r * kNR;
        float sum = first ? 0.0f : *o;
        for (int64_t k = 0; k < kcur; ++k) sum += af[r * kKnBlock + k] * simd::Scalar::load(bk + k * g.ldb + col);
        *o = sum;
      }
  }
}

template <class TA, class TB>
void gemv_kn_m(const GemvRowsArgs& g) {
  switch (g.m) {
    case 1: return gemv_kn_t<1, 8, TA, TB>(g);
    case 2: return gemv_kn_t<2, 4, TA, TB>(g);
    case 3: return gemv_kn_t<3, 4, TA, TB>(g);
    case 4: return gemv_kn_t<4, 2, TA, TB>(g);
    case 5: return gemv_kn_t<5, 2, TA, TB>(g);
    case 6: return gemv_kn_t<6, 2, TA, TB>(g);
    case 7: return gemv_kn_t<7, 1, TA, TB>(g);
    default: return gemv_kn_t<8, 1, TA, TB>(g);
  }
}

void gemv_kn(const GemvRowsArgs& g) {
  by_gemv_types(g, [&](auto a, auto b) { gemv_kn_m<decltype(a), decltype(b)>(g); });
}

#define OPTX_DISPATCH_M(KERN, ...)      \
  switch (m) {                          \
    case 1: return KERN<1>(__VA_ARGS__);  \
    case 2: return KERN<2>(__VA_ARGS__);  \
    case 3: return KERN<3>(__VA_ARGS__);  \
    case 4: return KERN<4>(__VA_ARGS__);  \
    case 5: return KERN<5>(__VA_ARGS__);  \
    default: return KERN<6>(__VA_ARGS__); \
  }

// out / ldo: where the finished tile goes (acc for KernelF32A, C for KernelF32Out).
template <int M>
void kern_f32_m(int64_t kc, const float* a, const void* b, float* acc, bool accumulate, const Prefetch& pf, float* out,
                int64_t ldo) {
  kern_one_m<LoadF32, M>(kc, a, b, acc, accumulate, pf, out, ldo);
}
template <int M>
void kern_i8b_m(int64_t kc, const float* a, const void* b, float* acc, bool accumulate, const Prefetch& pf) {
  kern_one_m<LoadI8, M>(kc, a, b, acc, accumulate, pf, acc, kNR);
}

void kern_f32(int m, int64_t kc, const float* a, const void* b, float* acc,
              bool accumulate, const Prefetch& pf) {
  OPTX_DISPATCH_M(kern_f32_m, kc, a, b, acc, accumulate, pf, acc, kNR)
}
void kern_f32_out(int m, int64_t kc, const float* a, const void* b, float* acc, bool accumulate,
                  const Prefetch& pf, float* c, int64_t ldc) {
  OPTX_DISPATCH_M(kern_f32_m, kc, a, b, acc, accumulate, pf, c, ldc)
}
void kern_bf16b(int m, int64_t kc, const float* a, const void* b, float* acc,
                bool accumulate, const Prefetch& pf) {
  switch (m) {  // decode and the remainder slices of larger M
    case 1: return kern_bf16b_m<1, 4>(kc, a, b, acc, accumulate, pf);
    case 2: return kern_bf16b_m<2, 4>(kc, a, b, acc, accumulate, pf);
    case 3: return kern_bf16b_m<3, 4>(kc, a, b, acc, accumulate, pf);
    case 4: return kern_bf16b_m<4, 4>(kc, a, b, acc, accumulate, pf);
    case 5: return kern_bf16b_m<5>(kc, a, b, acc, accumulate, pf);
    default: return kern_bf16b_m<6>(kc, a, b, acc, accumulate, pf);
  }
}
void kern_strip(int m, int64_t kc, const float* a, const void* b, float* acc, bool accumulate, const Prefetch& pf, float* out, int64_t ldo) {
  OPTX_DISPATCH_M(kern_strip_m, kc, a, static_cast<const float*>(b), acc, accumulate, pf, out, ldo)
}
void kern_i8b(int m, int64_t kc, const float* a, const void* b, float* acc,
              bool accumulate, const Prefetch& pf) {
  OPTX_DISPATCH_M(kern_i8b_m, kc, a, b, acc, accumulate, pf)
}
#undef OPTX_DISPATCH_M

}  // namespace
}  // namespace optx::gemm_detail::avx2

namespace optx::gemm_detail {
const KernelTable& kernels_avx2() {
  static const KernelTable t{.f32b = avx2::kern_f32, .bf16b = avx2::kern_bf16b, .i8b = avx2::kern_i8b, .bf16dp = nullptr,
                             .epilogue = avx2::epilogue, .gemv4_f32 = avx2::gemv4_f32, .gemv4_i8b = avx2::gemv4_i8b,
                             .gemv4_bf16b = avx2::gemv4_bf16b,
                             .gemv2_bf16b = {avx2::gemv_bf16b<2, 2>, avx2::gemv_bf16b<3, 2>, avx2::gemv_bf16b_passes<4, 2>,
                                             avx2::gemv_bf16b_passes<5, 2>, avx2::gemv_bf16b_passes<6, 2>},
                             .gemv2_i8b = {avx2::gemv_i8b<2, 2>, nullptr}, .f32b_out = avx2::kern_f32_out, .widen_b = avx2::widen_b,
                             .f32_strip = avx2::kern_strip, .pack_strips = avx2::pack_strips, .gemv_rows = avx2::gemv_rows, .gemv_kn = avx2::gemv_kn,
                             .pack_panel_fast = avx2::pack_panel_fast};
  return t;
}
}  // namespace optx::gemm_detail
