// Flash prefill on the AVX2 and AVX-512 units (bf16 or f32, K / V reused by other jobs):
// a job's scores and P·V as calls of the GEMM family's f32 microkernels, included by
// attention_kernels_inl.h. E: the K / V element type. AVX2 runs the 6-row x 16-column
// strip kernel (gemm_avx2.cpp), AVX-512 the 6 x 64 tile (gemm_avx512_inl.h): 24 zmm
// accumulators, one broadcast of A per row against four B vectors.
//
// Why: the AVX2 tiles (attention_avx2_bf16_inl.h) widen each K / V chunk once per 4 rows
// and end every 8 scores in a horizontal-add tree; the AVX-512 units' vector kernel
// scores one (row, key) dot at a time, and their vdpbf16ps / AMX kernels need a core that
// runs those at speed (Intel without AMX retires vdpbf16ps at half the FMA's FLOPs:
// attention_avx512_bf16.cpp). The GEMM kernel broadcasts one A value per row against B
// vectors, no reduction. It needs B with the reduced dimension first, in strips of kStrip
// columns (16 or 64), so per KV block the job writes, once for all its rows (96,
// Kernels::prefill_rows):
//   K^T  [64 / kStrip][D][kStrip] f32      (B of S = Q K^T, kc = D)
//   V    [Dv / kStrip][64][kStrip]         (B of O += P V, kc = n keys)
// and per job Q in the kernel's A layout (6-row micro-panels [d][6]); P is packed to
// [key][6] per slice. O lives in the kernel's tile layout [plane][row][64] until the
// job's end. Each strip (AVX2: 8 KiB of K^T at D = 128, 4 KiB of V; AVX-512: 32 KiB and
// 16 KiB) serves all the job's row slices from L1 / L2.
// AVX2: the strips replaced calls of the 64-column kernel (four 16-column passes per call,
// K^T in 64-row pieces, kc = 64 for both products): one block's products alone, one core,
// the scores 66-68 -> 80-83 GFLOP/s, P·V 66 -> 75-78.
// Measured against the tiles, alternating in one process: with 32-row jobs the two were
// equal (the kernels ran faster, but widening / transposing the block, waiting on its
// rows and packing P took it back); with 96-row jobs S = 2048 / 4096 +16% / +11% over
// the 32-row tiles and +7% / +25% over 96-row tiles.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including attention_gemm_prefill_inl.h"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/attention/attention_internal.h"
#include "ops/gemm/gemm_kernels.h"
#include "simd/simd_avx2.h"
#if defined(__AVX512F__)
#include "simd/simd_avx512.h"
#endif
#include "simd/simd_scalar.h"

namespace optx::attn_detail::OPTX_ISA_NS {
namespace {

using gemm_detail::kMR;
using gemm_detail::kNR;
static_assert(kKvBlock == kNR, "a KV block is one panel of the GEMM kernel");

template <class E>
struct GemmPrefill {
  int R = 0;
  int64_t D = 0, Dv = 0, planes = 0, slices = 0;
  float* q = nullptr;   // slices x D x kMR
  float* kt = nullptr;  // 64 / kStrip strips x D x kStrip
  float* v = nullptr;   // Dv / kStrip strips x 64 x kStrip
  float* o = nullptr;   // planes x R x 64
  float* p = nullptr;   // slices x 64 x kMR (AVX2; AVX-512 reads P's rows in place)
  bool live[(kMaxFlashRows + kMR - 1) / kMR] = {};  // find_live
#if defined(__AVX512F__)
  static constexpr int kStrip = kNR;
#else
  static constexpr int kStrip = 16;
#endif
  gemm_detail::KernelF32Out kern = nullptr;
  decltype(gemm_detail::KernelTable::f32_rows_out) kern_rows = nullptr;  // AVX-512: P . V from P's rows

