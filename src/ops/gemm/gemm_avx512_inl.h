// AVX-512 microkernels, 6 x 64 tiles: 6 rows x 4 zmm = 24 accumulators, 4 registers for the
// B row, broadcasts of A folded into the FMA's memory operand. Per k step that is 24 FMAs
// (12 cycles on two FMA ports) against 4 vector loads from an L1-resident B micro-panel
// plus 6 broadcast loads, so the loop is FMA-bound.
//
// Included by gemm_avx512.cpp and gemm_avx512_bf16.cpp (which adds vdpbf16ps), each in
// its own namespace OPTX_ISA_NS.
#include <immintrin.h>

#include <cstring>

#include "ops/gemm/gemm_kernels.h"
#include "simd/simd_avx512.h"
#define OPTX_GEMM_SIMD ::optx::simd::Avx512
#include "ops/gemm/gemm_epilogue_inl.h"

namespace optx::gemm_detail::OPTX_ISA_NS {
namespace {

// Software prefetch distance along the B panel, used on the pass that brings a B
// micro-panel in (decode, and the first row slice of each panel block): the stream comes
// from DRAM / L3 and one core's hardware prefetcher alone reaches ~13 GB/s here, 4 KiB
// ahead raised a single read stream to ~16.5 GB/s. Later slices find B in L1, where
// prefetching past the micro-panel would only evict it.
constexpr int64_t kPrefetchBytes = 4096;
OPTX_ALWAYS_INLINE void prefetch_b(const void* row, int lines, int64_t ahead = kPrefetchBytes) {
  const char* p = static_cast<const char*>(row) + ahead;
  for (int i = 0; i < lines; ++i) _mm_prefetch(p + 64 * i, _MM_HINT_T0);
}

template <int M>
OPTX_ALWAYS_INLINE void load_tile(__m512 (&c)[M][4], const float* acc, bool accumulate) {
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      c[r][i] = accumulate ? _mm512_loadu_ps(acc + r * kNR + 16 * i) : _mm512_setzero_ps();
}

template <int M>
OPTX_ALWAYS_INLINE void store_tile(__m512 (&c)[M][4], float* out, int64_t ldo = kNR) {
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + r * ldo + 16 * i, c[r][i]);
}

// The tile into a bf16 C, rounded as the epilogue's Avx512::store rounds.
template <int M>
OPTX_ALWAYS_INLINE void store_tile(__m512 (&c)[M][4], uint16_t* out, int64_t ldo) {
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) simd::Avx512::store(out + r * ldo + 16 * i, c[r][i]);
}

// a: packed A micro-panel, [k][kMR] (see gemm_kernels.h).
template <int M>
OPTX_ALWAYS_INLINE void fma_row(__m512 (&c)[M][4], const __m512 (&b)[4], const float* a,
                                int64_t k) {
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
    const __m512 av = _mm512_set1_ps(a[k * kMR + r]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) c[r][i] = _mm512_fmadd_ps(av, b[i], c[r][i]);
  }
}

// out / ldo: where the finished tile goes (acc itself, or C for kern_f32_out).
template <int M, bool kStream>
void kern_f32_m(int64_t kc, const float* a, const void* bv, const float* acc,
                bool accumulate, const Prefetch& pf, float* out, int64_t ldo) {
  const float* b = static_cast<const float*>(bv);
  __m512 c[M][4];
  load_tile<M>(c, acc, accumulate);
  L2Lines l2(pf, kc);
  for (int64_t k = 0; k < kc; ++k) {
    const float* bk = b + k * kNR;
    if constexpr (kStream) prefetch_b(bk, 4);
    l2.step();
    const __m512 bb[4] = {_mm512_load_ps(bk), _mm512_load_ps(bk + 16), _mm512_load_ps(bk + 32),
                          _mm512_load_ps(bk + 48)};
    fma_row<M>(c, bb, a, k);
  }
  store_tile<M>(c, out, ldo);
}

