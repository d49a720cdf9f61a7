// kv_cache_write, gather_pa_kv_cache, kv_rms_norm_rope_cache, qkv_rope_cache:
// validate (every slot, block id and position is checked before anything is written, so a
// bad index can never write outside the cache) -> dispatch -> tokens split across threads.

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstring>
#include <string>

#include "core/parallel.h"
#include "core/validate.h"
#include "ops/kv_cache/kv_cache_internal.h"

namespace optx {
namespace kv_detail {
namespace {

Status check_rows(const char* op, const TensorView& t, const char* name, int64_t rows, int64_t cols) {
  OPTX_RETURN_IF_ERROR(check_view(op, name, t));
  if (t.rank != 2) return Error(StatusCode::kInvalidArgument, op, ": ", name, ".rank=", t.rank, " but must be 2");
  if ((rows >= 0 && t.sizes[0] != rows) || t.sizes[1] != cols)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".sizes=[", t.sizes[0], ", ", t.sizes[1], "] but must be [",
                 rows >= 0 ? std::to_string(rows) : std::string("num_slots"), ", ", cols, "]");
  if (cols > 1 && t.strides[1] != 1)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[1]=", t.strides[1], " but must be 1");
  if (t.sizes[0] > 1 && t.strides[0] < cols)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, ".strides[0]=", t.strides[0], " but must be >= ", cols);
  return Status::Ok();
}

Status check_slots(const char* op, const TensorView& s, int64_t T, int64_t num_slots) {
  OPTX_RETURN_IF_ERROR(check_view(op, "slots", s));
  if (s.rank != 1 || s.sizes[0] != T)
    return Error(StatusCode::kInvalidArgument, op, ": slots must be [T=", T, "], got rank ", s.rank, " sizes[0]=", s.sizes[0]);
  if (s.dtype != DType::kI32 && s.dtype != DType::kI64)
    return Error(StatusCode::kInvalidArgument, op, ": slots.dtype=", dtype_name(s.dtype), " but must be i32 or i64");
  if (T > 1 && s.strides[0] != 1) return Error(StatusCode::kInvalidArgument, op, ": slots.strides[0]=", s.strides[0], " but must be 1");
  if (T > 0 && !s.data) return Error(StatusCode::kInvalidArgument, op, ": slots.data is null");
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = load_index(s.data, s.dtype == DType::kI64, t);
    if (v < -1 || v >= num_slots)
      return Error(StatusCode::kInvalidArgument, op, ": slots[", t, "]=", v, " is outside [-1, ", num_slots, ")");
  }
  return Status::Ok();
}

Plane plane(const TensorView& t) { return {t.data, t.strides[0], t.dtype, nullptr}; }

Status check_cache_scales(const char* op, const TensorView& cache, const TensorView& scales, const char* name,
                          float** out) {
  if (cache.dtype != DType::kI8) {
    if (!scales.empty())
      return Error(StatusCode::kInvalidArgument, op, ": ", name, " given but the cache is ", dtype_name(cache.dtype));
    return Status::Ok();
  }
  if (scales.rank != 1 || scales.sizes[0] != cache.sizes[0] || scales.dtype != DType::kF32 || (scales.sizes[0] > 0 && !scales.data) ||
      (scales.sizes[0] > 1 && scales.strides[0] != 1))
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " must be contiguous f32 [num_slots=", cache.sizes[0],
                 "] for an i8 cache");
  *out = static_cast<float*>(scales.data);
  return Status::Ok();
}

// Contiguous token ranges (the kernels pipeline consecutive rows) of at least 32 tokens,
// about four per thread, claimed as the threads go. Against fixed halves, MLA T = 4096
// bf16 2 threads, alternating in one process, nine runs: 0.96-0.99x the time when the two
// cores ran at one speed, 0.63-0.92x when one lagged.
// The same for every op of the family: tokens, or for a gather output rows (a range finds
// its first sequence by a scan of seq_lens).
//
// A slot named by two tokens gets the later token's row, as in the reference's token
// order: tokens go in chunks of kSlotChunk, in order; a chunk whose slots repeat runs on
// this thread one token per kernel call (the lockstep kernels interleave two tokens, and
// each call ends with the fence that orders its streaming stores before the next
// token's), any other chunk is split across threads. Left to the threads, a repeated slot
// got a row torn between two tokens (an i8 row's scale from the other one). The check
// costs a hash probe per token against a row copy per token.
constexpr int64_t kSlotChunk = 2048;

