// MoE family: gating, routing, grouped GEMM (+ SwiGLU), finalize and the one-call layer.
// The grouped GEMMs run optx::gemm on each group's row slice with its packed expert
// matrix, either split across the threads per group or from a shared queue of groups
// (see grouped_matmul); routing is a stable counting sort. Buffers live in the caller's
// workspace; the only allocation in a call is the grouped GEMM's small work list.
#include "optx/moe.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch/registry.h"
#include "numerics/quant_i8.h"

namespace optx {
namespace {

constexpr int64_t kMaxExperts = 1024;
constexpr int64_t kMaxTopK = 32;
constexpr int64_t kMaxHidden = 16384;
// Below this many non-empty groups per thread, LPT over whole groups leaves threads idle
// at the tail; splitting each GEMM across the threads is the better schedule.
constexpr int kQueueItemsPerThread = 2;
constexpr int64_t kMinTileRows = 128;

float load_f(const TensorView& t, int64_t i) {
  return t.dtype == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]) : static_cast<const float*>(t.data)[i];
}

Status check_2d(const char* op, const TensorView& t, const char* name, int64_t rows, int64_t cols, bool float_types) {
  if (t.rank != 2 || (rows >= 0 && t.sizes[0] != rows) || (cols >= 0 && t.sizes[1] != cols))
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be [", rows, ", ", cols, "], got rank ", t.rank, " [",
                 t.rank > 0 ? t.sizes[0] : -1, ", ", t.rank > 1 ? t.sizes[1] : -1, "]");
  if (float_types && t.dtype != DType::kF32 && t.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".dtype=", dtype_name(t.dtype), " but must be f32 or bf16");
  if (!t.is_contiguous()) return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be contiguous");
  if (t.numel() > 0 && !t.data) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".data is null");
  return Status::Ok();
}

Status check_1d(const char* op, const TensorView& t, const char* name, int64_t n, DType dt) {
  if (t.rank != 1 || t.sizes[0] != n || t.dtype != dt || (n > 1 && t.strides[0] != 1) || (n > 0 && !t.data))
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be contiguous ", dtype_name(dt), " [", n, "]");
  return Status::Ok();
}

// Top-k of v[0..n) among eligible entries, descending, ties to the lower index.
void topk(const float* v, const bool* eligible, int64_t n, int64_t k, int32_t* out) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      if (eligible && !eligible[e]) continue;
      bool taken = false;
      for (int64_t q = 0; q < j; ++q) taken |= out[q] == e;
      if (taken) continue;
      if (best < 0 || v[e] > v[best]) best = e;  // strict: an equal later id never wins
    }
    out[j] = int32_t(best);
  }
}

std::string generic_impl() { return "generic"; }
[[maybe_unused]] const bool registered = [] {
  for (const char* op : {"moe_gating_topk", "moe_init_routing", "grouped_matmul", "grouped_matmul_swiglu", "moe_finalize_routing",
                         "moe_forward"})
    dispatch::register_op(op, generic_impl);
  return true;
}();

}  // namespace

