// Grouped GEMMs: optx::gemm on each group's row slice with its packed expert matrix,
// scheduled either split (few groups: each GEMM across all threads) or from one shared
// queue of work items (many groups), optionally over several weight sets at once.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <array>
#include <cmath>
#include <span>

#include "core/validate.h"
#include "numerics/quant_i8.h"
#include "ops/moe/moe_internal.h"

namespace optx {
namespace moe_detail {
namespace {

// Below this many non-empty groups per thread, LPT over whole groups leaves threads idle
// at the tail; splitting each GEMM across the threads is the better schedule.
constexpr int kQueueItemsPerThread = 2;
// Row tiles of a hot group stay this tall: full AMX blocks, and weights re-streamed per
// tile stay cheap next to the tile's FLOPs.
constexpr int64_t kMinTileRows = 128;
// Cost model for ordering and cutting items: a row costs N * K multiply-adds, and
// streaming the N x K weights once costs about what this many rows do (a memory-bound
// decode item is not free: 2 bytes per weight at ~15 GB/s per core against AMX rates).
constexpr double kStreamRows = 16;
// Items of fewer rows than kStreamRows (weight streams: decode) are cut by output
// columns into pieces of about total / (kColumnPieces * threads): whole experts left one
// core idle for part of the last one, the cores not running at one speed (moe_forward
// T = 1: busy 87% / 94% -> 96% / 100%, uniform -4 to -8% time, Zipf level; 8 per thread
// lost 1-4% on Zipf, the pieces' GEMM calls and shorter streams costing more).
constexpr int kColumnPieces = 4;
// Parts of up to this many rows whose queue items would be cut by columns run SwiGLU
// unfused (f32 [gate | up] rows, then a pass): a fused item needs each gate panel's up
// panel I / 64 panels on. Unfused without a cut, T = 2 / 4 ran 2-3% slower.
constexpr int64_t kColumnCutRows = 32;

// x [M, K] against E weight matrices [n_cols, K] and the group offsets' view; need_data =
// false for the sizing calls, which see views before their buffers exist and may leave
// group_offsets empty (its values only matter to the run).
Status check_shapes(const char* op, const TensorView& x, const PackedWeights* w, const TensorView& offs, int64_t n_cols,
                    bool need_data) {
  OPTX_RETURN_IF_ERROR(check_2d(op, x, "x", -1, -1, true, need_data));
  const int64_t E = w->count();
  for (int64_t g = 0; g < E; ++g) {
    if ((*w)[g].k != x.sizes[1])
      return Error(StatusCode::kInvalidArgument, op, ": weights[", g, "] has K=", (*w)[g].k, " but x.sizes[1]=", x.sizes[1]);
    if ((*w)[g].n != n_cols)
      return Error(StatusCode::kInvalidArgument, op, ": weights[", g, "] has N=", (*w)[g].n, " but expected ", n_cols);
  }
  OPTX_RETURN_IF_ERROR(moe_detail::check_weights_dtype(op, "weights", x.dtype, *w));
  if (need_data || !offs.empty()) OPTX_RETURN_IF_ERROR(check_1d(op, offs, "group_offsets", E, DType::kI64, need_data));
  return Status::Ok();
}

// Group g's rows end at offs[g] (ascending, <= M), or with counts after offs[g] more rows
// (>= 0, compared against the rows left so the running sum cannot overflow).
Status check_offsets(const char* op, const int64_t* o, int64_t E, bool counts, int64_t M) {
  int64_t prev = 0;
  for (int64_t g = 0; g < E; ++g) {
    if (counts && (o[g] < 0 || o[g] > M - prev))
      return Error(StatusCode::kInvalidArgument, op, ": group_offsets[", g, "]=", o[g], " (a count) is negative or runs past x's ", M,
                   " rows (", prev, " taken before it)");
    if (!counts && (o[g] < prev || o[g] > M))
      return Error(StatusCode::kInvalidArgument, op, ": group_offsets[", g, "]=", o[g], " (an end offset) is below the previous ", prev,
                   " or past x's ", M, " rows");
    prev = counts ? prev + o[g] : o[g];
  }
  return Status::Ok();
}

// One grouped GEMM of a schedule: x's rows sorted by group, group g's rows times w[g]
// into the same rows of out, with a fused activation.
struct Job {
  TensorView x;
  const PackedWeights* w = nullptr;
  const int64_t* offs = nullptr;
  bool counts = false;
  TensorView out;
  GemmActivation act = GemmActivation::kNone;
};

GemmParams item_gemm(const Job& j, int64_t g, int64_t begin, int64_t end) {
  const int64_t K = j.x.sizes[1], N = j.out.sizes[1];
  // Sizing calls pass views without data (gemm_workspace_size needs shapes only).
  const auto row = [](const TensorView& v, int64_t r, int64_t n) -> void* {
    return v.data ? static_cast<uint8_t*>(v.data) + size_t(r * n) * dtype_size(v.dtype) : nullptr;
  };
  return {.a = make_view(row(j.x, begin, K), j.x.dtype, {end - begin, K}),
          .packed_b = &(*j.w)[g],
          .c = make_view(row(j.out, begin, N), j.out.dtype, {end - begin, N}),
          .activation = j.act};
}

// The item GEMM over output panels [p0, p1) only (no activation): B as a view of those
// panels of the packed matrix (and their i8 scales), C as those columns of out.
GemmParams column_gemm(const Job& j, int64_t g, int64_t begin, int64_t end, int64_t p0, int64_t p1, PackedMatrix* sub) {
  GemmParams q = item_gemm(j, g, begin, end);
  const PackedMatrix& m = (*j.w)[g];
  const int64_t c0 = p0 * PackedMatrix::kPanel, N = j.out.sizes[1];
  *sub = m;
  sub->data = m.panel(p0);
  sub->n = std::min(m.n, p1 * PackedMatrix::kPanel) - c0;
  if (m.scales) sub->scales = m.scales + c0;
  q.packed_b = sub;
  q.c = make_view(static_cast<uint8_t*>(q.c.data) + size_t(c0) * dtype_size(q.c.dtype), q.c.dtype, {end - begin, sub->n}, {N, 1});
  return q;
}

// The weight sets one call schedules together (moe_forward's routed and shared experts),
// as jobs or SwiGLU parts: a fixed array, no heap allocation inside a call (DESIGN.md).
constexpr size_t kMaxParts = 2;
template <class T>
struct Parts {
  std::array<T, kMaxParts> v;
  size_t n = 0;
  void push(const T& x) { v[n++] = x; }
  operator std::span<const T>() const { return {v.data(), n}; }
};
using Jobs = Parts<Job>;

// A queue item: rows [begin, end) of group g of jobs[job], output panels [p0, p1) of it
// (p1 = 0: all); seq orders equal costs. columns: a group cut into column pieces (their
// `after` runs once the queue is done).
struct Item {
  size_t job;
  int64_t g, begin, end;
  double cost;
  size_t seq;
  int64_t p0 = 0, p1 = 0;
  bool columns = false;
};

// The schedule's lists live in the workspace: the non-empty groups (at most sum E), and
// their row tiles and column pieces: at most one per group, plus total cost / fair share
// = 4 per thread for row tiles and kColumnPieces per thread for column pieces (ceil(x) <=
// x + 1; an item is cut one way or not at all); run_jobs also clips to this count, so
// rounding cannot overrun it.
size_t group_count(std::span<const Job> jobs) {
  size_t n = 0;
  for (const Job& j : jobs) n += size_t(j.w->count());
  return n;
}
size_t tile_cap(std::span<const Job> jobs, int nt) { return group_count(jobs) + (4 + kColumnPieces) * size_t(nt) + 1; }
size_t schedule_bytes(std::span<const Job> jobs, int nt) {
  return kAlign + align_up((group_count(jobs) + tile_cap(jobs, nt)) * sizeof(Item) + size_t(nt) * sizeof(double));
}

// f(job, g, begin, end, cost) for every non-empty group of the jobs, in order.
template <class F>
void for_each_group(std::span<const Job> jobs, F&& f) {
  for (size_t ji = 0; ji < jobs.size(); ++ji) {
    const Job& j = jobs[ji];
    for (int64_t g = 0, begin = 0; g < j.w->count(); ++g) {
      const int64_t end = j.counts ? begin + j.offs[g] : j.offs[g];
      if (end > begin)  // empty groups: no item
        f(ji, g, begin, end, double((*j.w)[g].n) * double((*j.w)[g].k) * (double(end - begin) + kStreamRows));
      begin = end;
    }
  }
}

bool queued(size_t items, int nt) { return nt > 1 && items >= size_t(kQueueItemsPerThread) * size_t(nt); }

// Column pieces of a queue item (rows of group g of j, cost as run_jobs counts it) for an
// activation-free GEMM (`plain`), 0 where the item is not cut by columns.
int64_t column_pieces(const Job& j, int64_t g, int64_t rows, double cost, double col_fair, bool plain) {
  const int64_t panels = (*j.w)[g].n_panels();
  if (!plain || double(rows) >= kStreamRows || panels < 2) return 0;
  return std::clamp<int64_t>(int64_t(std::ceil(cost / col_fair)), 1, panels);
}
double column_fair(double total_cost, int nt) { return std::max(total_cost / (double(kColumnPieces) * nt), 1.0); }

// gemm sizes its buffers for its row-chunk cap, so its workspace grows monotonically with
// M and all of x's rows bound every item. split: one GEMM on all threads; queue: one
// serial GEMM workspace per thread, each aligned.
size_t split_ws(std::span<const Job> jobs) {
  size_t s = 0;
  for (const Job& j : jobs)
    if (j.x.sizes[0] > 0) s = std::max(s, gemm_workspace_size(item_gemm(j, 0, 0, j.x.sizes[0])));
  return s;
}
size_t queue_slice(std::span<const Job> jobs) {
  ThreadScope serial(1);
  return align_up(split_ws(jobs) + kAlign);
}
size_t jobs_ws(std::span<const Job> jobs) {
  const int nt = num_threads();
  return schedule_bytes(jobs, nt) + std::max(split_ws(jobs), size_t(nt) * queue_slice(jobs));
}

// Runs the jobs' GEMMs, then after(job, begin, end) on the same thread for each finished
// item (an epilogue over whole rows, e.g. per-token quantisation, while they are in cache).
// ws: at least jobs_ws(jobs) bytes, which the callers check.
//
// Few non-empty groups (decode): each GEMM in turn, split across all threads by the GEMM
// itself (each thread streams its own run of weight columns). Many: a shared queue,
// costliest item first (LPT), each GEMM serial on the thread that took it — no fork/join
// or A re-pack per group, and a thread never waits while items remain. A hot group would
// set the tail on its own, so groups above a fair share of the cost are cut into row
// tiles (each re-streams its weights, cheap next to its FLOPs at >= kMinTileRows rows),
// and weight-streaming items without a fused activation into column pieces (their
// `after` then runs over the group's rows once the queue is done).
template <class After>
Status run_jobs(std::span<const Job> jobs, ScheduleStats* stats, Workspace ws, After&& after) {
  const int nt = num_threads();
  // [items: one per non-empty group][tiles][busy seconds per thread], then the GEMMs'.
  const size_t sched = schedule_bytes(jobs, nt);
  Item* const groups = reinterpret_cast<Item*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
  Item* const tiles = groups + group_count(jobs);
  const size_t cap = tile_cap(jobs, nt);
  double* const busy = reinterpret_cast<double*>(tiles + cap);
  ws = {static_cast<uint8_t*>(ws.data) + sched, ws.bytes - sched};
  size_t n_groups = 0;
  double total_cost = 0;
  for_each_group(jobs, [&](size_t ji, int64_t g, int64_t begin, int64_t end, double cost) {
    groups[n_groups] = {ji, g, begin, end, cost, n_groups};
    ++n_groups;
    total_cost += cost;
  });
  std::span<Item> items(groups, n_groups);
  const bool queue = queued(items.size(), nt);
  if (queue) {
    const double fair = std::max(total_cost / (4.0 * nt), 1.0);  // >= 1: weights with N or K = 0 cost nothing
    const double col_fair = column_fair(total_cost, nt);
    size_t used = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      const int64_t n = it.end - it.begin;
      const int64_t room = int64_t(cap - used - (items.size() - 1 - i));  // >= 1: one kept for each item left
      const Job& j = jobs[it.job];
      if (const int64_t cols = column_pieces(j, it.g, n, it.cost, col_fair, j.act == GemmActivation::kNone); cols > 0) {
        const int64_t panels = (*j.w)[it.g].n_panels(), pieces = std::min(cols, room);
        groups[i].columns = true;
        for (int64_t q = 0; q < pieces; ++q, ++used) {
          const int64_t p0 = panels * q / pieces, p1 = panels * (q + 1) / pieces;
          tiles[used] = {it.job, it.g, it.begin, it.end, it.cost * double(p1 - p0) / double(panels), used, p0, p1};
        }
        continue;
      }
      const int64_t pieces = std::clamp<int64_t>(std::min<int64_t>(int64_t(std::ceil(it.cost / fair)), n / kMinTileRows), 1, room);
      for (int64_t q = 0; q < pieces; ++q, ++used) {
        const int64_t b = it.begin + n * q / pieces, e = it.begin + n * (q + 1) / pieces;
        tiles[used] = {it.job, it.g, b, e, it.cost * double(e - b + kStreamRows) / double(n + kStreamRows), used};
      }
    }
    items = {tiles, used};
    // Costliest first, equal costs in cut order (std::stable_sort would take a heap buffer).
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost != b.cost ? a.cost > b.cost : a.seq < b.seq; });
  }
  auto run = [&](const Item& it, Workspace wsi) {
    if (it.p1 > 0) {
      PackedMatrix sub;
      return gemm(column_gemm(jobs[it.job], it.g, it.begin, it.end, it.p0, it.p1, &sub), wsi);
    }
    OPTX_RETURN_IF_ERROR(gemm(item_gemm(jobs[it.job], it.g, it.begin, it.end), wsi));
    after(it.job, it.begin, it.end);
    return Status::Ok();
  };
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::fill(busy, busy + nt, 0.0);  // per thread, reported when asked for
  auto account = [&] {
    if (!stats) return;
    stats->wall_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (stats->busy_s.size() < size_t(nt)) stats->busy_s.resize(size_t(nt), 0.0);
    for (int t = 0; t < nt; ++t) stats->busy_s[size_t(t)] += busy[size_t(t)];
  };
  if (!queue) {
    for (const Item& it : items) OPTX_RETURN_IF_ERROR(run(it, ws));
    std::fill(busy, busy + nt, std::chrono::duration<double>(Clock::now() - t0).count());
    account();
    return Status::Ok();
  }
  const size_t slice = queue_slice(jobs);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Status first_error = Status::Ok();
#pragma omp parallel num_threads(nt)
  {
    ThreadScope serial(1);
    const int t = omp_get_thread_num();
    Workspace mine{static_cast<uint8_t*>(ws.data) + size_t(t) * slice, slice};
    const auto start = Clock::now();
    for (size_t i = next++; i < items.size() && !failed.load(std::memory_order_relaxed); i = next++) {
      Status st = run(items[i], mine);
      if (!st.ok() && !failed.exchange(true)) first_error = std::move(st);
    }
    if (stats) busy[size_t(t)] = std::chrono::duration<double>(Clock::now() - start).count();
  }
  account();
  if (first_error.ok())
    for (const Item& g : std::span<const Item>(groups, n_groups))
      if (g.columns) after(g.job, g.begin, g.end);
  return first_error;
}

