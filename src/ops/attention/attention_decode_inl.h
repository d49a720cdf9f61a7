// bf16 pieces shared by the AMX and AVX512_BF16 units (included after
// attention_kernels_inl.h, in the unit's OPTX_ISA_NS): the conditions of the bf16 fast
// paths, the few-row decode kernel, and the rows' finalisation.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including attention_decode_inl.h"
#endif
#include <immintrin.h>

#include <cstring>

namespace optx::attn_detail::OPTX_ISA_NS {
namespace {

constexpr int kDecodeRows = 8;  // jobs with at most this many rows take run_job_decode

// bf16 with D and Dv multiples of 32, no softcap / mask / bias tensor.
bool supported(const Config& c, const Job& j) {
  if (!c.bf16 || c.D % 32 || c.Dv % 32 || c.softcap > 0.0f || c.D > kMaxHeadDim || c.Dv > kMaxHeadDim) return false;
  for (int r = 0; r < j.nrows; ++r)
    if (j.rows[r].mask || j.rows[r].bias) return false;
  return true;
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
  // j.groups KV heads of R rows each (rows g*R .. g*R+R-1 read slice g of each cache row).
  const int G = j.groups, NR = G * R;
  float* o = scratch;  // [NR][Dv]
  std::memset(o, 0, sizeof(float) * size_t(NR * Dv));
  alignas(64) float S[kMaxRows][kBlock];
  float mrow[kMaxRows], lrow[kMaxRows];
  int64_t vlo[kMaxRows], vhi[kMaxRows];  // each row's visible key range
  const uint16_t* q[kMaxRows];
  int64_t lo = j.kv_begin, hi = j.kv_end, top = INT64_MIN, bottom = INT64_MAX;
  for (int r = 0; r < NR; ++r) {
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
  // With several heads the prefetch covers every head's slice, i.e. whole rows in address
  // order, which the L2 streamer then follows.
  const int64_t k_lines = ((G - 1) * j.k_goff * 2 + D * 2 + 63) / 64, v_lines = ((G - 1) * j.v_goff * 2 + Dv * 2 + 63) / 64;
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
      for (int g = 0; g < G; ++g) {
        const uint16_t* k = static_cast<const uint16_t*>(kp[jj]) + g * j.k_goff;
        const uint16_t* const* qg = q + g * R;
        __m512 a[R];
        for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 32) {
          const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + d);
          for (int r = 0; r < R; ++r) a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_loadu_si512(qg[r] + d), kv);
        }
        for (int r = 0; r < R; ++r) S[g * R + r][jj] = _mm512_reduce_add_ps(a[r]) * c.scale;
      }
    }
    bool any = false;
    for (int r = 0; r < NR; ++r) {
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
    for (int g = 0; any && g < G; ++g) {
      float* og = o + g * R * Dv;
      const float(*Sg)[kBlock] = S + g * R;
      for (int64_t d0 = 0; d0 < Dv; d0 += kCh) {
        constexpr int kV = kCh / 16;
        const int nv = int(std::min<int64_t>(kCh, Dv - d0) / 16);  // Dv % 32 == 0: 2 or kV
        __m512 acc[R][kV];
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < kV; ++v) acc[r][v] = v < nv ? _mm512_loadu_ps(og + r * Dv + d0 + 16 * v) : _mm512_setzero_ps();
        for (int64_t jj = 0; jj < n; ++jj) {
          const uint16_t* vr = static_cast<const uint16_t*>(vp[jj]) + g * j.v_goff + d0;
          __m512 vv[kV];
          for (int v = 0; v < kV; ++v)
            vv[v] = v < nv ? _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + 16 * v)))
                           : _mm512_setzero_ps();
          for (int r = 0; r < R; ++r) {
            const __m512 pr = _mm512_set1_ps(Sg[r][jj]);
            for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
          }
        }
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < nv; ++v) _mm512_storeu_ps(og + r * Dv + d0 + 16 * v, acc[r][v]);
      }
    }
    std::copy(kp + kBlock, kp + kBlock + n_next, kp);
    std::copy(vp + kBlock, vp + kBlock + n_next, vp);
  }
  finish_rows(c, j, mrow, lrow, o);
}

void run_decode(const Config& c, const Job& j, float* scratch) {
  switch (j.nrows / j.groups) {
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

// The bf16 few-row fast path where it applies, else the unit's vector kernel.
void run_job_bf16(const Config& c, const Job& j, float* scratch) {
  if (supported(c, j) && j.nrows / j.groups <= kDecodeRows) return run_decode(c, j, scratch);
  run_job(c, j, scratch);
}

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
