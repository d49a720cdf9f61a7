// Attention ops: validate -> cut into jobs (attention_internal.h) -> run them on all
// threads (dynamic schedule: causal jobs differ in cost; the longest start first) -> for
// a split KV axis (decode, or flash with few jobs), merge the partials by log-sum-exp. A
// job's result does not depend on the thread that runs it, so outputs repeat bitwise at
// a fixed thread count; the job heights and KV splits follow the thread count, so
// between thread counts they can differ by rounding.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/validate.h"
#include "ops/attention/attention_internal.h"

namespace optx {
namespace attn_detail {
namespace {

size_t esize(DType t) { return dtype_size(t); }

Status check_tensor(const char* op, const TensorView& t, const char* name, int rank) {
  OPTX_RETURN_IF_ERROR(check_view(op, name, t));
  if (t.rank != rank) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".rank=", t.rank, " but must be ", rank);
  if (t.sizes[rank - 1] > 1 && t.strides[rank - 1] != 1)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[", rank - 1, "]=", t.strides[rank - 1], " but must be 1");
  return Status::Ok();
}

// An output: a checked view whose elements do not overlap (threads write them).
Status check_output(const char* op, const TensorView& t, const char* name, int rank) {
  OPTX_RETURN_IF_ERROR(check_tensor(op, t, name, rank));
  return check_disjoint(op, name, t);
}

// A window or a count past any sequence this library can hold means "unbounded":
// canonical -1, so the kernels never add it to a position (INT64_MAX + pos overflowed).
int64_t canonical_window(int64_t w) { return w >= kMaxViewElements ? -1 : w; }

// Per-token scales of an i8 cache: f32 [num_slots].
Status check_scales(const char* op, const TensorView& t, const char* name, int64_t slots, const char* with) {
  OPTX_RETURN_IF_ERROR(check_tensor(op, t, name, 1));
  if (t.dtype != DType::kF32 || t.sizes[0] != slots)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be f32 [num_slots=", slots, "] with ", with, ", got ",
                 dtype_name(t.dtype), " [", t.sizes[0], "]");
  return Status::Ok();
}

// Sequence geometry of one tensor: element offset of (b, pos, head) = base + pos*ps + head*hs.
struct Seq {
  int64_t base = 0, ps = 0, hs = 0, len = 0;
};

// ---- the parallel driver ------------------------------------------------------------------
size_t scratch_bytes(int64_t D, int64_t Dv, int rows) { return align_up(size_t(job_scratch_floats(D, Dv, rows)) * sizeof(float)); }
size_t scratch_bytes(const Config& c) { return scratch_bytes(c.D, c.Dv, c.max_rows); }

// A thread's place in a job list laid out sequence by sequence: batch b's jobs start at
// index `first`. A thread takes ascending indices (monotonic schedule), so it finds each
// job's sequence by stepping on from its last one; a scan from sequence 0 for every job
// was quadratic in the sequences of a varlen batch.
struct JobCursor {
  int64_t b = 0, first = 0;
};

// Per-thread scratch: one job's floats, then (i8 caches) its staging ring; jobs made on
// the fly by make(idx, job, cursor).
template <class Make>
void run_jobs(const Kernels& k, const Config& c, int64_t njobs, uint8_t* ws, size_t per_thread, const Make& make) {
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(num_threads(), njobs)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    uint8_t* mine = ws + size_t(omp_get_thread_num()) * per_thread;
    float* scratch = reinterpret_cast<float*>(mine);
    JobCursor cur;
#pragma omp for schedule(monotonic : dynamic, 1)
    for (int64_t idx = 0; idx < njobs; ++idx) {
      Job job;
      make(idx, job, cur);
      if (job.kv.i8.k) job.kv.i8.stage = mine + scratch_bytes(c);
      k.run_job(c, job, scratch);
    }
  }
}

// Rows per job (at most `rows`): the heads of a GQA group times as many query positions
// as fit.
void row_tiling(int64_t G, int64_t rows, int64_t* heads_per_job, int64_t* q_per_job) {
  *heads_per_job = std::min<int64_t>(G, rows);
  *q_per_job = std::max<int64_t>(1, rows / *heads_per_job);
}

// Job index -> (head chunk, query tile, split) within one (batch, kv head); query tiles
// in reverse so that, under a causal mask, the jobs with the most keys come first.
struct Tile {
  int64_t hc, qt, sp;
};
Tile tile_of(int64_t idx, int64_t head_chunks, int64_t q_tiles, int64_t splits) {
  Tile t;
  t.sp = idx % splits;
  idx /= splits;
  t.qt = q_tiles - 1 - idx % q_tiles;
  t.hc = idx / q_tiles;
  (void)head_chunks;
  return t;
}

// ---- flash attention --------------------------------------------------------------------
struct FlashGeo {
  int64_t B = 0, Nq = 0, Nkv = 0, D = 0, Dv = 0, Sq = 0, Skv = 0;
  const int32_t* cu_q = nullptr;
  const int32_t* cu_kv = nullptr;
  int64_t sq(int64_t b) const { return cu_q ? cu_q[b + 1] - cu_q[b] : Sq; }
  int64_t skv(int64_t b) const { return cu_kv ? cu_kv[b + 1] - cu_kv[b] : Skv; }
};

FlashGeo flash_geo_of(const FlashAttentionParams& p) {
  FlashGeo g;
  if (p.layout == AttnLayout::kTND) {
    g.B = p.cu_seqlens_q.sizes[0] - 1;
    g.Nq = p.q.sizes[1], g.D = p.q.sizes[2];
    g.Nkv = p.k.sizes[1], g.Dv = p.v.sizes[2];
    g.cu_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
    g.cu_kv = static_cast<const int32_t*>(p.cu_seqlens_kv.data);
  } else {
    const bool bsnd = p.layout == AttnLayout::kBSND;
    g.B = p.q.sizes[0];
    g.Nq = bsnd ? p.q.sizes[2] : p.q.sizes[1];
    g.Sq = bsnd ? p.q.sizes[1] : p.q.sizes[2];
    g.Nkv = bsnd ? p.k.sizes[2] : p.k.sizes[1];
    g.Skv = bsnd ? p.k.sizes[1] : p.k.sizes[2];
    g.D = p.q.sizes[3], g.Dv = p.v.sizes[3];
  }
  return g;
}

Seq seq_of(const TensorView& t, AttnLayout layout, const FlashGeo& g, bool is_q, int64_t b) {
  Seq s;
  if (layout == AttnLayout::kTND) {
    const int32_t* cu = is_q ? g.cu_q : g.cu_kv;
    s.base = int64_t(cu[b]) * t.strides[0];
    s.ps = t.strides[0];
    s.hs = t.strides[1];
  } else {
    s.base = b * t.strides[0];
    const bool bsnd = layout == AttnLayout::kBSND;
    s.ps = bsnd ? t.strides[1] : t.strides[2];
    s.hs = bsnd ? t.strides[2] : t.strides[1];
  }
  s.len = is_q ? g.sq(b) : g.skv(b);
  return s;
}

