// `optx bench` rows for the attention family.
//
// flash_attention, bf16, B = 1, 16 heads, D = 128, causal, S = 4096 (and 8192, and f32
// at 4096, outside --quick): optx against `basic` — per head, S = Q K^T with optx's GEMM into a
// materialised [S, S] f32 score matrix, a causal softmax over it written as bf16 P (f32:
// in place), then O = P V with optx's GEMM. FLOPs count the causal half of the square (4 S^2 D H / 2).
// The same shape with a softcap, a bias or a mask tensor: optx against its plain call.
// MQA decode over a contiguous cache (16 query heads, one KV head, Sq = 1 / 4 new tokens,
// S = 16384): a single job, split along the keys; bytes = K / V read (bench_flash_decode).
// peak_bytes: optx's workspace; basic's score + P buffers for one head (it runs heads one
// at a time — all 16 at once would need 16x that).
// paged_decode_attention / mla_decode_attention: bf16 caches, one new token; bytes = the
// K/V (latent) bytes read; sequences rotate over enough copies that the working set
// spans bench::dram_working_set() (twice the LLC). Against `basic` (BasicDecode): gather
// the sequence's blocks into contiguous K / V, then per KV head (and new token) optx's
// GEMM into f32 scores, softmax to bf16 P, optx's GEMM for P V; peak_bytes: its gathered
// copies, scores, P and GEMM workspace. The i8-cache rows' basic dequantises the rows to
// bf16 as it gathers them.
// Where the PyTorch peer is loaded (bench/torch_peer.h), `torch` rows beside them on the
// bf16 one-token and square cases: SDPA on the same buffers, and for the paged caches a
// gather per sequence first (torch_sdpa, torch_paged).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/basic_ops.h"
#include "bench/bench.h"
#include "bench/torch_peer.h"
#include "numerics/quant_i8.h"
#include "ops/attention/attention_internal.h"
#include "optx/gemm.h"
#include "testing/rng.h"

