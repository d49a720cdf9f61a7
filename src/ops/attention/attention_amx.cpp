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

#define OPTX_ISA_NS amx
#include "ops/attention/attention_kernels_inl.h"

namespace optx::attn_detail::amx {
namespace {

constexpr int kKeys = 32;
constexpr int kDecodeRows = 8;  // jobs with at most this many rows take run_job_decode
alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};  // pairs a missing last key

struct alignas(64) TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

void configure() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

bool supported(const Config& c, const Job& j) {
  if (!c.bf16 || c.D % 32 || c.Dv % 32 || c.softcap > 0.0f || c.D > kMaxHeadDim || c.Dv > kMaxHeadDim) return false;
  for (int r = 0; r < j.nrows; ++r)
    if (j.rows[r].mask || j.rows[r].bias) return false;
  return true;
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

// Sinks, normalisation, output and lse of a job's rows from the running max m, sum l
// and unnormalised accumulators o (row stride Dv).
void finish_rows(const Config& c, const Job& j, const float* mrow, const float* lrow, const float* o) {
  const int R = j.nrows;
  const int64_t Dv = c.Dv;
  for (int r = 0; r < R; ++r) {
    const Row& row = j.rows[r];
    numerics::SoftmaxState s;
    s.m = mrow[r];
    s.l = lrow[r];
    float extra = 1.0f;  // rescale of o for a sink above the running max
    if (row.sink != -INFINITY) {
      if (s.empty()) {
        s.m = row.sink;
        s.l = 1.0f;
      } else {
        extra = s.rescale_to(std::max(s.m, row.sink));
        s.l = s.l * extra + std::exp(row.sink - s.m);
      }
    }
    const float inv = s.inv_sum() * extra;
    if (c.partial) {
      for (int64_t d = 0; d < Dv; ++d) row.part_out[d] = o[r * Dv + d] * inv;
    } else {
      uint16_t* out = static_cast<uint16_t*>(row.out);
      const __m512 sv = _mm512_set1_ps(inv);
      for (int64_t d = 0; d < Dv; d += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), sv)));
    }
    if (row.lse) *row.lse = s.lse();
  }
}