Status flash_validate(const FlashAttentionParams& p, FlashGeo* g) {
  constexpr const char* op = "flash_attention";
  const bool tnd = p.layout == AttnLayout::kTND;
  const int rank = tnd ? 3 : 4;
  if (p.layout != AttnLayout::kBSND && p.layout != AttnLayout::kBNSD && !tnd)
    return Error(StatusCode::kInvalidArgument, op, ": layout=", int(p.layout), " is not an AttnLayout");
  OPTX_RETURN_IF_ERROR(check_tensor(op, p.q, "q", rank));
  OPTX_RETURN_IF_ERROR(check_tensor(op, p.k, "k", rank));
  OPTX_RETURN_IF_ERROR(check_tensor(op, p.v, "v", rank));
  OPTX_RETURN_IF_ERROR(check_output(op, p.out, "out", rank));
  if (p.q.dtype != DType::kF32 && p.q.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": q.dtype=", dtype_name(p.q.dtype), " but must be f32 or bf16");
  for (const auto* t : {&p.k, &p.v, &p.out})
    if (t->dtype != p.q.dtype)
      return Error(StatusCode::kInvalidArgument, op, ": ", t == &p.k ? "k" : t == &p.v ? "v" : "out", ".dtype=", dtype_name(t->dtype),
                   " but q.dtype=", dtype_name(p.q.dtype));
  if (tnd) {
    for (const auto* cu : {&p.cu_seqlens_q, &p.cu_seqlens_kv}) {
      const char* n = cu == &p.cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_kv";
      OPTX_RETURN_IF_ERROR(check_view(op, n, *cu));
      if (cu->rank != 1 || cu->sizes[0] < 1 || cu->dtype != DType::kI32 || !cu->data || (cu->sizes[0] > 1 && cu->strides[0] != 1))
        return Error(StatusCode::kInvalidArgument, op, ": ", n, " must be contiguous i32 [B + 1], got ", dtype_name(cu->dtype), " rank ",
                     cu->rank, " sizes[0]=", cu->sizes[0], " strides[0]=", cu->strides[0]);
    }
    if (p.cu_seqlens_q.sizes[0] != p.cu_seqlens_kv.sizes[0])
      return Error(StatusCode::kInvalidArgument, op, ": cu_seqlens_q has ", p.cu_seqlens_q.sizes[0], " entries but cu_seqlens_kv ",
                   p.cu_seqlens_kv.sizes[0]);
  }
  *g = flash_geo_of(p);
  if (tnd) {
    const int32_t* cq = g->cu_q;
    const int32_t* ck = g->cu_kv;
    if (cq[0] != 0 || ck[0] != 0) return Error(StatusCode::kInvalidArgument, op, ": cu_seqlens must start at 0");
    for (int64_t b = 0; b < g->B; ++b) {
      if (cq[b + 1] < cq[b] || ck[b + 1] < ck[b])
        return Error(StatusCode::kInvalidArgument, op, ": cu_seqlens must not decrease (batch ", b, ")");
    }
    if (cq[g->B] != p.q.sizes[0] || ck[g->B] != p.k.sizes[0] || p.v.sizes[0] != p.k.sizes[0] || p.out.sizes[0] != p.q.sizes[0])
      return Error(StatusCode::kInvalidArgument, op, ": cu_seqlens_q[B]=", cq[g->B], " / cu_seqlens_kv[B]=", ck[g->B],
                   " must equal the token counts of q / out (", p.q.sizes[0], ") and k / v (", p.k.sizes[0], ")");
    // Head counts (dim 1): out with fewer heads than q was written past its end.
    if (p.v.sizes[1] != g->Nkv || p.out.sizes[1] != g->Nq)
      return Error(StatusCode::kInvalidArgument, op, ": v has ", p.v.sizes[1], " heads and out ", p.out.sizes[1], " but k has Nkv=",
                   g->Nkv, " and q Nq=", g->Nq);
  } else {
    const bool bsnd = p.layout == AttnLayout::kBSND;
    const int sd = bsnd ? 1 : 2, nd = bsnd ? 2 : 1;
    if (p.k.sizes[0] != g->B || p.v.sizes[0] != g->B || p.out.sizes[0] != g->B)
      return Error(StatusCode::kInvalidArgument, op, ": batch sizes differ: q ", g->B, ", k ", p.k.sizes[0], ", v ", p.v.sizes[0],
                   ", out ", p.out.sizes[0]);
    if (p.v.sizes[sd] != g->Skv || p.v.sizes[nd] != g->Nkv)
      return Error(StatusCode::kInvalidArgument, op, ": v has Skv=", p.v.sizes[sd], ", Nkv=", p.v.sizes[nd], " but k has ", g->Skv, ", ",
                   g->Nkv);
    if (p.out.sizes[sd] != g->Sq || p.out.sizes[nd] != g->Nq)
      return Error(StatusCode::kInvalidArgument, op, ": out has S=", p.out.sizes[sd], ", N=", p.out.sizes[nd], " but q has ", g->Sq,
                   ", ", g->Nq);
  }
  const int last = rank - 1;
  if (p.k.sizes[last] != g->D)
    return Error(StatusCode::kInvalidArgument, op, ": k.sizes[", last, "]=", p.k.sizes[last], " but q.sizes[", last, "]=", g->D,
                 ": head dims must match");
  if (p.out.sizes[last] != g->Dv)
    return Error(StatusCode::kInvalidArgument, op, ": out.sizes[", last, "]=", p.out.sizes[last], " but v.sizes[", last, "]=", g->Dv);
  if (g->D < 1 || g->D > kMaxHeadDim || g->Dv < 1 || g->Dv > kMaxHeadDim)
    return Error(StatusCode::kInvalidArgument, op, ": head dims D=", g->D, ", Dv=", g->Dv, " must be in [1, ", kMaxHeadDim, "]");
  if (g->Nq < 1) return Error(StatusCode::kInvalidArgument, op, ": q has Nq=", g->Nq, " heads; need at least one");
  if (g->Nkv < 1 || g->Nq % g->Nkv != 0)
    return Error(StatusCode::kInvalidArgument, op, ": q heads Nq=", g->Nq, " must be a multiple of kv heads Nkv=", g->Nkv);
  if (!p.lse.empty()) {
    const int lr = tnd ? 2 : 3;
    OPTX_RETURN_IF_ERROR(check_output(op, p.lse, "lse", lr));
    const bool ok = p.lse.dtype == DType::kF32 &&
                    (tnd ? (p.lse.sizes[0] == g->Nq && p.lse.sizes[1] == p.q.sizes[0])
                         : (p.lse.sizes[0] == g->B && p.lse.sizes[1] == g->Nq && p.lse.sizes[2] == g->Sq));
    if (!ok)
      return Error(StatusCode::kInvalidArgument, op, ": lse must be f32 ",
                   tnd ? "[Nq=" + std::to_string(g->Nq) + ", Tq=" + std::to_string(p.q.sizes[0]) + "]"
                       : "[B=" + std::to_string(g->B) + ", Nq=" + std::to_string(g->Nq) + ", Sq=" + std::to_string(g->Sq) + "]",
                   ", got ", dtype_name(p.lse.dtype), " [", p.lse.sizes[0], ", ", p.lse.sizes[1], tnd ? "" : ", ",
                   tnd ? "" : std::to_string(p.lse.sizes[2]), "]");
  }
  // TND: a mask / bias is per sequence, padded: [B|1, N|1, >= longest q, >= longest kv],
  // indexed by positions within the sequence (as a padded batch's would be).
  int64_t mq = g->Sq, mk = g->Skv;
  if (tnd) {
    mq = mk = 0;
    for (int64_t b = 0; b < g->B; ++b)
      mq = std::max<int64_t>(mq, g->cu_q[b + 1] - g->cu_q[b]), mk = std::max<int64_t>(mk, g->cu_kv[b + 1] - g->cu_kv[b]);
  }
  for (const auto* t : {&p.mask, &p.bias}) {
    if (t->empty()) continue;
    const char* n = t == &p.mask ? "mask" : "bias";
    OPTX_RETURN_IF_ERROR(check_view(op, n, *t));
    if (t->rank != 4 || t->dtype != (t == &p.mask ? DType::kI8 : DType::kF32))
      return Error(StatusCode::kInvalidArgument, op, ": ", n, " must be ", t == &p.mask ? "i8" : "f32", " [B|1, N|1, Sq, Skv]");
    const bool rows_ok = tnd ? t->sizes[2] >= mq && t->sizes[3] >= mk : t->sizes[2] == mq && t->sizes[3] == mk;
    if ((t->sizes[0] != 1 && t->sizes[0] != g->B) || (t->sizes[1] != 1 && t->sizes[1] != g->Nq) || !rows_ok)
      return Error(StatusCode::kInvalidArgument, op, ": ", n, ".sizes=[", t->sizes[0], ", ", t->sizes[1], ", ", t->sizes[2], ", ",
                   t->sizes[3], "] must broadcast to [B=", g->B, ", Nq=", g->Nq, tnd ? ", Sq>=" : ", Sq=", mq, tnd ? ", Skv>=" : ", Skv=",
                   mk, "]", tnd ? " (TND: per sequence, padded to the longest)" : "");
  }
  OPTX_RETURN_IF_ERROR(check_view(op, "sinks", p.sinks));
  if (!p.sinks.empty() && (p.sinks.rank != 1 || p.sinks.sizes[0] != g->Nq || p.sinks.dtype != DType::kF32 || !p.sinks.data))
    return Error(StatusCode::kInvalidArgument, op, ": sinks must be f32 [Nq=", g->Nq, "], got ", dtype_name(p.sinks.dtype), " rank ",
                 p.sinks.rank, " sizes[0]=", p.sinks.sizes[0]);
  if (!(p.softcap >= 0.0f) || std::isinf(p.softcap))
    return Error(StatusCode::kInvalidArgument, op, ": softcap=", p.softcap, " must be finite and >= 0 (0: no softcap)");
  if (!std::isfinite(p.scale)) return Error(StatusCode::kInvalidArgument, op, ": scale=", p.scale, " must be finite");
  if (p.window_left < -1 || p.window_right < -1)
    return Error(StatusCode::kInvalidArgument, op, ": window_left=", p.window_left, ", window_right=", p.window_right,
                 " must be >= -1 (-1: unbounded)");
  return Status::Ok();
}

// The outputs and the workspace bytes a call uses (after validation), apart from the
// inputs: rows of out are written while other jobs still read q / k / v (and cu_seqlens,
// which locate every job's rows).
Status flash_apart(const FlashAttentionParams& p, const TensorView& workspace) {
  const TensorView none;
  const bool tnd = p.layout == AttnLayout::kTND;
  return check_apart("flash_attention", {{"out", p.out}, {"lse", p.lse}, {"workspace", workspace}},
                     {{"q", p.q}, {"k", p.k}, {"v", p.v}, {"mask", p.mask}, {"bias", p.bias}, {"sinks", p.sinks},
                      {"cu_seqlens_q", tnd ? p.cu_seqlens_q : none}, {"cu_seqlens_kv", tnd ? p.cu_seqlens_kv : none}});
}

// Sum over i in [i0, i1) of clamp(i + c, 0, n).
int64_t sum_clamped(int64_t i0, int64_t i1, int64_t c, int64_t n) {
  const int64_t lo = std::clamp(-c, i0, i1), hi = std::clamp(n - c, i0, i1);  // [i0, lo): 0, [lo, hi): i + c, [hi, i1): n
  return (hi - lo) * (lo + hi - 1 + 2 * c) / 2 + (i1 - hi) * n;
}