namespace optx::attn_detail {
namespace {

// A BSND view as the [B, N, S, D] view PyTorch's SDPA takes (the same memory, dims 1 and 2
// swapped).
TensorView bnsd(TensorView v) {
  std::swap(v.sizes[1], v.sizes[2]);
  std::swap(v.strides[1], v.strides[2]);
  return v;
}

// PyTorch's scaled_dot_product_attention on flash_attention's BSND q / k / v, where the
// peer is loaded (bench::torch_row, checked against optx's `expect`): params(c) is the
// call on operand copy c of `copies`.
std::vector<bench::Context::Peer> torch_sdpa(const bench::Context& ctx, const bench::Record& optx_rec,
                                             std::function<FlashAttentionParams(int)> params, int copies, const void* expect) {
  const bench::TorchPeer* torch = bench::torch_peer(ctx.threads);
  const FlashAttentionParams p = params(0);
  const int64_t sq = p.q.sizes[1], skv = p.k.sizes[1];
  // PyTorch's is_causal masks from the top left, flash_attention from the bottom right:
  // the same where Sq == Skv, and one query row sees every key either way.
  if (!torch || (p.causal && sq > 1 && sq != skv)) return {};
  const bool causal = p.causal && sq > 1;
  const float scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(float(p.q.sizes[3]));
  auto run = [torch, causal, scale, params](int c, const TensorView& out) {
    const FlashAttentionParams x = params(c);
    return torch->sdpa(bnsd(x.q), bnsd(x.k), bnsd(x.v), out, causal, scale);
  };
  return bench::torch_row(*torch, optx_rec, "sdpa", run, bnsd(p.out), expect, copies);
}

// The decode benches' PyTorch row (TorchPeer::paged_sdpa: gather + attention per
// sequence) on one new token, where the peer is loaded. The views are paged_sdpa's;
// tables(c) gives cache copy c's block tables.
struct PagedViews {
  TensorView q, k_cache, v_cache, lens, out;
  int64_t block_size;
  float scale;
};
std::vector<bench::Context::Peer> torch_paged(const bench::Context& ctx, const bench::Record& optx_rec, const PagedViews& pv,
                                              std::function<TensorView(int)> tables, int copies, const void* expect) {
  const bench::TorchPeer* torch = bench::torch_peer(ctx.threads);
  if (!torch || pv.q.sizes[1] != 1) return {};
  auto run = [torch, pv, tables](int c, const TensorView& out) {
    return torch->paged_sdpa(pv.q, pv.k_cache, pv.v_cache, tables(c), pv.lens, pv.block_size, out, pv.scale);
  };
  auto peers = bench::torch_row(*torch, optx_rec, "paged_sdpa", run, pv.out, expect, copies);
  for (auto& peer : peers) peer.record.note += ", " + std::to_string(copies) + " cache copies rotated";
  return peers;
}

void bench_flash(bench::Context& ctx, int64_t S, DType dt, int64_t H = 16) {
  const int64_t D = 128;
  const bool f32 = dt == DType::kF32;
  const size_t es = dtype_size(dt);
  testing::Rng rng(1);
  bench::Buffer q(size_t(S * H * D) * es), k(q.bytes()), v(q.bytes()), out(q.bytes());
  for (bench::Buffer* x : {&q, &k, &v}) {
    if (f32) testing::fill_f32(x->as<float>(), S * H * D, rng);
    else testing::fill_bf16(x->as<uint16_t>(), S * H * D, rng);
  }
  FlashAttentionParams p{.q = make_view(q.data(), dt, {1, S, H, D}), .k = make_view(k.data(), dt, {1, S, H, D}),
                         .v = make_view(v.data(), dt, {1, S, H, D}), .out = make_view(out.data(), dt, {1, S, H, D}), .causal = true};
  std::vector<uint8_t> ws(flash_attention_workspace_size(p));
  const double flops = 4.0 * double(S) * double(S) * D * H / 2;
  const std::string cs = std::string("dtype=") + dtype_name(dt) + " B=1 H=" + std::to_string(H) + " S=" + std::to_string(S) + " D=128 causal=1";
  const bench::Roof roof = f32 ? bench::Roof::kF32 : bench::Roof::kBF16;
  bench::Record r{.op = "flash_attention", .case_ = cs, .impl = "optx", .roof = roof};
  r.note = selected_impl("flash_attention");
  r.peak_bytes = double(ws.size());
  auto optx_fn = [&] { bench::check(flash_attention(p, {ws.data(), ws.size()})); };

  // basic: per head, scores materialised; P in the inputs' dtype.
  bench::Buffer scores(size_t(S * S) * 4), probs(f32 ? 0 : size_t(S * S) * 2);  // f32: P is the scores
  const float scale = 1.0f / std::sqrt(float(D));
  GemmParams qk{.a = make_view(q.data(), dt, {S, D}, {H * D, 1}), .b = make_view(k.data(), dt, {S, D}, {H * D, 1}),
                .c = make_view(scores.data(), DType::kF32, {S, S}), .alpha = scale};
  GemmParams pv{.a = make_view(f32 ? scores.data() : probs.data(), dt, {S, S}), .b = make_view(v.data(), dt, {S, D}, {H * D, 1}),
                .c = make_view(out.data(), dt, {S, D}, {H * D, 1}), .b_kn = true};
  std::vector<uint8_t> gws(std::max(gemm_workspace_size(qk), gemm_workspace_size(pv)));
  const int th = ctx.threads;
  bench::Record b{.op = "flash_attention", .case_ = cs, .impl = "basic", .roof = roof};
  b.peak_bytes = double(scores.bytes() + probs.bytes() + gws.size());
  b.note = f32 ? "per head: GEMM -> [S,S] f32 scores, causal softmax in place, GEMM"
               : "per head: GEMM -> [S,S] f32 scores, causal softmax -> bf16 P, GEMM";
  auto basic_fn = [&] {
    for (int64_t h = 0; h < H; ++h) {
      GemmParams a = qk, c = pv;
      a.a.data = q.as<uint8_t>() + size_t(h * D) * es;
      a.b.data = k.as<uint8_t>() + size_t(h * D) * es;
      c.b.data = v.as<uint8_t>() + size_t(h * D) * es;
      c.c.data = out.as<uint8_t>() + size_t(h * D) * es;
      bench::check(gemm(a, {gws.data(), gws.size()}));
#pragma omp parallel for num_threads(th) schedule(dynamic, 16)
      for (int64_t i = 0; i < S; ++i) {  // causal softmax of row i over keys 0..i (then bf16)
        float* s = scores.as<float>() + i * S;
        bench::basic::softmax_f32(s, s, i + 1);
        if (f32) {
          std::fill(s + i + 1, s + S, 0.0f);
          continue;
        }
        uint16_t* pr = probs.as<uint16_t>() + i * S;
        bench::basic::f32_to_bf16_op(s, pr, i + 1);
        std::fill(pr + i + 1, pr + S, uint16_t(0));
      }
      bench::check(gemm(c, {gws.data(), gws.size()}));
    }
  };
  // Both write `out`: optx's result is kept aside and compared with basic's first.
  optx_fn();
  const std::vector<uint8_t> optx_out(out.as<uint8_t>(), out.as<uint8_t>() + out.bytes());
  basic_fn();
  bench::expect_agree("flash_attention " + cs, optx_out.data(), out.data(), S * H * D, dt, 3e-2);
  ctx.add_interleaved(r, optx_fn, b, basic_fn, flops, 0, torch_sdpa(ctx, r, [p](int) { return p; }, 1, optx_out.data()));
}

// The logit options on the same shape (bf16, B = 1, 16 heads, D = 128, S = 4096), each
// timed interleaved with the plain causal call, whose time the notes divide by: a softcap
// (Gemma 2's 50), an additive f32 bias [1, 1, S, S], and the causal rule given as an i8
// mask [1, 1, S, S] instead of the flag (the kernel then visits the whole square). FLOPs
// count the causal half throughout, so a row's share of the peak is its useful work.
void bench_flash_logits(bench::Context& ctx) {
  const int64_t S = 4096, H = 16, D = 128;
  testing::Rng rng(2);
  bench::Buffer q(size_t(S * H * D) * 2), k(q.bytes()), v(q.bytes()), out(q.bytes()), bias(size_t(S * S) * 4), mask(size_t(S * S));
  for (bench::Buffer* x : {&q, &k, &v}) testing::fill_bf16(x->as<uint16_t>(), S * H * D, rng);
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < S; ++j) {
      bias.as<float>()[i * S + j] = -0.01f * float(i > j ? i - j : j - i);  // ALiBi-like distance penalty
      mask.as<int8_t>()[i * S + j] = j <= i;
    }
  const FlashAttentionParams plain{.q = make_view(q.data(), DType::kBF16, {1, S, H, D}), .k = make_view(k.data(), DType::kBF16, {1, S, H, D}),
                                   .v = make_view(v.data(), DType::kBF16, {1, S, H, D}),
                                   .out = make_view(out.data(), DType::kBF16, {1, S, H, D}), .causal = true};
  FlashAttentionParams capped = plain, biased = plain, masked = plain;
  capped.softcap = 50.0f;
  biased.bias = make_view(bias.data(), DType::kF32, {1, 1, S, S});
  masked.causal = false;
  masked.mask = make_view(mask.data(), DType::kI8, {1, 1, S, S});
  const FlashAttentionParams* ps[] = {&plain, &capped, &biased, &masked};
  size_t wsb = 0;
  for (const auto* p : ps) wsb = std::max(wsb, flash_attention_workspace_size(*p));
  std::vector<uint8_t> ws(wsb);
  std::vector<std::function<void()>> fns;
  for (const auto* p : ps) fns.push_back([&ws, p] { bench::check(flash_attention(*p, {ws.data(), ws.size()})); });
  const std::vector<bench::Timing> tm = ctx.time_interleaved(fns);
  const double flops = 4.0 * double(S) * double(S) * D * H / 2;
  const char* cases[] = {"softcap=50", "bias=[1,1,S,S]", "causal=0 mask=[1,1,S,S]"};
  for (int i = 0; i < 3; ++i) {
    const std::string what = cases[i];
    bench::Record r{.op = "flash_attention", .case_ = "dtype=bf16 B=1 H=16 S=4096 D=128 " + std::string(i < 2 ? "causal=1 " : "") + what,
                    .impl = "optx", .roof = bench::Roof::kBF16};
    r.peak_bytes = double(ws.size());
    char note[96];
    std::snprintf(note, sizeof note, "; %.2fx the plain causal call's time beside it", tm[size_t(i + 1)].median_ms / tm[0].median_ms);
    r.note = selected_impl("flash_attention") + std::string(note);
    ctx.add(r, tm[size_t(i + 1)], flops, 0);
  }
}

// Enough copies of `bytes` to span bench::dram_working_set(), so rotating them reads
// from DRAM.
int copies_for(double bytes) { return int(std::max<double>(1.0, std::ceil(double(bench::dram_working_set()) / bytes))); }

// Per-token int8 of `rows` rows of `width` bf16 values, with kv_cache_write's quantiser.
void quantize_rows(const uint16_t* x, int64_t rows, int64_t width, int64_t stride, int8_t* q, float* scales) {
  for (int64_t s = 0; s < rows; ++s) numerics::quantize_row_i8(x + s * stride, width, q + s * width, scales + s);
}

// flash_attention as MQA decode over a contiguous cache: bf16, B = 1, 16 query heads on one
// KV head, D = 128, Sq new tokens (causal among them) against S keys, so a single job
// (optx splits its keys across the threads). K / V copies rotate so the bytes come from
// DRAM; bytes = the K and V read. basic: GEMM q K^T -> f32 scores [Sq * 16, S], softmax
// -> bf16 P, GEMM P V.
void bench_flash_decode(bench::Context& ctx, int64_t Sq, int64_t S) {
  const int64_t Hq = 16, D = 128, rows = Sq * Hq, kv_elems = 2 * S * D;
  const double kv_bytes = double(kv_elems * 2), flops = 2.0 * double(rows) * double(S) * double(2 * D);
  const int copies = copies_for(kv_bytes);
  bench::Buffer kv(size_t(copies) * size_t(kv_elems) * 2);  // copy c: K [S, D], then V [S, D]
  testing::Rng rng(3);
  testing::fill_bf16(kv.as<uint16_t>(), copies * kv_elems, rng);
  std::vector<uint16_t> q(size_t(rows * D)), out(q.size()), basic_out(q.size());
  testing::fill_bf16(q.data(), rows * D, rng);
  const auto k_of = [&](int c) { return kv.as<uint16_t>() + size_t(c) * size_t(kv_elems); };
  const auto params = [&](int c) {
    return FlashAttentionParams{.q = make_view(q.data(), DType::kBF16, {1, Sq, Hq, D}), .k = make_view(k_of(c), DType::kBF16, {1, S, 1, D}),
                                .v = make_view(k_of(c) + S * D, DType::kBF16, {1, S, 1, D}),
                                .out = make_view(out.data(), DType::kBF16, {1, Sq, Hq, D}), .causal = true};
  };
  std::vector<uint8_t> ws(flash_attention_workspace_size(params(0)));
  const std::string cs = "dtype=bf16 B=1 Hq=16 Hkv=1 Sq=" + std::to_string(Sq) + " S=" + std::to_string(S) + " D=128 causal=1";
  const std::string key = "flash_attention " + cs;
  bench::Record r{.op = "flash_attention", .case_ = cs, .impl = "optx", .roof = bench::Roof::kMemory};
  r.peak_bytes = double(ws.size());
  r.note = selected_impl("flash_attention") + ", " + std::to_string(copies) + " K / V copies rotated";
  int set = 0, set_b = copies / 2;  // basic half the copies away (see bench_paged)
  auto optx_call = [&] { bench::check(flash_attention(params(set++ % copies), {ws.data(), ws.size()}), key); };

  bench::Buffer scores(size_t(rows * S) * 4), probs(size_t(rows * S) * 2);
  const GemmParams qk{.a = make_view(q.data(), DType::kBF16, {rows, D}), .b = make_view(k_of(0), DType::kBF16, {S, D}),
                      .c = make_view(scores.data(), DType::kF32, {rows, S}), .alpha = 1.0f / std::sqrt(float(D))};
  const GemmParams pv{.a = make_view(probs.data(), DType::kBF16, {rows, S}), .b = make_view(k_of(0) + S * D, DType::kBF16, {S, D}),
                      .c = make_view(basic_out.data(), DType::kBF16, {rows, D}), .b_kn = true};
  std::vector<uint8_t> gws(std::max(gemm_workspace_size(qk), gemm_workspace_size(pv)));
  const int th = ctx.threads;
  bench::Record b{.op = "flash_attention", .case_ = cs, .impl = "basic", .roof = bench::Roof::kMemory};
  b.peak_bytes = double(scores.bytes() + probs.bytes() + gws.size());
  b.note = "GEMM -> [rows, S] f32 scores, causal softmax -> bf16 P, GEMM";
  auto basic_seq = [&](int c) {
    GemmParams a = qk, o = pv;
    a.b.data = k_of(c), o.b.data = k_of(c) + S * D;
    bench::check(gemm(a, {gws.data(), gws.size()}), key);
#pragma omp parallel for num_threads(th) schedule(static)
    for (int64_t row = 0; row < rows; ++row) {  // token row / Hq sees the keys up to its own position
      const int64_t n = S - Sq + 1 + row / Hq;
      float* sr = scores.as<float>() + row * S;
      uint16_t* pr = probs.as<uint16_t>() + row * S;
      bench::basic::softmax_f32(sr, sr, n);
      bench::basic::f32_to_bf16_op(sr, pr, n);
      std::fill(pr + n, pr + S, uint16_t(0));
    }
    bench::check(gemm(o, {gws.data(), gws.size()}), key);
  };
  bench::check(flash_attention(params(0), {ws.data(), ws.size()}), key);
  basic_seq(0);
  bench::expect_agree(key, out.data(), basic_out.data(), int64_t(out.size()), DType::kBF16, 3e-2);
  const std::vector<uint16_t> optx_out = out;
  auto peers = torch_sdpa(ctx, r, params, copies, optx_out.data());
  for (auto& peer : peers) peer.record.note += ", " + std::to_string(copies) + " K / V copies rotated";
  ctx.add_interleaved(r, optx_call, b, [&] { basic_seq(set_b++ % copies); }, flops, kv_bytes, peers);
}

// `basic` decode: the composition a framework runs for one sequence whose KV sits in a
// paged pool. Its keys are first gathered into contiguous [n, heads * D] buffers (one
// memcpy per block), then each query-row group attends over them:
//   S = scale Q K^T     optx GEMM into [rows, n] f32 scores (M = rows, B = K's [n, D] rows),
//   P = softmax(S)      per row, written as bf16,
//   O = P V             optx GEMM, V read as [K = n, N = Dv].
// Buffers (gathered K / V, scores, P, GEMM workspace) are allocated once outside the timed
// calls and sized for the longest row group.
struct BasicDecode {
  int64_t ctx = 0, ld_k = 0, ld_v = 0;
  bench::Buffer k, v, scores, probs;  // v: empty when V is the first Dv values of K's rows
  std::vector<uint8_t> gws;
  int threads = 1;
  const std::string* key = nullptr;  // the case ("op case") a failing GEMM is reported under
  // v_width 0: V is part of K's gathered rows (MLA's latent).
  BasicDecode(int64_t ctx_len, int64_t k_width, int64_t v_width, int64_t rows, int64_t D, int64_t Dv, int th)
      : ctx(ctx_len), ld_k(k_width), ld_v(v_width ? v_width : k_width), k(size_t(ctx_len * k_width) * 2),
        v(size_t(ctx_len * v_width) * 2), scores(size_t(rows * ctx_len) * 4), probs(size_t(rows * ctx_len) * 2), threads(th) {
    gws.resize(std::max(gemm_workspace_size(qk(nullptr, rows, D, 0, ctx_len, 1.0f)),
                        gemm_workspace_size(pv(rows, 0, Dv, ctx_len, nullptr))));
  }
  double bytes() const { return double(k.bytes() + v.bytes() + scores.bytes() + probs.bytes() + gws.size()); }

