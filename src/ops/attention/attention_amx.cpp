// AMX attention job kernel (bf16; D and Dv multiples of 32; no softcap / bias / mask
// tensor — anything else runs the vector kernel of this unit).
//
// Per block of 32 keys, with up to 32 query rows as two 16-row column tiles:
//   S^T[key][row] = K . Q^T   A tiles: 16 staged K rows x 32 of D; B tiles: Q^T in pairs
//                             ([D/2][32 rows][2], built once per job) — no transposes of K.
//   online softmax            vertical: each key's scores are a vector over rows, so the
//                             running max, exp and sums need no horizontal reductions.
//   O[row][dv] += P . V       A tiles: P rows (the 32 x 32 bf16 block transposed);
//                             B tiles: V key-pairs interleaved ([16][Dv][2], vpermt2w);
//                             O accumulates in f32 memory, two 16 x 32 column chunks at a
//                             time (4 C tiles), rescaled by the softmax correction first.
#include <immintrin.h>

#include <cstring>

#include "simd/simd_avx512_bf16.h"

namespace optx::attn_detail::amx {
namespace {
using simd_type = simd::Avx512Bf16;
}
}  // namespace optx::attn_detail::amx

namespace optx::attn_detail::amx {
namespace {
struct alignas(64) TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
}  // namespace
}  // namespace optx::attn_detail::amx

#define OPTX_ISA_NS amx
#define OPTX_ATTN_DECODE_AMX 1
#include "ops/attention/attention_kernels_inl.h"
#include "ops/attention/attention_decode_inl.h"

namespace optx::attn_detail::amx {
namespace {

constexpr int kKeys = 32;
alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};  // pairs a missing last key

void configure() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// Interleaves rows a and b (bf16, n a multiple of 32) into pairs: out[2i] = a[i], out[2i+1] = b[i].
OPTX_ALWAYS_INLINE void interleave(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3,
                                      34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54, 22, 53, 21, 52, 20,
                                      51, 19, 50, 18, 49, 17, 48, 16);
  for (int64_t i = 0; i < n; i += 32) {
    const __m512i va = _mm512_loadu_si512(a + i), vb = _mm512_loadu_si512(b + i);
    _mm512_storeu_si512(out + 2 * i, _mm512_permutex2var_epi16(va, lo, vb));
    _mm512_storeu_si512(out + 2 * i + 32, _mm512_permutex2var_epi16(va, hi, vb));
  }
}