// Jobs of flash attention: per batch, per kv head, per head chunk, query tile and KV
// split (flash_run: kv_splits).
struct FlashJobs {
  const FlashAttentionParams* p = nullptr;
  FlashGeo g;
  Config cfg;
  int64_t heads_per_job = 1, q_per_job = 1, head_chunks = 1;
  int64_t splits = 1;
  float* part = nullptr;  // splits > 1: per query row and split, Dv outputs then the lse
  int64_t q_tiles(int64_t b) const { return (g.sq(b) + q_per_job - 1) / q_per_job; }
  int64_t per_batch(int64_t b) const { return g.Nkv * head_chunks * q_tiles(b) * splits; }
  int64_t total() const {
    int64_t n = 0;
    for (int64_t b = 0; b < g.B; ++b) n += per_batch(b);
    return n;
  }
  // Query rows (token, head) in token order: a split's partials and the merge index them.
  int64_t first_token(int64_t b) const { return g.cu_q ? g.cu_q[b] : b * g.Sq; }
  int64_t rows_total() const { return first_token(g.B) * g.Nq; }
  float* part_of(int64_t row, int64_t sp) const { return part + (row * splits + sp) * (cfg.Dv + 1); }
  size_t part_bytes() const { return splits > 1 ? align_up(size_t(rows_total() * splits * (cfg.Dv + 1)) * sizeof(float)) : 0; }
  // KV blocks of the longest key range a sequence's rows see (a job's split cuts its own
  // range, which lies within): what kv_splits weighs, whatever the job height.
  int64_t span_blocks() const {
    int64_t n = 0;
    for (int64_t b = 0; b < g.B; ++b) {
      const int64_t sq = g.sq(b), skv = g.skv(b);
      if (sq == 0) continue;
      const int64_t lo = std::clamp<int64_t>(visible_range(cfg, 0, skv - sq).lo, 0, skv);
      n = std::max(n, std::clamp<int64_t>(visible_range(cfg, sq - 1, skv - sq).hi, lo, skv) - lo);
    }
    return (n + kKvBlock - 1) / kKvBlock;
  }
  // Where query row `row` (partials' order: token, then head) finishes.
  void final_row(int64_t row, void** out, float** lse) const {
    const int64_t t = row / g.Nq;
    const int64_t b = g.cu_q ? std::upper_bound(g.cu_q, g.cu_q + g.B + 1, int32_t(t)) - g.cu_q - 1 : t / g.Sq;
    final_row(b, t - first_token(b), row % g.Nq, out, lse);
  }
  // Where row (b, i, h) of the call finishes: its out row and lse entry (or null).
  void final_row(int64_t b, int64_t i, int64_t h, void** out, float** lse) const {
    const FlashAttentionParams& P = *p;
    const Seq os = seq_of(P.out, P.layout, g, true, b);
    *out = static_cast<uint8_t*>(P.out.data) + size_t(os.base + i * os.ps + h * os.hs) * esize(P.q.dtype);
    *lse = nullptr;
    if (!P.lse.empty()) {
      float* l = static_cast<float*>(P.lse.data);
      *lse = P.layout == AttnLayout::kTND ? l + h * P.lse.strides[0] + (g.cu_q[b] + i) * P.lse.strides[1]
                                          : l + b * P.lse.strides[0] + h * P.lse.strides[1] + i * P.lse.strides[2];
    }
  }
  // The call's time on `threads` threads, in row-key units: jobs go in index order to the
  // first free thread (run_jobs' dynamic schedule), each costing the keys its rows see
  // plus kSharedCost row-equivalents per key of its span for the work its rows share (K /
  // V reads, V staging), a KV split an equal part of that. 28 fits the AMX kernel, whose
  // 64-row jobs took 1.15-1.22x the time of 128-row ones per row and key (stop 56). For
  // calls of a few jobs only.
  static constexpr int kEstThreads = 64;  // est_time's most threads (no allocation in a call)
  double est_time(int threads) const {
    constexpr double kSharedCost = 28.0;
    std::array<double, kEstThreads> all{};
    const std::span<double> busy(all.data(), size_t(std::clamp(threads, 1, kEstThreads)));
    const int64_t G = g.Nq / g.Nkv;
    for (int64_t b = 0; b < g.B; ++b) {
      const int64_t sq = g.sq(b), skv = g.skv(b);
      // Row i sees keys [clamp(i + r0.lo), clamp(i + r0.hi)) of [0, skv), both ends rising
      // with i; a side without a bound is 0 or skv throughout.
      const KeyRange r0 = visible_range(cfg, 0, skv - sq);
      const auto end_at = [&](int64_t i, int64_t c, int64_t unbounded) {
        return c == unbounded ? (unbounded == INT64_MIN ? 0 : skv) : std::clamp<int64_t>(i + c, 0, skv);
      };
      const auto sum_ends = [&](int64_t i0, int64_t i1, int64_t c, int64_t unbounded) {
        return c == unbounded ? (i1 - i0) * end_at(0, c, unbounded) : sum_clamped(i0, i1, c, skv);
      };
      for (int64_t job = 0; job < per_batch(b); ++job) {
        const Tile t = tile_of(job % (head_chunks * q_tiles(b) * splits), head_chunks, q_tiles(b), splits);
        const int64_t heads = std::min(G, (t.hc + 1) * heads_per_job) - t.hc * heads_per_job;
        const int64_t i0 = t.qt * q_per_job, i1 = std::min(sq, i0 + q_per_job);
        const int64_t seen = sum_ends(i0, i1, r0.hi, INT64_MAX) - sum_ends(i0, i1, r0.lo, INT64_MIN);
        const int64_t span = end_at(i1 - 1, r0.hi, INT64_MAX) - end_at(i0, r0.lo, INT64_MIN);
        const double cost = double(seen * heads) + kSharedCost * double(std::max<int64_t>(span, 0));
        *std::min_element(busy.begin(), busy.end()) += cost / double(splits);
      }
    }
    return *std::max_element(busy.begin(), busy.end());
  }
  void make(int64_t idx, Job& job, JobCursor& cur) const {
    if (idx < cur.first) cur = {};  // not ascending after all: start over
    while (idx >= cur.first + per_batch(cur.b)) cur.first += per_batch(cur.b++);
    const int64_t b = cur.b;
    idx -= cur.first;
    const int64_t qt_n = q_tiles(b);
    const int64_t per_head = head_chunks * qt_n * splits;
    const int64_t kvh = idx / per_head;
    const Tile t = tile_of(idx % per_head, head_chunks, qt_n, splits);
    const FlashAttentionParams& P = *p;
    const Seq qs = seq_of(P.q, P.layout, g, true, b), ks = seq_of(P.k, P.layout, g, false, b),
              vs = seq_of(P.v, P.layout, g, false, b);
    const size_t es = esize(P.q.dtype);
    auto ptr = [&](const TensorView& tv, int64_t off) { return static_cast<uint8_t*>(tv.data) + size_t(off) * es; };
    job.kv = KvView{};
    job.kv.k = ptr(P.k, ks.base + kvh * ks.hs);
    job.kv.v = ptr(P.v, vs.base + kvh * vs.hs);
    job.kv.k_rs = ks.ps;
    job.kv.v_rs = vs.ps;
    job.offset = ks.len - qs.len;
    const int64_t G = g.Nq / g.Nkv;
    const int64_t h0 = kvh * G + t.hc * heads_per_job;
    const int64_t h1 = std::min(kvh * G + G, h0 + heads_per_job);
    const int64_t i0 = t.qt * q_per_job, i1 = std::min(qs.len, i0 + q_per_job);
    job.kv_begin = 0;
    job.kv_end = ks.len;
    if (splits > 1) {  // split t.sp of the keys the rows see (their ranges rise with i), in whole blocks
      const int64_t lo = std::clamp<int64_t>(visible_range(cfg, i0, job.offset).lo, 0, ks.len);
      const int64_t hi = std::clamp<int64_t>(visible_range(cfg, i1 - 1, job.offset).hi, lo, ks.len);
      const int64_t nblk = (hi - lo + kKvBlock - 1) / kKvBlock;
      job.kv_begin = std::min(hi, lo + nblk * t.sp / splits * kKvBlock);
      job.kv_end = std::min(hi, lo + nblk * (t.sp + 1) / splits * kKvBlock);
    }
    job.nrows = 0;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t h = h0; h < h1; ++h) {
        Row& r = job.rows[job.nrows++];
        r = Row{};
        r.q = ptr(P.q, qs.base + i * qs.ps + h * qs.hs);
        r.qpos = i;
        if (splits > 1) {
          r.part_out = part_of((first_token(b) + i) * g.Nq + h, t.sp);
          r.lse = r.part_out + cfg.Dv;
        } else {
          final_row(b, i, h, &r.out, &r.lse);
        }
        // A sink joins one split's sum only: the merge then adds it to the denominator once.
        if (!P.sinks.empty() && t.sp == 0) r.sink = static_cast<const float*>(P.sinks.data)[h * P.sinks.strides[0]];
        if (!P.mask.empty()) {
          const TensorView& m = P.mask;
          r.mask = static_cast<const int8_t*>(m.data) + (m.sizes[0] == 1 ? 0 : b * m.strides[0]) +
                   (m.sizes[1] == 1 ? 0 : h * m.strides[1]) + i * m.strides[2];
          r.mask_cs = m.strides[3];
        }
        if (!P.bias.empty()) {
          const TensorView& m = P.bias;
          r.bias = static_cast<const float*>(m.data) + (m.sizes[0] == 1 ? 0 : b * m.strides[0]) +
                   (m.sizes[1] == 1 ? 0 : h * m.strides[1]) + i * m.strides[2];
          r.bias_cs = m.strides[3];
        }
      }
  }
};