// ---- gating --------------------------------------------------------------------------------
Status moe_gating_topk(const MoeGatingParams& p, Workspace) {
  constexpr const char* op = "moe_gating_topk";
  OPTX_RETURN_IF_ERROR(check_2d(op, p.logits, "logits", -1, -1, true));
  const int64_t T = p.logits.sizes[0], E = p.logits.sizes[1];
  if (E < 1 || E > kMaxExperts) return Error(StatusCode::kInvalidArgument, op, ": experts E=", E, " must be in [1, ", kMaxExperts, "]");
  if (p.topk_ids.rank != 2) return Error(StatusCode::kInvalidArgument, op, ": topk_ids must be i32 [T, k]");
  const int64_t k = p.topk_ids.sizes[1];
  if (p.topk_ids.dtype != DType::kI32) return Error(StatusCode::kInvalidArgument, op, ": topk_ids.dtype=", dtype_name(p.topk_ids.dtype), " but must be i32");
  OPTX_RETURN_IF_ERROR(check_2d(op, p.topk_ids, "topk_ids", T, k, false));
  OPTX_RETURN_IF_ERROR(check_2d(op, p.topk_weights, "topk_weights", T, k, false));
  if (p.topk_weights.dtype != DType::kF32) return Error(StatusCode::kInvalidArgument, op, ": topk_weights must be f32");
  if (p.n_group < 1 || E % p.n_group || p.topk_group < 1 || p.topk_group > p.n_group)
    return Error(StatusCode::kInvalidArgument, op, ": n_group=", p.n_group, " must divide E=", E, " and topk_group=", p.topk_group,
                 " be in [1, n_group]");
  const int64_t eligible_max = E / p.n_group * p.topk_group;
  if (k < 1 || k > kMaxTopK || k > eligible_max)
    return Error(StatusCode::kInvalidArgument, op, ": top-k=", k, " must be in [1, min(", kMaxTopK, ", experts in the kept groups = ",
                 eligible_max, ")]");
  if (!p.bias.empty()) OPTX_RETURN_IF_ERROR(check_1d(op, p.bias, "bias", E, DType::kF32));
  if (p.topk_then_softmax && (p.score != MoeScore::kSoftmax || p.n_group > 1 || !p.bias.empty()))
    return Error(StatusCode::kInvalidArgument, op, ": topk_then_softmax takes softmax scoring without groups or bias");
  const float* bias = p.bias.empty() ? nullptr : static_cast<const float*>(p.bias.data);
  int32_t* ids = static_cast<int32_t*>(p.topk_ids.data);
  float* wts = static_cast<float*>(p.topk_weights.data);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (T > 16)
  for (int64_t t = 0; t < T; ++t) {
    float logit[kMaxExperts], score[kMaxExperts], sel[kMaxExperts];
    bool ok[kMaxExperts];
    for (int64_t e = 0; e < E; ++e) logit[e] = load_f(p.logits, t * E + e);
    int32_t* id = ids + t * k;
    float* w = wts + t * k;
    if (p.topk_then_softmax) {
      topk(logit, nullptr, E, k, id);
      const float m = logit[id[0]];
      float s = 0;
      for (int64_t j = 0; j < k; ++j) s += (w[j] = std::exp(logit[id[j]] - m));
      for (int64_t j = 0; j < k; ++j) w[j] = w[j] / s * p.routed_scaling_factor;
      continue;
    }
    if (p.score == MoeScore::kSoftmax) {
      float m = -INFINITY, s = 0;
      for (int64_t e = 0; e < E; ++e) m = std::max(m, logit[e]);
      for (int64_t e = 0; e < E; ++e) s += (score[e] = std::exp(logit[e] - m));
      for (int64_t e = 0; e < E; ++e) score[e] /= s;
    } else if (p.score == MoeScore::kSigmoid) {
      for (int64_t e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-logit[e]));
    } else {  // sqrt(softplus(x)), softplus computed stably
      for (int64_t e = 0; e < E; ++e) {
        const float x = logit[e];
        score[e] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
      }
    }
    for (int64_t e = 0; e < E; ++e) sel[e] = score[e] + (bias ? bias[e] : 0.0f), ok[e] = true;
    if (p.n_group > 1) {  // keep the topk_group best groups
      const int64_t gs = E / p.n_group;
      float gscore[kMaxExperts];
      for (int64_t g = 0; g < p.n_group; ++g) {
        float a = -INFINITY, b = -INFINITY;  // largest two
        for (int64_t e = g * gs; e < (g + 1) * gs; ++e) {
          if (sel[e] > a) b = a, a = sel[e];
          else if (sel[e] > b) b = sel[e];
        }
        gscore[g] = p.group_score == MoeGroupScore::kMax ? a : a + (gs > 1 ? b : 0.0f);
      }
      int32_t keep[kMaxExperts];
      topk(gscore, nullptr, p.n_group, p.topk_group, keep);
      for (int64_t e = 0; e < E; ++e) ok[e] = false;
      for (int64_t g = 0; g < p.topk_group; ++g)
        for (int64_t e = keep[g] * gs; e < (keep[g] + 1) * gs; ++e) ok[e] = true;
    }
    topk(sel, ok, E, k, id);
    float s = 0;
    for (int64_t j = 0; j < k; ++j) s += (w[j] = score[id[j]]);
    const float scale = p.routed_scaling_factor / (p.renormalize && s > 0 ? s : 1.0f);
    for (int64_t j = 0; j < k; ++j) w[j] *= scale;
  }
  return Status::Ok();
}