void run_job_amx(const Config& c, const Job& j, float* scratch) {
  if (!supported(c, j) || j.groups > 1 || j.nrows <= kDecodeRows) return run_job_bf16(c, j, scratch);
  const int R = j.nrows;
  const bool two = R > 16;  // second column tile of rows
  const int64_t D = c.D, Dv = c.Dv;
  // Scratch layout (all 64-byte aligned multiples).
  uint16_t* qt = reinterpret_cast<uint16_t*>(scratch);         // [D/2][32][2]
  uint16_t* kst = qt + D * 32;                                  // [32][D]
  uint16_t* vp = kst + 32 * D;                                  // [16][Dv][2]
  float* st = reinterpret_cast<float*>(vp + 32 * Dv);           // [32 keys][32 rows]
  uint16_t* pt = reinterpret_cast<uint16_t*>(st + 32 * 32);     // [32 keys][32 rows]
  uint16_t* pr = pt + 32 * 32;                                  // [32 rows][32 keys]
  float* o = reinterpret_cast<float*>(pr + 32 * 32);            // [32 rows][Dv]

  // Q^T in pairs, rows past R zero.
  uint32_t* qt32 = reinterpret_cast<uint32_t*>(qt);
  for (int64_t p = 0; p < D / 2; ++p)
    for (int r = 0; r < 32; ++r) {
      uint32_t v = 0;
      if (r < R) std::memcpy(&v, static_cast<const uint16_t*>(j.rows[r].q) + 2 * p, 4);
      qt32[p * 32 + r] = v;
    }
  std::memset(o, 0, sizeof(float) * size_t(32 * Dv));
  // Per-row running state as vectors over rows; diagonal positions (padded rows see nothing).
  alignas(64) float diag[32], mrow[32], lrow[32];
  for (int r = 0; r < 32; ++r) {
    diag[r] = r < R ? float(j.rows[r].qpos + j.offset) : -1e30f;
    mrow[r] = -INFINITY;
    lrow[r] = 0.0f;
  }
  int64_t lo = j.kv_begin, hi = j.kv_end;
  {
    float dmin = 1e30f, dmax = -1e30f;
    for (int r = 0; r < R; ++r) dmin = std::min(dmin, diag[r]), dmax = std::max(dmax, diag[r]);
    if (R > 0) {
      if (c.causal) hi = std::min<int64_t>(hi, int64_t(dmax) + 1);
      if (c.window_right >= 0) hi = std::min<int64_t>(hi, int64_t(dmax) + c.window_right + 1);
      if (c.window_left >= 0) lo = std::max<int64_t>(lo, int64_t(dmin) - c.window_left);
    }
  }
  configure();
  const void* kp[kKeys];
  const void* vpp[kKeys];
  const __m512 scale = _mm512_set1_ps(c.scale);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  // Rows of the next block are prefetched while this block's are staged: a job reads
  // one head's slice of rows a slot apart, which the hardware prefetchers do not follow.
  const void* kn[kKeys];
  const void* vn[kKeys];
  const int64_t k_lines = (D * 2 + 63) / 64, v_lines = (Dv * 2 + 63) / 64;
  if (lo < hi) j.kv.rows(lo, std::min<int64_t>(kKeys, hi - lo), true, kn, vn);
  for (int64_t kb = lo; kb < hi; kb += kKeys) {
    const int64_t n = std::min<int64_t>(kKeys, hi - kb);
    std::copy(kn, kn + n, kp);
    std::copy(vn, vn + n, vpp);
    const int64_t n_next = std::max<int64_t>(0, std::min<int64_t>(kKeys, hi - kb - kKeys));
    if (n_next) j.kv.rows(kb + kKeys, n_next, true, kn, vn);
    // Each 16-key A tile loads straight from the cache rows when they sit at one stride
    // (a paged block of >= 16 slots); otherwise, or past n, from rows staged in kst.
    const uint16_t* ka[2];
    int64_t ka_stride[2];
    for (int t = 0; t < 2; ++t) {
      const int64_t k0 = 16 * t;
      const char* base = k0 < n ? static_cast<const char*>(kp[k0]) : nullptr;
      const int64_t stride = k0 + 1 < n ? static_cast<const char*>(kp[k0 + 1]) - base : 0;
      bool direct = k0 + 16 <= n && stride > 0;
      for (int i = 2; direct && i < 16; ++i) direct = static_cast<const char*>(kp[k0 + i]) - base == i * stride;
      ka[t] = direct ? reinterpret_cast<const uint16_t*>(base) : kst + k0 * D;
      ka_stride[t] = direct ? stride : D * 2;
      for (int64_t k = k0; !direct && k < k0 + 16; ++k) {
        if (k < n) std::memcpy(kst + k * D, kp[k], size_t(D) * 2);
        else std::memset(kst + k * D, 0, size_t(D) * 2);
      }
    }
    // The next block's rows are prefetched a slice per tile step below: issued in one
    // burst, the prefetches wait on the fill buffers and hold up the tile work behind
    // them, so memory and compute would take turns instead of overlapping.
    const bool v_apart = n_next > 0 && vn[0] != kn[0];
    const int64_t row_lines = k_lines + (v_apart ? v_lines : 0);
    const int64_t pf_step = (n_next * row_lines + D / 32 + Dv / 32 - 1) / (D / 32 + Dv / 32);
    int64_t pf_key = 0, pf_line = 0;
    auto prefetch_next = [&] {
      for (int64_t i = 0; i < pf_step && pf_key < n_next; ++i) {
        _mm_prefetch(pf_line < k_lines ? static_cast<const char*>(kn[pf_key]) + 64 * pf_line
                                       : static_cast<const char*>(vn[pf_key]) + 64 * (pf_line - k_lines),
                     _MM_HINT_T0);
        if (++pf_line == row_lines) pf_line = 0, ++pf_key;
      }
    };
    // S^T = K . Q^T over D in steps of 32.
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t d = 0; d < D; d += 32) {
      prefetch_next();
      _tile_loadd(4, ka[0] + d, ka_stride[0]);
      _tile_loadd(5, ka[1] + d, ka_stride[1]);
      _tile_loadd(6, qt + (d / 2) * 64, 128);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      if (two) {
        _tile_loadd(7, qt + (d / 2) * 64 + 32, 128);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, st, 128);
    _tile_stored(2, st + 16 * 32, 128);
    if (two) {
      _tile_stored(1, st + 16, 128);
      _tile_stored(3, st + 16 * 32 + 16, 128);
    }
    // Vertical online softmax over the block's keys, 16 rows per vector.
    alignas(64) float corr[32];
    for (int half = 0; half < (two ? 2 : 1); ++half) {
      const __m512 dg = _mm512_load_ps(diag + 16 * half);
      __m512 bmax = neg_inf;
      for (int64_t k = 0; k < n; ++k) {
        const float key = float(kb + k);
        __m512 s = _mm512_mul_ps(_mm512_load_ps(st + k * 32 + 16 * half), scale);
        __mmask16 vis = 0xffff;
        if (c.causal) vis &= _mm512_cmp_ps_mask(_mm512_set1_ps(key), dg, _CMP_LE_OQ);
        if (c.window_left >= 0)
          vis &= _mm512_cmp_ps_mask(_mm512_set1_ps(key), _mm512_sub_ps(dg, _mm512_set1_ps(float(c.window_left))), _CMP_GE_OQ);
        if (c.window_right >= 0)
          vis &= _mm512_cmp_ps_mask(_mm512_set1_ps(key), _mm512_add_ps(dg, _mm512_set1_ps(float(c.window_right))), _CMP_LE_OQ);
        vis &= _mm512_cmp_ps_mask(dg, _mm512_set1_ps(-1e29f), _CMP_GT_OQ);  // padded rows
        s = _mm512_mask_blend_ps(vis, neg_inf, s);
        _mm512_store_ps(st + k * 32 + 16 * half, s);
        bmax = _mm512_max_ps(bmax, s);
      }
      const __m512 m_old = _mm512_load_ps(mrow + 16 * half);
      const __m512 m_new = _mm512_max_ps(m_old, bmax);
      const __mmask16 live = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_OQ);
      // exp(m_old - m_new): 1 where nothing is live yet (avoids -inf - -inf).
      const __m512 f = _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f), simd_type::exp(_mm512_sub_ps(m_old, m_new)));
      __m512 l = _mm512_mul_ps(_mm512_load_ps(lrow + 16 * half), f);
      for (int64_t k = 0; k < kKeys; ++k) {
        __m512 p = _mm512_setzero_ps();
        if (k < n) p = _mm512_maskz_mov_ps(live, simd_type::exp(_mm512_sub_ps(_mm512_load_ps(st + k * 32 + 16 * half), m_new)));
        l = _mm512_add_ps(l, p);
        _mm256_store_si256(reinterpret_cast<__m256i*>(pt + k * 32 + 16 * half), (__m256i)_mm512_cvtneps_pbh(p));
      }
      _mm512_store_ps(mrow + 16 * half, m_new);
      _mm512_store_ps(lrow + 16 * half, l);
      _mm512_store_ps(corr + 16 * half, f);
    }
    // P = (P^T)^T: rows x keys.
    for (int r = 0; r < (two ? 32 : 16); ++r)
      for (int k = 0; k < kKeys; ++k) pr[r * kKeys + k] = pt[k * 32 + r];
    // Rescale O rows whose max moved.
    for (int r = 0; r < (two ? 32 : 16); ++r)
      if (corr[r] != 1.0f) {
        const __m512 f = _mm512_set1_ps(corr[r]);
        for (int64_t d = 0; d < Dv; d += 16) _mm512_storeu_ps(o + r * Dv + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), f));
      }
    // V key-pairs, zero past n.
    for (int64_t p = 0; p < kKeys / 2; ++p) {
      const int64_t k0 = 2 * p, k1 = 2 * p + 1;
      const uint16_t* a = k0 < n ? static_cast<const uint16_t*>(vpp[k0]) : kZeroRow;
      const uint16_t* b = k1 < n ? static_cast<const uint16_t*>(vpp[k1]) : kZeroRow;
      interleave(a, b, Dv, vp + p * Dv * 2);
    }
    _tile_loadd(4, pr, 64);
    if (two) _tile_loadd(5, pr + 16 * kKeys, 64);
    for (int64_t d = 0; d < Dv; d += 32) {
      prefetch_next();
      _tile_loadd(0, o + d, Dv * 4);
      _tile_loadd(1, o + d + 16, Dv * 4);
      _tile_loadd(6, vp + d * 2, Dv * 4);
      _tile_loadd(7, vp + (d + 16) * 2, Dv * 4);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_stored(0, o + d, Dv * 4);
      _tile_stored(1, o + d + 16, Dv * 4);
      if (two) {
        _tile_loadd(2, o + 16 * Dv + d, Dv * 4);
        _tile_loadd(3, o + 16 * Dv + d + 16, Dv * 4);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_stored(2, o + 16 * Dv + d, Dv * 4);
        _tile_stored(3, o + 16 * Dv + d + 16, Dv * 4);
      }
    }
  }
  _tile_release();
  finish_rows(c, j, mrow, lrow, o);
}

}  // namespace
}  // namespace optx::attn_detail::amx

namespace optx::attn_detail {
const Kernels& kernels_amx() {
  static const Kernels k{amx::run_job_amx, true};
  return k;
}
}  // namespace optx::attn_detail