FlashJobs flash_jobs(const FlashAttentionParams& p, const FlashGeo& g, int rows) {
  FlashJobs j;
  j.p = &p;
  j.g = g;
  row_tiling(g.Nq / g.Nkv, std::clamp(rows, 1, kMaxFlashRows), &j.heads_per_job, &j.q_per_job);
  j.head_chunks = (g.Nq / g.Nkv + j.heads_per_job - 1) / j.heads_per_job;
  j.cfg.bf16 = p.q.dtype == DType::kBF16;
  j.cfg.D = g.D;
  j.cfg.Dv = g.Dv;
  j.cfg.max_rows = kMaxFlashRows;  // whatever the kernel's prefill_rows: flash_workspace does not know it
  j.cfg.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(g.D));
  j.cfg.softcap = p.softcap;
  j.cfg.causal = p.causal;
  j.cfg.window_left = canonical_window(p.window_left);
  j.cfg.window_right = canonical_window(p.window_right);
  for (int64_t b = 0; b < g.B; ++b) j.cfg.kv_once = j.cfg.kv_once && j.head_chunks == 1 && j.q_tiles(b) <= 1;
  return j;
}

// ---- paged decode (standard and MLA) ---------------------------------------------------------
struct DecodeJobs {
  Config cfg;
  int64_t B = 0, Sq = 0, Nq = 0, Nkv = 0, G = 0, heads_per_job = 1, q_per_job = 1, head_chunks = 1, q_tiles = 1;
  int64_t splits = 1;
  // One job per (sequence, split) over every KV head (Job::groups), for kernels that take
  // such jobs: each job then reads whole cache rows in address order.
  bool all_heads = false;
  const TensorView* q = nullptr;
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_rs = 0, v_rs = 0, k_hs = 0, v_hs = 0;  // slot stride and per-kv-head offset
  const int32_t* tables = nullptr;
  int64_t table_stride = 0, block_size = 0;
  int64_t len_cap = 0;  // the longest sequence the block tables can hold (seq_lens are i32)
  const int32_t* seq_lens = nullptr;
  I8Kv i8;                // i8 caches: base planes, one KV head's widths (staging set per thread by run_jobs)
  float* part = nullptr;  // splits > 1: per row and split, Dv outputs then the lse
  size_t per_thread() const {
    const int64_t heads = all_heads_fit() ? Nkv : 1;  // an all_heads job stages whole rows
    return scratch_bytes(cfg) +
           (i8.k ? align_up(I8Kv::stage_bytes(heads * i8.k_dim + i8.rope_dim, i8.v ? heads * i8.v_dim : 0, cfg.bf16)) : 0);
  }
  int64_t rows_total() const { return B * Sq * Nq; }
  int64_t per_seq() const { return all_heads ? splits : Nkv * head_chunks * q_tiles * splits; }
  // Whether all_heads jobs fit a kernel that takes up to `rows` rows in one, `group_rows`
  // per KV head, f32 as well as bf16 if `f32` (Kernels::decode_rows / decode_group_rows /
  // decode_f32; by default the most any kernel takes, which sizes the workspace): head
  // dims the fast kernels take, every row of a sequence in one job, slices of adjacent
  // heads adjacent.
  bool all_heads_fit(int64_t rows = kMaxJobRows, int64_t group_rows = kMaxGroupRows, bool f32 = true) const {
    return (cfg.bf16 || f32) && Nkv > 1 && cfg.D % 32 == 0 && cfg.Dv % 32 == 0 && cfg.softcap == 0.0f && Nq * Sq <= rows &&
           G * Sq <= group_rows && k_hs == cfg.D && v_hs == cfg.Dv;
  }
  int64_t total() const { return B * per_seq(); }
  int64_t row_id(int64_t b, int64_t i, int64_t h) const { return (b * Sq + i) * Nq + h; }
  float* part_of(int64_t row, int64_t sp) const { return part + (row * splits + sp) * (cfg.Dv + 1); }

  void make(int64_t idx, Job& job) const {
    const int64_t b = idx / per_seq();
    idx %= per_seq();
    if (all_heads) {  // rows of KV head g are heads g*G .. g*G+G-1: runs by group
      set_keys(job, b, 0, idx);
      job.groups = int(Nkv);
      job.k_goff = k_hs, job.v_goff = v_hs;
      for (int64_t h = 0; h < Nq; ++h)
        for (int64_t i = 0; i < Sq; ++i) add_row(job, b, i, h, idx);
      return;
    }
    const int64_t per_head = head_chunks * q_tiles * splits;
    const int64_t kvh = idx / per_head;
    const Tile t = tile_of(idx % per_head, head_chunks, q_tiles, splits);
    set_keys(job, b, kvh, t.sp);
    const TileRows tr = tile_rows(kvh, t);
    for (int64_t i = tr.i0; i < tr.i1; ++i)
      for (int64_t h = tr.h0; h < tr.h1; ++h) add_row(job, b, i, h, t.sp);
  }

  // The query heads [h0, h1) and new-token positions [i0, i1) of tile t of KV head kvh.
  struct TileRows {
    int64_t h0, h1, i0, i1;
    int64_t count() const { return (h1 - h0) * (i1 - i0); }
  };
  TileRows tile_rows(int64_t kvh, const Tile& t) const {
    const int64_t h0 = kvh * G + t.hc * heads_per_job, i0 = t.qt * q_per_job;
    return {h0, std::min(kvh * G + G, h0 + heads_per_job), i0, std::min(Sq, i0 + q_per_job)};
  }

  // The job's KV view from KV head kvh on, and split sp's key range (whole KV blocks).
  void set_keys(Job& job, int64_t b, int64_t kvh, int64_t sp) const {
    const int64_t L = seq_lens[b];
    const size_t es = cfg.bf16 ? 2 : 4;
    job.kv = KvView{};
    job.kv.k = static_cast<const uint8_t*>(k) + size_t(kvh * k_hs) * es;
    job.kv.v = static_cast<const uint8_t*>(v) + size_t(kvh * v_hs) * es;
    job.kv.k_rs = k_rs;
    job.kv.v_rs = v_rs;
    job.kv.table = tables + b * table_stride;
    job.kv.block_size = block_size;
    if (i8.k) {  // the slices this job reads: one KV head's, or whole rows
      job.kv.i8 = i8;
      const int64_t heads = all_heads ? Nkv : 1;
      job.kv.i8.k = i8.k + kvh * k_hs, job.kv.i8.k_dim = heads * i8.k_dim;
      if (i8.v) job.kv.i8.v = i8.v + kvh * v_hs, job.kv.i8.v_dim = heads * i8.v_dim;
    }
    const int64_t nblk = (L + kKvBlock - 1) / kKvBlock;
    job.kv_begin = std::min(L, nblk * sp / splits * kKvBlock);
    job.kv_end = std::min(L, nblk * (sp + 1) / splits * kKvBlock);
    job.offset = L - Sq;
    job.nrows = 0;
  }

  // Where row (b, position i, head h) finishes: its out row and lse entry (or null); by
  // row id (row_id's order) for the merge.
  void final_row(int64_t b, int64_t i, int64_t h, void** o, float** l) const {
    const size_t es = cfg.bf16 ? 2 : 4;
    *o = static_cast<uint8_t*>(out->data) + size_t(b * out->strides[0] + i * out->strides[1] + h * out->strides[2]) * es;
    *l = lse->empty() ? nullptr : static_cast<float*>(lse->data) + b * lse->strides[0] + h * lse->strides[1] + i * lse->strides[2];
  }
  void final_row(int64_t row, void** o, float** l) const { final_row(row / (Nq * Sq), (row / Nq) % Sq, row % Nq, o, l); }

  // Query row (b, position i, head h): its q, and its output (or split sp's partial).
  void add_row(Job& job, int64_t b, int64_t i, int64_t h, int64_t sp) const {
    const size_t es = cfg.bf16 ? 2 : 4;
    Row& r = job.rows[job.nrows++];
    r = Row{};
    r.qpos = i;
    r.q = static_cast<const uint8_t*>(q->data) + size_t(b * q->strides[0] + i * q->strides[1] + h * q->strides[2]) * es;
    if (splits > 1) {
      float* pp = part_of(row_id(b, i, h), sp);
      r.part_out = pp;
      r.lse = pp + cfg.Dv;
    } else {
      final_row(b, i, h, &r.out, &r.lse);
    }
  }
};