  // The sequence's first n_blocks blocks of `pool` (blocks of bs rows of `width` bf16
  // values) into dst.
  void gather(const uint16_t* pool, int64_t width, const int32_t* table, int64_t n_blocks, int64_t bs, uint16_t* dst) const {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n_blocks; ++i)
      std::memcpy(dst + i * bs * width, pool + int64_t(table[i]) * bs * width, size_t(bs * width) * 2);
  }
  // The same from an i8 pool (per-token scales): each row dequantised to bf16 on the way,
  // and tail_width bf16 values of the slot's `tail` row copied behind it (MLA's rope part).
  void gather_i8(const int8_t* pool, const float* scales, int64_t width, const int32_t* table, int64_t n_blocks, int64_t bs,
                 uint16_t* dst, const uint16_t* tail = nullptr, int64_t tail_width = 0) const {
    const int64_t ld = width + tail_width;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n_blocks; ++i)
      for (int64_t t = 0; t < bs; ++t) {
        const int64_t slot = int64_t(table[i]) * bs + t;
        uint16_t* row = dst + (i * bs + t) * ld;
        bench::basic::dequant_i8_to_bf16(pool + slot * width, scales[slot], row, width);
        if (tail_width) std::memcpy(row + width, tail + slot * tail_width, size_t(tail_width) * 2);
      }
  }
  // O [rows, Dv] (bf16, contiguous) of q [rows, D] over the first n gathered keys: K's
  // values at k_off in each gathered row, V's at v_off in V's (or K's) rows.
  void attend(uint16_t* q, int64_t rows, int64_t D, int64_t k_off, int64_t v_off, int64_t Dv, int64_t n, float scale,
              uint16_t* out) {
    static const std::string next_row;
    const std::string& case_key = key ? *key : next_row;
    bench::check(gemm(qk(q, rows, D, k_off, n, scale), {gws.data(), gws.size()}), case_key);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* s = scores.as<float>() + r * ctx;
      bench::basic::softmax_f32(s, s, n);
      bench::basic::f32_to_bf16_op(s, probs.as<uint16_t>() + r * ctx, n);
    }
    bench::check(gemm(pv(rows, v_off, Dv, n, out), {gws.data(), gws.size()}), case_key);
  }

 private:
  GemmParams qk(uint16_t* q, int64_t rows, int64_t D, int64_t k_off, int64_t n, float scale) const {
    return {.a = make_view(q, DType::kBF16, {rows, D}), .b = make_view(k.as<uint16_t>() + k_off, DType::kBF16, {n, D}, {ld_k, 1}),
            .c = make_view(scores.data(), DType::kF32, {rows, n}, {ctx, 1}), .alpha = scale};
  }
  GemmParams pv(int64_t rows, int64_t v_off, int64_t Dv, int64_t n, uint16_t* out) const {
    uint16_t* vb = (v.bytes() ? v.as<uint16_t>() : k.as<uint16_t>()) + v_off;
    return {.a = make_view(probs.data(), DType::kBF16, {rows, n}, {ctx, 1}), .b = make_view(vb, DType::kBF16, {n, Dv}, {ld_v, 1}),
            .c = make_view(out, DType::kBF16, {rows, Dv}), .b_kn = true};
  }
};