// ---- routing -------------------------------------------------------------------------------
Status moe_init_routing(const MoeRoutingParams& p, Workspace) {
  constexpr const char* op = "moe_init_routing";
  OPTX_RETURN_IF_ERROR(check_2d(op, p.x, "x", -1, -1, true));
  const int64_t T = p.x.sizes[0], H = p.x.sizes[1], E = p.num_experts;
  if (E < 1 || E > kMaxExperts) return Error(StatusCode::kInvalidArgument, op, ": num_experts=", E, " must be in [1, ", kMaxExperts, "]");
  if (p.topk_ids.rank != 2 || p.topk_ids.dtype != DType::kI32)
    return Error(StatusCode::kInvalidArgument, op, ": topk_ids must be i32 [T, k]");
  const int64_t k = p.topk_ids.sizes[1], N = T * k;
  OPTX_RETURN_IF_ERROR(check_2d(op, p.topk_ids, "topk_ids", T, k, false));
  OPTX_RETURN_IF_ERROR(check_2d(op, p.sorted_rows, "sorted_rows", N, H, false));
  const bool quant = p.sorted_rows.dtype == DType::kI8;
  if (!quant && p.sorted_rows.dtype != p.x.dtype)
    return Error(StatusCode::kInvalidArgument, op, ": sorted_rows.dtype must be x.dtype or i8");
  if (quant) OPTX_RETURN_IF_ERROR(check_1d(op, p.row_scales, "row_scales", N, DType::kF32));
  else if (p.row_scales.data)
    return Error(StatusCode::kInvalidArgument, op, ": row_scales is only written when sorted_rows is i8");
  OPTX_RETURN_IF_ERROR(check_1d(op, p.row_map, "row_map", N, DType::kI32));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.inverse, "inverse", N, DType::kI32));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.counts, "counts", E, DType::kI64));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.offsets, "offsets", E, DType::kI64));
  const int64_t e0 = p.expert_begin, e1 = p.expert_end < 0 ? E : p.expert_end;
  if (e0 < 0 || e1 > E || e0 > e1)
    return Error(StatusCode::kInvalidArgument, op, ": expert range [", e0, ", ", e1, ") must lie in [0, ", E, "]");
  const int32_t* ids = static_cast<const int32_t*>(p.topk_ids.data);
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] < 0 || ids[i] >= E)
      return Error(StatusCode::kInvalidArgument, op, ": topk_ids[", i / k, "][", i % k, "]=", ids[i], " is outside [0, ", E, ")");
  int64_t* counts = static_cast<int64_t*>(p.counts.data);
  int64_t* offsets = static_cast<int64_t*>(p.offsets.data);
  std::fill(counts, counts + E, 0);
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] >= e0 && ids[i] < e1) ++counts[ids[i]];
  int64_t cursor[kMaxExperts];
  int64_t run = 0;
  for (int64_t e = 0; e < E; ++e) {
    cursor[e] = run;
    run += counts[e];
    offsets[e] = run;
  }
  int32_t* row_map = static_cast<int32_t*>(p.row_map.data);
  int32_t* inverse = static_cast<int32_t*>(p.inverse.data);
  for (int64_t i = 0; i < N; ++i) {  // stable: (t, j) in order within each expert
    const int32_t e = ids[i];
    if (e < e0 || e >= e1) {
      inverse[i] = -1;
      continue;
    }
    const int64_t pos = cursor[e]++;
    row_map[pos] = int32_t(i);
    inverse[i] = int32_t(pos);
  }
  for (int64_t i = run; i < N; ++i) row_map[i] = -1;
  const size_t row_bytes = size_t(H) * dtype_size(p.x.dtype);
  const uint8_t* x = static_cast<const uint8_t*>(p.x.data);
  if (quant) {
    // Each of a token's k copies is quantised on its own: identical codes, and no shared
    // per-token scratch between threads.
    int8_t* q = static_cast<int8_t*>(p.sorted_rows.data);
    float* scales = static_cast<float*>(p.row_scales.data);
    const bool bf16 = p.x.dtype == DType::kBF16;
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (run * H > (1 << 16))
    for (int64_t pos = 0; pos < run; ++pos) {
      const uint8_t* src = x + size_t(row_map[pos] / k) * row_bytes;
      if (bf16) numerics::quantize_row_i8(reinterpret_cast<const uint16_t*>(src), H, q + pos * H, scales + pos);
      else numerics::quantize_row_i8(reinterpret_cast<const float*>(src), H, q + pos * H, scales + pos);
    }
    return Status::Ok();
  }
  uint8_t* out = static_cast<uint8_t*>(p.sorted_rows.data);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (run > 64)
  for (int64_t pos = 0; pos < run; ++pos) std::memcpy(out + size_t(pos) * row_bytes, x + size_t(row_map[pos] / k) * row_bytes, row_bytes);
  return Status::Ok();
}