Status decode_validate_common(const char* op, const TensorView& q, const TensorView& tables, const TensorView& lens,
                              int64_t block_size, int64_t num_slots, const TensorView& out, const TensorView& lse, int64_t Dv) {
  OPTX_RETURN_IF_ERROR(check_tensor(op, q, "q", 4));
  OPTX_RETURN_IF_ERROR(check_output(op, out, "out", 4));
  if (q.dtype != DType::kF32 && q.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": q.dtype=", dtype_name(q.dtype), " but must be f32 or bf16");
  const int64_t B = q.sizes[0], Sq = q.sizes[1], Nq = q.sizes[2];
  if (Sq < 1 || Sq > 8) return Error(StatusCode::kInvalidArgument, op, ": q.sizes[1]=", Sq, " new tokens must be in [1, 8]");
  if (Nq < 1) return Error(StatusCode::kInvalidArgument, op, ": q.sizes[2]=", Nq, " query heads; need at least one");
  if (out.sizes[0] != B || out.sizes[1] != Sq || out.sizes[2] != Nq || out.sizes[3] != Dv || out.dtype != q.dtype)
    return Error(StatusCode::kInvalidArgument, op, ": out must be ", dtype_name(q.dtype), " [B=", B, ", Sq=", Sq, ", Nq=", Nq,
                 ", Dv=", Dv, "]");
  if (!lse.empty()) {
    OPTX_RETURN_IF_ERROR(check_output(op, lse, "lse", 3));
    if (lse.dtype != DType::kF32 || lse.sizes[0] != B || lse.sizes[1] != Nq || lse.sizes[2] != Sq)
      return Error(StatusCode::kInvalidArgument, op, ": lse must be f32 [B=", B, ", Nq=", Nq, ", Sq=", Sq, "], got ",
                   dtype_name(lse.dtype), " [", lse.sizes[0], ", ", lse.sizes[1], ", ", lse.sizes[2], "]");
  }
  return check_block_tables(op, tables, lens, B, block_size, num_slots, Sq, "Sq");
}

// Splits the KV axis when there are fewer jobs than threads, so every core streams, but
// not below kMinSplitBlocks blocks per split: the merge moves every split's partial rows
// between cores (~15 us for 16 rows of 512, MLA), more than a core spends on 256 keys.
// Long contexts get up to kBalanceSplits splits per thread, each still kBalanceBlocks
// blocks or more: the two cores of this VM do not run at one speed (a busy hyperthread
// sibling — another guest — slowed one core's tdpbf16ps from 6.5 to 10-11 ns in a tile
// microbenchmark), and with one split per thread the call waits on the slower one, while
// smaller splits go to whichever thread is free (jobs are scheduled dynamically).
// Alternating in one process, B = 1, 8 splits against 2: MLA ctx 32k +8% to +14% (four
// runs), GQA ctx 32k +3% / +18%; at ctx 8k (2048 keys per split) MLA lost 6-9%.
constexpr int64_t kMinSplitBlocks = 4;
constexpr int64_t kBalanceSplits = 4, kBalanceBlocks = 4096 / kKvBlock;
// max_len: the longest sequence (the run), or the tables' capacity (the workspace query:
// the count never falls as max_len grows, so a workspace sized once for the tables
// serves every later decode step).
//
// Whole jobs that do not share out evenly leave threads idle at the end of the call: MLA
// at Sq = 3 (16 heads: a 32-row and a 16-row job) ran one job per thread and took as
// long as Sq = 4; three sequences' all-heads jobs on two threads likewise. So the count
// is also at least the smallest (up to kEvenSplits) whose pool schedule ends within
// kEvenSlack of an even share, as far as the blocks allow. That rule reads only shapes
// (rows per job, sequences taken as equally long), so the workspace query finds it too.
constexpr int64_t kEvenSplits = 8;
constexpr double kEvenSlack = 1.1;
constexpr int kEvenMaxThreads = 256;  // the schedule's per-thread state lives on the stack

// When the pool (dynamic, jobs taken in index order by whichever thread is free) ends,
// the jobs cut into `splits` equal parts, in rows x (one sequence's keys). free_at is a
// min-heap of the threads' finishing times: O(log T) per job.
double pool_makespan(const DecodeJobs& d, int64_t splits, double* free_at, int T) {
  std::fill(free_at, free_at + T, 0.0);
  const auto take = [&](double work) {
    std::pop_heap(free_at, free_at + T, std::greater<>());
    free_at[T - 1] += work;
    std::push_heap(free_at, free_at + T, std::greater<>());
  };
  const int64_t per_head = d.head_chunks * d.q_tiles * splits;
  for (int64_t b = 0; b < d.B; ++b) {
    if (d.all_heads) {
      for (int64_t sp = 0; sp < splits; ++sp) take(double(d.Nq * d.Sq) / double(splits));
      continue;
    }
    for (int64_t idx = 0; idx < d.Nkv * per_head; ++idx)
      take(double(d.tile_rows(0, tile_of(idx % per_head, d.head_chunks, d.q_tiles, splits)).count()) / double(splits));
  }
  return *std::max_element(free_at, free_at + T);
}

// Where the even rule applies: several threads, at most kEvenMaxThreads, and few jobs
// (with many, the tail is a small share).
bool even_rule_applies(int64_t jobs, int T) { return T >= 2 && T <= kEvenMaxThreads && jobs <= 8 * int64_t(T); }

int64_t even_splits(const DecodeJobs& d, int64_t jobs, int T) {
  if (!even_rule_applies(jobs, T)) return 1;
  double free_at[kEvenMaxThreads];
  const double even = double(d.rows_total()) / T;
  for (int64_t s = 1; s < kEvenSplits; ++s)
    if (pool_makespan(d, s, free_at, T) <= kEvenSlack * even) return s;
  return kEvenSplits;
}

// Splits per job for `jobs` jobs on T threads over keys of `blocks` KV blocks: enough for
// every thread when there are fewer jobs, by the rules above; never more as jobs grow
// (flash_workspace relies on it).
constexpr int64_t kFlashEvenSplits = 4;  // flash_run's most splits for jobs that do not share out evenly (even_split_cap)
int64_t kv_splits(int64_t jobs, int T, int64_t blocks) {
  if (jobs >= T || jobs < 1) return 1;
  const int64_t per_job = (T + jobs - 1) / jobs;
  return std::clamp<int64_t>(std::max(std::min(per_job, blocks / kMinSplitBlocks), std::min(per_job * kBalanceSplits, blocks / kBalanceBlocks)), 1, 64);
}

// The most splits flash_run tries for jobs that read their keys alone but do not share
// out evenly; flash_workspace reserves the same.
int64_t even_split_cap(const FlashJobs& j) { return std::min(kFlashEvenSplits, j.span_blocks() / kMinSplitBlocks); }

// The split count of a run at num_threads(); for the workspace query (`reserve`), the
// most that any thread count up to it picks. A workspace sized for more threads must
// serve fewer (attention.h), and the even rule is not monotone in the thread count (B = 1,
// Sq = 4, 32 / 8 heads: three threads split further than four, whose partials outgrew a
// thread's scratch). kv_splits grows with it, so the query takes the even rule's cap
// wherever that rule applies at some count up to num_threads() (its reach grows with the
// count up to kEvenMaxThreads).
int64_t decode_splits(const DecodeJobs& d, int64_t max_len, bool reserve = false) {
  const int64_t jobs = d.all_heads ? d.B : d.B * d.Nkv * d.head_chunks * d.q_tiles;
  const int T = num_threads();
  const int64_t blocks = (max_len + kKvBlock - 1) / kKvBlock;
  const int64_t even_rule = !reserve                                            ? even_splits(d, jobs, T)
                            : even_rule_applies(jobs, std::min(T, kEvenMaxThreads)) ? kEvenSplits
                                                                                     : 1;
  const int64_t even = std::min(even_rule, blocks / kMinSplitBlocks);
  return std::clamp<int64_t>(std::max(kv_splits(jobs, T, blocks), even), 1, 64);
}

int64_t longest(const DecodeJobs& d) {
  int64_t max_len = 0;
  for (int64_t b = 0; b < d.B; ++b) max_len = std::max<int64_t>(max_len, d.seq_lens[b]);
  return max_len;
}

// Sized for the larger split count of the two job shapes (the workspace query does not
// know which kernel will run) at the tables' capacity, not the current seq_lens.
size_t decode_workspace(const DecodeJobs& d) {
  size_t bytes = d.per_thread() * size_t(num_threads()) + kAlign;
  int64_t splits = d.B > 0 ? decode_splits(d, d.len_cap, true) : 1;
  if (d.B > 0 && d.all_heads_fit()) {
    DecodeJobs a = d;
    a.all_heads = true;
    splits = std::max(splits, decode_splits(a, d.len_cap, true));
  }
  if (splits > 1) bytes += align_up(size_t(d.rows_total() * splits * (d.cfg.Dv + 1)) * sizeof(float));
  return bytes;
}

// The attention_update rule for one row: out = sum_i w_i o_i / sum_i w_i, w_i =
// exp(lse_i - max lse), lse = max + log(sum w). Partials with w_i = 0 (empty, or far
// below the max) are skipped whole, so their outputs may hold anything. part(i) gives
// partial i's outputs (Dv floats) and lse. The f32 sums run over column chunks held on
// the stack (any Dv, no scratch to size or allocate); the weights' exps are recomputed
// per chunk, P per kChunk columns against P * kChunk multiply-adds.
template <class T, class Part>
void merge_row(int64_t P, int64_t Dv, Part part, T* out, float* lse) {
  float m = -INFINITY;
  for (int64_t i = 0; i < P; ++i) m = std::max(m, part(i).second);
  if (m == -INFINITY) {
    for (int64_t x = 0; x < Dv; ++x) out[x] = T(0);
    if (lse) *lse = -INFINITY;
    return;
  }
  auto weight = [&](int64_t i) { return float(std::exp(double(part(i).second) - m)); };
  double sum = 0;
  for (int64_t i = 0; i < P; ++i) sum += weight(i);
  const float inv = float(1.0 / sum);
  constexpr int64_t kChunk = 256;
  float acc[kChunk];
  for (int64_t x0 = 0; x0 < Dv; x0 += kChunk) {
    const int64_t n = std::min(kChunk, Dv - x0);
    std::fill(acc, acc + n, 0.0f);
    for (int64_t i = 0; i < P; ++i) {
      const float w = weight(i);
      if (w == 0.0f) continue;
      const float* o = part(i).first + x0;
      for (int64_t x = 0; x < n; ++x) acc[x] += w * o[x];
    }
    for (int64_t x = 0; x < n; ++x) {
      if constexpr (sizeof(T) == 2) out[x0 + x] = f32_to_bf16(acc[x] * inv);
      else out[x0 + x] = acc[x] * inv;
    }
  }
  if (lse) *lse = m + float(std::log(sum));
}