// A as m rows lda apart instead of a packed micro-panel (a[r * lda + k]): for an A that a
// caller writes row by row and reads once per B block (flash attention's P, whose packing
// into [k][kMR] cost more shuffles than the broadcasts from six rows do).
template <int M>
void kern_f32_rows_m(int64_t kc, const float* a, int64_t lda, const float* b, float* acc, bool accumulate, float* out,
                     int64_t ldo) {
  __m512 c[M][4];
  load_tile<M>(c, acc, accumulate);
  for (int64_t k = 0; k < kc; ++k) {
    const float* bk = b + k * kNR;
    const __m512 bb[4] = {_mm512_load_ps(bk), _mm512_load_ps(bk + 16), _mm512_load_ps(bk + 32), _mm512_load_ps(bk + 48)};
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) c[r][i] = _mm512_fmadd_ps(av, bb[i], c[r][i]);
    }
  }
  store_tile<M>(c, out, ldo);
}

// B bf16 pairs widened to f32 in registers: a 32-bit lane holds (k even | k odd << 16) of
// one column, so "lane << 16" is the even-k value and "lane & 0xffff0000" the odd-k value.
template <int M, bool kStream>
void kern_bf16b_m(int64_t kc, const float* a, const void* bv, float* acc,
                  bool accumulate, const Prefetch& pf) {
  const uint16_t* b = static_cast<const uint16_t*>(bv);
  __m512 c[M][4];
  load_tile<M>(c, acc, accumulate);
  // An odd kc (last block of an odd K) reads one pair past K: zero in both packed A and B.
  L2Lines l2(pf, (kc + 1) / 2);
  for (int64_t k = 0; k < kc; k += 2) {
    const uint16_t* bk = b + k * kNR;
    if constexpr (kStream) prefetch_b(bk, 4);
    l2.step();
    __m512 even[4], odd[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      simd::Avx512::widen_pairs(_mm512_load_si512(bk + 32 * i), even[i], odd[i]);
    }
    fma_row<M>(c, even, a, k);
    fma_row<M>(c, odd, a, k + 1);
  }
  store_tile<M>(c, acc);
}

// KernelTable::widen_panel: bf16 pairs [kc/2][64][2] or int8 [kc][64] as f32 [kc][64].
[[maybe_unused]] void widen_panel(DType bt, int64_t kc, const void* bv, float* dst) {
  if (bt == DType::kI8) {
    const int8_t* b = static_cast<const int8_t*>(bv);
    for (int64_t k = 0; k < kc; ++k)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i)
        _mm512_store_ps(dst + k * kNR + 16 * i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                    _mm_load_si128(reinterpret_cast<const __m128i*>(b + k * kNR + 16 * i)))));
    return;
  }
  const uint16_t* b = static_cast<const uint16_t*>(bv);
  for (int64_t k = 0; k < kc; k += 2) {
    const uint16_t* bk = b + k * kNR;
    float* even = dst + k * kNR;
    float* odd = even + kNR;
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      __m512 e, o;
      simd::Avx512::widen_pairs(_mm512_load_si512(bk + 32 * i), e, o);
      _mm512_store_ps(even + 16 * i, e);
      _mm512_store_ps(odd + 16 * i, o);
    }
  }
}

template <int M, bool kStream>
void kern_i8b_m(int64_t kc, const float* a, const void* bv, float* acc,
                bool accumulate, const Prefetch& pf) {
  const int8_t* b = static_cast<const int8_t*>(bv);
  __m512 c[M][4];
  load_tile<M>(c, acc, accumulate);
  L2Lines l2(pf, kc);
  for (int64_t k = 0; k < kc; ++k) {
    const int8_t* bk = b + k * kNR;
    if constexpr (kStream) prefetch_b(bk, 1);
    l2.step();
    __m512 bb[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      bb[i] = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bk + 16 * i))));
    fma_row<M>(c, bb, a, k);
  }
  store_tile<M>(c, acc);
}