Status moe_compute_expert_tokens(const TensorView& sorted_ids, const TensorView& offsets) {
  constexpr const char* op = "moe_compute_expert_tokens";
  if (sorted_ids.rank != 1 || sorted_ids.dtype != DType::kI32 || (sorted_ids.sizes[0] > 0 && !sorted_ids.data))
    return Error(StatusCode::kInvalidArgument, op, ": sorted_ids must be i32 [N]");
  const int64_t N = sorted_ids.sizes[0];
  if (offsets.rank != 1 || offsets.dtype != DType::kI64 || !offsets.data || offsets.sizes[0] < 1)
    return Error(StatusCode::kInvalidArgument, op, ": offsets must be i64 [E]");
  const int64_t E = offsets.sizes[0];
  const int32_t* ids = static_cast<const int32_t*>(sorted_ids.data);
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] < 0 || ids[i] >= E || (i > 0 && ids[i] < ids[i - 1]))
      return Error(StatusCode::kInvalidArgument, op, ": sorted_ids[", i, "]=", ids[i], " is out of [0, ", E, ") or not ascending");
  int64_t* off = static_cast<int64_t*>(offsets.data);
  int64_t i = 0;
  for (int64_t e = 0; e < E; ++e) {
    while (i < N && ids[i] <= e) ++i;
    off[e] = i;
  }
  return Status::Ok();
}