// Whether two tokens of [t0, t1) (at most kSlotChunk) name one slot (-1 aside): open
// addressing in a table on the stack, so the op allocates nothing.
template <class A>
bool repeats_slot(const A& a, int64_t t0, int64_t t1) {
  int64_t table[2 * kSlotChunk];
  int bits = 1;
  while ((int64_t(1) << bits) < 2 * (t1 - t0)) ++bits;
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  std::fill(table, table + mask + 1, int64_t(-1));
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t s = a.slot(t);
    if (s < 0) continue;
    for (uint64_t h = (uint64_t(s) * 0x9E3779B97F4A7C15ull) >> (64 - bits);; h = (h + 1) & mask) {
      if (table[h] == s) return true;
      if (table[h] < 0) {
        table[h] = s;
        break;
      }
    }
  }
  return false;
}

template <class A, void (*Kernels::*Member)(const A&, int64_t, int64_t), const Kernels& (*K)()>
Status run_tokens(const A& a) {
  const auto fn = K().*Member;
  if constexpr (std::is_same_v<A, GatherArgs>) {
    parallel_chunks(a.total, 32, 4, [&](int64_t t0, int64_t t1) { fn(a, t0, t1); });
  } else {
    for (int64_t c0 = 0; c0 < a.T; c0 += kSlotChunk) {
      const int64_t c1 = std::min(a.T, c0 + kSlotChunk);
      if (repeats_slot(a, c0, c1)) {
        for (int64_t t = c0; t < c1; ++t) fn(a, t, t + 1);
      } else {
        parallel_chunks(c1 - c0, 32, 4, [&](int64_t t0, int64_t t1) { fn(a, c0 + t0, c0 + t1); });
      }
    }
  }
  return Status::Ok();
}

std::string write_selected() { return write_registry().selected_name(); }
std::string gather_selected() { return gather_registry().selected_name(); }
std::string mla_selected() { return mla_registry().selected_name(); }
std::string qkv_selected() { return qkv_registry().selected_name(); }
[[maybe_unused]] const bool registered = [] {
  dispatch::register_op("kv_cache_write", write_selected);
  dispatch::register_op("gather_pa_kv_cache", gather_selected);
  dispatch::register_op("kv_rms_norm_rope_cache", mla_selected);
  dispatch::register_op("qkv_rope_cache", qkv_selected);
  return true;
}();

template <class Fn, class P, class A>
Status run(const dispatch::Registry<Fn>& reg, const P& p) {
  A a;
  OPTX_RETURN_IF_ERROR(to_args(p, &a));
  const dispatch::Impl<Fn>* impl = nullptr;
  OPTX_RETURN_IF_ERROR(reg.select_to_run(&impl));
  return impl->fn(a);
}

}  // namespace