// GQA decode: B sequences of ctx tokens in a pool; `copies` disjoint sets of block
// tables rotate so the bytes come from DRAM. with_i8: also the i8 caches of the same
// values (kv_cache_write's layout), timed alternately with the bf16 ones. Sq: new tokens per
// sequence (speculative decoding past 1).
void bench_paged(bench::Context& ctx, int64_t B, int64_t ctx_len, bool with_i8, int64_t Sq = 1) {
  const int64_t Hq = 32, Hkv = 8, D = 128, Dv = 128, bs = 16;
  const double kv_bytes = double(B * ctx_len * Hkv * (D + Dv) * 2), i8_bytes = double(B * ctx_len * (Hkv * (D + Dv) + 8));
  const double flops = 2.0 * double(B * Sq * Hq) * double(ctx_len) * double(D + Dv);  // q . k and p . v per (row, key)
  const int copies = copies_for(with_i8 ? i8_bytes : kv_bytes);
  const int64_t blocks_per_seq = ctx_len / bs, slots = blocks_per_seq * B * copies * bs;
  bench::Buffer kc(size_t(slots * Hkv * D) * 2), vc(size_t(slots * Hkv * Dv) * 2);
  testing::Rng rng(2);
  testing::fill_bf16(kc.as<uint16_t>(), slots * Hkv * D, rng);
  testing::fill_bf16(vc.as<uint16_t>(), slots * Hkv * Dv, rng);
  std::unique_ptr<bench::Buffer> k8, v8, ks, vs;
  if (with_i8) {
    k8 = std::make_unique<bench::Buffer>(size_t(slots * Hkv * D)), v8 = std::make_unique<bench::Buffer>(size_t(slots * Hkv * Dv));
    ks = std::make_unique<bench::Buffer>(size_t(slots) * 4), vs = std::make_unique<bench::Buffer>(size_t(slots) * 4);
    quantize_rows(kc.as<uint16_t>(), slots, Hkv * D, Hkv * D, k8->as<int8_t>(), ks->as<float>());
    quantize_rows(vc.as<uint16_t>(), slots, Hkv * Dv, Hkv * Dv, v8->as<int8_t>(), vs->as<float>());
  }
  auto tables = bench::disjoint_tables(copies, B * blocks_per_seq, rng);
  std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(ctx_len));
  std::vector<uint16_t> q(size_t(B * Sq * Hq * D)), out(size_t(B * Sq * Hq * Dv));
  testing::fill_bf16(q.data(), B * Sq * Hq * D, rng);
  const char* op = "paged_decode_attention";
  const std::string shape = "B=" + std::to_string(B) + " Hq=32 Hkv=8 D=128 ctx=" + std::to_string(ctx_len) + (Sq > 1 ? " Sq=" + std::to_string(Sq) : "");
  bench::Record r{.op = op, .case_ = "dtype=bf16 " + shape, .impl = "optx", .roof = bench::Roof::kMemory};
  bench::Record r8{.op = op, .case_ = "dtype=bf16 cache=i8 " + shape, .impl = "optx", .roof = bench::Roof::kMemory};
  auto params = [&](bool i8, int c) {
    PagedDecodeParams p{.q = make_view(q.data(), DType::kBF16, {B, Sq, Hq, D}),
                        .k_cache = make_view(kc.data(), DType::kBF16, {slots, Hkv * D}),
                        .v_cache = make_view(vc.data(), DType::kBF16, {slots, Hkv * Dv}),
                        .block_tables = make_view(tables[size_t(c)].data(), DType::kI32, {B, blocks_per_seq}),
                        .seq_lens = make_view(lens.data(), DType::kI32, {B}), .block_size = bs, .kv_heads = Hkv,
                        .out = make_view(out.data(), DType::kBF16, {B, Sq, Hq, Dv})};
    if (i8) {
      p.k_cache = make_view(k8->data(), DType::kI8, {slots, Hkv * D}), p.v_cache = make_view(v8->data(), DType::kI8, {slots, Hkv * Dv});
      p.k_scales = make_view(ks->data(), DType::kF32, {slots}), p.v_scales = make_view(vs->data(), DType::kF32, {slots});
    }
    return p;
  };
  std::vector<uint8_t> ws(paged_decode_attention_workspace_size(params(with_i8, 0)));
  r.peak_bytes = r8.peak_bytes = double(ws.size());
  const std::string note = std::string(selected_impl(op)) + ", " + std::to_string(copies) + " cache copies rotated";
  r.note = note;
  // basic starts half the copies away: interleaved with optx on the same copy, it would
  // read the cache optx streamed a moment before, partly still in the last-level cache.
  int set = 0, set8 = 0, set_b = copies / 2;
  // bf16 and i8 caches are timed together: each call's error names its own case.
  const std::string key = std::string(op) + " " + r.case_, key8 = std::string(op) + " " + r8.case_;
  auto bf16_call = [&] { bench::check(paged_decode_attention(params(false, set++ % copies), {ws.data(), ws.size()}), key); };

  const int64_t G = Hq / Hkv;
  BasicDecode basic(ctx_len, Hkv * D, Hkv * Dv, G, D, Dv, ctx.threads);
  std::vector<uint16_t> basic_out(out.size());
  bench::Record b{.op = op, .case_ = r.case_, .impl = "basic", .roof = bench::Roof::kMemory};
  b.peak_bytes = basic.bytes();
  b.note = "per sequence: gather blocks -> contiguous K, V; per KV head and new token: GEMM -> f32 scores, softmax -> bf16 P, GEMM";
  // i8: the blocks dequantised to bf16 while gathered, then the same.
  auto basic_seqs = [&](bool i8, int c) {
    basic.key = i8 ? &key8 : &key;
    const float scale = 1.0f / std::sqrt(float(D));
    for (int64_t s = 0; s < B; ++s) {
      const int32_t* table = tables[size_t(c)].data() + s * blocks_per_seq;
      if (i8) {
        basic.gather_i8(k8->as<int8_t>(), ks->as<float>(), Hkv * D, table, blocks_per_seq, bs, basic.k.as<uint16_t>());
        basic.gather_i8(v8->as<int8_t>(), vs->as<float>(), Hkv * Dv, table, blocks_per_seq, bs, basic.v.as<uint16_t>());
      } else {
        basic.gather(kc.as<uint16_t>(), Hkv * D, table, blocks_per_seq, bs, basic.k.as<uint16_t>());
        basic.gather(vc.as<uint16_t>(), Hkv * Dv, table, blocks_per_seq, bs, basic.v.as<uint16_t>());
      }
      for (int64_t t = 0; t < Sq; ++t)  // new token t sees the keys up to its own position
        for (int64_t g = 0; g < Hkv; ++g) {
          const int64_t row = (s * Sq + t) * Hq + g * G;
          basic.attend(q.data() + row * D, G, D, g * D, g * Dv, Dv, ctx_len - Sq + 1 + t, scale, basic_out.data() + row * Dv);
        }
    }
  };
  auto basic_call = [&] { basic_seqs(false, set_b++ % copies); };
  // optx against basic on the same cache copy before timing (each cache kind).
  auto agree = [&](bool i8, const std::string& k) {
    bench::check(paged_decode_attention(params(i8, 0), {ws.data(), ws.size()}), k);
    basic_seqs(i8, 0);
    bench::expect_agree(k, out.data(), basic_out.data(), int64_t(out.size()), DType::kBF16, 3e-2);
  };
  agree(false, key);
  const std::vector<uint16_t> optx_out = out;
  if (with_i8) agree(true, key8);
  const PagedViews pv{.q = make_view(q.data(), DType::kBF16, {B, Sq, Hq, D}),
                      .k_cache = make_view(kc.data(), DType::kBF16, {slots, Hkv, D}),
                      .v_cache = make_view(vc.data(), DType::kBF16, {slots, Hkv, Dv}),
                      .lens = make_view(lens.data(), DType::kI32, {B}),
                      .out = make_view(out.data(), DType::kBF16, {B, Sq, Hq, Dv}), .block_size = bs, .scale = 1.0f / std::sqrt(float(D))};
  const auto peers = torch_paged(
      ctx, r, pv, [&](int c) { return make_view(tables[size_t(c)].data(), DType::kI32, {B, blocks_per_seq}); }, copies, optx_out.data());
  if (!with_i8) {
    ctx.add_interleaved(r, bf16_call, b, basic_call, flops, kv_bytes, peers);
    return;
  }
  int set_b8 = copies / 2;
  bench::Record b8{.op = op, .case_ = r8.case_, .impl = "basic", .roof = bench::Roof::kMemory};
  b8.peak_bytes = basic.bytes();
  b8.note = "as the bf16 cache's basic, the rows dequantised to bf16 while gathered";
  std::vector<std::function<void()>> fns = {bf16_call,
                                             [&] { bench::check(paged_decode_attention(params(true, set8++ % copies), {ws.data(), ws.size()}), key8); },
                                             basic_call, [&] { basic_seqs(true, set_b8++ % copies); }};
  for (const auto& peer : peers) fns.push_back(peer.fn);
  const auto tm = ctx.time_interleaved(fns);
  char ratio[64];
  std::snprintf(ratio, sizeof(ratio), "; i8 %.2fx the bf16 cache's tokens/s", tm[0].median_ms / tm[1].median_ms);
  r8.note = note + ratio;
  ctx.add(r, tm[0], flops, kv_bytes);
  ctx.add(r8, tm[1], flops, i8_bytes);
  ctx.add(b, tm[2], flops, kv_bytes);
  ctx.add(b8, tm[3], flops, i8_bytes);
  for (size_t i = 0; i < peers.size(); ++i) ctx.add(peers[i].record, tm[4 + i], flops, kv_bytes);
}