// Row loops inside an item's epilogue: parallel when called outside the queue (split
// schedule), serial on the item's thread inside it.
template <class F>
void for_rows(int64_t begin, int64_t end, F&& f) {
  const int nt = omp_in_parallel() ? 1 : num_threads();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && end - begin > 16)
  for (int64_t r = begin; r < end; ++r) f(r);
}

Job plain_job(const GroupedMatmulParams& p) {
  return {.x = p.x, .w = p.weights, .offs = static_cast<const int64_t*>(p.group_offsets.data),
          .counts = p.offsets_are_counts, .out = p.out};
}

// grouped_matmul_swiglu per part: SwiGLU runs in the GEMM's registers when the up half
// starts on a panel boundary (I % 64 == 0, every DeepSeek width); otherwise the
// [gate | up] rows go through an f32 buffer and each item applies SwiGLU to its rows
// right after its GEMM. i8 output also goes through the buffer (I columns), quantised
// per row by the item.
struct SwigluPart {
  Job job;
  int64_t I = 0;
  bool fused = true;
  int64_t buf_cols = 0;  // 0, I or 2I
  size_t buf_bytes = 0;  // the f32 buffer is job.out when buf_cols > 0
  TensorView out, out_scales;
};

// fuse = false: unfused even where the widths allow the epilogue (a decode part whose
// items the queue cuts by columns).
SwigluPart swiglu_part(const GroupedMatmulSwigluParams& p, bool fuse = true) {
  SwigluPart s;
  const int64_t M = p.x.sizes[0], N2 = (*p.weights)[0].n;
  s.I = N2 / 2;
  s.fused = fuse && s.I % PackedMatrix::kPanel == 0;
  s.buf_cols = !s.fused ? N2 : p.out.dtype == DType::kI8 ? s.I : 0;
  s.buf_bytes = align_up(size_t(M * s.buf_cols) * sizeof(float));
  // The unfused buffer for up to kColumnCutRows rows (unfuse), reserved past them too: the
  // size never shrinks as M grows (a workspace sized for the longest call serves the
  // decode steps).
  if (s.fused) s.buf_bytes = std::max(s.buf_bytes, align_up(size_t(std::min(M, kColumnCutRows) * N2) * sizeof(float)));
  s.out = p.out;
  s.out_scales = p.out_scales;
  s.job = {.x = p.x, .w = p.weights, .offs = static_cast<const int64_t*>(p.group_offsets.data),
           .out = s.buf_cols ? make_view(nullptr, DType::kF32, {M, s.buf_cols}) : make_view(p.out.data, p.out.dtype, {M, s.I}),
           .act = s.fused ? GemmActivation::kSwiglu : GemmActivation::kNone};
  return s;
}