// ---- validation -----------------------------------------------------------------------------
Status to_args(const KvCacheWriteParams& p, WriteArgs* a) {
  constexpr const char* op = "kv_cache_write";
  if (p.k.empty() && p.v.empty()) return Error(StatusCode::kInvalidArgument, op, ": k and v are both empty");
  const TensorView& first = p.k.empty() ? p.v : p.k;
  const char* first_name = p.k.empty() ? "v" : "k";
  OPTX_RETURN_IF_ERROR(check_view(op, first_name, first));
  if (first.rank != 2)
    return Error(StatusCode::kInvalidArgument, op, ": ", first_name, ".rank=", first.rank, " but must be 2 ([T, row])");
  if (first.dtype != DType::kF32 && first.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": ", first_name, ".dtype=", dtype_name(first.dtype), " but must be f32 or bf16");
  const int64_t T = first.sizes[0], row = first.sizes[1];
  a->T = T;
  a->row = row;
  for (int w = 0; w < 2; ++w) {
    const TensorView& src = w ? p.v : p.k;
    const TensorView& cache = w ? p.v_cache : p.k_cache;
    const char* sn = w ? "v" : "k";
    const char* cn = w ? "v_cache" : "k_cache";
    if (src.empty()) {
      if (!cache.empty()) return Error(StatusCode::kInvalidArgument, op, ": ", cn, " given without ", sn);
      if (!(w ? p.v_scales : p.k_scales).empty())
        return Error(StatusCode::kInvalidArgument, op, ": ", w ? "v_scales" : "k_scales", " given without ", sn);
      continue;
    }
    OPTX_RETURN_IF_ERROR(check_rows(op, src, sn, T, row));
    if (src.dtype != first.dtype)
      return Error(StatusCode::kInvalidArgument, op, ": ", sn, ".dtype=", dtype_name(src.dtype), " but ", first_name, ".dtype=",
                   dtype_name(first.dtype));
    OPTX_RETURN_IF_ERROR(check_rows(op, cache, cn, -1, row));
    if (cache.dtype != src.dtype && cache.dtype != DType::kI8)
      return Error(StatusCode::kInvalidArgument, op, ": ", cn, ".dtype=", dtype_name(cache.dtype), " must be ",
                   dtype_name(src.dtype), " or i8");
    Plane& s = w ? a->v : a->k;
    Plane& c = w ? a->v_cache : a->k_cache;
    s = plane(src);
    c = plane(cache);
    OPTX_RETURN_IF_ERROR(check_cache_scales(op, cache, w ? p.v_scales : p.k_scales, w ? "v_scales" : "k_scales", &c.scales));
  }
  const int64_t num_slots = p.k_cache.empty() ? p.v_cache.sizes[0] : p.k_cache.sizes[0];
  if (!p.k_cache.empty() && !p.v_cache.empty() && p.v_cache.sizes[0] != num_slots)
    return Error(StatusCode::kInvalidArgument, op, ": k_cache has ", num_slots, " slots but v_cache ", p.v_cache.sizes[0]);
  OPTX_RETURN_IF_ERROR(check_slots(op, p.slots, T, num_slots));
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"k_cache", p.k_cache}, {"v_cache", p.v_cache}, {"k_scales", p.k_scales}, {"v_scales", p.v_scales}},
                                   {{"k", p.k}, {"v", p.v}, {"slots", p.slots}}));
  a->slots = p.slots.data;
  a->slots64 = p.slots.dtype == DType::kI64;
  // (in double: T * row can be near the views' element bound)
  a->stream = 2.0 * double(T) * double(row) * double(dtype_size(first.dtype)) >= double(simd::kStreamMinBytes);
  return Status::Ok();
}