// ---- grouped GEMMs -----------------------------------------------------------------------------
namespace {

Status grouped_common(const char* op, const TensorView& x, const PackedWeights* w, const TensorView& offs, bool counts,
                      int64_t N_expected_cols, int64_t* total, int64_t* nonempty = nullptr) {
  OPTX_RETURN_IF_ERROR(check_2d(op, x, "x", -1, -1, true));
  if (!w || w->count() < 1) return Error(StatusCode::kInvalidArgument, op, ": weights is null or empty");
  const int64_t E = w->count();
  OPTX_RETURN_IF_ERROR(check_1d(op, offs, "group_offsets", E, DType::kI64));
  const int64_t* o = static_cast<const int64_t*>(offs.data);
  int64_t prev = 0, filled = 0;
  for (int64_t g = 0; g < E; ++g) {
    const int64_t end = counts ? prev + o[g] : o[g];
    filled += end > prev;
    if (end < prev || end > x.sizes[0])
      return Error(StatusCode::kInvalidArgument, op, ": group_offsets[", g, "] gives rows up to ", end, " (previous ", prev,
                   "), beyond x's ", x.sizes[0], " rows or decreasing");
    if ((*w)[g].k != x.sizes[1])
      return Error(StatusCode::kInvalidArgument, op, ": weights[", g, "] has K=", (*w)[g].k, " but x.sizes[1]=", x.sizes[1]);
    if ((*w)[g].n != N_expected_cols)
      return Error(StatusCode::kInvalidArgument, op, ": weights[", g, "] has N=", (*w)[g].n, " but expected ", N_expected_cols);
    prev = end;
  }
  *total = prev;
  if (nonempty) *nonempty = filled;
  return Status::Ok();
}

// The GEMM of one work item: rows [begin, end) of x times weights w into out's rows.
GemmParams item_gemm(const TensorView& x, const PackedMatrix& w, const TensorView& out, GemmActivation act,
                     int64_t begin, int64_t end) {
  const int64_t K = x.sizes[1], N = out.sizes[1];
  const auto* xb = static_cast<const uint8_t*>(x.data ? x.data : reinterpret_cast<void*>(64));
  auto* ob = static_cast<uint8_t*>(out.data ? out.data : reinterpret_cast<void*>(64));
  return {.a = make_view(const_cast<uint8_t*>(xb) + size_t(begin * K) * dtype_size(x.dtype), x.dtype, {end - begin, K}),
          .packed_b = &w,
          .c = make_view(ob + size_t(begin * N) * dtype_size(out.dtype), out.dtype, {end - begin, N}),
          .activation = act};
}

// Largest GEMM workspace over the group sizes that can occur: gemm sizes its buffers for
// its row-chunk cap, so the workspace grows monotonically with M and M = max_rows bounds it.
size_t gemm_ws_bound(const TensorView& x, const PackedMatrix& w, const TensorView& out, GemmActivation act) {
  if (x.sizes[0] < 1) return 0;
  return gemm_workspace_size(item_gemm(x, w, out, act, 0, x.sizes[0]));
}

// Expert-queue workspace: one serial GEMM workspace per thread, each aligned.
size_t queue_ws_bound(const TensorView& x, const PackedMatrix& w, const TensorView& out, GemmActivation act) {
  const int nt = num_threads();
  ThreadScope serial(1);
  return size_t(nt) * align_up(gemm_ws_bound(x, w, out, act) + kAlign);
}

size_t grouped_ws_bound(const TensorView& x, const PackedMatrix& w, const TensorView& out, GemmActivation act) {
  return std::max(gemm_ws_bound(x, w, out, act), queue_ws_bound(x, w, out, act));
}

// One grouped GEMM: x's rows sorted by group, group g's rows times weights[g] into out
// (activation act), then after(begin, end) on the same thread for each finished item (an
// epilogue over whole rows, e.g. per-token quantisation, while they are still in cache).
//
// Few groups (decode): each GEMM in turn, split across all threads by the GEMM itself.
// Many groups: a shared queue, largest item first (LPT), each GEMM serial on the thread
// that took it — no fork/join or A re-pack split per group, and a thread never waits
// while items remain. A hot expert would set the tail on its own, so groups above a fair
// share of rows are cut into row tiles (each re-streams that expert's weights, cheap
// next to its FLOPs at these sizes); tiles stay >= kMinTileRows for full AMX blocks.
template <class After>
Status run_grouped(const char* op, const TensorView& x, const PackedWeights& w, const int64_t* o, bool counts,
                   int64_t total, int64_t nonempty, const TensorView& out, GemmActivation act, ScheduleStats* stats,
                   Workspace ws, After&& after) {
  struct Item {
    int64_t g, begin, end;
  };
  const int64_t E = w.count();
  auto group_end = [&](int64_t g, int64_t begin) { return counts ? begin + o[g] : o[g]; };
  const int nt = num_threads();
  const bool queue = nt > 1 && nonempty >= int64_t(kQueueItemsPerThread) * nt;
  const int64_t fair = (total + 4 * nt - 1) / (4 * nt);
  const int64_t tile = queue ? std::max<int64_t>(kMinTileRows, (fair + 31) / 32 * 32) : std::max<int64_t>(total, 1);
  std::vector<Item> items;
  for (int64_t g = 0, begin = 0; g < E; begin = group_end(g, begin), ++g) {
    const int64_t n = group_end(g, begin) - begin, pieces = (n + tile - 1) / tile;  // empty groups: no item
    for (int64_t q = 0; q < pieces; ++q) items.push_back({g, begin + n * q / pieces, begin + n * (q + 1) / pieces});
  }
  auto run = [&](const Item& it, Workspace wsi) {
    OPTX_RETURN_IF_ERROR(gemm(item_gemm(x, w[it.g], out, act, it.begin, it.end), wsi));
    after(it.begin, it.end);
    return Status::Ok();
  };
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<double> busy(size_t(nt), 0.0);
  auto account = [&] {
    if (!stats) return;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    stats->wall_s += wall;
    if (stats->busy_s.size() < size_t(nt)) stats->busy_s.resize(size_t(nt), 0.0);
    for (int t = 0; t < nt; ++t) stats->busy_s[size_t(t)] += busy[size_t(t)];
  };
  if (!queue) {
    for (const Item& it : items) OPTX_RETURN_IF_ERROR(run(it, ws));
    std::fill(busy.begin(), busy.end(), std::chrono::duration<double>(Clock::now() - t0).count());
    account();
    return Status::Ok();
  }
  const size_t need = queue_ws_bound(x, w[0], out, act);
  if (ws.bytes < need || !ws.data)
    return Error(StatusCode::kWorkspaceTooSmall, op, ": workspace.bytes=", ws.bytes, " but the expert queue needs ", need);
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.end - a.begin > b.end - b.begin; });
  const size_t slice = need / size_t(nt);
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
    busy[size_t(t)] = std::chrono::duration<double>(Clock::now() - start).count();
  }
  account();
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