  // qbuf: room for Q's micro-panels (ceil(rows / 6) * 6 x d floats); max_rows: the
  // rows the scratch is laid out for (Config::max_rows).
  GemmPrefill(int rows, int64_t d, int64_t dv, int max_rows, float* scratch, float* qbuf)
      : R(rows), D(d), Dv(dv),
        kern(kStrip == kNR ? gemm_detail::kernels_avx512().f32b_out : gemm_detail::kernels_avx2().f32_strip),
        kern_rows(kStrip == kNR ? gemm_detail::kernels_avx512().f32_rows_out : nullptr) {
    const GemmPrefillLayout l(d, dv, max_rows);
    planes = l.planes;
    slices = (rows + kMR - 1) / kMR;
    q = qbuf, kt = scratch + l.kt, v = scratch + l.v, o = scratch + l.o, p = scratch + l.p;
    std::fill(o, o + planes * R * kNR, 0.0f);
    // A 64-column strip past Dv (Dv % 64 != 0) is read whole: its columns stay zero.
    if (rows > 0 && Dv % kStrip) std::fill(v, v + planes * kNR * kNR, 0.0f);
  }

  // The job's R rows of q, times scale, straight from their rows. Rows past R in the last
  // slice are zero.
  void pack_q(const Job& j, float scale) {
    for (int s = 0; s < slices; ++s) {
      float* dst = q + s * kMR * D;
      for (int r = 0; r < kMR; ++r) {
        const int row = s * kMR + r;
        const E* x = row < R ? static_cast<const E*>(j.rows[row].q) : nullptr;
        for (int64_t d = 0; d < D; ++d) dst[d * kMR + r] = x ? scale * simd::Scalar::load(x + d) : 0.0f;
      }
    }
  }

  // K^T of keys kp[0, n) (rows of D values, D a multiple of 16): 8 keys x 8 values at a
  // time, loaded as f32 (bf16 widened) and transposed in registers; keys n .. 64 zero.
  // Key j, value d at kt_at(d, j).
  void load_k(const void* const* kp, int64_t n) {
#if defined(__AVX512F__)
    return transpose_k(n, [&](int64_t jj, int64_t d) __attribute__((always_inline)) { return widen16(static_cast<const E*>(kp[jj]) + d); });
#endif
    int64_t j0 = 0;
    for (; j0 + 8 <= n; j0 += 8) {
      const E* k[8];
      for (int i = 0; i < 8; ++i) k[i] = static_cast<const E*>(kp[j0 + i]);
      for (int64_t d = 0; d < D; d += 8) {
        __m256 x[8];
        for (int i = 0; i < 8; ++i) x[i] = simd::Avx2::load(k[i] + d);
        simd::Avx2::transpose8(x);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(kt_at(d + i, j0), x[i]);
      }
    }
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t jj = j0; jj < n; ++jj) *kt_at(d, jj) = simd::Scalar::load(static_cast<const E*>(kp[jj]) + d);
      for (int64_t jj = n; jj < kNR; ++jj) *kt_at(d, jj) = 0.0f;
    }
  }

#if defined(__AVX512F__)
  // MLA from an i8 latent (the AVX-512 unit's many-row decode): K^T and V as load_k and
  // load_v build them, each key's latent (its first Dv values, int8) times its scale and
  // K's rope part (D - Dv values of E) from its own row. The products run on exact f32
  // values, as the int8 tiles' do.
  void load_k_i8(const void* const* lat, const float* scale, const void* const* rope, int64_t n) {
    transpose_k(n, [&](int64_t jj, int64_t d) __attribute__((always_inline)) {
      return d < Dv ? latent16(static_cast<const int8_t*>(lat[jj]) + d, scale[jj]) : widen16(static_cast<const E*>(rope[jj]) + (d - Dv));
    });
  }
  void load_v_i8(const void* const* lat, const float* scale, int64_t n) {
    for (int64_t jj = 0; jj < n; ++jj)
      for (int64_t c = 0; c < Dv; c += 16)
        _mm512_store_si512(v + strip_at(kNR, jj, c), latent16(static_cast<const int8_t*>(lat[jj]) + c, scale[jj]));
  }
  // The next block's latent and rope rows, as next_rows.
  void next_rows_i8(const void* const* lat, const void* const* rope, int64_t n) {
    next_rows(lat, rope, n, (Dv + 63) / 64, ((D - Dv) * int64_t(sizeof(E)) + 63) / 64);
  }
#endif