Status to_args(const GatherKvParams& p, GatherArgs* a) {
  constexpr const char* op = "gather_pa_kv_cache";
  const TensorView& bt = p.block_tables;
  const TensorView& sl = p.seq_lens;
  if (p.k_cache.empty() && p.v_cache.empty()) return Error(StatusCode::kInvalidArgument, op, ": k_cache and v_cache are both empty");
  const TensorView& first = p.k_cache.empty() ? p.v_cache : p.k_cache;
  const char* first_name = p.k_cache.empty() ? "v_cache" : "k_cache";
  OPTX_RETURN_IF_ERROR(check_view(op, first_name, first));
  if (first.rank != 2) return Error(StatusCode::kInvalidArgument, op, ": ", first_name, ".rank=", first.rank, " but must be 2");
  if (first.dtype != DType::kF32 && first.dtype != DType::kBF16 && first.dtype != DType::kI8)
    return Error(StatusCode::kInvalidArgument, op, ": ", first_name, ".dtype=", dtype_name(first.dtype), " but must be f32, bf16 or i8");
  const int64_t num_slots = first.sizes[0], row = first.sizes[1];
  int64_t total = 0;
  OPTX_RETURN_IF_ERROR(check_block_tables(op, bt, sl, -1, p.block_size, num_slots, 0, "", &total));
  if (num_slots % p.block_size)
    return Error(StatusCode::kInvalidArgument, op, ": cache has ", num_slots, " slots, not a multiple of block_size=", p.block_size);
  const int64_t B = bt.sizes[0];
  const int32_t* lens = static_cast<const int32_t*>(sl.data);
  const int32_t* tables = static_cast<const int32_t*>(bt.data);
  a->B = B;
  a->row = row;
  a->block_size = p.block_size;
  a->max_blocks = bt.strides[0];
  a->total = total;
  a->block_tables = tables;
  a->seq_lens = lens;
  a->stream = 2.0 * double(total) * double(row) * double(dtype_size(first.dtype)) >= double(simd::kStreamMinBytes);
  for (int w = 0; w < 2; ++w) {
    const TensorView& cache = w ? p.v_cache : p.k_cache;
    const TensorView& out = w ? p.v_out : p.k_out;
    const char* cn = w ? "v_cache" : "k_cache";
    const char* on = w ? "v_out" : "k_out";
    if (cache.empty()) {
      if (!out.empty()) return Error(StatusCode::kInvalidArgument, op, ": ", on, " given without ", cn);
      for (const auto& [view, name] : {std::pair{w ? p.v_scales : p.k_scales, w ? "v_scales" : "k_scales"},
                                       std::pair{w ? p.v_scales_out : p.k_scales_out, w ? "v_scales_out" : "k_scales_out"}})
        if (!view.empty()) return Error(StatusCode::kInvalidArgument, op, ": ", name, " given without ", cn);
      continue;
    }
    OPTX_RETURN_IF_ERROR(check_rows(op, cache, cn, num_slots, row));
    if (cache.dtype != first.dtype)  // one element size for both planes (a->stream, the row copies)
      return Error(StatusCode::kInvalidArgument, op, ": ", cn, ".dtype=", dtype_name(cache.dtype), " but ", first_name, ".dtype=",
                   dtype_name(first.dtype));
    OPTX_RETURN_IF_ERROR(check_rows(op, out, on, total, row));
    if (out.dtype != cache.dtype)
      return Error(StatusCode::kInvalidArgument, op, ": ", on, ".dtype=", dtype_name(out.dtype), " but ", cn, ".dtype=",
                   dtype_name(cache.dtype));
    Plane& c = w ? a->v_cache : a->k_cache;
    Plane& o = w ? a->v_out : a->k_out;
    c = plane(cache);
    o = plane(out);
    OPTX_RETURN_IF_ERROR(check_cache_scales(op, cache, w ? p.v_scales : p.k_scales, w ? "v_scales" : "k_scales", &c.scales));
    if (cache.dtype == DType::kI8) {
      const TensorView& so = w ? p.v_scales_out : p.k_scales_out;
      OPTX_RETURN_IF_ERROR(check_view(op, w ? "v_scales_out" : "k_scales_out", so));
      if (so.rank != 1 || so.sizes[0] != total || so.dtype != DType::kF32 || (total > 0 && !so.data) || (total > 1 && so.strides[0] != 1))
        return Error(StatusCode::kInvalidArgument, op, ": ", w ? "v_scales_out" : "k_scales_out",
                     " must be contiguous f32 [", total, "] for an i8 cache");
      o.scales = static_cast<float*>(so.data);
    } else if (!(w ? p.v_scales_out : p.k_scales_out).empty()) {
      return Error(StatusCode::kInvalidArgument, op, ": ", w ? "v_scales_out" : "k_scales_out", " given but the cache is ",
                   dtype_name(cache.dtype));
    }
  }
  return check_apart(op, {{"k_out", p.k_out}, {"v_out", p.v_out}, {"k_scales_out", p.k_scales_out}, {"v_scales_out", p.v_scales_out}},
                     {{"k_cache", p.k_cache}, {"v_cache", p.v_cache}, {"k_scales", p.k_scales}, {"v_scales", p.v_scales},
                      {"block_tables", bt}, {"seq_lens", sl}});
}