// After an item's GEMM, per row: SwiGLU of [gate | up] (unfused widths), written straight
// to out, or in place over gate when it is then quantised; i8 out quantises the row.
void swiglu_rows(const SwigluPart& s, int64_t begin, int64_t end) {
  if (!s.buf_cols) return;
  const int64_t I = s.I;
  float* buf = static_cast<float*>(s.job.out.data);
  auto silu_mul = [](float g, float u) { return g / (1.0f + std::exp(-g)) * u; };
  switch (s.out.dtype) {
    case DType::kBF16:
      return for_rows(begin, end, [&](int64_t r) {
        const float* g = buf + r * s.buf_cols;
        uint16_t* o = static_cast<uint16_t*>(s.out.data) + r * I;
        for (int64_t i = 0; i < I; ++i) o[i] = f32_to_bf16(silu_mul(g[i], g[I + i]));
      });
    case DType::kF32:
      return for_rows(begin, end, [&](int64_t r) {
        const float* g = buf + r * s.buf_cols;
        float* o = static_cast<float*>(s.out.data) + r * I;
        for (int64_t i = 0; i < I; ++i) o[i] = silu_mul(g[i], g[I + i]);
      });
    default:  // i8
      return for_rows(begin, end, [&](int64_t r) {
        float* g = buf + r * s.buf_cols;
        if (!s.fused)
          for (int64_t i = 0; i < I; ++i) g[i] = silu_mul(g[i], g[I + i]);
        numerics::quantize_row_i8(g, I, static_cast<int8_t*>(s.out.data) + r * I, static_cast<float*>(s.out_scales.data) + r);
      });
  }
}