// SwiGLU runs in the GEMM's registers when the up half starts on a panel boundary
// (I % 64 == 0, every DeepSeek width); otherwise the [gate | up] rows go through an f32
// buffer and each item applies SwiGLU to its rows right after its GEMM.
bool fused_swiglu(int64_t I) { return I % PackedMatrix::kPanel == 0; }

}  // namespace

size_t grouped_matmul_workspace_size(const GroupedMatmulParams& p) {
  if (!p.weights || p.weights->count() < 1 || p.x.rank != 2) return 0;
  return grouped_ws_bound(p.x, (*p.weights)[0], make_view(nullptr, p.out.dtype, {p.x.sizes[0], (*p.weights)[0].n}),
                          GemmActivation::kNone);
}

Status grouped_matmul(const GroupedMatmulParams& p, Workspace ws) {
  constexpr const char* op = "grouped_matmul";
  int64_t total = 0, nonempty = 0;
  if (!p.weights || p.weights->count() < 1) return Error(StatusCode::kInvalidArgument, op, ": weights is null or empty");
  OPTX_RETURN_IF_ERROR(
      grouped_common(op, p.x, p.weights, p.group_offsets, p.offsets_are_counts, (*p.weights)[0].n, &total, &nonempty));
  OPTX_RETURN_IF_ERROR(check_2d(op, p.out, "out", p.x.sizes[0], (*p.weights)[0].n, true));
  return run_grouped(op, p.x, *p.weights, static_cast<const int64_t*>(p.group_offsets.data), p.offsets_are_counts, total,
                     nonempty, p.out, GemmActivation::kNone, p.stats, ws, [](int64_t, int64_t) {});
}