Status to_args(const KvRmsNormRopeCacheParams& p, MlaArgs* a) {
  constexpr const char* op = "kv_rms_norm_rope_cache";
  const TensorView& kv = p.kv;
  OPTX_RETURN_IF_ERROR(check_view(op, "kv", kv));
  if (kv.rank != 2) return Error(StatusCode::kInvalidArgument, op, ": kv.rank=", kv.rank, " but must be 2");
  if (kv.dtype != DType::kF32 && kv.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": kv.dtype=", dtype_name(kv.dtype), " but must be f32 or bf16");
  const int64_t T = kv.sizes[0], width = kv.sizes[1], rank = p.kv_lora_rank;
  const int64_t rd = rank >= 1 && rank <= width ? width - rank : 0;  // rank is unchecked input: no width - INT64_MIN
  if (rank < 1 || rd < 2)
    return Error(StatusCode::kInvalidArgument, op, ": kv.sizes[1]=", width, " must be kv_lora_rank=", rank,
                 " (>= 1) plus a rope part of >= 2");
  if (width > kMaxMlaRow)
    return Error(StatusCode::kInvalidArgument, op, ": kv.sizes[1]=", width, " exceeds the supported row of ", kMaxMlaRow);
  OPTX_RETURN_IF_ERROR(check_rows(op, kv, "kv", T, width));
  OPTX_RETURN_IF_ERROR(check_view(op, "weight", p.weight));
  if (p.weight.rank != 1 || p.weight.sizes[0] != rank || p.weight.dtype != kv.dtype || !p.weight.data ||
      (rank > 1 && p.weight.strides[0] != 1))
    return Error(StatusCode::kInvalidArgument, op, ": weight must be contiguous ", dtype_name(kv.dtype), " [kv_lora_rank=", rank, "]");
  if (!(p.eps >= 0.0f) || std::isinf(p.eps))
    return Error(StatusCode::kInvalidArgument, op, ": eps=", p.eps, " must be finite and >= 0");
  const bool i8 = p.cache.dtype == DType::kI8;
  OPTX_RETURN_IF_ERROR(check_rows(op, p.cache, "cache", -1, i8 ? rank : width));
  if (p.cache.dtype != kv.dtype && !i8)
    return Error(StatusCode::kInvalidArgument, op, ": cache.dtype=", dtype_name(p.cache.dtype), " but must be ",
                 dtype_name(kv.dtype), " or i8");
  OPTX_RETURN_IF_ERROR(check_cache_scales(op, p.cache, p.cache_scales, "cache_scales", &a->scales));
  if (i8) {
    OPTX_RETURN_IF_ERROR(check_rows(op, p.rope_cache, "rope_cache", p.cache.sizes[0], rd));
    if (p.rope_cache.dtype != kv.dtype)
      return Error(StatusCode::kInvalidArgument, op, ": rope_cache.dtype=", dtype_name(p.rope_cache.dtype), " but kv.dtype=",
                   dtype_name(kv.dtype));
    a->rope_cache = p.rope_cache.data;
    a->ldr = p.rope_cache.strides[0];
  } else if (!p.rope_cache.empty()) {
    return Error(StatusCode::kInvalidArgument, op, ": rope_cache is only used with an i8 cache");
  }
  a->i8 = i8;
  OPTX_RETURN_IF_ERROR(check_slots(op, p.slots, T, p.cache.sizes[0]));
  OPTX_RETURN_IF_ERROR(rope_detail::table_args(op, p.positions, p.cos, p.sin, rd, p.style, T, &a->rope));
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"cache", p.cache}, {"cache_scales", p.cache_scales}, {"rope_cache", p.rope_cache}},
                                   {{"kv", kv}, {"weight", p.weight}, {"positions", p.positions}, {"cos", p.cos}, {"sin", p.sin},
                                    {"slots", p.slots}}));
  a->T = T;
  a->rank = rank;
  a->rope_dim = rd;
  a->bf16 = kv.dtype == DType::kBF16;
  a->kv = kv.data;
  a->ldkv = kv.strides[0];
  a->weight = p.weight.data;
  a->eps = p.eps;
  a->slots = p.slots.data;
  a->slots64 = p.slots.dtype == DType::kI64;
  a->cache = p.cache.data;
  a->ldc = p.cache.strides[0];
  return Status::Ok();
}