Status check_parts(const char* op, size_t n) {
  if (n > kMaxParts) return Error(StatusCode::kInvalidArgument, op, ": ", n, " weight sets in one call; at most ", kMaxParts);
  return Status::Ok();
}

// Everything of a part but its offsets' values and the workspace (need_data: see
// check_shapes).
Status check_plain(const char* op, const GroupedMatmulParams& p, bool need_data) {
  if (!p.weights || p.weights->count() < 1) return Error(StatusCode::kInvalidArgument, op, ": weights is null or empty");
  const int64_t N = (*p.weights)[0].n;
  OPTX_RETURN_IF_ERROR(check_shapes(op, p.x, p.weights, p.group_offsets, N, need_data));
  return check_2d(op, p.out, "out", p.x.sizes[0], N, true, need_data);
}

Status check_swiglu(const char* op, const GroupedMatmulSwigluParams& p, bool need_data) {
  if (!p.weights || p.weights->count() < 1) return Error(StatusCode::kInvalidArgument, op, ": weights is null or empty");
  const int64_t N2 = (*p.weights)[0].n;
  if (N2 % 2) return Error(StatusCode::kInvalidArgument, op, ": weights have N=", N2, " rows; need [gate; up], an even count");
  OPTX_RETURN_IF_ERROR(check_shapes(op, p.x, p.weights, p.group_offsets, N2, need_data));
  const bool quant = p.out.dtype == DType::kI8;
  OPTX_RETURN_IF_ERROR(check_2d(op, p.out, "out", p.x.sizes[0], N2 / 2, !quant, need_data));
  if (quant) return check_1d(op, p.out_scales, "out_scales", p.x.sizes[0], DType::kF32, need_data);
  if (!p.out_scales.empty())
    return Error(StatusCode::kInvalidArgument, op, ": out_scales given but out.dtype=", dtype_name(p.out.dtype), " (only for i8 out)");
  return Status::Ok();
}