#define OPTX_DISPATCH_M(KERN, ...)                                      \
  if (stream) {                                                         \
    switch (m) {                                                        \
      case 1: return KERN<1, true>(__VA_ARGS__);                        \
      case 2: return KERN<2, true>(__VA_ARGS__);                        \
      case 3: return KERN<3, true>(__VA_ARGS__);                        \
      case 4: return KERN<4, true>(__VA_ARGS__);                        \
      case 5: return KERN<5, true>(__VA_ARGS__);                        \
      default: return KERN<6, true>(__VA_ARGS__);                       \
    }                                                                   \
  }                                                                     \
  switch (m) {                                                          \
    case 1: return KERN<1, false>(__VA_ARGS__);                         \
    case 2: return KERN<2, false>(__VA_ARGS__);                         \
    case 3: return KERN<3, false>(__VA_ARGS__);                         \
    case 4: return KERN<4, false>(__VA_ARGS__);                         \
    case 5: return KERN<5, false>(__VA_ARGS__);                         \
    default: return KERN<6, false>(__VA_ARGS__);                        \
  }

void kern_f32(int m, int64_t kc, const float* a, const void* b, float* acc, bool accumulate,
              const Prefetch& pf) {
  const bool stream = pf.stream;
  OPTX_DISPATCH_M(kern_f32_m, kc, a, b, acc, accumulate, pf, acc, kNR)
}
void kern_f32_out(int m, int64_t kc, const float* a, const void* b, float* acc, bool accumulate,
                  const Prefetch& pf, float* c, int64_t ldc) {
  const bool stream = pf.stream;
  OPTX_DISPATCH_M(kern_f32_m, kc, a, b, acc, accumulate, pf, c, ldc)
}
void kern_f32_rows(int m, int64_t kc, const float* a, int64_t lda, const float* b, float* acc, bool accumulate, float* c,
                   int64_t ldc) {
  switch (m) {
    case 1: return kern_f32_rows_m<1>(kc, a, lda, b, acc, accumulate, c, ldc);
    case 2: return kern_f32_rows_m<2>(kc, a, lda, b, acc, accumulate, c, ldc);
    case 3: return kern_f32_rows_m<3>(kc, a, lda, b, acc, accumulate, c, ldc);
    case 4: return kern_f32_rows_m<4>(kc, a, lda, b, acc, accumulate, c, ldc);
    case 5: return kern_f32_rows_m<5>(kc, a, lda, b, acc, accumulate, c, ldc);
    default: return kern_f32_rows_m<6>(kc, a, lda, b, acc, accumulate, c, ldc);
  }
}
void kern_bf16b(int m, int64_t kc, const float* a, const void* b, float* acc, bool accumulate,
                const Prefetch& pf) {
  const bool stream = pf.stream;
  OPTX_DISPATCH_M(kern_bf16b_m, kc, a, b, acc, accumulate, pf)
}
void kern_i8b(int m, int64_t kc, const float* a, const void* b, float* acc, bool accumulate,
              const Prefetch& pf) {
  const bool stream = pf.stream;
  OPTX_DISPATCH_M(kern_i8b_m, kc, a, b, acc, accumulate, pf)
}

#ifdef __AVX512BF16__
// Native bf16: vdpbf16ps adds a[k]*b[k] + a[k+1]*b[k+1] into each f32 lane, so one
// instruction does the work of two FMAs and B needs no widening.
// a: packed A micro-panel of bf16 pairs, [k/2][kMR][2]; an odd kc reads the zero pad.
template <int M, bool kStream>
void kern_bf16dp_m(int64_t kc, const uint16_t* a, const void* bv, float* acc, bool accumulate,
                   const Prefetch& pf, void* out, int64_t ldo, bool out_bf16) {
  const uint16_t* b = static_cast<const uint16_t*>(bv);
  __m512 c[M][4];
  load_tile<M>(c, acc, accumulate);
  const int64_t pairs = (kc + 1) / 2;
  L2Lines l2(pf, pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* bk = b + p * 2 * kNR;
    if constexpr (kStream) prefetch_b(bk, 4);
    l2.step();
    __m512bh bb[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) bb[i] = (__m512bh)_mm512_load_si512(bk + 32 * i);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + (p * kMR + r) * 2, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) c[r][i] = _mm512_dpbf16_ps(c[r][i], av, bb[i]);
    }
  }
  if (out_bf16) store_tile<M>(c, static_cast<uint16_t*>(out), ldo);
  else store_tile<M>(c, static_cast<float*>(out), ldo);
}