// MLA decode, 16 heads, latent 512 + 64, one sequence: the bf16 cache and the i8 layout
// (per-token scales, bf16 rope part) of the same values, timed alternately; each row's
// bytes are what its cache holds for the context. Sq > 1 (DeepSeek-V3's multi-token
// prediction: 2): the bf16 cache only.
void bench_mla(bench::Context& ctx, int64_t ctx_len, int64_t Sq = 1) {
  const int64_t H = 16, D = 576, Dv = 512, R = D - Dv, bs = 64;
  const double bf16_bytes = double(ctx_len * D * 2), i8_bytes = double(ctx_len * (Dv + 4 + R * 2));
  const double flops = 2.0 * double(H * Sq) * double(ctx_len) * double(D + Dv);  // q . latent+rope and p . latent per (row, key)
  const bool with_i8 = Sq == 1;
  const int copies = copies_for(with_i8 ? i8_bytes : bf16_bytes);  // the i8 count is >= the bf16 cache's
  const int64_t blocks = ctx_len / bs, slots = blocks * copies * bs;
  bench::Buffer kc(size_t(slots * D) * 2);
  testing::Rng rng(2);
  testing::fill_bf16(kc.as<uint16_t>(), slots * D, rng);
  // The i8 layout of the same rows: the latent quantised, the rope part copied.
  std::unique_ptr<bench::Buffer> lat, sc, rc;
  if (with_i8) {
    lat = std::make_unique<bench::Buffer>(size_t(slots * Dv)), sc = std::make_unique<bench::Buffer>(size_t(slots) * 4);
    rc = std::make_unique<bench::Buffer>(size_t(slots * R) * 2);
    quantize_rows(kc.as<uint16_t>(), slots, Dv, D, lat->as<int8_t>(), sc->as<float>());
    for (int64_t s = 0; s < slots; ++s) std::copy(kc.as<uint16_t>() + s * D + Dv, kc.as<uint16_t>() + (s + 1) * D, rc->as<uint16_t>() + s * R);
  }
  auto tables = bench::disjoint_tables(copies, blocks, rng);
  std::vector<int32_t> lens = {int32_t(ctx_len)};
  std::vector<uint16_t> q(size_t(Sq * H * D)), out(size_t(Sq * H * Dv));
  testing::fill_bf16(q.data(), Sq * H * D, rng);
  constexpr float kScale = 0.1f;  // optx's and basic's
  auto params = [&](bool i8, int c) {
    MlaDecodeParams p{.q = make_view(q.data(), DType::kBF16, {1, Sq, H, D}), .cache = make_view(kc.data(), DType::kBF16, {slots, D}),
                      .block_tables = make_view(tables[size_t(c)].data(), DType::kI32, {1, blocks}),
                      .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = bs, .kv_lora_rank = Dv,
                      .out = make_view(out.data(), DType::kBF16, {1, Sq, H, Dv}), .scale = kScale};
    if (i8) {
      p.cache = make_view(lat->data(), DType::kI8, {slots, Dv});
      p.cache_scales = make_view(sc->data(), DType::kF32, {slots});
      p.rope_cache = make_view(rc->data(), DType::kBF16, {slots, R});
    }
    return p;
  };
  const char* op = "mla_decode_attention";
  const std::string shape = "B=1 H=16 D=576 ctx=" + std::to_string(ctx_len) + (Sq > 1 ? " Sq=" + std::to_string(Sq) : "");
  bench::Record r{.op = op, .case_ = "dtype=bf16 " + shape, .impl = "optx", .roof = bench::Roof::kMemory};
  bench::Record r8{.op = op, .case_ = "dtype=bf16 cache=i8 " + shape, .impl = "optx", .roof = bench::Roof::kMemory};
  std::vector<uint8_t> ws(std::max(mla_decode_attention_workspace_size(params(false, 0)),
                                   with_i8 ? mla_decode_attention_workspace_size(params(true, 0)) : size_t(0)));
  r.peak_bytes = r8.peak_bytes = double(ws.size());
  r.note = std::string(selected_impl(op)) + ", " + std::to_string(copies) + " cache copies rotated";
  BasicDecode basic(ctx_len, D, 0, H, D, Dv, ctx.threads);
  std::vector<uint16_t> basic_out(out.size());
  bench::Record b{.op = op, .case_ = r.case_, .impl = "basic", .roof = bench::Roof::kMemory};
  b.peak_bytes = basic.bytes();
  b.note = "gather blocks -> contiguous latent; GEMM -> f32 scores, softmax -> bf16 P, GEMM with the latent as V";
  bench::Record b8{.op = op, .case_ = r8.case_, .impl = "basic", .roof = bench::Roof::kMemory};
  b8.peak_bytes = basic.bytes();
  b8.note = "as the bf16 cache's basic, the latent dequantised to bf16 (and the rope part copied) while gathered";
  // basic starts half the copies away (see bench_paged).
  int set = 0, set8 = 0, set_b = copies / 2, set_b8 = copies / 2;
  // bf16 and i8 caches are timed together: each call's error names its own case.
  const std::string key = std::string(op) + " " + r.case_, key8 = std::string(op) + " " + r8.case_;
  auto basic_call = [&](bool i8, int c) {
    basic.key = i8 ? &key8 : &key;
    if (i8)
      basic.gather_i8(lat->as<int8_t>(), sc->as<float>(), Dv, tables[size_t(c)].data(), blocks, bs, basic.k.as<uint16_t>(),
                      rc->as<uint16_t>(), R);
    else
      basic.gather(kc.as<uint16_t>(), D, tables[size_t(c)].data(), blocks, bs, basic.k.as<uint16_t>());
    for (int64_t t = 0; t < Sq; ++t)  // new token t sees the keys up to its own position
      basic.attend(q.data() + t * H * D, H, D, 0, 0, Dv, ctx_len - Sq + 1 + t, kScale, basic_out.data() + t * H * Dv);
  };
  // optx against basic on the same cache copy before timing (each cache kind); the bf16
  // cache's output kept for the PyTorch row's check.
  std::vector<uint16_t> optx_out;
  for (bool i8 : {false, true}) {
    if (i8 && !with_i8) break;
    const std::string& k = i8 ? key8 : key;
    bench::check(mla_decode_attention(params(i8, 0), {ws.data(), ws.size()}), k);
    if (!i8) optx_out = out;
    basic_call(i8, 0);
    bench::expect_agree(k, out.data(), basic_out.data(), int64_t(out.size()), DType::kBF16, 3e-2);
  }
  // PyTorch on the bf16 latent: K the whole rows, V their first Dv columns.
  const PagedViews pv{.q = make_view(q.data(), DType::kBF16, {1, Sq, H, D}),
                      .k_cache = make_view(kc.data(), DType::kBF16, {slots, 1, D}),
                      .v_cache = make_view(kc.data(), DType::kBF16, {slots, 1, Dv}, {D, D, 1}),
                      .lens = make_view(lens.data(), DType::kI32, {1}),
                      .out = make_view(out.data(), DType::kBF16, {1, Sq, H, Dv}), .block_size = bs, .scale = kScale};
  const auto peers = torch_paged(
      ctx, r, pv, [&](int c) { return make_view(tables[size_t(c)].data(), DType::kI32, {1, blocks}); }, copies, optx_out.data());
  const auto bf16_call = [&] { bench::check(mla_decode_attention(params(false, set++ % copies), {ws.data(), ws.size()}), key); };
  if (!with_i8) {
    ctx.add_interleaved(r, bf16_call, b, [&] { basic_call(false, set_b++ % copies); }, flops, bf16_bytes, peers);
    return;
  }
  std::vector<std::function<void()>> fns = {
      bf16_call,
      [&] { bench::check(mla_decode_attention(params(true, set8++ % copies), {ws.data(), ws.size()}), key8); },
      [&] { basic_call(false, set_b++ % copies); },
      [&] { basic_call(true, set_b8++ % copies); },
  };
  for (const auto& peer : peers) fns.push_back(peer.fn);
  const auto tm = ctx.time_interleaved(fns);
  char note[96];
  std::snprintf(note, sizeof(note), ", %d cache copies rotated; i8 %.2fx the bf16 cache's tokens/s", copies, tm[0].median_ms / tm[1].median_ms);
  r8.note = std::string(selected_impl(op)) + note;
  ctx.add(r, tm[0], flops, bf16_bytes);
  ctx.add(r8, tm[1], flops, i8_bytes);
  ctx.add(b, tm[2], flops, bf16_bytes);
  ctx.add(b8, tm[3], flops, i8_bytes);
  for (size_t i = 0; i < peers.size(); ++i) ctx.add(peers[i].record, tm[4 + i], flops, bf16_bytes);
}