  // V of keys vp[0, n) (rows of Dv values, Dv a multiple of 16) into the strips, as f32.
  void load_v(const void* const* vp, int64_t n) {
    for (int64_t jj = 0; jj < n; ++jj) {
      const E* src = static_cast<const E*>(vp[jj]);
#if defined(__AVX512F__)
      for (int64_t c = 0; c < Dv; c += 16) _mm512_store_si512(v + strip_at(kNR, jj, c), widen16(src + c));
#else
      for (int64_t c = 0; c < Dv; c += 8) _mm256_storeu_ps(v + strip_at(kNR, jj, c), simd::Avx2::load(src + c));
#endif
    }
  }

  // The next block's rows (kp / vp of the job), prefetched a share per kernel call while
  // this block computes: rows a token apart are 4 KiB apart, which the hardware
  // prefetchers do not follow, and loading the block waited on them otherwise.
  // k_lines / v_lines: each row's lines (default: D / Dv values of E).
  void next_rows(const void* const* kp, const void* const* vp, int64_t n, int64_t k_lines = -1, int64_t v_lines = -1) {
    pf_k = kp, pf_v = vp, pf_n = n, pf_key = 0, pf_line = 0;
    pf_k_lines = k_lines >= 0 ? k_lines : (D * int64_t(sizeof(E)) + 63) / 64;
    pf_v_lines = v_lines >= 0 ? v_lines : (Dv * int64_t(sizeof(E)) + 63) / 64;
    const int64_t calls = slices * (kNR / kStrip + v_strips());
    pf_per_call = (n * (pf_k_lines + pf_v_lines) + calls - 1) / calls;
  }

  // Which row slices see any of the block's keys kb .. kb + n - 1. The others skip both
  // products: their scores are all masked (the softmax fills them with -inf) and their P
  // is zero. A causal job's diagonal blocks are each seen by fewer of its rows: of a
  // 192-row job's three, (0 + 64 + 128) rows see nothing.
  void find_live(const Config& c, const Job& j, int64_t kb, int64_t n) {
    for (int s = 0; s < slices; ++s) {
      live[s] = false;
      for (int r = s * kMR; r < std::min(R, (s + 1) * kMR) && !live[s]; ++r) {
        const auto [a, b] = visible_keys(c, j.rows[r].qpos, j.offset, kb, n);
        live[s] = a < b;
      }
    }
  }

  // S[r][0, 64) (stride kKvBlock) = q_r . k for the live slices' rows; keys past n score
  // 0. A strip of K^T at a time, reused by all row slices from L1 (AVX2) or L1 / L2
  // (AVX-512).
  void scores(float* S) {
    const gemm_detail::Prefetch pf;
    for (int st = 0; st < kNR / kStrip; ++st)
      for (int s = 0; s < slices; ++s) {
        float* tile = S + s * kMR * kKvBlock + st * kStrip;
        if (live[s]) kern(std::min(kMR, R - s * kMR), D, q + s * kMR * D, kt + st * D * kStrip, tile, false, pf, tile, kKvBlock);
        prefetch_some();
      }
  }

  // O_r += sum_jj P[r][jj] v_jj over keys jj < n; a V strip at a time.
  void pv(const float* P, int64_t n) {
    const gemm_detail::Prefetch pf;
    if (kern_rows) {  // P's rows broadcast in place (S, row stride kKvBlock): no packing pass
      for (int64_t st = 0; st < v_strips(); ++st)
        for (int s = 0; s < slices; ++s) {
          float* tile = o + (st * R + s * kMR) * kNR;
          if (live[s])
            kern_rows(std::min(kMR, R - s * kMR), n, P + s * kMR * kKvBlock, kKvBlock, v + st * kNR * kNR, tile, true, tile, kNR);
          prefetch_some();
        }
      return;
    }
    // 8 rows x 8 keys transposed in registers; key jj's 8 values are stored at its 6-float
    // slot, the two extra lanes overwritten by key jj + 1 (or, past a slice's last key,
    // by the next slice's first; the last slice's spill lands in the buffer's padding).
    // Rows past R read the following scratch: they land in lanes the kernel does not read
    // (r >= its m) or that are overwritten.
    for (int s = 0; s < slices; ++s)
      for (int64_t jj = 0; jj < n; jj += 8) {
        __m256 x[8];
        for (int i = 0; i < 8; ++i) x[i] = _mm256_loadu_ps(P + (s * kMR + i) * kKvBlock + jj);
        simd::Avx2::transpose8(x);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(p + (s * kNR + jj + i) * kMR, x[i]);
      }
    for (int64_t st = 0; st < v_strips(); ++st)
      for (int s = 0; s < slices; ++s) {
        float* tile = o + ((st * kStrip / kNR) * R + s * kMR) * kNR + st * kStrip % kNR;
        if (live[s]) kern(std::min(kMR, R - s * kMR), n, p + s * kNR * kMR, v + st * kNR * kStrip, tile, true, pf, tile, kNR);
        prefetch_some();
      }
  }