// The dot-product kernel's A micro-panel from six bf16 rows: dword p * kMR + r of dst is
// row r's pair p, 16 pairs at a time. Each output vector takes lanes from all six rows:
// one two-row permute per row pair (the same index serves the three pairs: the lane's row
// parity picks the table half, its pair the element) and two blends. Returns the pairs
// written (a multiple of 16); the caller packs the rest.
[[maybe_unused]] int64_t pack_a_pairs(const uint16_t* const* rows, int64_t pairs, uint16_t* dst) {
  static_assert(kMR == 6);
  struct Perm {
    __m512i idx[6];
    __mmask16 from23[6], from45[6];
    Perm() {
      for (int j = 0; j < 6; ++j) {
        alignas(64) int32_t x[16];
        unsigned m23 = 0, m45 = 0;
        for (int l = 0; l < 16; ++l) {
          const int g = 16 * j + l, p = g / 6, r = g % 6;
          x[l] = (r & 1) * 16 + p;
          if (r / 2 == 1) m23 |= 1u << l;
          if (r / 2 == 2) m45 |= 1u << l;
        }
        idx[j] = _mm512_load_si512(x);
        from23[j] = __mmask16(m23), from45[j] = __mmask16(m45);
      }
    }
  };
  static const Perm perm;
  const int64_t full = pairs / 16 * 16;
  for (int64_t p0 = 0; p0 < full; p0 += 16) {
    __m512i a[6];
    for (int r = 0; r < 6; ++r) a[r] = _mm512_loadu_si512(rows[r] + 2 * p0);
    uint16_t* d = dst + p0 * kMR * 2;
    for (int j = 0; j < 6; ++j) {
      __m512i o = _mm512_permutex2var_epi32(a[0], perm.idx[j], a[1]);
      o = _mm512_mask_blend_epi32(perm.from23[j], o, _mm512_permutex2var_epi32(a[2], perm.idx[j], a[3]));
      o = _mm512_mask_blend_epi32(perm.from45[j], o, _mm512_permutex2var_epi32(a[4], perm.idx[j], a[5]));
      _mm512_storeu_si512(d + 32 * j, o);
    }
  }
  return full;
}

// KernelTable::i8_pairs. An int8 value is exact in f32 and its bf16 is the f32's top half:
// row 2p's in the low half of each dword (shifted down), row 2p + 1's in the high half (a
// 16-bit masked move keeps it in place).
[[maybe_unused]] void i8_pairs(const int8_t* b, int64_t kc, uint16_t* dst) {
  const auto widen = [](const int8_t* x) { return _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))))); };
  for (int64_t p = 0; p < (kc + 1) / 2; ++p) {
    const int8_t* r0 = b + 2 * p * kNR;
    // A last odd row pairs with zero: A's pad makes the product 0 anyway, but the row
    // past the block may be past the panel's buffer.
    const bool two = 2 * p + 1 < kc;
    for (int i = 0; i < kNR / 16; ++i) {
      const __m512i lo = _mm512_srli_epi32(widen(r0 + 16 * i), 16);
      const __m512i pr = two ? _mm512_mask_mov_epi16(lo, 0xAAAAAAAA, widen(r0 + kNR + 16 * i)) : lo;
      _mm512_store_si512(dst + (p * kNR + 16 * i) * 2, pr);
    }
  }
}

[[maybe_unused]] void kern_bf16dp(int m, int64_t kc, const uint16_t* a, const void* b, float* acc, bool accumulate,
                                  const Prefetch& pf, void* c, int64_t ldc, bool c_bf16) {
  const bool stream = pf.stream;
  OPTX_DISPATCH_M(kern_bf16dp_m, kc, a, b, acc, accumulate, pf, c, ldc, c_bf16)
}

#endif