namespace {
// Layout of grouped_matmul_swiglu's workspace: [f32 rows (when needed)][GEMM workspace].
struct SwigluPlan {
  bool fused = true;       // SwiGLU in the GEMM epilogue
  int64_t buf_cols = 0;    // f32 buffer columns: 0, I (fused + i8 out) or 2I (unfused)
  TensorView gemm_out;     // what the grouped GEMM writes (shape; data set at run time)
  GemmActivation act = GemmActivation::kNone;
  size_t buf_bytes = 0;
};
SwigluPlan swiglu_plan(const GroupedMatmulSwigluParams& p) {
  SwigluPlan s;
  const int64_t M = p.x.sizes[0], N2 = (*p.weights)[0].n, I = N2 / 2;
  s.fused = fused_swiglu(I);
  s.act = s.fused ? GemmActivation::kSwiglu : GemmActivation::kNone;
  const bool quant = p.out.dtype == DType::kI8;
  s.buf_cols = !s.fused ? N2 : quant ? I : 0;
  s.gemm_out = s.buf_cols ? make_view(nullptr, DType::kF32, {M, s.buf_cols}) : make_view(nullptr, p.out.dtype, {M, I});
  s.buf_bytes = align_up(size_t(M * s.buf_cols) * sizeof(float));
  return s;
}
}  // namespace

size_t grouped_matmul_swiglu_workspace_size(const GroupedMatmulSwigluParams& p) {
  if (!p.weights || p.weights->count() < 1 || p.x.rank != 2) return 0;
  const SwigluPlan s = swiglu_plan(p);
  return kAlign + s.buf_bytes + grouped_ws_bound(p.x, (*p.weights)[0], s.gemm_out, s.act);  // + aligning the base
}

Status grouped_matmul_swiglu(const GroupedMatmulSwigluParams& p, Workspace ws) {
  constexpr const char* op = "grouped_matmul_swiglu";
  if (!p.weights || p.weights->count() < 1) return Error(StatusCode::kInvalidArgument, op, ": weights is null or empty");
  const int64_t M = p.x.sizes[0], N2 = (*p.weights)[0].n, I = N2 / 2;
  if (N2 % 2) return Error(StatusCode::kInvalidArgument, op, ": weights have N=", N2, " rows; need [gate; up], an even count");
  int64_t total = 0, nonempty = 0;
  OPTX_RETURN_IF_ERROR(grouped_common(op, p.x, p.weights, p.group_offsets, false, N2, &total, &nonempty));
  const bool quant = p.out.dtype == DType::kI8;
  OPTX_RETURN_IF_ERROR(check_2d(op, p.out, "out", M, I, !quant));
  if (quant) OPTX_RETURN_IF_ERROR(check_1d(op, p.out_scales, "out_scales", M, DType::kF32));
  else if (!p.out_scales.empty())
    return Error(StatusCode::kInvalidArgument, op, ": out_scales given but out.dtype=", dtype_name(p.out.dtype), " (only for i8 out)");
  const size_t need = grouped_matmul_swiglu_workspace_size(p);
  if (ws.bytes < need || !ws.data)
    return Error(StatusCode::kWorkspaceTooSmall, op, ": workspace.bytes=", ws.bytes, " but grouped_matmul_swiglu_workspace_size()=", need);
  SwigluPlan s = swiglu_plan(p);
  uint8_t* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(ws.data)));
  float* buf = reinterpret_cast<float*>(base);
  const size_t used = size_t(base - static_cast<uint8_t*>(ws.data)) + s.buf_bytes;
  const Workspace gws{static_cast<uint8_t*>(ws.data) + used, ws.bytes - used};
  s.gemm_out.data = s.buf_cols ? static_cast<void*>(buf) : p.out.data;
  int8_t* q = static_cast<int8_t*>(p.out.data);
  float* qs = quant ? static_cast<float*>(p.out_scales.data) : nullptr;
  // Per item, on rows still in cache: SwiGLU from the [gate | up] buffer when the GEMM
  // could not fuse it (in place over the gate half), then per-token int8 when asked.
  auto after = [&](int64_t begin, int64_t end) {
    if (!s.buf_cols) return;
    for_rows(begin, end, [&](int64_t r) {
      float* g = buf + r * s.buf_cols;
      if (!s.fused) {
        for (int64_t i = 0; i < I; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * g[I + i];
        if (!quant) {
          for (int64_t i = 0; i < I; ++i) {
            if (p.out.dtype == DType::kBF16) static_cast<uint16_t*>(p.out.data)[r * I + i] = f32_to_bf16(g[i]);
            else static_cast<float*>(p.out.data)[r * I + i] = g[i];
          }
          return;
        }
      }
      numerics::quantize_row_i8(g, I, q + r * I, qs + r);
    });
  };
  return run_grouped(op, p.x, *p.weights, static_cast<const int64_t*>(p.group_offsets.data), false, total, nonempty,
                     s.gemm_out, s.act, p.stats, gws, after);
}