// Merges split partials row by row into each row's out and lse (J: FlashJobs or
// DecodeJobs, whose part_of and final_row share one row order).
template <class J>
void merge_splits(const J& j) {
  const int64_t Dv = j.cfg.Dv;
#pragma omp parallel for num_threads(num_threads()) schedule(static)
  for (int64_t row = 0; row < j.rows_total(); ++row) {
    void* o = nullptr;
    float* lse = nullptr;
    j.final_row(row, &o, &lse);
    const auto part = [&](int64_t sp) { return std::pair<const float*, float>(j.part_of(row, sp), j.part_of(row, sp)[Dv]); };
    if (j.cfg.bf16) merge_row(j.splits, Dv, part, static_cast<uint16_t*>(o), lse);
    else merge_row(j.splits, Dv, part, static_cast<float*>(o), lse);
  }
}

// need: decode_workspace(d), taken before the kernel's all-heads choice below.
Status run_decode(const Kernels& k, DecodeJobs& d, size_t need, Workspace ws, const char* op, const char* size_fn) {
  if (k.multi_group && d.B > 0 && d.all_heads_fit(k.decode_rows, k.decode_group_rows, k.decode_f32)) {
    d.all_heads = true;
    d.splits = decode_splits(d, longest(d));
  }
  if (d.all_heads && d.Nq * d.Sq > d.cfg.max_rows)  // the job scratch is laid out for max_rows rows
    return Error(StatusCode::kInternal, op, ": an all-heads job of ", d.Nq * d.Sq, " rows exceeds the ", d.cfg.max_rows,
                 " its scratch holds");
  OPTX_RETURN_IF_ERROR(check_workspace(op, size_fn, ws, need));
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
  const size_t per_thread = d.per_thread();
  d.part = d.splits > 1 ? reinterpret_cast<float*>(base + per_thread * size_t(num_threads())) : nullptr;
  Config c = d.cfg;
  c.partial = d.splits > 1;
  run_jobs(k, c, d.total(), base, per_thread, [&](int64_t idx, Job& job, JobCursor&) { d.make(idx, job); });
  if (d.splits > 1) merge_splits(d);
  return Status::Ok();
}

void decode_common(DecodeJobs& d, const TensorView& q, const TensorView& out, const TensorView& lse, const TensorView& tables,
                   const TensorView& lens, int64_t block_size) {
  d.B = q.sizes[0], d.Sq = q.sizes[1], d.Nq = q.sizes[2];
  d.G = d.Nq / std::max<int64_t>(d.Nkv, 1);
  d.cfg.bf16 = q.dtype == DType::kBF16;
  d.cfg.causal = true;  // among the new tokens; every earlier position is visible
  row_tiling(d.G, kMaxRows, &d.heads_per_job, &d.q_per_job);
  d.head_chunks = (d.G + d.heads_per_job - 1) / d.heads_per_job;
  d.q_tiles = (d.Sq + d.q_per_job - 1) / d.q_per_job;
  d.q = &q, d.out = &out, d.lse = &lse;
  d.tables = static_cast<const int32_t*>(tables.data);
  d.table_stride = tables.strides[0];
  d.block_size = block_size;
  const int64_t max_blocks = tables.sizes[1];
  d.len_cap = max_blocks > INT32_MAX / block_size ? INT32_MAX : max_blocks * block_size;
  d.seq_lens = static_cast<const int32_t*>(lens.data);
  d.splits = 1;
  if (d.B > 0) d.splits = decode_splits(d, longest(d));
  // An all-heads job past kMaxRows rows (speculative decoding: Sq > 1 over 32 heads) has
  // its scratch laid out for its rows; the workspace query sizes it whatever the kernel.
  if (d.all_heads_fit()) d.cfg.max_rows = int(std::max<int64_t>(kMaxRows, d.Nq * d.Sq));
}

DecodeJobs paged_jobs(const PagedDecodeParams& p) {
  DecodeJobs d;
  const int64_t D = p.q.sizes[3];
  d.Nkv = p.kv_heads;
  d.cfg.D = D;
  d.cfg.Dv = p.v_cache.sizes[1] / p.kv_heads;
  d.cfg.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(D));
  d.k = p.k_cache.data, d.v = p.v_cache.data;
  d.k_rs = p.k_cache.strides[0], d.v_rs = p.v_cache.strides[0];
  d.k_hs = D, d.v_hs = d.cfg.Dv;
  if (p.k_cache.dtype == DType::kI8) {
    d.i8.k = static_cast<const int8_t*>(p.k_cache.data), d.i8.v = static_cast<const int8_t*>(p.v_cache.data);
    d.i8.k_scales = static_cast<const float*>(p.k_scales.data), d.i8.v_scales = static_cast<const float*>(p.v_scales.data);
    d.i8.k_dim = D, d.i8.v_dim = d.cfg.Dv;
    d.i8.k_rs = p.k_cache.strides[0], d.i8.v_rs = p.v_cache.strides[0];
  }
  decode_common(d, p.q, p.out, p.lse, p.block_tables, p.seq_lens, p.block_size);
  return d;
}

Status paged_validate(const PagedDecodeParams& p) {
  constexpr const char* op = "paged_decode_attention";
  OPTX_RETURN_IF_ERROR(check_tensor(op, p.k_cache, "k_cache", 2));
  OPTX_RETURN_IF_ERROR(check_tensor(op, p.v_cache, "v_cache", 2));
  OPTX_RETURN_IF_ERROR(check_tensor(op, p.q, "q", 4));
  const int64_t Nq = p.q.sizes[2], D = p.q.sizes[3];
  if (Nq < 1) return Error(StatusCode::kInvalidArgument, op, ": q.sizes[2]=", Nq, " query heads; need at least one");
  if (p.kv_heads < 1 || Nq % p.kv_heads)
    return Error(StatusCode::kInvalidArgument, op, ": kv_heads=", p.kv_heads, " must be >= 1 and divide Nq=", Nq);
  // kv_heads * D is never formed: with no batch (B = 0) q has no elements, and Nq, and so
  // kv_heads, may reach 2^62.
  if (D < 1 || D > kMaxHeadDim) return Error(StatusCode::kInvalidArgument, op, ": head dim D=q.sizes[3]=", D, " must be in [1, ", kMaxHeadDim, "]");
  if (p.k_cache.sizes[1] % D != 0 || p.k_cache.sizes[1] / D != p.kv_heads)
    return Error(StatusCode::kInvalidArgument, op, ": k_cache.sizes[1]=", p.k_cache.sizes[1], " but must be kv_heads * D = ", p.kv_heads,
                 " * ", D);
  if (p.v_cache.sizes[1] % p.kv_heads || p.v_cache.sizes[0] != p.k_cache.sizes[0])
    return Error(StatusCode::kInvalidArgument, op, ": v_cache must be [num_slots=", p.k_cache.sizes[0], ", kv_heads * Dv]");
  const bool i8 = p.k_cache.dtype == DType::kI8 && p.v_cache.dtype == DType::kI8;
  if (!i8 && (p.k_cache.dtype != p.q.dtype || p.v_cache.dtype != p.q.dtype))
    return Error(StatusCode::kInvalidArgument, op, ": k_cache / v_cache dtype (", dtype_name(p.k_cache.dtype), " / ",
                 dtype_name(p.v_cache.dtype), ") must both be q.dtype=", dtype_name(p.q.dtype), " or both i8");
  for (const auto& [t, n] : {std::pair{&p.k_scales, "k_scales"}, std::pair{&p.v_scales, "v_scales"}}) {
    if (!i8) {
      if (!t->empty()) return Error(StatusCode::kInvalidArgument, op, ": ", n, " is for i8 caches, but the caches are ", dtype_name(p.k_cache.dtype));
      continue;
    }
    OPTX_RETURN_IF_ERROR(check_scales(op, *t, n, p.k_cache.sizes[0], "i8 caches"));
  }
  const int64_t Dv = p.v_cache.sizes[1] / p.kv_heads;
  if (Dv < 1 || Dv > kMaxHeadDim)  // D is bounded above
    return Error(StatusCode::kInvalidArgument, op, ": head dims D=", D, ", Dv=", Dv, " must be in [1, ", kMaxHeadDim, "]");
  if (!std::isfinite(p.scale)) return Error(StatusCode::kInvalidArgument, op, ": scale=", p.scale, " must be finite (0: 1/sqrt(D))");
  return decode_validate_common(op, p.q, p.block_tables, p.seq_lens, p.block_size, p.k_cache.sizes[0], p.out, p.lse, Dv);
}

// A decode job writes its rows (or split partials into the workspace) while others still
// read the caches and the tables that address them.
Status paged_apart(const PagedDecodeParams& p, const TensorView& workspace) {
  return check_apart("paged_decode_attention", {{"out", p.out}, {"lse", p.lse}, {"workspace", workspace}},
                     {{"q", p.q}, {"k_cache", p.k_cache}, {"v_cache", p.v_cache}, {"k_scales", p.k_scales}, {"v_scales", p.v_scales},
                      {"block_tables", p.block_tables}, {"seq_lens", p.seq_lens}});
}