// Unpacked B [N, K] against 1-8 rows of A (KernelTable::gemv_rows): each output a row dot
// product straight from A's and B's rows, Op::kStep k per instruction (f32 A: 16 per FMA,
// a bf16 B widened; bf16 A and B: 32 per vdpbf16ps), K's tail as masked loads of both
// (zero lanes add 0). The AVX2 gemv_rows this replaces widens bf16 (two ops per 8
// elements) beside 8-lane FMAs and ran compute-bound from 4 rows (bf16 M = 8: 22% of the
// dot peak); from 5 rows it loads each A row once per B row (M = 5-7 from DRAM 1.4-2.3x
// slower than this). M x NB accumulators, NB B rows loaded per step and each A row once
// against all of them. l2_ahead: the call's next NB rows go into L2 a line per row as
// this group's loads cross one, as in AVX2's.
// The element ops: kStep k per instruction, the first n of a step's elements of A's and
// B's rows loaded (the rest zero; n < kStep only in K's tail, where simd::Avx512's counted
// loads take over).
struct FmaF32 {  // f32 A x f32 B; a bf16 B (FmaF32Bf16) is widened exactly by the same loads
  using TA = float;
  using TB = float;
  static constexpr int kStep = 16;
  template <class T>
  static __m512 load(const T* p, int n) { return n == kStep ? simd::Avx512::load(p) : simd::Avx512::load(p, n); }
  static __m512 madd(__m512 c, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, c); }
};
struct FmaF32Bf16 : FmaF32 {
  using TB = uint16_t;
};
#ifdef __AVX512BF16__
struct DpBf16 {  // bf16 A x bf16 B, 16 pairs per vector
  using TA = uint16_t;
  using TB = uint16_t;
  static constexpr int kStep = 32;
  static __m512bh load(const uint16_t* p, int n) {
    return (__m512bh)(n == kStep ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(__mmask32((1u << n) - 1u), p));
  }
  static __m512 madd(__m512 c, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(c, a, b); }
};
#endif

template <class Op, int M, int NB>
OPTX_ALWAYS_INLINE void gemv_rows_step(__m512 (&c)[M][NB], const typename Op::TA* a, int64_t lda,
                                       const typename Op::TB* const (&b)[NB], int64_t k, int n) {
  decltype(Op::load(b[0], n)) bv[NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) bv[j] = Op::load(b[j] + k, n);
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
    const auto av = Op::load(a + r * lda + k, n);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) c[r][j] = Op::madd(c[r][j], av, bv[j]);
  }
}

template <class Op, int M, int NB, bool kAhead>
void gemv_rows_pass(const GemvRowsArgs& g) {
  using TB = typename Op::TB;
  const auto* a = static_cast<const typename Op::TA*>(g.a);
  const int64_t Kv = g.K / Op::kStep * Op::kStep;
  static_assert(64 / sizeof(TB) % Op::kStep == 0);  // run_ahead's line test lands on steps
  for (int n0 = 0; n0 < g.nb; n0 += NB) {
    const GemvRowGroup<NB, TB> grp(g, n0, kAhead);
    const auto& b = grp.b;
    const int nb = grp.nb;
    __m512 c[M][NB];
#pragma GCC unroll 8
    for (auto& row : c)
#pragma GCC unroll 8
      for (auto& x : row) x = _mm512_setzero_ps();
    for (int64_t k = 0; k < Kv; k += Op::kStep) {
      if (kAhead) grp.run_ahead(k, g.ldb);
      gemv_rows_step<Op, M, NB>(c, a, g.lda, b, k, Op::kStep);
    }
    if (Kv < g.K) gemv_rows_step<Op, M, NB>(c, a, g.lda, b, Kv, int(g.K - Kv));
    // Constant bounds, so c stays in registers (an index bound by nb spills it every step).
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j)
        if (j < nb) g.acc[r * kNR + n0 + j] = _mm512_reduce_add_ps(c[r][j]);
  }
}

template <class Op, int M, int NB>
void gemv_rows_t(const GemvRowsArgs& g) {
  if (g.l2_ahead) gemv_rows_pass<Op, M, NB, true>(g);
  else gemv_rows_pass<Op, M, NB, false>(g);
}