// Few rows (GQA decode: one group's 1-8 heads at 1-2 positions). AMX would run its tiles
// 4/16 full and pays a tile store / load of O per 32 keys; here each key's K and V rows
// are read once from memory for all rows and the work stays in vector registers:
//   scores   vdpbf16ps of the bf16 q rows against the raw bf16 K row (exact products,
//            f32 sums), one horizontal sum per row and key;
//   softmax  per row over a block of 64 keys, exp vectorised over keys;
//   P . V    the V row widened to f32 once per key, accumulated into a column chunk of
//            every row held in registers for the whole block (R x CH / 16 zmm).
// The job reads a whole head slice per key; keys are prefetched 16 ahead as the vector
// kernel does (a head's slices sit a slot apart, which the hardware does not follow).
template <int R>
void run_job_decode(const Config& c, const Job& j, float* scratch) {
  constexpr int64_t kBlock = 64, kPrefetchKeys = 16;
  constexpr int kCh = R <= 4 ? 64 : 32;  // accumulator columns per pass: R * kCh / 16 <= 16 zmm
  const int64_t D = c.D, Dv = c.Dv;
  float* o = scratch;  // [R][Dv]
  std::memset(o, 0, sizeof(float) * size_t(R * Dv));
  alignas(64) float S[R][kBlock];
  float mrow[R], lrow[R];
  int64_t vlo[R], vhi[R];  // each row's visible key range
  const uint16_t* q[R];
  int64_t lo = j.kv_begin, hi = j.kv_end, top = INT64_MIN, bottom = INT64_MAX;
  for (int r = 0; r < R; ++r) {
    mrow[r] = -INFINITY, lrow[r] = 0.0f;
    q[r] = static_cast<const uint16_t*>(j.rows[r].q);
    const int64_t d = j.rows[r].qpos + j.offset;
    vhi[r] = c.causal ? d + 1 : INT64_MAX;
    if (c.window_right >= 0) vhi[r] = std::min(vhi[r], d + c.window_right + 1);
    vlo[r] = c.window_left >= 0 ? d - c.window_left : INT64_MIN;
    top = std::max(top, vhi[r]), bottom = std::min(bottom, vlo[r]);
  }
  hi = std::min(hi, top), lo = std::max(lo, bottom);
  const void* kp[2 * kBlock];
  const void* vp[2 * kBlock];
  const int64_t k_lines = (D * 2 + 63) / 64, v_lines = (Dv * 2 + 63) / 64;
  if (lo < hi) j.kv.rows(lo, std::min(kBlock, hi - lo), true, kp, vp);
  for (int64_t kb = lo; kb < hi; kb += kBlock) {
    const int64_t n = std::min(kBlock, hi - kb);
    const int64_t n_next = std::max<int64_t>(0, std::min(kBlock, hi - kb - kBlock));
    if (n_next) j.kv.rows(kb + kBlock, n_next, true, kp + kBlock, vp + kBlock);
    for (int64_t jj = 0; jj < n; ++jj) {
      if (jj + kPrefetchKeys < n + n_next) {
        const char* pk = static_cast<const char*>(kp[jj + kPrefetchKeys]);
        const char* pv = static_cast<const char*>(vp[jj + kPrefetchKeys]);
        for (int64_t l = 0; l < k_lines; ++l) __builtin_prefetch(pk + 64 * l);
        if (pv != pk)
          for (int64_t l = 0; l < v_lines; ++l) __builtin_prefetch(pv + 64 * l);
      }
      const uint16_t* k = static_cast<const uint16_t*>(kp[jj]);
      __m512 a[R];
      for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 32) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + d);
        for (int r = 0; r < R; ++r) a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_loadu_si512(q[r] + d), kv);
      }
      for (int r = 0; r < R; ++r) S[r][jj] = _mm512_reduce_add_ps(a[r]) * c.scale;
    }
    bool any = false;
    for (int r = 0; r < R; ++r) {
      float* s = S[r];
      if (kb < vlo[r] || kb + n > vhi[r])
        for (int64_t jj = 0; jj < n; ++jj)
          if (kb + jj < vlo[r] || kb + jj >= vhi[r]) s[jj] = -INFINITY;
      __m512 bm = _mm512_set1_ps(-INFINITY);
      for (int64_t jj = 0; jj < n; jj += 16)
        bm = _mm512_max_ps(bm, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), __mmask16(n - jj >= 16 ? 0xffff : (1u << (n - jj)) - 1), s + jj));
      numerics::SoftmaxState st{mrow[r], lrow[r]};
      const float f = st.rescale_to(_mm512_reduce_max_ps(bm));
      if (st.empty()) {  // nothing visible yet: no probabilities this block
        std::memset(s, 0, sizeof(float) * size_t(n));
        continue;
      }
      any = true;
      if (f != 1.0f) {
        st.l *= f;
        const __m512 fv = _mm512_set1_ps(f);
        for (int64_t d = 0; d < Dv; d += 16) _mm512_storeu_ps(o + r * Dv + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + d), fv));
      }
      const __m512 m = _mm512_set1_ps(st.m);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t jj = 0; jj < n; jj += 16) {
        const __mmask16 live = __mmask16(n - jj >= 16 ? 0xffff : (1u << (n - jj)) - 1);
        const __m512 p = _mm512_maskz_mov_ps(live, simd_type::exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + jj), m)));
        _mm512_mask_storeu_ps(s + jj, live, p);
        sum = _mm512_add_ps(sum, p);
      }
      st.l += _mm512_reduce_add_ps(sum);
      mrow[r] = st.m, lrow[r] = st.l;
    }
    if (any) {
      for (int64_t d0 = 0; d0 < Dv; d0 += kCh) {
        constexpr int kV = kCh / 16;
        const int nv = int(std::min<int64_t>(kCh, Dv - d0) / 16);  // Dv % 32 == 0: 2 or kV
        __m512 acc[R][kV];
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < kV; ++v) acc[r][v] = v < nv ? _mm512_loadu_ps(o + r * Dv + d0 + 16 * v) : _mm512_setzero_ps();
        for (int64_t jj = 0; jj < n; ++jj) {
          const uint16_t* vr = static_cast<const uint16_t*>(vp[jj]) + d0;
          __m512 vv[kV];
          for (int v = 0; v < kV; ++v)
            vv[v] = v < nv ? _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + 16 * v)))
                           : _mm512_setzero_ps();
          for (int r = 0; r < R; ++r) {
            const __m512 pr = _mm512_set1_ps(S[r][jj]);
            for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
          }
        }
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < nv; ++v) _mm512_storeu_ps(o + r * Dv + d0 + 16 * v, acc[r][v]);
      }
    }
    std::copy(kp + kBlock, kp + kBlock + n_next, kp);
    std::copy(vp + kBlock, vp + kBlock + n_next, vp);
  }
  finish_rows(c, j, mrow, lrow, o);
}

void run_decode(const Config& c, const Job& j, float* scratch) {
  switch (j.nrows) {
    case 1: return run_job_decode<1>(c, j, scratch);
    case 2: return run_job_decode<2>(c, j, scratch);
    case 3: return run_job_decode<3>(c, j, scratch);
    case 4: return run_job_decode<4>(c, j, scratch);
    case 5: return run_job_decode<5>(c, j, scratch);
    case 6: return run_job_decode<6>(c, j, scratch);
    case 7: return run_job_decode<7>(c, j, scratch);
    default: return run_job_decode<8>(c, j, scratch);
  }
}

void run_job_amx(const Config& c, const Job& j, float* scratch) {
  if (!supported(c, j)) return run_job(c, j, scratch);
  if (j.nrows <= kDecodeRows) return run_decode(c, j, scratch);
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
    for (int64_t k = 0; k < kKeys; ++k) {
      if (k < n_next) {
        for (int64_t l = 0; l < k_lines; ++l) __builtin_prefetch(static_cast<const char*>(kn[k]) + 64 * l);
        if (vn[k] != kn[k])
          for (int64_t l = 0; l < v_lines; ++l) __builtin_prefetch(static_cast<const char*>(vn[k]) + 64 * l);
      }
      if (k < n) std::memcpy(kst + k * D, kp[k], size_t(D) * 2);
      else std::memset(kst + k * D, 0, size_t(D) * 2);
    }
    // S^T = K . Q^T over D in steps of 32.
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t d = 0; d < D; d += 32) {
      _tile_loadd(4, kst + d, D * 2);
      _tile_loadd(5, kst + 16 * D + d, D * 2);
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
  static const Kernels k{amx::run_job_amx};
  return k;
}
}  // namespace optx::attn_detail