// ---- finalize ---------------------------------------------------------------------------------
Status moe_finalize_routing(const MoeFinalizeParams& p, Workspace) {
  constexpr const char* op = "moe_finalize_routing";
  OPTX_RETURN_IF_ERROR(check_2d(op, p.out, "out", -1, -1, true));
  const int64_t T = p.out.sizes[0], H = p.out.sizes[1];
  if (H > kMaxHidden) return Error(StatusCode::kInvalidArgument, op, ": hidden H=", H, " exceeds ", kMaxHidden);
  if (p.weights.rank != 2 || p.weights.dtype != DType::kF32) return Error(StatusCode::kInvalidArgument, op, ": weights must be f32 [T, k]");
  const int64_t k = p.weights.sizes[1];
  OPTX_RETURN_IF_ERROR(check_2d(op, p.weights, "weights", T, k, false));
  OPTX_RETURN_IF_ERROR(check_1d(op, p.inverse, "inverse", T * k, DType::kI32));
  OPTX_RETURN_IF_ERROR(check_2d(op, p.y, "y", -1, H, true));
  if (!p.shared.empty()) OPTX_RETURN_IF_ERROR(check_2d(op, p.shared, "shared", T, H, true));
  if (!p.residual.empty()) OPTX_RETURN_IF_ERROR(check_2d(op, p.residual, "residual", T, H, true));
  const int32_t* inv = static_cast<const int32_t*>(p.inverse.data);
  for (int64_t i = 0; i < T * k; ++i)
    if (inv[i] < -1 || inv[i] >= p.y.sizes[0])
      return Error(StatusCode::kInvalidArgument, op, ": inverse[", i, "]=", inv[i], " is outside [-1, ", p.y.sizes[0], ")");
  const float* w = static_cast<const float*>(p.weights.data);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (T > 4)
  for (int64_t t = 0; t < T; ++t) {
    float acc[kMaxHidden];
    for (int64_t h = 0; h < H; ++h) acc[h] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = inv[t * k + j];
      if (row < 0) continue;
      const float wj = w[t * k + j];
      for (int64_t h = 0; h < H; ++h) acc[h] += wj * load_f(p.y, row * H + h);
    }
    for (int64_t h = 0; h < H; ++h) {
      float v = acc[h];
      if (!p.shared.empty()) v += load_f(p.shared, t * H + h);
      if (!p.residual.empty()) v += load_f(p.residual, t * H + h);
      if (p.out.dtype == DType::kBF16) static_cast<uint16_t*>(p.out.data)[t * H + h] = f32_to_bf16(v);
      else static_cast<float*>(p.out.data)[t * H + h] = v;
    }
  }
  return Status::Ok();
}

}  // namespace optx