// 1-6 rows against 4 B rows, 7-8 against 3 (<= 24 accumulators).
template <class Op>
void gemv_rows_m(const GemvRowsArgs& g) {
  switch (g.m) {
    case 1: return gemv_rows_t<Op, 1, 4>(g);
    case 2: return gemv_rows_t<Op, 2, 4>(g);
    case 3: return gemv_rows_t<Op, 3, 4>(g);
    case 4: return gemv_rows_t<Op, 4, 4>(g);
    case 5: return gemv_rows_t<Op, 5, 4>(g);
    case 6: return gemv_rows_t<Op, 6, 4>(g);
    case 7: return gemv_rows_t<Op, 7, 3>(g);
    default: return gemv_rows_t<Op, 8, 3>(g);
  }
}

// bf16 A x bf16 B on units without vdpbf16ps keeps the AVX2 unit's kernel (bf16 A x f32 B
// is rejected by validate).
[[maybe_unused]] void gemv_rows(const GemvRowsArgs& g) {
  if (g.a_dtype == DType::kF32) {
    if (g.b_dtype == DType::kF32) return gemv_rows_m<FmaF32>(g);
    return gemv_rows_m<FmaF32Bf16>(g);
  }
#ifdef __AVX512BF16__
  if (g.b_dtype == DType::kBF16) return gemv_rows_m<DpBf16>(g);
#endif
  kernels_avx2().gemv_rows(g);
}

#undef OPTX_DISPATCH_M

// Decode (one to three rows of A) reads the call's panels in step: two or four sequential
// streams, each prefetched into L1 a few KiB ahead (below); the L2 streamer runs ahead
// on each stream's page, so more streams keep more lines in flight than the L1 fill
// buffers hold. Which works best depends on the machine. Sapphire Rapids VM (stop 56;
// M = 1, N = K = 4096, 2 threads, weights rotated past the LLC, variants alternating call
// by call): one panel at a time with an L2 run-ahead 16 KiB ahead (the previous scheme)
// 25.4-26.2 GB/s, one at a time with the L1 prefetch only 25.5-26.0, four in step
// 30.6-31.5, two in step 30.8-31.0, four in step plus the L2 run-ahead 16 / 8 KiB ahead
// 26.3-27.6 (the far prefetches hold fill buffers the streams need); bf16 M = 2 / 3
// 1.23x / 1.17x, int8 M = 1 / 2 / 3 level / 1.06x / 1.10x, f32 M = 1 1.10x. The Emerald
// Rapids VM (stop 43) measured the opposite for bf16: four in step with the L1 prefetch
// 25.0 GB/s, one at a time 31.9, plus the L2 run-ahead 35.5-36.1. Each panel's sums run in
// its k order as before, so results are bitwise unchanged.
//
// R rows of A against P panels (panel q's R x 64 results at acc + (q R + r) 64): k steps
// of S rows (bf16: S = 2, a k pair per 64-byte line; odd K reads the zero pad), where
// widen(bk, i, w) gives the S vectors of columns [16i, 16i + 16) of step bk as floats,
// once for all rows (int8: the epilogue applies the channel scales). A is the packed
// [k][kMR] micro-panel; `lines` is a step's 64-byte lines per panel, prefetched `ahead`
// bytes on: 4 KiB, int8 2 KiB (its M = 1 GEMV 27.5-27.8 GB/s at 4 KiB, 30.4-30.9 at 2,
// 28.2-29.0 at 1; f32 at 8 KiB 0.95x).
//
// H > 1 reads each panel's K in H parts in step as well (P * H streams; the parts' sums
// are added at the end, so the rounding differs from H = 1's, the same for any thread
// count), for a machine whose reads want more streams than P: see kGemv1Parts.
template <int R, int P, int S, class T, class Widen, int H = 1>
OPTX_ALWAYS_INLINE void gemv_panels(const Gemv4Args& g, int lines, Widen widen, int64_t ahead = kPrefetchBytes) {
  const float* a = g.a;
  __m512 c[P][H][R][4];
#pragma GCC unroll 4
  for (int q = 0; q < P; ++q)
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) c[q][h][r][i] = _mm512_setzero_ps();
  const int64_t part = H == 1 ? g.kc : (g.kc + H * S - 1) / (H * S) * S;  // k steps per part
  for (int64_t k = 0; k < part; k += S) {
#pragma GCC unroll 4
    for (int q = 0; q < P; ++q)
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        const int64_t kk = k + h * part;
        if (H > 1 && kk >= g.kc) continue;
        const T* bk = static_cast<const T*>(g.b[q]) + kk * kNR;
        prefetch_b(bk, lines, ahead);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          __m512 w[S];
          widen(bk, i, w);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
            for (int s = 0; s < S; ++s)
              c[q][h][r][i] = _mm512_fmadd_ps(_mm512_set1_ps(a[(kk + s) * kMR + r]), w[s], c[q][h][r][i]);
        }
      }
  }