template <class P>
TensorView scales_of(const P& p) {
  if constexpr (requires { p.out_scales; }) return p.out_scales;
  else return {};
}

// Every part's outputs apart from each other, from every part's x and offsets, and from
// the workspace's first `used` bytes: a part's tiles are stored while other threads still
// read the rows and the offsets that place them.
template <class P>
Status parts_apart(const char* op, std::span<const P> parts, Workspace ws, size_t used) {
  const TensorView wsv = workspace_view(ws, used);
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorView sc = scales_of(parts[i]);
    for (size_t j = 0; j < parts.size(); ++j) {
      OPTX_RETURN_IF_ERROR(check_apart(op, {{"out", parts[i].out}, {"out_scales", sc}, {"workspace", wsv}},
                                       {{"x", parts[j].x}, {"group_offsets", parts[j].group_offsets}}));
      if (j > i)
        OPTX_RETURN_IF_ERROR(check_apart(op, {{"out", parts[i].out}, {"out_scales", sc}},
                                         {{"another part's out", parts[j].out}, {"another part's out_scales", scales_of(parts[j])}}));
    }
  }
  return Status::Ok();
}

}  // namespace

size_t grouped_matmul_workspace_size(std::span<const GroupedMatmulParams> parts) {
  if (parts.size() > kMaxParts) return 0;
  Jobs jobs;
  for (const GroupedMatmulParams& p : parts) {
    if (!check_plain("grouped_matmul", p, /*need_data=*/false).ok()) return 0;
    jobs.push(plain_job(p));
  }
  return jobs_ws(jobs);
}