void bench_attention(bench::Context& ctx) {
  if (ctx.wants("flash_attention")) {
    bench_flash(ctx, 4096, DType::kBF16);
    bench_flash(ctx, 256, DType::kBF16, 1);  // a call of few jobs (job heights chosen by schedule)
    bench_flash_decode(ctx, 1, 16384);        // one job: its keys split across the threads
    if (!ctx.quick) bench_flash_decode(ctx, 4, 16384);
    if (!ctx.quick) bench_flash(ctx, 8192, DType::kBF16);
    if (!ctx.quick) bench_flash(ctx, 4096, DType::kF32);
    if (!ctx.quick) bench_flash_logits(ctx);
  }
  if (ctx.wants("paged_decode_attention")) {
    for (int64_t c : {8192, 32768}) bench_paged(ctx, 1, c, true);
    bench_paged(ctx, 8, 8192, false);
    if (!ctx.quick) bench_paged(ctx, 8, 32768, false);
    if (!ctx.quick) bench_paged(ctx, 1, 32768, false, 2);  // speculative decoding: 2 new tokens
    if (!ctx.quick) bench_paged(ctx, 1, 8192, true, 4);    // 4: 16 rows per KV head, bf16 and i8 caches
  }
  if (ctx.wants("mla_decode_attention")) {
    for (int64_t c : {8192, 32768}) bench_mla(ctx, c);
    if (!ctx.quick) bench_mla(ctx, 8192, 2);  // multi-token prediction: 2 new tokens
  }
}

OPTX_REGISTER_BENCH("flash_attention|paged_decode_attention|mla_decode_attention", bench_attention);

}  // namespace
}  // namespace optx::attn_detail