DecodeJobs mla_jobs(const MlaDecodeParams& p) {
  DecodeJobs d;
  const int64_t W = p.q.sizes[3];
  d.Nkv = 1;
  d.cfg.D = W;
  d.cfg.Dv = p.kv_lora_rank;
  d.cfg.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(float(W));
  d.k = d.v = p.cache.data;  // V is the first kv_lora_rank values of the same row
  d.k_rs = d.v_rs = p.cache.strides[0];
  if (p.cache.dtype == DType::kI8) {
    d.i8.k = static_cast<const int8_t*>(p.cache.data);
    d.i8.k_scales = static_cast<const float*>(p.cache_scales.data);
    d.i8.rope = p.rope_cache.data;
    d.i8.k_dim = p.kv_lora_rank, d.i8.rope_dim = W - p.kv_lora_rank;
    d.i8.k_rs = p.cache.strides[0], d.i8.rope_rs = p.rope_cache.strides[0];
  }
  decode_common(d, p.q, p.out, p.lse, p.block_tables, p.seq_lens, p.block_size);
  return d;
}

Status mla_validate(const MlaDecodeParams& p) {
  constexpr const char* op = "mla_decode_attention";
  OPTX_RETURN_IF_ERROR(check_tensor(op, p.cache, "cache", 2));
  if (p.q.rank != 4) return Error(StatusCode::kInvalidArgument, op, ": q.rank=", p.q.rank, " but must be 4 ([B, Sq, Nq, rank + rope])");
  const int64_t W = p.q.sizes[3];
  if (p.kv_lora_rank < 1 || p.kv_lora_rank >= W)
    return Error(StatusCode::kInvalidArgument, op, ": kv_lora_rank=", p.kv_lora_rank, " must be in [1, q.sizes[3]=", W, ")");
  if (W > kMaxHeadDim) return Error(StatusCode::kInvalidArgument, op, ": q.sizes[3]=", W, " exceeds ", kMaxHeadDim);
  const int64_t slots = p.cache.sizes[0], rope = W - p.kv_lora_rank;
  if (p.cache.dtype == DType::kI8) {
    if (p.cache.sizes[1] != p.kv_lora_rank)
      return Error(StatusCode::kInvalidArgument, op, ": an i8 cache must be [num_slots, kv_lora_rank=", p.kv_lora_rank, "], got [",
                   slots, ", ", p.cache.sizes[1], "]");
    OPTX_RETURN_IF_ERROR(check_scales(op, p.cache_scales, "cache_scales", slots, "an i8 cache"));
    OPTX_RETURN_IF_ERROR(check_tensor(op, p.rope_cache, "rope_cache", 2));
    if (p.rope_cache.dtype != p.q.dtype || p.rope_cache.sizes[0] != slots || p.rope_cache.sizes[1] != rope)
      return Error(StatusCode::kInvalidArgument, op, ": rope_cache must be ", dtype_name(p.q.dtype), " [num_slots=", slots,
                   ", rope_dim=", rope, "] with an i8 cache, got ", dtype_name(p.rope_cache.dtype), " [", p.rope_cache.sizes[0],
                   ", ", p.rope_cache.sizes[1], "]");
  } else {
    if (p.cache.sizes[1] != W || p.cache.dtype != p.q.dtype)
      return Error(StatusCode::kInvalidArgument, op, ": cache must be ", dtype_name(p.q.dtype), " [num_slots, ", W, "] or i8 [num_slots, ",
                   p.kv_lora_rank, "], got [", slots, ", ", p.cache.sizes[1], "] ", dtype_name(p.cache.dtype));
    if (!p.cache_scales.empty() || !p.rope_cache.empty())
      return Error(StatusCode::kInvalidArgument, op, ": cache_scales / rope_cache are for an i8 cache, but cache is ",
                   dtype_name(p.cache.dtype));
  }
  if (!std::isfinite(p.scale)) return Error(StatusCode::kInvalidArgument, op, ": scale=", p.scale, " must be finite (0: 1/sqrt(D))");
  return decode_validate_common(op, p.q, p.block_tables, p.seq_lens, p.block_size, p.cache.sizes[0], p.out, p.lse, p.kv_lora_rank);
}

Status mla_apart(const MlaDecodeParams& p, const TensorView& workspace) {
  return check_apart("mla_decode_attention", {{"out", p.out}, {"lse", p.lse}, {"workspace", workspace}},
                     {{"q", p.q}, {"cache", p.cache}, {"cache_scales", p.cache_scales}, {"rope_cache", p.rope_cache},
                      {"block_tables", p.block_tables}, {"seq_lens", p.seq_lens}});
}

// ---- registries -----------------------------------------------------------------------------
void reference_job(const Config& c, const Job& j, float*) { run_job_reference(c, j); }
const Kernels& kernels_reference() {
  static const Kernels k{reference_job};
  return k;
}

// One kernel table per ISA serves every attention op; each op keeps its own registry so
// OPTX_IMPL can force one op's implementation. Flash prefill puts `avx512` (the GEMM
// prefill, bf16 widened to f32 for FMAs) before `avx512_bf16` (vdpbf16ps) where that
// instruction does half the FMA's FLOPs, as the GEMM family does: S = 4096, 16 heads,
// causal, two threads (Sapphire Rapids class without AMX, one run, alternating): see
// PERF_LOG.md (stop 39). Decode keeps `avx512_bf16` first: its few-row kernels are
// the unit's own.
dispatch::Registry<KernelsFn> make_registry(const char* op, bool widen_first = false) {
  const dispatch::Impl<KernelsFn> widen{"avx512", Isa::kAvx512, kernels_avx512};
  const dispatch::Impl<KernelsFn> dot{"avx512_bf16", Isa::kAvx512Bf16, kernels_avx512_bf16};
  return dispatch::Registry<KernelsFn>(op, {{"amx", Isa::kAmx, kernels_amx},
                                            widen_first ? widen : dot,
                                            widen_first ? dot : widen,
                                            {"avx2", Isa::kAvx2, kernels_avx2},
                                            {"scalar", Isa::kScalar, kernels_scalar},
                                            {"reference", Isa::kScalar, kernels_reference}});
}

std::string flash_selected() { return flash_registry().selected_name(); }
std::string paged_selected() { return paged_registry().selected_name(); }
std::string mla_selected() { return mla_registry().selected_name(); }
std::string update_selected() { return "generic"; }
[[maybe_unused]] const bool registered = [] {
  dispatch::register_op("flash_attention", flash_selected);
  dispatch::register_op("paged_decode_attention", paged_selected);
  dispatch::register_op("mla_decode_attention", mla_selected);
  dispatch::register_op("attention_update", update_selected);
  return true;
}();

}  // namespace

const dispatch::Registry<KernelsFn>& flash_registry() {
  static const auto r = make_registry("flash_attention", !cpu_features().fast_bf16_dot);
  return r;
}
const dispatch::Registry<KernelsFn>& paged_registry() {
  static const auto r = make_registry("paged_decode_attention");
  return r;
}
const dispatch::Registry<KernelsFn>& mla_registry() {
  static const auto r = make_registry("mla_decode_attention");
  return r;
}

Status flash_run(const Kernels& k, const FlashAttentionParams& p, Workspace ws) {
  FlashGeo g;
  OPTX_RETURN_IF_ERROR(flash_validate(p, &g));
  // A call of a few jobs (short sequences, few heads) leaves a thread idle, or one thread
  // two jobs where the other has one: of the kernel's job height and its halves down to 32
  // rows, the one with the least estimated time (est_time). One head (AMX VM, alternating):
  // S = 128 19 -> 11 us, S = 384 82 -> 67, causal S = 256 31 -> 25.
  // Fewer jobs than threads (a few query rows against long keys: MQA decode, a short chunk
  // over a contiguous cache) also split the KV axis, as decode does, and merge by lse.
  // Jobs that read their keys alone (Config::kv_once) but do not share out evenly (three
  // sequences on two threads) split too, up to kFlashEvenSplits, where the estimate gains
  // a tenth.
  FlashJobs jobs = flash_jobs(p, g, k.prefill_rows);
  if (const int threads = num_threads(); threads > 1 && threads <= FlashJobs::kEstThreads && jobs.total() < 4 * threads) {
    const auto plan = [&](int rows) {
      FlashJobs j = flash_jobs(p, g, rows);
      j.splits = kv_splits(j.total(), threads, j.span_blocks());
      return j;
    };
    jobs = plan(k.prefill_rows);
    double best = jobs.est_time(threads);
    for (int rows = k.prefill_rows / 2; rows >= 32; rows /= 2) {
      FlashJobs smaller = plan(rows);
      if (const double t = smaller.est_time(threads); t < best) best = t, jobs = smaller;
    }
    if (jobs.splits == 1 && jobs.cfg.kv_once) {
      const FlashJobs whole = jobs;
      for (int64_t s = 2, cap = even_split_cap(whole); s <= cap; ++s) {
        FlashJobs split = whole;
        split.splits = s;
        if (const double t = split.est_time(threads); t < 0.9 * best) best = t, jobs = split;
      }
    }
  }
  const size_t per_thread = scratch_bytes(jobs.cfg);
  const size_t need = per_thread * size_t(num_threads()) + kAlign + jobs.part_bytes();
  OPTX_RETURN_IF_ERROR(flash_apart(p, workspace_view(ws, need)));
  OPTX_RETURN_IF_ERROR(check_workspace("flash_attention", "flash_attention_workspace_size", ws, need));
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
  Config c = jobs.cfg;
  c.partial = jobs.splits > 1;
  jobs.part = c.partial ? reinterpret_cast<float*>(base + per_thread * size_t(num_threads())) : nullptr;
  run_jobs(k, c, jobs.total(), base, per_thread, [&](int64_t idx, Job& job, JobCursor& cur) { jobs.make(idx, job, cur); });
  if (c.partial) merge_splits(jobs);
  return Status::Ok();
}