Status to_args(const QkvRopeCacheParams& p, QkvArgs* a) {
  constexpr const char* op = "qkv_rope_cache";
  const TensorView& x = p.qkv;
  if (p.q_heads < 1 || p.kv_heads < 1 || p.head_dim < 2)
    return Error(StatusCode::kInvalidArgument, op, ": q_heads=", p.q_heads, ", kv_heads=", p.kv_heads, ", head_dim=", p.head_dim,
                 " must be >= 1, >= 1, >= 2");
  OPTX_RETURN_IF_ERROR(check_view(op, "qkv", x));
  if (x.rank != 2) return Error(StatusCode::kInvalidArgument, op, ": qkv.rank=", x.rank, " but must be 2");
  if (x.dtype != DType::kF32 && x.dtype != DType::kBF16)
    return Error(StatusCode::kInvalidArgument, op, ": qkv.dtype=", dtype_name(x.dtype), " but must be f32 or bf16");
  // The row width from the head counts in checked arithmetic: a wrapped product matched a
  // zero-width qkv and the kernels then walked q_heads heads.
  const int64_t T = x.sizes[0], d = p.head_dim;
  int64_t heads = 0, width = 0, kvw = 0;
  if (__builtin_add_overflow(p.q_heads, 2 * std::min<int64_t>(p.kv_heads, kMaxViewElements), &heads) ||
      __builtin_mul_overflow(heads, d, &width) || width > kMaxViewElements || __builtin_mul_overflow(p.kv_heads, d, &kvw))
    return Error(StatusCode::kInvalidArgument, op, ": (q_heads=", p.q_heads, " + 2 x kv_heads=", p.kv_heads, ") x head_dim=", d,
                 " exceeds 2^", kMaxViewLog2);
  OPTX_RETURN_IF_ERROR(check_rows(op, x, "qkv", T, width));
  const int64_t rd = p.rotary_dim == 0 ? d : p.rotary_dim;
  if (rd > d) return Error(StatusCode::kInvalidArgument, op, ": rotary_dim=", rd, " exceeds head_dim=", d);
  OPTX_RETURN_IF_ERROR(rope_detail::table_args(op, p.positions, p.cos, p.sin, rd, p.style, T, &a->rope));
  const TensorView& q = p.q_out;
  OPTX_RETURN_IF_ERROR(check_view(op, "q_out", q));
  if (q.rank != 3 || q.sizes[0] != T || q.sizes[1] != p.q_heads || q.sizes[2] != d || q.dtype != x.dtype)
    return Error(StatusCode::kInvalidArgument, op, ": q_out must be ", dtype_name(x.dtype), " [T=", T, ", q_heads=", p.q_heads,
                 ", head_dim=", d, "]");
  // Contiguous head rows that do not overlap (q_out is written by several threads), in any
  // order of tokens and heads: token-major [T, q_heads, d] or head-major as rope() takes.
  if (d > 1 && q.strides[2] != 1)
    return Error(StatusCode::kInvalidArgument, op, ": q_out.strides[2]=", q.strides[2], " but must be 1");
  OPTX_RETURN_IF_ERROR(check_disjoint(op, "q_out", q));
  for (int w = 0; w < 2; ++w) {
    const TensorView& c = w ? p.v_cache : p.k_cache;
    const char* cn = w ? "v_cache" : "k_cache";
    OPTX_RETURN_IF_ERROR(check_rows(op, c, cn, -1, kvw));
    if (c.dtype != x.dtype)
      return Error(StatusCode::kInvalidArgument, op, ": ", cn, ".dtype=", dtype_name(c.dtype), " but qkv.dtype=", dtype_name(x.dtype));
  }
  if (p.k_cache.sizes[0] != p.v_cache.sizes[0])
    return Error(StatusCode::kInvalidArgument, op, ": k_cache has ", p.k_cache.sizes[0], " slots but v_cache ", p.v_cache.sizes[0]);
  OPTX_RETURN_IF_ERROR(check_slots(op, p.slots, T, p.k_cache.sizes[0]));
  OPTX_RETURN_IF_ERROR(check_apart(op, {{"q_out", q}, {"k_cache", p.k_cache}, {"v_cache", p.v_cache}},
                                   {{"qkv", x}, {"positions", p.positions}, {"cos", p.cos}, {"sin", p.sin}, {"slots", p.slots}}));
  a->T = T;
  a->hq = p.q_heads;
  a->hkv = p.kv_heads;
  a->d = d;
  a->bf16 = x.dtype == DType::kBF16;
  a->qkv = x.data;
  a->ldqkv = x.strides[0];
  a->slots = p.slots.data;
  a->slots64 = p.slots.dtype == DType::kI64;
  a->k_cache = p.k_cache.data;
  a->v_cache = p.v_cache.data;
  a->ldk = p.k_cache.strides[0];
  a->ldv = p.v_cache.strides[0];
  a->q_out = q.data;
  a->ldq_t = q.strides[0];
  a->stream_q = T * p.q_heads * d * int64_t(dtype_size(x.dtype)) >= simd::kStreamMinBytes;
  a->ldq_h = q.strides[1];
  return Status::Ok();
}