Status grouped_matmul(std::span<const GroupedMatmulParams> parts, ScheduleStats* stats, Workspace ws) {
  constexpr const char* op = "grouped_matmul";
  OPTX_RETURN_IF_ERROR(check_parts(op, parts.size()));
  Jobs jobs;
  for (const GroupedMatmulParams& p : parts) {
    OPTX_RETURN_IF_ERROR(check_plain(op, p, /*need_data=*/true));
    OPTX_RETURN_IF_ERROR(check_offsets(op, static_cast<const int64_t*>(p.group_offsets.data), p.weights->count(),
                                       p.offsets_are_counts, p.x.sizes[0]));
    jobs.push(plain_job(p));
  }
  const size_t need = jobs_ws(jobs);
  OPTX_RETURN_IF_ERROR(check_workspace(op, "grouped_matmul_workspace_size", ws, need));
  OPTX_RETURN_IF_ERROR(parts_apart(op, parts, ws, need));
  return run_jobs(jobs, stats, ws, [](size_t, int64_t, int64_t) {});
}

namespace {
// [aligned f32 buffers of the parts that need one][the GEMMs' workspace] + aligning the base.
size_t swiglu_ws(std::span<const SwigluPart> sp, Jobs* jobs) {
  size_t bufs = 0;
  for (const SwigluPart& s : sp) {
    bufs += s.buf_bytes;
    jobs->push(s.job);
  }
  return kAlign + bufs + jobs_ws(*jobs);
}

using SwigluParts = Parts<SwigluPart>;
}  // namespace