Status paged_run(const Kernels& k, const PagedDecodeParams& p, Workspace ws) {
  OPTX_RETURN_IF_ERROR(paged_validate(p));
  DecodeJobs d = paged_jobs(p);
  const size_t need = decode_workspace(d);
  OPTX_RETURN_IF_ERROR(paged_apart(p, workspace_view(ws, need)));
  return run_decode(k, d, need, ws, "paged_decode_attention", "paged_decode_attention_workspace_size");
}

Status mla_run(const Kernels& k, const MlaDecodeParams& p, Workspace ws) {
  OPTX_RETURN_IF_ERROR(mla_validate(p));
  DecodeJobs d = mla_jobs(p);
  const size_t need = decode_workspace(d);
  OPTX_RETURN_IF_ERROR(mla_apart(p, workspace_view(ws, need)));
  return run_decode(k, d, need, ws, "mla_decode_attention", "mla_decode_attention_workspace_size");
}

bool masks_hide(const Job& j, int64_t kb, int64_t n) {
  // Unit-stride rows are compared with zeros by memcmp, which the C library runs in wide
  // vectors: a hidden 128-key block of 96 rows is 12 KiB to scan, and a loop over 8-byte
  // words left the causal-mask bench row at 1.26-1.32x the flag's time, against 1.20x.
  static const int8_t kZeros[256] = {};
  for (int r = 0; r < j.nrows; ++r) {
    const Row& row = j.rows[r];
    if (!row.mask) return false;
    const int8_t* m = row.mask + kb * row.mask_cs;
    if (row.mask_cs == 1) {
      for (int64_t k = 0; k < n; k += 256)
        if (std::memcmp(m + k, kZeros, size_t(std::min<int64_t>(256, n - k)))) return false;
      continue;
    }
    for (int64_t k = 0; k < n; ++k)
      if (m[k * row.mask_cs]) return false;
  }
  return true;
}

Status flash_check(const FlashAttentionParams& p) {
  FlashGeo g;
  return flash_validate(p, &g);
}
Status paged_check(const PagedDecodeParams& p) { return paged_validate(p); }
Status mla_check(const MlaDecodeParams& p) { return mla_validate(p); }

// The partials are sized for the most splits any kernel's plan can take: jobs of the
// tallest height are the fewest, kv_splits never grows with the job count, and a plan
// whose jobs read their keys alone (kv_once) and are fewer than 4 per thread has them at
// that height too. Past kEstThreads threads the run does not split, but a workspace sized
// there must serve a run at fewer: the partials are sized for kEstThreads (kv_splits
// never shrinks as the threads grow).
size_t flash_workspace(const FlashAttentionParams& p) {
  FlashGeo g;
  if (!flash_validate(p, &g).ok()) return 0;
  FlashJobs most = flash_jobs(p, g, kMaxFlashRows);
  const int T = num_threads();
  if (T > 1) {
    const int Ts = std::min(T, FlashJobs::kEstThreads);
    const int64_t jobs = most.total(), blocks = most.span_blocks();
    most.splits = kv_splits(jobs, Ts, blocks);
    if (jobs < 4 * int64_t(Ts) && most.cfg.kv_once) most.splits = std::max(most.splits, even_split_cap(most));
  }
  return scratch_bytes(g.D, g.Dv, kMaxFlashRows) * size_t(T) + kAlign + most.part_bytes();
}
size_t paged_workspace(const PagedDecodeParams& p) { return paged_validate(p).ok() ? decode_workspace(paged_jobs(p)) : 0; }
size_t mla_workspace(const MlaDecodeParams& p) { return mla_validate(p).ok() ? decode_workspace(mla_jobs(p)) : 0; }

}  // namespace attn_detail

size_t flash_attention_workspace_size(const FlashAttentionParams& p) { return attn_detail::flash_workspace(p); }
size_t paged_decode_attention_workspace_size(const PagedDecodeParams& p) { return attn_detail::paged_workspace(p); }
size_t mla_decode_attention_workspace_size(const MlaDecodeParams& p) { return attn_detail::mla_workspace(p); }

namespace {
const attn_detail::Kernels* pick(const dispatch::Registry<attn_detail::KernelsFn>& reg, Status* st) {
  const dispatch::Impl<attn_detail::KernelsFn>* impl = nullptr;
  *st = reg.select_to_run(&impl);
  if (!st->ok()) return nullptr;
  return &impl->fn();
}
}  // namespace

Status flash_attention(const FlashAttentionParams& p, Workspace ws) {
  Status st;
  const auto* k = pick(attn_detail::flash_registry(), &st);
  return k ? attn_detail::flash_run(*k, p, ws) : st;
}
Status paged_decode_attention(const PagedDecodeParams& p, Workspace ws) {
  Status st;
  const auto* k = pick(attn_detail::paged_registry(), &st);
  return k ? attn_detail::paged_run(*k, p, ws) : st;
}
Status mla_decode_attention(const MlaDecodeParams& p, Workspace ws) {
  Status st;
  const auto* k = pick(attn_detail::mla_registry(), &st);
  return k ? attn_detail::mla_run(*k, p, ws) : st;
}

Status attention_update(const AttentionUpdateParams& p, Workspace) {
  constexpr const char* op = "attention_update";
  const TensorView &outs = p.outs, &lses = p.lses;
  for (const auto& [t, n] : {std::pair{&outs, "outs"}, std::pair{&lses, "lses"}, std::pair{&p.out, "out"}, std::pair{&p.lse, "lse"}})
    OPTX_RETURN_IF_ERROR(check_view(op, n, *t));
  if (outs.rank != 3 || outs.dtype != DType::kF32 || !outs.is_contiguous() || (outs.numel() > 0 && !outs.data))
    return Error(StatusCode::kInvalidArgument, op, ": outs must be contiguous f32 [P, R, Dv], got ", dtype_name(outs.dtype), " rank ",
                 outs.rank, outs.is_contiguous() ? "" : " (not contiguous)");
  const int64_t P = outs.sizes[0], R = outs.sizes[1], Dv = outs.sizes[2];
  if (P < 1) return Error(StatusCode::kInvalidArgument, op, ": outs.sizes[0]=", P, " partials; need at least 1");
  if (lses.rank != 2 || lses.dtype != DType::kF32 || lses.sizes[0] != P || lses.sizes[1] != R || !lses.is_contiguous() ||
      (lses.numel() > 0 && !lses.data))
    return Error(StatusCode::kInvalidArgument, op, ": lses must be contiguous f32 [P=", P, ", R=", R, "]");
  if (p.out.rank != 2 || p.out.sizes[0] != R || p.out.sizes[1] != Dv || (p.out.dtype != DType::kF32 && p.out.dtype != DType::kBF16) ||
      (Dv > 1 && p.out.strides[1] != 1) || (R > 0 && Dv > 0 && !p.out.data))
    return Error(StatusCode::kInvalidArgument, op, ": out must be f32 | bf16 [R=", R, ", Dv=", Dv, "] with unit column stride, got ",
                 dtype_name(p.out.dtype), " rank ", p.out.rank, " sizes [", p.out.sizes[0], ", ", p.out.sizes[1], "] strides [",
                 p.out.strides[0], ", ", p.out.strides[1], "]");
  OPTX_RETURN_IF_ERROR(check_disjoint(op, "out", p.out));
  if (!p.lse.empty() && (p.lse.rank != 1 || p.lse.sizes[0] != R || p.lse.dtype != DType::kF32 || !p.lse.data))
    return Error(StatusCode::kInvalidArgument, op, ": lse must be f32 [R=", R, "], got ", dtype_name(p.lse.dtype), " rank ",
                 p.lse.rank, " sizes[0]=", p.lse.sizes[0]);
  if (!p.lse.empty()) OPTX_RETURN_IF_ERROR(check_disjoint(op, "lse", p.lse));
  // A merged row written over partials not yet read would merge what it wrote.
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"out", p.out}, {"lse", p.lse}}, {{"outs", outs}, {"lses", lses}}));
  const float* o = static_cast<const float*>(outs.data);
  const float* l = static_cast<const float*>(lses.data);
  const bool bf = p.out.dtype == DType::kBF16;
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (R > 64)
  for (int64_t r = 0; r < R; ++r) {
    auto part = [&](int64_t i) { return std::pair<const float*, float>(o + (i * R + r) * Dv, l[i * R + r]); };
    float* lse = p.lse.empty() ? nullptr : static_cast<float*>(p.lse.data) + r * p.lse.strides[0];
    if (bf) attn_detail::merge_row(P, Dv, part, static_cast<uint16_t*>(p.out.data) + r * p.out.strides[0], lse);
    else attn_detail::merge_row(P, Dv, part, static_cast<float*>(p.out.data) + r * p.out.strides[0], lse);
  }
  return Status::Ok();
}

}  // namespace optx
