// Internal interface of the attention family.
//
// Every op is cut into jobs: a set of up to kMaxRows query rows that share one KV head
// (the heads of a GQA group and/or several query positions), attending to keys
// [kv_begin, kv_end) of one sequence, stored contiguously (strided) or in a paged cache.
// One per-ISA kernel runs a job: it streams the keys in blocks of kKvBlock, computes the
// block's scores for all rows, folds them into each row's online-softmax state
// (numerics::SoftmaxState) and accumulates p . v. Each K/V row is read once per job
// however many query rows share it — the reason decode groups a GQA group's heads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "dispatch/registry.h"
#include "optx/attention.h"
#include "ops/gemm/gemm_kernels.h"

namespace optx::attn_detail {

inline constexpr int kMaxRows = 32;
// Rows a job can hold: flash jobs of kernels with a larger Kernels::prefill_rows go up to
// kMaxJobRows (the AVX2 unit; all-heads decode jobs too) or kMaxFlashRows (the `avx512`
// unit's GEMM prefill: each K / V block widened once for twice the rows, flash S = 4096
// 299-307 -> 279-291 ms alternating); every other job keeps to kMaxRows.
inline constexpr int kMaxJobRows = 96;
inline constexpr int kMaxFlashRows = 192;
// Rows of the AVX512_BF16 job kernel's flash jobs: 32-row groups that share each
// superblock's K / V reads and V staging.
inline constexpr int kDpFlashRows = 96;
// Rows of the AMX job kernel's flash jobs, the same way (four groups; job_scratch_floats
// sizes their scratch).
inline constexpr int kAmxFlashRows = 128;
inline constexpr int kDecodeRows = 8;  // rows per KV head the bf16 few-row decode kernel takes
inline constexpr int kMaxGroupRows = 12;  // rows per KV head of an all-heads decode job (Kernels)
inline constexpr int64_t kKvBlock = 64;
inline constexpr int64_t kMaxHeadDim = 1024;

// Keys a kernel asks KvView::rows() for at once (a block or an AMX superblock).
inline constexpr int64_t kMaxRowsPerCall = 128;
static_assert(kKvBlock <= kMaxRowsPerCall);

// An i8 cache with per-token scales: K and V planes as kv_cache_write writes them, or
// the MLA latent kv_rms_norm_rope_cache writes (no V plane: V is the first v_dim values of
// K's row, whose tail is the rope part in the q dtype). KvView::rows() dequantises the
// rows a job reads into its staging ring, rounded once to the q dtype, so a kernel (and
// the reference) can read plain rows; the ring holds two calls' rows, the block in use
// and the next one. The AMX decode kernels read the int8 rows themselves (planes(),
// sources()) and use the ring's space for their own buffers.
struct I8Kv {
  const int8_t* k = nullptr;
  const int8_t* v = nullptr;       // null: V is K's row prefix (MLA)
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  const void* rope = nullptr;      // MLA: K's row tail, rope_dim values in the q dtype
  int64_t k_dim = 0, v_dim = 0, rope_dim = 0;  // values per staged row (the job's slices)
  int64_t k_rs = 0, v_rs = 0, rope_rs = 0;     // element strides between slots
  uint8_t* stage = nullptr;
  // Staged row widths and the ring's bytes for rows of k_w + v_w values.
  int64_t k_width() const { return k_dim + rope_dim; }
  int64_t v_width() const { return v ? v_dim : 0; }
  bool mla_latent() const { return k && !v && rope; }  // MLA's i8 latent (no V plane, rope rows apart)
  static size_t stage_bytes(int64_t k_w, int64_t v_w, bool bf16) { return size_t(2 * kMaxRowsPerCall * (k_w + v_w)) * (bf16 ? 2 : 4); }
};

// One i8 row -> dst in the q dtype (value * scale in f32, rounded to nearest even),
// then the rope part's bytes (if any) after it. static: each unit (each compiled with its
// own ISA flags) keeps its own copy.
static inline void dequant_i8_row(const int8_t* x, float s, int64_t n, const void* rope, size_t rope_bytes, bool bf16, uint8_t* dst) {
  if (bf16) {
    uint16_t* o = reinterpret_cast<uint16_t*>(dst);
    for (int64_t d = 0; d < n; ++d) o[d] = f32_to_bf16(float(x[d]) * s);
  } else {
    float* o = reinterpret_cast<float*>(dst);
    for (int64_t d = 0; d < n; ++d) o[d] = float(x[d]) * s;
  }
  if (rope_bytes) std::memcpy(dst + size_t(n) * (bf16 ? 2 : 4), rope, rope_bytes);
}

// The member functions that walk pages and dequantise take the calling unit's Deq, a
// functor type local to that unit: every ISA unit then gets its own instantiation,
// compiled with its own flags (one shared inline copy could be an AVX-512 build of the
// loop, picked by the linker for the scalar unit too).
struct KvView {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_rs = 0, v_rs = 0;        // element stride between key positions (or slots)
  const int32_t* table = nullptr;    // paged: key j lives in slot table[j / bs] * bs + j % bs
  int64_t block_size = 0;
  I8Kv i8;                           // i8.k set: k / v unused, rows come from the staging ring
  mutable int ring = 0;              // staging half the next rows() call fills
  // One key's row; with an i8 cache, dequantised into the ring's first row (valid until
  // the next call): for the reference's key-at-a-time reads.
  template <class Deq>
  const void* key(int64_t j, bool bf16, const Deq& deq) const {
    return i8.k ? dequant_k(slot(j), bf16, i8.stage, deq) : row(k, k_rs, j, bf16);
  }
  template <class Deq>
  const void* value(int64_t j, bool bf16, const Deq& deq) const {
    if (!i8.k) return row(v, v_rs, j, bf16);
    return i8.v ? dequant_v(slot(j), bf16, i8.stage, deq) : dequant_k(slot(j), bf16, i8.stage, deq);
  }
  // Row addresses of keys j0 .. j0 + n (n <= kMaxRowsPerCall). With an i8 cache the rows
  // are dequantised here, into the other ring half.
  template <class Deq>
  void rows(int64_t j0, int64_t n, bool bf16, const void** kp, const void** vp, const Deq& deq) const {
    const size_t es = bf16 ? 2 : 4;
    const uint8_t* kb = static_cast<const uint8_t*>(k);
    const uint8_t* vb = static_cast<const uint8_t*>(v);
    if (!table) {
      for (int64_t i = 0; i < n; ++i) {
        kp[i] = kb + size_t((j0 + i) * k_rs) * es;
        vp[i] = vb + size_t((j0 + i) * v_rs) * es;
      }
      return;
    }
    uint8_t* stage = nullptr;
    const size_t k_row = size_t(i8.k_width()) * es, stage_row = k_row + size_t(i8.v_width()) * es;
    if (i8.k) {
      stage = i8.stage + size_t(ring) * size_t(kMaxRowsPerCall) * stage_row;
      ring ^= 1;
    }
    walk(j0, n, [&](int64_t i, int64_t slot) {
      if (stage) {
        uint8_t* dst = stage + size_t(i) * stage_row;
        kp[i] = vp[i] = dequant_k(slot, bf16, dst, deq);
        if (i8.v) vp[i] = dequant_v(slot, bf16, dst + k_row, deq);
      } else {
        kp[i] = kb + size_t(slot * k_rs) * es;
        vp[i] = vb + size_t(slot * v_rs) * es;
      }
    });
  }