size_t grouped_matmul_swiglu_workspace_size(std::span<const GroupedMatmulSwigluParams> parts) {
  if (parts.size() > kMaxParts) return 0;
  SwigluParts sp;
  for (const GroupedMatmulSwigluParams& p : parts) {
    if (!check_swiglu("grouped_matmul_swiglu", p, /*need_data=*/false).ok()) return 0;
    sp.push(swiglu_part(p));
  }
  Jobs jobs;
  return swiglu_ws(sp, &jobs);
}

Status grouped_matmul_swiglu(std::span<const GroupedMatmulSwigluParams> parts, ScheduleStats* stats, Workspace ws) {
  constexpr const char* op = "grouped_matmul_swiglu";
  // Validate every part, then plan each once: the sizing, the buffers and the schedule
  // all come from the same parts.
  OPTX_RETURN_IF_ERROR(check_parts(op, parts.size()));
  SwigluParts sp;
  for (const GroupedMatmulSwigluParams& p : parts) {
    OPTX_RETURN_IF_ERROR(check_swiglu(op, p, /*need_data=*/true));
    OPTX_RETURN_IF_ERROR(check_offsets(op, static_cast<const int64_t*>(p.group_offsets.data), p.weights->count(), false, p.x.sizes[0]));
    sp.push(swiglu_part(p));
  }
  Jobs jobs;
  const size_t need = swiglu_ws(sp, &jobs);
  OPTX_RETURN_IF_ERROR(check_workspace(op, "grouped_matmul_swiglu_workspace_size", ws, need));
  OPTX_RETURN_IF_ERROR(parts_apart(op, parts, ws, need));
  // Decode-sized fused parts whose queue items would be cut by columns run unfused.
  std::array<bool, kMaxParts> cut{};
  const int nt = num_threads();
  size_t items = 0;
  double total = 0;
  for_each_group(jobs, [&](size_t, int64_t, int64_t, int64_t, double cost) { ++items, total += cost; });
  if (queued(items, nt))
    for_each_group(jobs, [&](size_t ji, int64_t g, int64_t b, int64_t e, double cost) {
      const bool may = sp.v[ji].fused && sp.v[ji].job.x.sizes[0] <= kColumnCutRows;
      cut[ji] = cut[ji] || column_pieces(jobs.v[ji], g, e - b, cost, column_fair(total, nt), may) > 1;
    });
  for (size_t i = 0; i < sp.n; ++i)  // the same buffer bytes: a fused part reserves the unfused rows up to kColumnCutRows
    if (cut[i]) sp.v[i] = swiglu_part(parts[i], false), jobs.v[i] = sp.v[i].job;
  uint8_t* at = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
  for (size_t i = 0; i < sp.n; ++i) {
    if (!sp.v[i].buf_cols) continue;
    sp.v[i].job.out.data = jobs.v[i].out.data = at;
    at += sp.v[i].buf_bytes;
  }
  const size_t used = size_t(at - static_cast<uint8_t*>(ws.data));
  return run_jobs(jobs, stats, {static_cast<uint8_t*>(ws.data) + used, ws.bytes - used},
                  [&](size_t j, int64_t begin, int64_t end) { swiglu_rows(sp.v[j], begin, end); });
}

Status validate_grouped_matmul(const GroupedMatmulParams& p, bool need_data) { return check_plain("grouped_matmul", p, need_data); }
Status validate_grouped_matmul_swiglu(const GroupedMatmulSwigluParams& p, bool need_data) {
  return check_swiglu("grouped_matmul_swiglu", p, need_data);
}

}  // namespace moe_detail

size_t grouped_matmul_workspace_size(const GroupedMatmulParams& p) { return moe_detail::grouped_matmul_workspace_size({&p, 1}); }
Status grouped_matmul(const GroupedMatmulParams& p, Workspace ws) { return moe_detail::grouped_matmul({&p, 1}, p.stats, ws); }
size_t grouped_matmul_swiglu_workspace_size(const GroupedMatmulSwigluParams& p) {
  return moe_detail::grouped_matmul_swiglu_workspace_size({&p, 1});
}
Status grouped_matmul_swiglu(const GroupedMatmulSwigluParams& p, Workspace ws) {
  return moe_detail::grouped_matmul_swiglu({&p, 1}, p.stats, ws);
}

}  // namespace optx