  void scale_row(int r, float f) {
#if defined(__AVX512F__)
    const __m512 s16 = _mm512_set1_ps(f);
    for (int64_t pl = 0; pl < planes; ++pl) {
      float* x = o + (pl * R + r) * kNR;
      for (int c = 0; c < kNR; c += 16) _mm512_storeu_ps(x + c, _mm512_mul_ps(_mm512_loadu_ps(x + c), s16));
    }
    return;
#endif
    const __m256 s = _mm256_set1_ps(f);
    for (int64_t pl = 0; pl < planes; ++pl) {
      float* x = o + (pl * R + r) * kNR;
      for (int c = 0; c < kNR; c += 8) _mm256_storeu_ps(x + c, _mm256_mul_ps(_mm256_loadu_ps(x + c), s));
    }
  }

  // O into acc (R rows, stride Dvp), the layout the job's epilogue reads.
  void store_o(float* acc, int64_t Dvp) const {
    for (int r = 0; r < R; ++r)
      for (int64_t pl = 0; pl < planes; ++pl)
        std::copy_n(o + (pl * R + r) * kNR, std::min<int64_t>(kNR, Dv - pl * kNR), acc + r * Dvp + pl * kNR);
  }

 private:
#if defined(__AVX512F__)
  // 16 values as f32 bits (bf16 widened by a shift).
  static __m512i widen16(const E* x) {
    if constexpr (std::is_same_v<E, float>) return _mm512_castps_si512(_mm512_loadu_ps(x));
    else return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16);
  }
  // K^T from 16 values at a time, key(jj, d) giving key jj's values d .. d + 15 as f32
  // bits: 16 keys x 16 values per in-register transpose (0.25 shuffles per value where the
  // 8 x 8 one takes 0.375, on the two ports the FMAs need); keys n .. 64 zero.
  template <class Key>
  OPTX_ALWAYS_INLINE void transpose_k(int64_t n, Key&& key) {
    for (int64_t j0 = 0; j0 < kNR; j0 += 16)
      for (int64_t d = 0; d < D; d += 16) {
        __m512i x[16];
        for (int i = 0; i < 16; ++i) x[i] = j0 + i < n ? key(j0 + i, d) : _mm512_setzero_si512();
        simd::Avx512::transpose16(x);
        for (int i = 0; i < 16; ++i) _mm512_store_si512(kt_at(d + i, j0), x[i]);
      }
  }
  // 16 int8 values times s, as f32 bits.
  static __m512i latent16(const int8_t* x, float s) {
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
    return _mm512_castps_si512(_mm512_mul_ps(f, _mm512_set1_ps(s)));
  }
#endif
  // Element (k, col) of a K block of kc rows in strips of kStrip columns.
  static int64_t strip_at(int64_t kc, int64_t k, int64_t col) { return (col / kStrip) * kc * kStrip + k * kStrip + col % kStrip; }
  float* kt_at(int64_t d, int64_t j) const { return kt + strip_at(D, d, j); }
  int64_t v_strips() const { return (Dv + kStrip - 1) / kStrip; }
  const void* const* pf_k = nullptr;
  const void* const* pf_v = nullptr;
  int64_t pf_n = 0, pf_key = 0, pf_line = 0, pf_per_call = 0;
  int64_t pf_k_lines = 0, pf_v_lines = 0;  // lines of each pf_k / pf_v row
  void prefetch_some() {
    const int64_t kl = pf_k_lines, vl = pf_v_lines;
    for (int64_t i = 0; i < pf_per_call && pf_key < pf_n; ++i) {
      const char* row = static_cast<const char*>(pf_line < kl ? pf_k[pf_key] : pf_v[pf_key]);
      _mm_prefetch(row + 64 * (pf_line < kl ? pf_line : pf_line - kl), _MM_HINT_T0);
      if (++pf_line == kl + vl) pf_line = 0, ++pf_key;
    }
  }
};

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