  // i8 K / V planes: the rows of keys j0 .. j0 + n (this job's slices) and their scales,
  // for kernels that read int8 directly (ks / vs null: the rows alone, to prefetch them).
  template <class Deq>
  void planes(int64_t j0, int64_t n, const void** kp, const void** vp, float* ks, float* vs, const Deq&) const {
    walk(j0, n, [&](int64_t i, int64_t slot) {
      kp[i] = i8.k + slot * i8.k_rs, vp[i] = i8.v + slot * i8.v_rs;
      if (ks) ks[i] = i8.k_scales[slot], vs[i] = i8.v_scales[slot];
    });
  }
  // i8 MLA latent: the source rows (latent, rope) of keys j0 .. j0 + n, for reading or
  // prefetching them directly; scale_out (may be null) gets each key's scale.
  template <class Deq>
  void sources(int64_t j0, int64_t n, bool bf16, const void** lat_p, const void** rope_p, float* scale_out, const Deq&) const {
    const size_t es = bf16 ? 2 : 4;
    walk(j0, n, [&](int64_t i, int64_t slot) {
      lat_p[i] = i8.k + slot * i8.k_rs;
      rope_p[i] = static_cast<const uint8_t*>(i8.rope) + size_t(slot * i8.rope_rs) * es;
      if (scale_out) scale_out[i] = i8.k_scales[slot];
    });
  }