#pragma GCC unroll 4
  for (int q = 0; q < P; ++q)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m512 sum = c[q][0][r][i];
#pragma GCC unroll 4
        for (int h = 1; h < H; ++h) sum = _mm512_add_ps(sum, c[q][h][r][i]);
        _mm512_storeu_ps(g.acc + (q * R + r) * kNR + 16 * i, sum);
      }
}

OPTX_ALWAYS_INLINE void widen_f32(const float* bk, int i, __m512 (&w)[1]) { w[0] = _mm512_load_ps(bk + 16 * i); }
OPTX_ALWAYS_INLINE void widen_i8(const int8_t* bk, int i, __m512 (&w)[1]) {
  w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bk + 16 * i))));
}
// A 64-column k-pair row: (even, odd) k.
OPTX_ALWAYS_INLINE void widen_bf16(const uint16_t* bk, int i, __m512 (&w)[2]) {
  simd::Avx512::widen_pairs(_mm512_load_si512(bk + 32 * i), w[0], w[1]);
}

// The decode entry points. int8 at two and three rows went through the generic 6-row
// kernel before (alternating call by call, 4096^2, 2 threads: M = 2 26.4-27.5 -> 31.5-33.4
// GB/s, M = 3 26.2 -> 28.5; 8 + 4R port uops per line: M = 3 is compute-bound).
void gemv4_f32(const Gemv4Args& g) { gemv_panels<1, 4, 1, float>(g, 4, widen_f32); }
constexpr int64_t kI8Ahead = 2048;
// Single-row decode in the unit without AVX512_BF16 (Ice Lake, 17 rotated 4096^2 weights,
// 2 threads, alternating call by call; the Sapphire Rapids VM runs the other unit, where
// one part and 4 KiB measured best, stop 56):
// - each of the four panels read in two halves of K in step, eight streams (32
//   accumulators, so some spill, but the loop waits on DRAM): bf16 1.04-1.15x (25.4 ->
//   29.3 GB/s at best, the 8-stream read loop's rate), int8 1.00-1.09x; four parts
//   (16 streams) int8 0.63x, bf16 1.03x;
// - bf16 prefetched 8 KiB ahead: 24.6-25.0 -> 25.7-27.0 GB/s (M = 2 / 3 level to 0.98x,
//   so they keep 4 KiB).
#ifdef __AVX512BF16__
constexpr int kGemv1Parts = 1;
constexpr int64_t kBf16Ahead1 = kPrefetchBytes;
#else
constexpr int kGemv1Parts = 2;
constexpr int64_t kBf16Ahead1 = 2 * kPrefetchBytes;
#endif
void gemv4_i8b(const Gemv4Args& g) { gemv_panels<1, 4, 1, int8_t, decltype(&widen_i8), kGemv1Parts>(g, 1, widen_i8, kI8Ahead); }
void gemv4_bf16b(const Gemv4Args& g) {
  gemv_panels<1, 4, 2, uint16_t, decltype(&widen_bf16), kGemv1Parts>(g, 4, widen_bf16, kBf16Ahead1);
}
template <int R>
void gemv2_bf16b(const Gemv4Args& g) {
  gemv_panels<R, 2, 2, uint16_t>(g, 4, widen_bf16);
}
template <int R>
void gemv2_i8b(const Gemv4Args& g) {
  gemv_panels<R, 2, 1, int8_t>(g, 1, widen_i8, kI8Ahead);
}

}  // namespace
}  // namespace optx::gemm_detail::OPTX_ISA_NS