// ---- registries ------------------------------------------------------------------------------
const dispatch::Registry<WriteFn>& write_registry() {
  static const dispatch::Registry<WriteFn> r("kv_cache_write", {{"avx512", Isa::kAvx512, run_tokens<WriteArgs, &Kernels::write_tokens, kernels_avx512>},
                                                                 {"avx2", Isa::kAvx2, run_tokens<WriteArgs, &Kernels::write_tokens, kernels_avx2>},
                                                                 {"scalar", Isa::kScalar, run_tokens<WriteArgs, &Kernels::write_tokens, kernels_scalar>},
                                                                 {"reference", Isa::kScalar, write_reference}});
  return r;
}
const dispatch::Registry<GatherFn>& gather_registry() {
  static const dispatch::Registry<GatherFn> r("gather_pa_kv_cache", {{"avx512", Isa::kAvx512, run_tokens<GatherArgs, &Kernels::gather_rows, kernels_avx512>},
                                                                      {"avx2", Isa::kAvx2, run_tokens<GatherArgs, &Kernels::gather_rows, kernels_avx2>},
                                                                      {"scalar", Isa::kScalar, run_tokens<GatherArgs, &Kernels::gather_rows, kernels_scalar>},
                                                                      {"reference", Isa::kScalar, gather_reference}});
  return r;
}
const dispatch::Registry<MlaFn>& mla_registry() {
  static const dispatch::Registry<MlaFn> r(
      "kv_rms_norm_rope_cache", {{"avx512_bf16", Isa::kAvx512Bf16, run_tokens<MlaArgs, &Kernels::mla_tokens, kernels_avx512_bf16>},
                                 {"avx512", Isa::kAvx512, run_tokens<MlaArgs, &Kernels::mla_tokens, kernels_avx512>},
                                 {"avx2", Isa::kAvx2, run_tokens<MlaArgs, &Kernels::mla_tokens, kernels_avx2>},
                                 {"scalar", Isa::kScalar, run_tokens<MlaArgs, &Kernels::mla_tokens, kernels_scalar>},
                                 {"reference", Isa::kScalar, mla_reference}});
  return r;
}
const dispatch::Registry<QkvFn>& qkv_registry() {
  static const dispatch::Registry<QkvFn> r(
      "qkv_rope_cache", {{"avx512_bf16", Isa::kAvx512Bf16, run_tokens<QkvArgs, &Kernels::qkv_tokens, kernels_avx512_bf16>},
                         {"avx512", Isa::kAvx512, run_tokens<QkvArgs, &Kernels::qkv_tokens, kernels_avx512>},
                         {"avx2", Isa::kAvx2, run_tokens<QkvArgs, &Kernels::qkv_tokens, kernels_avx2>},
                         {"scalar", Isa::kScalar, run_tokens<QkvArgs, &Kernels::qkv_tokens, kernels_scalar>},
                         {"reference", Isa::kScalar, qkv_reference}});
  return r;
}

}  // namespace kv_detail

Status kv_cache_write(const KvCacheWriteParams& p, Workspace) {
  return kv_detail::run<kv_detail::WriteFn, KvCacheWriteParams, kv_detail::WriteArgs>(kv_detail::write_registry(), p);
}
Status gather_pa_kv_cache(const GatherKvParams& p, Workspace) {
  return kv_detail::run<kv_detail::GatherFn, GatherKvParams, kv_detail::GatherArgs>(kv_detail::gather_registry(), p);
}
Status kv_rms_norm_rope_cache(const KvRmsNormRopeCacheParams& p, Workspace) {
  return kv_detail::run<kv_detail::MlaFn, KvRmsNormRopeCacheParams, kv_detail::MlaArgs>(kv_detail::mla_registry(), p);
}
Status qkv_rope_cache(const QkvRopeCacheParams& p, Workspace) {
  return kv_detail::run<kv_detail::QkvFn, QkvRopeCacheParams, kv_detail::QkvArgs>(kv_detail::qkv_registry(), p);
}

}  // namespace optx