 private:
  // f(i, slot) for keys j0 + i, i < n, of a paged view: one division, then a page walk
  // (a division per key cost more than the key's whole dot product in decode).
  template <class F>
  void walk(int64_t j0, int64_t n, F&& f) const {
    int64_t blk = j0 / block_size, off = j0 % block_size;
    for (int64_t i = 0; i < n; ++i) {
      f(i, int64_t(table[blk]) * block_size + off);
      if (++off == block_size) off = 0, ++blk;
    }
  }
  int64_t slot(int64_t j) const { return table ? int64_t(table[j / block_size]) * block_size + j % block_size : j; }
  const void* row(const void* base, int64_t rs, int64_t j, bool bf16) const {
    return static_cast<const uint8_t*>(base) + size_t(slot(j) * rs) * (bf16 ? 2 : 4);
  }
  template <class Deq>
  const void* dequant_k(int64_t slot, bool bf16, uint8_t* dst, const Deq& deq) const {
    const size_t es = bf16 ? 2 : 4;
    const uint8_t* rope = i8.rope ? static_cast<const uint8_t*>(i8.rope) + size_t(slot * i8.rope_rs) * es : nullptr;
    deq(i8.k + slot * i8.k_rs, i8.k_scales[slot], i8.k_dim, rope, size_t(i8.rope_dim) * es, bf16, dst);
    return dst;
  }
  template <class Deq>
  const void* dequant_v(int64_t slot, bool bf16, uint8_t* dst, const Deq& deq) const {
    deq(i8.v + slot * i8.v_rs, i8.v_scales[slot], i8.v_dim, nullptr, 0, bf16, dst);
    return dst;
  }
};

struct Row {
  const void* q = nullptr;      // D values
  int64_t qpos = 0;             // query index within its sequence (for position masks)
  void* out = nullptr;          // final output (dtype of q) — or, for partial jobs:
  float* part_out = nullptr;    //   f32 partial output [Dv]
  float* lse = nullptr;         // lse destination (final or partial); may be null
  float sink = -INFINITY;       // per-head sink logit (-inf: none)
  const int8_t* mask = nullptr; // this row's mask over keys, stride mask_cs; may be null
  int64_t mask_cs = 0;
  const float* bias = nullptr;  // this row's bias over keys, stride bias_cs; may be null
  int64_t bias_cs = 0;
};

struct Job {
  KvView kv;
  int64_t kv_begin = 0, kv_end = 0;
  int64_t offset = 0;  // Skv - Sq of the sequence: query i sits at key position i + offset
  int nrows = 0;
  Row rows[kMaxFlashRows];
  // Several KV heads in one job (kernels with Kernels::multi_group only): rows come in
  // `groups` equal runs, run g reading the slice g * k_goff (K) / g * v_goff (V) elements
  // into each cache row, so a job streams whole rows in address order.
  int groups = 1;
  int64_t k_goff = 0, v_goff = 0;
};

struct Config {
  bool bf16 = false;
  int64_t D = 0, Dv = 0;
  float scale = 1.0f, softcap = 0.0f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  bool partial = false;  // write unnormalised-merge partials (part_out, lse) instead of out
  // Every KV row is read by one job (decode, or a prefill whose query tile covers the
  // sequence): it streams from DRAM, so kernels prefetch it. Otherwise a head's KV serves
  // many query tiles from cache and the prefetches only cost issue slots.
  bool kv_once = true;
  // Rows the job scratch is laid out for (job_scratch_floats): flash kMaxFlashRows, decode
  // kMaxRows.
  int max_rows = kMaxRows;
};

// Rows of the q area of a job's scratch: the GEMM path keeps Q as 6-row micro-panels.
constexpr int64_t qf_rows(int64_t rows) { return (rows + gemm_detail::kMR - 1) / gemm_detail::kMR * gemm_detail::kMR; }

// The prefill GEMM path's operands (attention_gemm_prefill_inl.h), as float offsets
// into the part of a job's scratch after the rows' q, O and scores (Q's 6-row
// micro-panels sit where the q rows would): K^T [D][64], V and O in planes of 64 columns,
// P micro-panels. Each piece
// is a multiple of 16 floats (D % 16 == 0: the kernels' B loads are aligned to 64 bytes);
// `floats` keeps 8 more for
// the last overlapping store of the P / Q packing.
struct GemmPrefillLayout {
  int64_t planes, kt = 0, v, o, p, floats;
  GemmPrefillLayout(int64_t D, int64_t Dv, int64_t rows)
      : planes((Dv + gemm_detail::kNR - 1) / gemm_detail::kNR) {
    v = kt + D * gemm_detail::kNR;
    o = v + planes * gemm_detail::kNR * gemm_detail::kNR;
    p = o + planes * rows * gemm_detail::kNR;
    // P micro-panels: the AVX2 strips' only (AVX-512 reads P's rows), whose jobs hold up to
    // kMaxJobRows rows.
    floats = p + (kMaxJobRows + gemm_detail::kMR - 1) / gemm_detail::kMR * gemm_detail::kNR * gemm_detail::kMR + 8;
  }
};

// The AVX2 many-row decode path's operands (attention_avx2_manyrows_inl.h), as float
// offsets into a decode job's scratch after the rows' q, O and scores: one block's K rows
// and (when they are not K's row prefix) V rows widened to f32, Q^T [D][kMaxRows], and
// the block's S^T, later P^T, [kKvBlock][kMaxRows].
struct ManyRowsLayout {
  int64_t kf = 0, vf, qt, st, floats;
  ManyRowsLayout(int64_t D, int64_t Dv)
      : vf(kf + kKvBlock * D), qt(vf + kKvBlock * Dv), st(qt + D * kMaxRows), floats(st + kKvBlock * kMaxRows) {}
};

// Scratch floats one job of up to `rows` rows (Config::max_rows) needs: the vector
// kernel's q rows, accumulators and one block of scores, then either one block of staged
// bf16 K / V rows, GemmPrefillLayout (flash; on the AVX-512 unit also many-row decode) or
// ManyRowsLayout (decode); or the AMX / AVX512_BF16 job kernels' Q^T, staged K and V
// pairs, scores, P and O (the largest).
inline int64_t job_scratch_floats(int64_t D, int64_t Dv, int rows) {
  const int64_t pad = 16;
  const int64_t gemm = GemmPrefillLayout(D, Dv, rows).floats;
  const int64_t many = rows <= kMaxRows ? ManyRowsLayout(D, Dv).floats : 0;
  // q rows: as many as Q's 6-row micro-panels of the GEMM path take (qf_rows).
  const int64_t vec = qf_rows(rows) * (D + pad) + rows * ((Dv + pad) + kKvBlock) + std::max({kKvBlock * (D + Dv) / 2, gemm, many});
  // AMX job kernel: Q^T per 32-row group, staged K rows, V pairs of a superblock, scores,
  // P^T, P rows and O (flash jobs of up to 128 rows in four groups).
  // (K rows staged: a superblock's, up to kMaxRowsPerCall, in a flash job of several groups.)
  const int64_t amx_rows = rows > kMaxRows ? kAmxFlashRows : 32, amx_groups = amx_rows / 32;
  const int64_t amx_kst = (amx_groups > 1 ? kMaxRowsPerCall : 32) * D / 2;
  const int64_t amx = amx_groups * 16 * D + amx_kst + 2048 + 128 * 32 + 2048 + amx_rows * 64 + amx_rows * Dv + 64;
  // AVX512_BF16 job kernel: flash jobs of up to kDpFlashRows rows in 32-row groups.
  const int64_t dp_rows = rows > kMaxRows ? kDpFlashRows : 32, dp_groups = dp_rows / 32;
  const int64_t dp = dp_groups * (16 * D + 128 * 32 + 2048) + dp_rows * 64 + 4096 + dp_rows * Dv;
  return std::max({vec, amx, dp});
}

struct Kernels {
  void (*run_job)(const Config& c, const Job& j, float* scratch);
  bool multi_group = false;  // run_job takes jobs with groups > 1 (decode over all KV heads)
  int prefill_rows = kMaxRows;  // rows of a flash job (<= kMaxFlashRows)
  // multi_group decode: rows an all-heads job may hold in total (<= kMaxJobRows) and per
  // KV head (<= kMaxGroupRows), and whether it takes f32 q / caches (else bf16 only).
  int decode_rows = kMaxRows, decode_group_rows = kDecodeRows;
  bool decode_f32 = false;
};
const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels& kernels_avx512_bf16();
const Kernels& kernels_amx();

// Flash prefill jobs (K / V read by other jobs too) that run as GEMM microkernel calls
// (attention_gemm_prefill_inl.h) on the AVX2 and `avx512` units, and on the AVX-512 units
// with dot-product kernels for the jobs those do not take (f32, masks, bias, softcap) and,
// where vdpbf16ps runs at half the FMA's FLOPs (cpu_features().fast_bf16_dot false), all
// of them: each K / V block loaded (bf16: widened) once for all the job's rows into GEMM
// microkernel calls, where the AVX-512 units' vector kernel scores one (row, key) dot at a
// time. Flash S = 4096, 16 heads, D = 128, causal, two threads (Sapphire Rapids class,
// stop 30, the AVX2 strips): f32 759-828 -> 388-436 ms, bf16 on the `avx512` unit 887 ->
// 403 ms. Its tiles need D and Dv multiples of 16.
inline bool gemm_prefill_job(const Config& c, const Job& j) {
  return !c.kv_once && j.groups == 1 && c.D % 16 == 0 && c.Dv % 16 == 0;
}

// Reference for one job: scores and softmax in double, naive, no blocking.
void run_job_reference(const Config& c, const Job& j);

using KernelsFn = const Kernels& (*)();
const dispatch::Registry<KernelsFn>& flash_registry();
const dispatch::Registry<KernelsFn>& paged_registry();
const dispatch::Registry<KernelsFn>& mla_registry();
// Validate and run with a given implementation (tests, verify, bench).
Status flash_run(const Kernels& k, const FlashAttentionParams& p, Workspace ws);
Status paged_run(const Kernels& k, const PagedDecodeParams& p, Workspace ws);
Status mla_run(const Kernels& k, const MlaDecodeParams& p, Workspace ws);
// What the size queries refuse (each returns 0 exactly when its check fails): the C API's
// message for a refused query.
Status flash_check(const FlashAttentionParams& p);
Status paged_check(const PagedDecodeParams& p);
Status mla_check(const MlaDecodeParams& p);

// Whether the job's mask tensors hide every one of keys kb .. kb + n from every row (false
// when a row has none). Such a block changes nothing (p = 0 throughout, each row's m and l
// as they were), so the kernels skip it: a causal or block-sparse rule given as a mask
// tensor then costs about what the flag costs, where they visited the whole square. Flash
// bf16, 16 heads, a causal mask tensor: S = 4096 on the job kernel 2.2x -> 1.15-1.2x the
// flag's time; S = 2048 on the vector kernels, `avx512` 270 -> 135 ms, `avx2` 314 -> 162
// (the flag 109 / 143).
bool masks_hide(const Job& j, int64_t kb, int64_t n);

// Visibility of key j for a row (position rules only; mask tensors apply separately).
// The keys a row at qpos sees, [lo, hi) (INT64_MIN / INT64_MAX where unbounded): causal
// ends at its diagonal, a window bounds either side.
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange visible_range(const Config& c, int64_t qpos, int64_t offset) {
  const int64_t d = qpos + offset;  // the row's diagonal key position
  KeyRange r{c.window_left >= 0 ? d - c.window_left : INT64_MIN, c.causal ? d + 1 : INT64_MAX};
  if (c.window_right >= 0) r.hi = std::min(r.hi, d + c.window_right + 1);
  return r;
}
inline bool visible(const Config& c, int64_t qpos, int64_t offset, int64_t j) {
  const KeyRange r = visible_range(c, qpos, offset);
  return j >= r.lo && j < r.hi;
}
// The keys a job visits: [kv_begin, kv_end) cut to the hull of its first `rows` rows'
// visible ranges (keys in between that a row does not see are masked per row).
inline KeyRange job_keys(const Config& c, const Job& j, int rows) {
  KeyRange hull{INT64_MAX, INT64_MIN};
  for (int r = 0; r < rows; ++r) {
    const KeyRange v = visible_range(c, j.rows[r].qpos, j.offset);
    hull.lo = std::min(hull.lo, v.lo), hull.hi = std::max(hull.hi, v.hi);
  }
  return {std::max(j.kv_begin, hull.lo), std::min(j.kv_end, hull.hi)};
}
// The keys of the block kb .. kb + n - 1 (kb >= 0) that the row sees: kb + [a, b), a <= b.
inline std::pair<int64_t, int64_t> visible_keys(const Config& c, int64_t qpos, int64_t offset, int64_t kb, int64_t n) {
  const KeyRange r = visible_range(c, qpos, offset);
  const int64_t b = r.hi - kb >= n ? n : std::max<int64_t>(r.hi - kb, 0);  // hi - kb cannot overflow: kb >= 0
  const int64_t a = r.lo <= kb ? 0 : std::min(r.lo - kb, b);
  return {a, b};
}

}  // namespace optx::attn_detail
