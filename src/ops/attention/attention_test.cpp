// Attention family: every runnable implementation against a naive double-precision
// softmax(q k^T) v on edge cases (lengths up to 1023, head dims, GQA ratios, layouts,
// strided views, explicit scale, masks and biases in every broadcast shape, windows that
// hide whole rows, sinks, softcap, large logits, empty sequences, no lse), split vs
// unsplit decode, attention_update against a merge in double, bad inputs.
#include <gtest/gtest.h>
#include <omp.h>
#include <xmmintrin.h>

#include <cmath>

#include <algorithm>
#include <numeric>
#include <tuple>

#include "ops/attention/attention_testutil.h"
#include "testing/alloc_count.h"
#include "optx/kv_cache.h"
#include "optx/rope.h"

namespace optx::attn_detail {
namespace {

using testutil::DecodeCase;
using testutil::FlashCase;

// A run at 2 threads, which splits the keys, against the same case at 1: both pass the
// reference, the 2-thread workspace holds partials (per-thread scratch S and alignment A:
// one = S + A, two = 2 S + A + the partials), and out / lse agree within the f32 merge's
// rounding.
void expect_split_agrees(const std::string& what, DType dt, const testutil::Outcome& one, const testutil::Outcome& two) {
  ASSERT_TRUE(one.pass() && two.pass()) << what << ": " << one.message() << " / " << two.message();
  EXPECT_GT(two.ws_bytes + kAlign, 2 * one.ws_bytes) << what << ": no split planned at 2 threads";
  const double tol = dt == DType::kF32 ? 1e-5 : 2 * testing::kEpsBF16;
  double mx = 0;
  for (double v : one.got_out) mx = std::max(mx, std::fabs(v));
  const auto agree = testing::compare(two.got_out, one.got_out, {tol * mx, tol});
  EXPECT_TRUE(agree.pass) << what << ": split vs unsplit: " << agree.message;
  EXPECT_TRUE(testing::compare(two.got_lse, one.got_lse, {1e-5, 1e-6}).pass) << what;
}

void expect_all(const std::vector<FlashCase>& cases) {
  for (const auto* impl : flash_registry().runnable())
    for (const FlashCase& c : cases) {
      const auto o = testutil::run_flash(*impl, c, uint64_t(c.Sq * 31 + c.Skv + c.D));
      EXPECT_TRUE(o.pass()) << impl->name << " " << c.name() << ": " << o.message();
    }
}

TEST(FlashAttention, ShapesLayoutsAndGqa) {
  std::vector<FlashCase> cs;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto [Sq, Skv, D, Dv, Nq, Nkv] : {std::tuple{1, 1, 64, 64, 1, 1}, {17, 17, 80, 80, 3, 1}, {1, 113, 128, 128, 8, 2},
                                          {17, 113, 96, 96, 4, 1}, {113, 17, 64, 64, 8, 1}, {5, 70, 192, 128, 4, 4}})
      for (AttnLayout l : {AttnLayout::kBSND, AttnLayout::kBNSD}) {
        FlashCase c;
        c.dtype = dt, c.layout = l, c.Sq = Sq, c.Skv = Skv, c.D = D, c.Dv = Dv, c.Nq = Nq, c.Nkv = Nkv, c.B = Sq == 1 ? 3 : 1;
        c.causal = Skv % 2 == 1;
        cs.push_back(c);
      }
  expect_all(cs);
}

TEST(FlashAttention, MasksWindowsSinksSoftcap) {
  std::vector<FlashCase> cs;
  FlashCase c;
  c.Sq = 17, c.Skv = 40, c.Nq = 4, c.Nkv = 2;
  c.causal = true, c.wl = 5;  // sliding window (left) with causal
  cs.push_back(c);
  c.causal = false, c.wl = 3, c.wr = 2;  // two-sided window
  cs.push_back(c);
  c.wl = -1, c.wr = -1, c.mask = true, c.bias = true;  // bool mask (row 0 fully hidden) + additive bias
  cs.push_back(c);
  c.mask = false, c.bias = false, c.sinks = true, c.softcap = 5.0f;
  cs.push_back(c);
  c.sinks = false, c.softcap = 0, c.causal = true, c.Sq = 17, c.Skv = 5;  // first 12 rows see no key
  cs.push_back(c);
  c.causal = false, c.Skv = 9, c.magnitude = 1e4f, c.dtype = DType::kBF16;  // logits ~ +-1e4 stay finite
  cs.push_back(c);
  c.magnitude = 1.0f, c.sinks = true, c.mask = true, c.Skv = 40, c.dtype = DType::kF32;  // masked rows with a sink
  cs.push_back(c);
  expect_all(cs);
}

// Prefill whose query tiles share K / V (more than one tile per head; AVX2 tiles hold up
// to 96 rows, the `avx512` GEMM prefill's 192): head dims with a partial 64-column piece, D != Dv, a key count off the
// 8-key and 64-key grids, row counts off the 6-row slices, GQA rows, and the softmax
// options on top.
TEST(FlashAttention, LongPrefillTilesSharingKv) {
  std::vector<FlashCase> cs;
  for (auto [Sq, Skv, D, Dv, Nq, Nkv] : {std::tuple{200, 203, 192, 48, 2, 2}, {131, 131, 80, 112, 6, 2}, {250, 97, 16, 16, 1, 1},
                                                         {397, 401, 80, 112, 2, 1}}) {
    FlashCase c;
    c.dtype = DType::kBF16, c.Sq = Sq, c.Skv = Skv, c.D = D, c.Dv = Dv, c.Nq = Nq, c.Nkv = Nkv, c.causal = true;
    cs.push_back(c);
  }
  FlashCase c;
  c.dtype = DType::kBF16, c.Sq = 150, c.Skv = 150, c.Nq = 2, c.Nkv = 1, c.D = 64, c.Dv = 64;
  c.mask = true, c.bias = true, c.softcap = 5.0f, c.sinks = true;
  cs.push_back(c);
  c.mask = false, c.bias = false, c.softcap = 0.0f, c.sinks = false, c.causal = true, c.wl = 70, c.wr = 0;
  cs.push_back(c);
  // MHA with a 60-key window: a 96-row job's three 32-row groups reach different keys, the
  // first none of its second superblock.
  c.Sq = 400, c.Skv = 400, c.Nq = 1, c.Nkv = 1, c.wl = 60;
  cs.push_back(c);
  // A softcap over logits from ~0 (tanh's series) to far past it (saturated), D = 128.
  c.causal = false, c.wl = -1, c.wr = -1, c.Sq = 70, c.Skv = 300, c.Nq = 4, c.Nkv = 1, c.D = 128, c.Dv = 128;
  c.softcap = 2.0f, c.magnitude = 20.0f, c.bias = true;
  cs.push_back(c);
  expect_all(cs);
}

TEST(FlashAttention, VarlenWithEmptySequences) {
  FlashCase c;
  c.layout = AttnLayout::kTND;
  c.Nq = 6, c.Nkv = 2, c.D = 64, c.Dv = 64, c.causal = true;
  c.lens_q = {5, 0, 17, 1, 0}, c.lens_kv = {9, 4, 17, 33, 0};
  expect_all({c});
  c.dtype = DType::kBF16, c.causal = false, c.wl = 4;
  expect_all({c});
}

// Fewer jobs than threads (a few query rows against long keys) split the keys at 2
// threads: every implementation against the reference at 1 and 2 threads, the split run
// asking for its partials (a larger workspace) and agreeing with the unsplit one. Sinks
// join one split only; a window leaves some rows no key in a split; D != Dv; a varlen
// batch with an empty sequence; fully masked rows; three jobs on two threads.
TEST(FlashAttention, FewRowsSplitTheKeys) {
  std::vector<FlashCase> cs;
  FlashCase c;
  c.Sq = 1, c.Skv = 700, c.Nq = 8, c.Nkv = 1, c.D = c.Dv = 64, c.causal = true, c.sinks = true;
  cs.push_back(c);
  c.dtype = DType::kBF16;
  cs.push_back(c);
  c.sinks = false, c.Sq = 4, c.Skv = 2000, c.Nq = 16, c.wl = 600, c.softcap = 4.0f, c.bias = true;
  cs.push_back(c);
  c.softcap = 0.0f, c.bias = false, c.wl = -1, c.mask = true, c.sinks = true;  // row 0 fully hidden, with a sink
  cs.push_back(c);
  c.mask = false, c.sinks = false, c.causal = false, c.wl = -1, c.Sq = 3, c.Skv = 600, c.Nq = c.Nkv = 1, c.D = 128, c.Dv = 96;
  cs.push_back(c);
  c.dtype = DType::kF32, c.layout = AttnLayout::kTND, c.causal = true, c.Nq = 4, c.D = c.Dv = 64;
  c.lens_q = {2, 0}, c.lens_kv = {900, 5};
  cs.push_back(c);
  c.lens_q = {2, 0, 1}, c.lens_kv = {900, 5, 0};  // queries without keys: every split empty (out 0, lse -inf)
  cs.push_back(c);
  // Three jobs on two threads (they do not share out evenly): split too.
  c.layout = AttnLayout::kBSND, c.lens_q.clear(), c.lens_kv.clear(), c.B = 3, c.Sq = 1, c.Skv = 700, c.Nq = 8, c.sinks = true;
  cs.push_back(c);
  for (const auto* impl : flash_registry().runnable())
    for (const FlashCase& fc : cs) {
      set_num_threads(1);
      const auto one = testutil::run_flash(*impl, fc, 5);
      set_num_threads(2);
      const auto two = testutil::run_flash(*impl, fc, 5);
      set_num_threads(0);
      expect_split_agrees(impl->name + std::string(" ") + fc.name(), fc.dtype, one, two);
    }
}

// A workspace sized for more threads serves fewer, KV-split partials included: sized at
// 65 threads (past FlashJobs::kEstThreads, where a call does not split), it serves a
// 64-thread call, whose 64 splits' partials (128 rows) outweigh a thread's scratch, and
// a 2-thread one; the two agree within the merge's rounding.
TEST(FlashAttention, WorkspaceSizedForMoreThreadsServesFewer) {
  const int64_t Skv = 16384, Nq = 128, D = 64;
  testing::Rng rng(12);
  std::vector<uint16_t> q(size_t(Nq * D)), kv(size_t(2 * Skv * D)), out(q.size());
  for (auto* x : {&q, &kv})
    for (auto& e : *x) e = f32_to_bf16(rng.uniform());
  const FlashAttentionParams p{.q = make_view(q.data(), DType::kBF16, {1, 1, Nq, D}),
                               .k = make_view(kv.data(), DType::kBF16, {1, Skv, 1, D}),
                               .v = make_view(kv.data() + Skv * D, DType::kBF16, {1, Skv, 1, D}),
                               .out = make_view(out.data(), DType::kBF16, {1, 1, Nq, D}), .causal = true};
  size_t bytes = 0;
  {
    ThreadScope many(65);
    bytes = flash_attention_workspace_size(p);
  }
  std::vector<uint8_t> ws(bytes);
  std::vector<double> first;
  for (int threads : {64, 2}) {
    ThreadScope scope(threads);
    const Status st = flash_attention(p, {ws.data(), ws.size()});
    ASSERT_TRUE(st.ok()) << threads << " threads: " << st.message();
    std::vector<double> got(out.size());
    for (size_t i = 0; i < out.size(); ++i) got[i] = bf16_to_f32(out[i]);
    if (first.empty()) first = got;
    else EXPECT_TRUE(testing::compare(got, first, {2 * testing::kEpsBF16, 2 * testing::kEpsBF16}).pass) << threads << " threads";
  }
}

// TND with a mask / bias: per sequence, padded past the longest sequence (Sq, Skv here
// are the padded sizes), indexed by positions within each sequence; every broadcast shape.
TEST(FlashAttention, VarlenWithPaddedMaskAndBias) {
  std::vector<FlashCase> cs;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int shape = 0; shape < 4; ++shape) {
      FlashCase c;
      c.dtype = dt, c.layout = AttnLayout::kTND, c.Nq = 4, c.Nkv = 2;
      c.lens_q = {5, 0, 17, 3}, c.lens_kv = {9, 4, 17, 33};
      c.Sq = 20, c.Skv = 36;  // padded: longest q 17, kv 33
      c.B = 4;
      c.mask = true, c.bias = shape != 3, c.causal = shape == 1;
      c.mask_b = shape % 2 == 0, c.mask_h = shape >= 2, c.bias_b = shape != 0, c.bias_h = shape % 2 == 1;
      cs.push_back(c);
    }
  expect_all(cs);
  // A mask shorter than the longest sequence is an error naming the rule.
  std::vector<float> q(6 * 2 * 8), k(6 * 2 * 8), out(6 * 2 * 8);
  std::vector<int8_t> m(1 * 1 * 4 * 6, 1);
  std::vector<int32_t> cq = {0, 1, 6}, ck = {0, 2, 6};
  std::vector<uint8_t> ws(1 << 20);
  FlashAttentionParams t{.q = make_view(q.data(), DType::kF32, {6, 2, 8}), .k = make_view(k.data(), DType::kF32, {6, 2, 8}),
                         .v = make_view(k.data(), DType::kF32, {6, 2, 8}), .out = make_view(out.data(), DType::kF32, {6, 2, 8}),
                         .layout = AttnLayout::kTND, .cu_seqlens_q = make_view(cq.data(), DType::kI32, {3}),
                         .cu_seqlens_kv = make_view(ck.data(), DType::kI32, {3}), .mask = make_view(m.data(), DType::kI8, {1, 1, 4, 6})};
  const Status st = flash_attention(t, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("mask.sizes=[1, 1, 4, 6] must broadcast to [B=2, Nq=2, Sq>=5, Skv>=4] (TND: per sequence"),
            std::string::npos)
      << st.message();
  t.mask = make_view(m.data(), DType::kI8, {1, 1, 5, 4});
  EXPECT_TRUE(flash_attention(t, {ws.data(), ws.size()}).ok());
}

TEST(FlashAttention, FullyMaskedRowsGiveZeroAndMinusInf) {
  // causal with Sq > Skv: rows 0..Sq-Skv-1 see nothing.
  std::vector<float> q(8 * 16, 1.0f), k(2 * 16, 1.0f), v(2 * 16, 3.0f), out(8 * 16, NAN), lse(8, 0.0f);
  FlashAttentionParams p{.q = make_view(q.data(), DType::kF32, {1, 8, 1, 16}), .k = make_view(k.data(), DType::kF32, {1, 2, 1, 16}),
                         .v = make_view(v.data(), DType::kF32, {1, 2, 1, 16}), .out = make_view(out.data(), DType::kF32, {1, 8, 1, 16}),
                         .lse = make_view(lse.data(), DType::kF32, {1, 1, 8}), .causal = true};
  std::vector<uint8_t> ws(flash_attention_workspace_size(p));
  ASSERT_TRUE(flash_attention(p, {ws.data(), ws.size()}).ok());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(lse[size_t(i)], -INFINITY) << i;
    for (int d = 0; d < 16; ++d) EXPECT_EQ(out[size_t(i * 16 + d)], 0.0f);
  }
  EXPECT_NEAR(out[6 * 16], 3.0f, 1e-6);
  EXPECT_NEAR(lse[7], std::log(2.0) + 16.0 / 4.0, 1e-5);  // two keys, score 16 / sqrt(16)
}

// A row's diagonal sits at key i + Skv - Sq (bottom-right alignment), so with Sq > Skv a
// window that ends at most `right` keys past the diagonal ends before key 0 for the top
// rows: they see nothing and must give out = 0, lse = -inf (no NaN), while later rows of
// the same job tile see a few keys. (With Sq <= Skv a window always holds the diagonal.)
TEST(FlashAttention, WindowsThatHideWholeRows) {
  std::vector<FlashCase> cs;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (AttnLayout l : {AttnLayout::kBSND, AttnLayout::kBNSD})
      // rows 0..58 empty: three whole 16-row tiles (Nq/Nkv = 2) and part of a fourth
      for (auto [Sq, Skv, Nq, Nkv, wl, wr] : {std::tuple{70, 9, 2, 1, 3, 2},
                                             {40, 17, 4, 2, 0, 0},      // one key per row (the diagonal), rows 0..22 empty
                                             {33, 8, 4, 4, -1, 1}}) {  // right edge only: rows 0..23 empty
        FlashCase c;
        c.dtype = dt, c.layout = l, c.Sq = Sq, c.Skv = Skv, c.Nq = Nq, c.Nkv = Nkv, c.wl = wl, c.wr = wr;
        cs.push_back(c);
      }
  FlashCase c;  // the same with sinks: empty rows give out = 0, lse = sink
  c.Sq = 70, c.Skv = 9, c.Nq = 2, c.Nkv = 1, c.wl = 3, c.wr = 2, c.sinks = true;
  cs.push_back(c);
  FlashCase t;  // varlen: sequence 0 and 2 have empty top rows, sequence 1 none
  t.layout = AttnLayout::kTND, t.Nq = 4, t.Nkv = 2, t.wl = 2, t.wr = 0;
  t.lens_q = {40, 5, 3}, t.lens_kv = {17, 20, 1};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    t.dtype = dt;
    cs.push_back(t);
  }
  expect_all(cs);
}

// A float bias used as an additive mask (PyTorch's float attn_mask): -inf entries hide
// their keys, a row of them gives 0 and lse -inf as a fully masked row; both the bf16 job
// kernel (rows 9-96) and the vector kernels (f32; few-row jobs).
TEST(FlashAttention, MinusInfBiasActsAsAMask) {
  std::vector<FlashCase> cs;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto [Sq, Nq] : {std::pair<int64_t, int64_t>{40, 4}, {3, 2}}) {
      FlashCase c;
      c.dtype = dt, c.Sq = Sq, c.Skv = 150, c.Nq = Nq, c.Nkv = 1, c.bias = true, c.bias_inf = true, c.causal = true;
      cs.push_back(c);
      c.softcap = 3.0f;
      cs.push_back(c);
    }
  expect_all(cs);
}

// A banded mask (each row sees the keys within 50 of its diagonal): whole key blocks
// before and after a job's band are hidden from all its rows, which the kernels skip;
// the rows' state must come through the skipped blocks intact, with unit and strided
// mask columns.
TEST(FlashAttention, BandMaskSkipsHiddenSuperblocks) {
  std::vector<FlashCase> cs;
  for (DType dt : {DType::kBF16, DType::kF32})
    for (bool strided : {false, true}) {
      FlashCase c;
      c.dtype = dt, c.Sq = 400, c.Skv = 430, c.Nq = 2, c.Nkv = 1, c.D = 64, c.Dv = 64;
      c.mask = true, c.mask_band = 50, c.strided = strided;
      cs.push_back(c);
    }
  expect_all(cs);
}

// q, k, v and out with row strides above their packed size (padding after every head
// row and every token / head slice, different per tensor), mask and bias with a column
// stride of 2: the same values as the packed case must give bitwise the same result
// (strides only move addresses), within the reference's tolerance, with out's padding
// untouched (run_flash checks its sentinel). Padded K rows sit off 64-byte lines: 70 rows
// of two q heads on one KV head make jobs of several 32-row groups, whose AMX kernel then
// copies each superblock's K rows onto lines (150 keys: a partial superblock's zero rows).
TEST(FlashAttention, StridedViewsMatchContiguous) {
  for (const auto* impl : flash_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (AttnLayout l : {AttnLayout::kBSND, AttnLayout::kBNSD, AttnLayout::kTND})
        for (auto [Sq, Skv, Nq, Nkv, D, causal, masked] :
             {std::tuple{17, 40, 4, 2, 64, true, false}, {20, 20, 8, 1, 80, false, false}, {23, 150, 4, 1, 64, true, true},
              {70, 150, 2, 1, 64, true, false}}) {
          FlashCase c;
          c.dtype = dt, c.layout = l, c.B = 2, c.Sq = Sq, c.Skv = Skv, c.Nq = Nq, c.Nkv = Nkv, c.D = D, c.Dv = D, c.causal = causal;
          c.mask = c.bias = masked;
          if (l == AttnLayout::kTND) c.lens_q = {Sq, 5}, c.lens_kv = {Skv, 9};
          // One thread: a call's jobs take the kernel's full height (several groups), where
          // more threads might plan lower ones to share out few jobs.
          const ThreadScope scope(Sq > 32 ? 1 : num_threads());
          const auto packed = testutil::run_flash(*impl, c, 11);
          c.strided = true;
          const auto strided = testutil::run_flash(*impl, c, 11);
          EXPECT_TRUE(strided.pass()) << impl->name << " " << c.name() << ": " << strided.message();
          EXPECT_TRUE(packed.pass()) << impl->name << " " << c.name() << " (packed): " << packed.message();
          EXPECT_TRUE(strided.got_out == packed.got_out && strided.got_lse == packed.got_lse)
              << impl->name << " " << c.name() << ": strided result differs from the packed one";
        }
}

// An explicit scale replaces 1/sqrt(D): a kernel that ignored it, or applied both, fails.
// A negative scale flips which key has the largest score (a max taken before scaling would
// pick the smallest), in jobs of 34 rows (two column tiles of the bf16 kernels) and 140
// (several jobs, causal edges inside superblocks).
TEST(FlashAttention, ExplicitScale) {
  std::vector<FlashCase> cs;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto [scale, l, causal] : {std::tuple{0.3f, AttnLayout::kBSND, true}, {1.7f, AttnLayout::kBNSD, false},
                                    {-0.4f, AttnLayout::kBSND, true}, {-1.1f, AttnLayout::kBNSD, false}}) {
      FlashCase c;
      c.dtype = dt, c.layout = l, c.Sq = 17, c.Skv = 40, c.Nq = 4, c.Nkv = 2, c.scale = scale, c.causal = causal;
      cs.push_back(c);
    }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    FlashCase c;
    c.dtype = dt, c.Sq = 140, c.Skv = 300, c.Nq = 2, c.Nkv = 1, c.scale = -0.25f, c.causal = true;
    cs.push_back(c);
  }
  FlashCase c;  // with softcap: scale applies before the cap
  c.scale = 0.9f, c.softcap = 2.0f, c.Skv = 70;
  cs.push_back(c);
  expect_all(cs);
}

// B = 2 with every broadcast shape the API allows: mask [B|1, Nq|1, Sq, Skv] and bias
// likewise. A kernel that indexed a [1, ..] tensor by batch, or a [B, ..] one without it,
// reads other values (or outside the tensor) for batch 1.
TEST(FlashAttention, MaskAndBiasBroadcastOverBatchAndHeads) {
  std::vector<FlashCase> cs;
  for (auto [dt, l] : {std::pair{DType::kF32, AttnLayout::kBSND}, {DType::kBF16, AttnLayout::kBNSD}})
    for (int ms = 0; ms < 4; ++ms)
      for (int bs = 0; bs < 4; ++bs) {
        FlashCase c;
        c.dtype = dt, c.layout = l, c.B = 2, c.Sq = 9, c.Skv = 24, c.Nq = 4, c.Nkv = 2, c.mask = true, c.bias = true;
        c.mask_b = ms & 1, c.mask_h = ms & 2, c.bias_b = bs & 1, c.bias_h = bs & 2;
        cs.push_back(c);
      }
  expect_all(cs);
}

// Varlen sequences with queries but no keys (first, middle, last, and a batch with no
// keys at all): their rows give out = 0 and lse = -inf (with a sink: lse = sink), no NaN.
TEST(FlashAttention, VarlenSequenceWithQueriesButNoKeys) {
  std::vector<FlashCase> cs;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto [lq, lkv] : {std::pair{std::vector<int32_t>{3, 5, 2, 4}, std::vector<int32_t>{0, 9, 0, 0}},
                           {std::vector<int32_t>{2, 33}, std::vector<int32_t>{0, 0}}})
      for (int variant = 0; variant < 3; ++variant) {
        FlashCase c;
        c.dtype = dt, c.layout = AttnLayout::kTND, c.Nq = 4, c.Nkv = 2, c.lens_q = lq, c.lens_kv = lkv;
        c.causal = variant == 1, c.wl = variant == 1 ? 3 : -1, c.sinks = variant == 2;
        cs.push_back(c);
      }
  expect_all(cs);
}

// The lse output is optional: without it, out must be bitwise what it is with it.
TEST(FlashAttention, WithoutLseSameOutput) {
  for (const auto* impl : flash_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (AttnLayout l : {AttnLayout::kBSND, AttnLayout::kTND}) {
        FlashCase c;
        c.dtype = dt, c.layout = l, c.Sq = 33, c.Skv = 40, c.Nq = 4, c.Nkv = 2, c.causal = true, c.sinks = true;
        if (l == AttnLayout::kTND) c.lens_q = {33, 0, 7}, c.lens_kv = {40, 3, 5};
        const auto with = testutil::run_flash(*impl, c, 21);
        c.lse = false;
        const auto without = testutil::run_flash(*impl, c, 21);
        EXPECT_TRUE(without.pass()) << impl->name << " " << c.name() << ": " << without.message();
        EXPECT_TRUE(with.pass()) << impl->name << " " << c.name() << " (with lse): " << with.message();
        EXPECT_TRUE(without.got_out == with.got_out) << impl->name << " " << c.name() << ": out differs from the run with lse";
      }
}

// Sq = 1023 (not a multiple of any tile): a sliding-window causal prefill over many query
// tiles (bf16, D = 32: the AMX kernel where the host has it) and full rows over few keys.
TEST(FlashAttention, LongQueryLength1023) {
  std::vector<FlashCase> cs;
  FlashCase c;
  c.dtype = DType::kBF16, c.Sq = 1023, c.Skv = 1023, c.Nq = 2, c.Nkv = 1, c.D = 32, c.Dv = 32, c.causal = true, c.wl = 100;
  cs.push_back(c);
  c.dtype = DType::kF32, c.layout = AttnLayout::kBNSD, c.Skv = 37, c.causal = false, c.wl = -1, c.D = 16, c.Dv = 16;
  cs.push_back(c);
  expect_all(cs);
}

// bf16 prefill jobs of 9-96 rows of one KV head (the AVX512_BF16 / AMX pair kernels; the
// AVX512_BF16 one takes 33-96 rows as two or three 32-row groups, AMX up to 64 in two):
// row counts with every remainder of the 6-row P . V blocks, one 16-row half and two, one
// group, two and three, head
// dims with a last 32-column V chunk (Dv % 64 == 32) and D != Dv, keys over several
// 128-key superblocks ending off the 32-key grid (an odd last key), causal with Sq < Skv
// and Sq > Skv (rows of a half that see nothing), windows, sinks, GQA rows of several
// heads, and varlen with sequences without queries or keys.
TEST(FlashAttention, Bf16JobsOf9To96RowsOfOneKvHead) {
  std::vector<FlashCase> cs;
  struct S {
    int64_t Sq, Skv, Nq, Nkv, D, Dv;
    bool causal;
    int64_t wl, wr;
    bool sinks;
  };
  for (const S& s : {S{43, 300, 1, 1, 192, 128, true, -1, -1, false},   // 32 + 11 rows, 3 superblocks
                     S{45, 200, 2, 2, 128, 96, true, 70, -1, false},    // 32 + 13 rows, window cuts lo
                     S{17, 150, 1, 1, 160, 160, false, -1, -1, true},   // 17: one row in the second half
                     S{25, 40, 1, 1, 64, 96, false, 3, 5, false},       // two-sided window
                     S{31, 20, 1, 1, 96, 96, true, -1, -1, true},       // Sq > Skv: rows 0..10 see nothing
                     S{14, 133, 1, 1, 96, 96, true, -1, -1, false},     // one half, Dv % 64 == 32
                     S{9, 129, 1, 1, 32, 32, false, -1, -1, false},     // 9 rows, 128 + 1 keys
                     S{16, 257, 2, 2, 64, 32, true, 100, 0, true},      // 16 rows, 2 superblocks + 1 key
                     S{7, 70, 6, 2, 64, 160, true, -1, -1, false},      // 3 heads x 7 positions = 21 rows
                     S{12, 5, 2, 1, 32, 64, true, -1, -1, true},       // 2 heads x 12 = 24 rows, 19 empty
                     S{64, 64, 1, 1, 128, 128, true, -1, -1, false},    // two full groups
                     S{100, 260, 1, 1, 64, 96, true, 40, -1, true},     // 64 + 36 rows, window
                     S{8, 90, 8, 1, 64, 64, false, -1, -1, false},      // 8 heads x 8 = 64 rows
                     S{70, 33, 1, 1, 32, 32, true, -1, -1, false},     // Sq > Skv: the first group sees nothing
                     S{96, 300, 1, 1, 128, 128, true, -1, -1, false},   // three full groups
                     S{75, 200, 1, 1, 64, 96, true, 40, -1, true},      // 64 + 11 rows, window, sinks
                     S{90, 40, 1, 1, 32, 32, true, -1, -1, false},      // Sq > Skv: rows 0..49 see nothing
                     S{6, 70, 16, 1, 64, 64, false, -1, -1, false}}) {  // 16 heads x 6 = 96 rows
    FlashCase c;
    c.dtype = DType::kBF16, c.Sq = s.Sq, c.Skv = s.Skv, c.Nq = s.Nq, c.Nkv = s.Nkv, c.D = s.D, c.Dv = s.Dv;
    c.causal = s.causal, c.wl = s.wl, c.wr = s.wr, c.sinks = s.sinks;
    cs.push_back(c);
  }
  FlashCase t;  // varlen: 19, 32 + 8 (no keys) and 13 rows; a sequence without queries
  t.dtype = DType::kBF16, t.layout = AttnLayout::kTND, t.Nq = 2, t.Nkv = 2, t.D = 96, t.Dv = 96;
  t.lens_q = {19, 0, 40, 13}, t.lens_kv = {150, 5, 0, 13};
  for (int variant = 0; variant < 3; ++variant) {
    t.causal = variant != 1, t.wl = variant == 1 ? 6 : -1, t.sinks = variant == 2;
    cs.push_back(t);
  }
  expect_all(cs);
}

// Query and key positions past 2^24 (not all of them floats): a causal prefill whose rows
// see only their diagonal key (window_left = 0), so lse = the one score. K and V repeat
// one row (position stride 0) to keep 2^24 keys small. A kernel comparing positions as
// floats lets a row see its rounded neighbours (lse + log 2 or log 3) or none. Every
// implementation but the reference (it scores all 2^24 keys per row), against the
// reference rows over the keys around the diagonals.
TEST(FlashAttention, PositionsPast2To24) {
  const int64_t Skv = (int64_t(1) << 24) + 40, D = 32;
  for (int64_t Sq : {16, 27}) {
    testing::Rng rng{uint64_t(Sq)};
    std::vector<uint16_t> q(size_t(Sq * D)), kv(size_t(2 * D)), out(size_t(Sq * D));
    for (auto* x : {&q, &kv})
      for (auto& e : *x) e = f32_to_bf16(rng.uniform());
    std::vector<float> lse(static_cast<size_t>(Sq));
    FlashAttentionParams p{.q = make_view(q.data(), DType::kBF16, {1, Sq, 1, D}),
                           .k = make_view(kv.data(), DType::kBF16, {1, Skv, 1, D}, {D, 0, D, 1}),
                           .v = make_view(kv.data() + D, DType::kBF16, {1, Skv, 1, D}, {D, 0, D, 1}),
                           .out = make_view(out.data(), DType::kBF16, {1, Sq, 1, D}), .lse = make_view(lse.data(), DType::kF32, {1, 1, Sq}),
                           .causal = true, .window_left = 0};
    // Reference rows over keys base .. Skv (every row's visible keys), at their true positions.
    const int64_t base = Skv - Sq - 8, n = Skv - base;
    std::vector<double> ref, naive, rlse;
    for (int64_t i = 0; i < Sq; ++i) {
      const int64_t diag = Skv - Sq + i;
      auto row = [&](bool bf16_steps) {
        return testutil::naive_row(
            D, D, n, 1.0 / std::sqrt(double(D)), 0.0, -INFINITY, [&](int64_t d) { return double(bf16_to_f32(q[size_t(i * D + d)])); },
            [&](int64_t, int64_t d) { return double(bf16_to_f32(kv[size_t(d)])); },
            [&](int64_t, int64_t d) { return double(bf16_to_f32(kv[size_t(D + d)])); },
            [&](int64_t j, double*) { return base + j == diag; }, bf16_steps);
      };
      const testutil::RowRef rr = row(false), rn = row(true);
      ref.insert(ref.end(), rr.out.begin(), rr.out.end()), naive.insert(naive.end(), rn.out.begin(), rn.out.end());
      rlse.push_back(rr.lse);
    }
    for (const auto* impl : flash_registry().runnable()) {
      if (std::string(impl->name) == "reference") continue;
      std::fill(lse.begin(), lse.end(), NAN);
      std::vector<uint8_t> ws(flash_attention_workspace_size(p));
      ASSERT_TRUE(flash_run(impl->fn(), p, {ws.data(), ws.size()}).ok()) << impl->name;
      std::vector<double> got, glse(lse.begin(), lse.end());
      for (uint16_t x : out) got.push_back(bf16_to_f32(x));
      const auto co = testutil::compare_out(got, ref, &naive), cl = testutil::compare_lse(glse, rlse);
      EXPECT_TRUE(co.pass) << impl->name << " Sq=" << Sq << " out: " << co.message;
      EXPECT_TRUE(cl.pass) << impl->name << " Sq=" << Sq << " lse: " << cl.message;
    }
  }
}

TEST(PagedDecode, MatchesNaiveSplitOrNot) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto* impl : paged_registry().runnable())
      for (DType dt : {DType::kF32, DType::kBF16})
        for (bool i8 : {false, true})
        for (auto [B, Sq, Nq, Nkv, D, lens] : {std::tuple{1, 1, 8, 8, 64, std::vector<int32_t>{1}},
                                               {2, 1, 8, 2, 128, std::vector<int32_t>{37, 300}},
                                               {3, 3, 12, 4, 80, std::vector<int32_t>{3, 64, 129}},
                                               // D off the 32 grid with few rows per job (not
                                               // the few-row kernel's): split at 2 threads, and
                                               // a 16-column P . V tail after 64 + 32
                                               {1, 1, 8, 2, 80, std::vector<int32_t>{600}},
                                               {2, 1, 6, 3, 112, std::vector<int32_t>{5, 260}},
                                               {1, 8, 4, 1, 96, std::vector<int32_t>{200}},
                                               // >= 2 x kMinSplitBlocks blocks: split at 2 threads
                                               {1, 2, 4, 1, 96, std::vector<int32_t>{530}},
                                               {1, 2, 8, 2, 64, std::vector<int32_t>{600}},
                                               // 8 and 6 rows per job: the few-row decode kernel
                                               // (causal among 2 positions; Dv in 32-column passes)
                                               {1, 2, 8, 2, 64, std::vector<int32_t>{90}},
                                               {2, 1, 6, 1, 192, std::vector<int32_t>{5, 260}},
                                               // 3 KV heads: scores of a head pair, then one alone
                                               {1, 1, 12, 3, 64, std::vector<int32_t>{150}},
                                               // 4 rows per job, Dv = 96: a full 64-column P . V
                                               // pass, then a partial one
                                               {1, 1, 8, 2, 96, std::vector<int32_t>{600}},
                                               // 4 rows per KV head at D = 32 / 64 (scores_quad's
                                               // 4 and 8 q groups; 96 and 128 above), a block tail
                                               {1, 1, 8, 2, 32, std::vector<int32_t>{77}},
                                               {1, 1, 16, 4, 64, std::vector<int32_t>{150}},
                                               // 8 rows per KV head (GQA 8): two quads
                                               {1, 1, 16, 2, 128, std::vector<int32_t>{300}},
                                               // 24 rows over one KV head: the AVX2 many-row
                                               // path's 16-row and 8-row score groups
                                               {1, 3, 8, 1, 64, std::vector<int32_t>{300}},
                                               // all-heads jobs past 32 rows (AVX2: up to 96,
                                               // 12 per KV head): speculative Sq = 2 / 3 over
                                               // several KV heads, and 12 heads per group
                                               {1, 2, 32, 8, 64, std::vector<int32_t>{600}},
                                               {2, 3, 16, 4, 64, std::vector<int32_t>{90, 300}},
                                               {1, 1, 48, 4, 64, std::vector<int32_t>{530}},
                                               // three all-heads jobs: split at 2 threads so
                                               // they share out evenly (decode_splits)
                                               {3, 1, 16, 2, 64, std::vector<int32_t>{520, 600, 530}}}) {
          if (threads == 2 && *std::max_element(lens.begin(), lens.end()) < 512) continue;  // no split either way
          DecodeCase c;
          c.dtype = dt, c.i8 = i8, c.B = B, c.Sq = Sq, c.Nq = Nq, c.Nkv = Nkv, c.D = D, c.Dv = D, c.lens = lens;
          const auto o = testutil::run_decode(*impl, c, uint64_t(D + B));
          EXPECT_TRUE(o.pass()) << threads << " threads, " << impl->name << " " << c.name() << ": " << o.message();
        }
    // Dv != D, 4 rows per job: D = 128 (int8 caches score on tiles), Dv = 96, so P . V runs a
    // full 64-column pass and a partial one on the int8 and the bf16 V rows.
    for (const auto* impl : paged_registry().runnable())
      for (bool i8 : {false, true}) {
        DecodeCase c;
        c.dtype = DType::kBF16, c.i8 = i8, c.B = 1, c.Sq = 1, c.Nq = 8, c.Nkv = 2, c.D = 128, c.Dv = 96, c.lens = {600};
        const auto o = testutil::run_decode(*impl, c, 7);
        EXPECT_TRUE(o.pass()) << threads << " threads, " << impl->name << " " << c.name() << ": " << o.message();
      }
  }
  set_num_threads(0);
}

// Denormal cache values: the widened-FMA decode kernel (Intel) runs with denormals as
// zero, as vdpbf16ps does, and must hand the caller's MXCSR back unchanged.
TEST(PagedDecode, DenormalCacheValuesAndTheCallersMxcsr) {
  set_num_threads(1);  // the job runs on this thread
  for (const auto* impl : paged_registry().runnable())
    for (auto [Sq, Nq, Nkv, D] : {std::tuple{1, 8, 2, 128}, {2, 8, 2, 64}, {1, 8, 8, 64}}) {
      DecodeCase c;
      c.B = 1, c.Sq = Sq, c.Nq = Nq, c.Nkv = Nkv, c.D = c.Dv = D, c.lens = {150}, c.denormal_every = 7;
      const unsigned modes = 0xffc0u;  // rounding, DAZ / FTZ and exception masks; not the sticky flags
      const unsigned before = _mm_getcsr() & modes;
      const auto o = testutil::run_decode(*impl, c, 3);
      EXPECT_EQ(_mm_getcsr() & modes, before) << impl->name << " " << c.name();
      EXPECT_TRUE(o.pass()) << impl->name << " " << c.name() << ": " << o.message();
    }
  set_num_threads(0);
}

// The same decode at 1 thread (one job per sequence and KV head) and at 2 (the KV axis
// split across threads, partials merged by log-sum-exp): the 2-thread call must ask for
// the split's partial buffers, and the two outputs agree to the rounding the split moves
// (f32: 1e-5; bf16: the P tiles round exp(s - running max) to bf16 and each split has its
// own running max, so two bf16 ulps of the output's scale).
// No heap allocation inside a call (DESIGN.md), on one and two threads, after a first call:
// selecting the implementation copied the op's name, which past 15 characters
// (paged_decode_attention, mla_decode_attention) left the small-string buffer.
TEST(Attention, NoHeapAllocationInsideACall) {
  const int64_t S = 200, H = 4, Hk = 2, D = 64, bs = 16, nb = 32, slots = nb * bs;
  std::vector<uint16_t> q(S * H * D, 0x3c00), k(S * Hk * D, 0x3c00), o(S * H * D), kc(slots * Hk * D, 0x3c00), mc(slots * 96, 0x3c00);
  std::vector<float> lse(H * S), outs(3 * 4 * 64), lses(3 * 4), uo(4 * 64);
  std::vector<int32_t> bt(2 * 16), sl = {250, 40};
  for (size_t i = 0; i < bt.size(); ++i) bt[i] = int32_t(i * 7 % nb);
  std::vector<uint8_t> ws(16 << 20);
  const Workspace w{ws.data(), ws.size()};
  const FlashAttentionParams f{.q = make_view(q.data(), DType::kBF16, {1, S, H, D}), .k = make_view(k.data(), DType::kBF16, {1, S, Hk, D}),
                               .v = make_view(k.data(), DType::kBF16, {1, S, Hk, D}), .out = make_view(o.data(), DType::kBF16, {1, S, H, D}),
                               .lse = make_view(lse.data(), DType::kF32, {1, H, S}), .causal = true};
  // One job over 800 keys (the k buffer read as [1, 800, 1, 32]): split along the keys at two threads.
  const FlashAttentionParams f1{.q = make_view(q.data(), DType::kBF16, {1, 1, H, 32}), .k = make_view(k.data(), DType::kBF16, {1, 800, 1, 32}),
                                .v = make_view(k.data(), DType::kBF16, {1, 800, 1, 32}), .out = make_view(o.data(), DType::kBF16, {1, 1, H, 32}),
                                .lse = make_view(lse.data(), DType::kF32, {1, H, 1}), .causal = true};
  const PagedDecodeParams p{.q = make_view(q.data(), DType::kBF16, {2, 1, H, D}), .k_cache = make_view(kc.data(), DType::kBF16, {slots, Hk * D}),
                            .v_cache = make_view(kc.data(), DType::kBF16, {slots, Hk * D}),
                            .block_tables = make_view(bt.data(), DType::kI32, {2, 16}), .seq_lens = make_view(sl.data(), DType::kI32, {2}),
                            .block_size = bs, .kv_heads = Hk, .out = make_view(o.data(), DType::kBF16, {2, 1, H, D})};
  PagedDecodeParams p1 = p;  // one sequence: split along the KV axis at two threads
  p1.q.sizes[0] = p1.out.sizes[0] = p1.block_tables.sizes[0] = p1.seq_lens.sizes[0] = 1;
  const MlaDecodeParams m{.q = make_view(q.data(), DType::kBF16, {1, 1, 8, 96}), .cache = make_view(mc.data(), DType::kBF16, {slots, 96}),
                          .block_tables = p1.block_tables, .seq_lens = p1.seq_lens, .block_size = bs, .kv_lora_rank = 64,
                          .out = make_view(o.data(), DType::kBF16, {1, 1, 8, 64}), .scale = 0.1f};
  const AttentionUpdateParams u{.outs = make_view(outs.data(), DType::kF32, {3, 4, 64}), .lses = make_view(lses.data(), DType::kF32, {3, 4}),
                                .out = make_view(uo.data(), DType::kF32, {4, 64})};
  auto calls = [&] {
    Status st = flash_attention(f, w);
    if (st.ok()) st = flash_attention(f1, w);
    if (st.ok()) st = paged_decode_attention(p, w);
    if (st.ok()) st = paged_decode_attention(p1, w);
    if (st.ok()) st = mla_decode_attention(m, w);
    if (st.ok()) st = attention_update(u);
    return st;
  };
  testing::expect_no_heap_allocation(calls, "the attention ops");
}

// A workspace sized at an early decode step serves the later ones: the KV split count,
// and the partials it needs, grow with the sequence, so the query sizes for what the
// block tables can hold (before, 1024 tokens at 2 threads failed a workspace sized at 16).
TEST(Decode, WorkspaceSizedOnceServesLongerContexts) {
  set_num_threads(2);
  const int64_t Nq = 8, Nkv = 2, D = 64, R = 48, bs = 16, max_blocks = 64, slots = max_blocks * bs;
  std::vector<float> q(Nq * D, 0.1f), cache(slots * Nkv * D, 0.01f), out(Nq * D);
  std::vector<int32_t> tables(max_blocks), len = {16};
  for (int64_t i = 0; i < max_blocks; ++i) tables[size_t(i)] = int32_t(max_blocks - 1 - i);
  const TensorView bt = make_view(tables.data(), DType::kI32, {1, max_blocks}), sl = make_view(len.data(), DType::kI32, {1});
  const PagedDecodeParams p{.q = make_view(q.data(), DType::kF32, {1, 1, Nq, D}), .k_cache = make_view(cache.data(), DType::kF32, {slots, Nkv * D}),
                            .v_cache = make_view(cache.data(), DType::kF32, {slots, Nkv * D}), .block_tables = bt, .seq_lens = sl,
                            .block_size = bs, .kv_heads = Nkv, .out = make_view(out.data(), DType::kF32, {1, 1, Nq, D})};
  const MlaDecodeParams m{.q = make_view(q.data(), DType::kF32, {1, 1, Nq, D}), .cache = make_view(cache.data(), DType::kF32, {slots, D}),
                          .block_tables = bt, .seq_lens = sl, .block_size = bs, .kv_lora_rank = R,
                          .out = make_view(out.data(), DType::kF32, {1, 1, Nq, R}), .scale = 0.1f};
  std::vector<uint8_t> ws_p(paged_decode_attention_workspace_size(p)), ws_m(mla_decode_attention_workspace_size(m));
  for (int32_t L : {16, 300, 1024}) {
    len[0] = L;
    const Status a = paged_decode_attention(p, {ws_p.data(), ws_p.size()}), b = mla_decode_attention(m, {ws_m.data(), ws_m.size()});
    EXPECT_TRUE(a.ok()) << "L=" << L << ": " << a.message();
    EXPECT_TRUE(b.ok()) << "L=" << L << ": " << b.message();
    EXPECT_EQ(paged_decode_attention_workspace_size(p), ws_p.size()) << "L=" << L;
  }
  set_num_threads(0);
}

TEST(Decode, SplitAgreesWithUnsplit) {
  for (bool mla : {false, true}) {
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int kernel = 0; kernel < 2; ++kernel) {
        DecodeCase c;
        c.dtype = dt, c.B = 1, c.Sq = 1, c.lens = {700};
        if (mla) c.mla = true, c.Nq = 16, c.Nkv = 1, c.D = 64 + 32, c.Dv = 64, c.block_size = 64;
        else c.Nq = 4, c.Nkv = 1, c.D = c.Dv = 64;
        const auto& reg = mla ? mla_registry() : paged_registry();
        const auto runnable = reg.runnable();
        const auto* impl = kernel == 0 ? runnable.front() : runnable.back();  // best and reference
        set_num_threads(1);
        const auto one = testutil::run_decode(*impl, c, 11);
        set_num_threads(2);
        const auto two = testutil::run_decode(*impl, c, 11);
        set_num_threads(0);
        expect_split_agrees(impl->name + std::string(" ") + c.name(), dt, one, two);
      }
  }
}

// Called from the threads of an engine's own parallel region (nesting off, so no team of
// its own): each op runs whole on its calling thread, as with one thread, bitwise — the
// prefill tiles, and the flash call and decodes whose KV split and merge a 2-thread call
// would plan.
TEST(Attention, CalledFromInsideAParallelRegion) {
  FlashCase f;
  f.dtype = DType::kBF16, f.B = 2, f.Sq = f.Skv = 150, f.Nq = 4, f.Nkv = 2, f.D = f.Dv = 64, f.causal = true;
  FlashCase fs = f;  // one job: a 2-thread call splits its keys
  fs.B = 1, fs.Sq = 1, fs.Skv = 700, fs.Nq = 8, fs.Nkv = 1;
  DecodeCase d;
  d.dtype = DType::kBF16, d.B = 1, d.Sq = 2, d.Nq = 8, d.Nkv = 2, d.D = d.Dv = 64, d.lens = {600};
  DecodeCase m;
  m.dtype = DType::kBF16, m.mla = true, m.B = 1, m.Sq = 1, m.Nq = 16, m.Nkv = 1, m.D = 64 + 32, m.Dv = 64,
  m.block_size = 64, m.lens = {700};
  auto run = [&](int which) {
    if (which == 0 || which == 3) return testutil::run_flash(*flash_registry().runnable().front(), which == 0 ? f : fs, 3);
    return testutil::run_decode(*(which == 1 ? paged_registry() : mla_registry()).runnable().front(), which == 1 ? d : m, 3);
  };
  for (int which = 0; which < 4; ++which) {
    set_num_threads(1);
    const testutil::Outcome want = run(which);
    set_num_threads(2);
    testutil::Outcome got[2];
#pragma omp parallel num_threads(2)
    got[omp_get_thread_num()] = run(which);
    set_num_threads(0);
    ASSERT_TRUE(want.pass()) << which << ": " << want.message();
    for (int t = 0; t < 2; ++t) {
      EXPECT_TRUE(got[t].pass()) << which << ", thread " << t << ": " << got[t].message();
      EXPECT_EQ(got[t].got_out, want.got_out) << which << ", thread " << t;
      EXPECT_EQ(got[t].got_lse, want.got_lse) << which << ", thread " << t;
    }
  }
}

// Paged decode with q and out rows padded (token and head strides above their packed
// size): the same values as the packed case give bitwise the same out and lse, within the
// reference, with out's padding untouched (run_decode checks its sentinel). The cases
// take the one-KV-head job path, the all-heads few-row path (bf16, <= 8 rows per KV head)
// and, at 2 threads, the split path whose merge writes out.
TEST(PagedDecode, StridedQAndOut) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto* impl : paged_registry().runnable())
      for (DType dt : {DType::kF32, DType::kBF16})
        for (bool i8 : {false, true})
          for (auto [B, Sq, Nq, Nkv, D, lens] : {std::tuple{2, 1, 8, 2, 64, std::vector<int32_t>{37, 100}},
                                                 {2, 3, 12, 4, 80, std::vector<int32_t>{3, 70}},
                                                 {1, 2, 8, 2, 64, std::vector<int32_t>{520}}}) {
            // The long case only where it splits (2 threads), the others where they do not;
            // the merge that writes a split's out is the same for i8 caches.
            if ((threads == 2) != (lens.back() >= 512) || (threads == 2 && i8)) continue;
            DecodeCase c;
            c.dtype = dt, c.i8 = i8, c.B = B, c.Sq = Sq, c.Nq = Nq, c.Nkv = Nkv, c.D = D, c.Dv = D, c.lens = lens;
            const auto packed = testutil::run_decode(*impl, c, uint64_t(D + B));
            c.strided = true;
            const auto strided = testutil::run_decode(*impl, c, uint64_t(D + B));
            EXPECT_TRUE(strided.pass()) << threads << " threads, " << impl->name << " " << c.name() << ": " << strided.message();
            EXPECT_TRUE(packed.pass()) << threads << " threads, " << impl->name << " " << c.name() << " (packed): " << packed.message();
            EXPECT_TRUE(strided.got_out == packed.got_out && strided.got_lse == packed.got_lse)
                << threads << " threads, " << impl->name << " " << c.name() << ": strided result differs from the packed one";
          }
  }
  set_num_threads(0);
}

// The cache in q's dtype and in the i8 layout kv_rms_norm_rope_cache writes (per-token
// scales, some tokens all zero, rope part in the q dtype), through every kernel and both
// split paths.
TEST(MlaDecode, MatchesNaiveSplitOrNot) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto* impl : mla_registry().runnable())
      for (DType dt : {DType::kF32, DType::kBF16})
        for (bool i8 : {false, true})
          // (rank % 64 == 0 and rope % 32 == 0: the AMX kernel's int8 scores for an i8
          // cache; 32 rows: two column tiles; block 8: rows not at one stride, staged)
          for (auto [B, Sq, Nq, rank, rope, lens, bs] : {std::tuple{1, 1, 16, 64, 16, std::vector<int32_t>{70}, 64},
                                                         {2, 2, 4, 32, 16, std::vector<int32_t>{2, 150}, 64},
                                                         {1, 1, 16, 512, 64, std::vector<int32_t>{65}, 64},
                                                         {1, 1, 16, 64, 32, std::vector<int32_t>{600}, 64},
                                                         {1, 2, 16, 64, 32, std::vector<int32_t>{300}, 64},
                                                         {1, 1, 16, 64, 32, std::vector<int32_t>{100}, 8},
                                                         // a 32-row and a 16-row job: split at 2
                                                         // threads so they share out evenly
                                                         {1, 3, 16, 64, 32, std::vector<int32_t>{600}, 64},
                                                         // 20 rows: a score group of 8 half empty
                                                         {1, 1, 20, 64, 16, std::vector<int32_t>{150}, 64}}) {
            // Only >= 2 x kMinSplitBlocks blocks split at 2 threads.
            if (threads == 2 && *std::max_element(lens.begin(), lens.end()) < 512) continue;
            DecodeCase c;
            c.mla = true, c.i8 = i8, c.dtype = dt, c.B = B, c.Sq = Sq, c.Nq = Nq, c.Nkv = 1, c.D = rank + rope, c.Dv = rank;
            c.lens = lens, c.block_size = bs;
            const auto o = testutil::run_decode(*impl, c, uint64_t(rank + B + (i8 ? 7 : 0)));
            EXPECT_TRUE(o.pass()) << threads << " threads, " << impl->name << " " << c.name() << ": " << o.message();
          }
  }
  set_num_threads(0);
}

// Decode jobs of 9-32 rows of one KV head (more than kDecodeRows rows per KV head, so no
// all-heads job): bf16 and i8 caches (AVX512_BF16: read as int8 where D % 64 == 0 — D = 64,
// 128 — dequantised to bf16 otherwise), paged blocks smaller than a 128-key superblock, one
// and two KV heads, Sq > 1 (causal among the new tokens), Dv % 64 == 32, Dv % 32 == 16
// (a 16-column P . V tail, which int8 V rows do not stage) and D != Dv, row
// counts with every remainder of the 6-row P . V blocks, and at 2 threads the KV split
// (partial outputs and lse, a split starting past key 0).
TEST(PagedDecode, JobsOf9To32RowsOfOneKvHead) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto* impl : paged_registry().runnable())
      for (bool i8 : {false, true})
        for (auto [B, Sq, Nq, Nkv, D, Dv, lens, bs] : {std::tuple{1, 1, 16, 1, 64, 64, std::vector<int32_t>{600}, 16},
                                                       {1, 2, 8, 1, 96, 96, std::vector<int32_t>{530}, 32},
                                                       {1, 3, 8, 1, 128, 96, std::vector<int32_t>{700}, 8},
                                                       {1, 1, 11, 1, 64, 160, std::vector<int32_t>{520}, 64},
                                                       {2, 1, 26, 2, 64, 64, std::vector<int32_t>{37, 300}, 16},
                                                       {1, 2, 15, 1, 32, 32, std::vector<int32_t>{259}, 16},
                                                       {1, 1, 12, 1, 64, 48, std::vector<int32_t>{300}, 16},
                                                       {1, 2, 9, 1, 128, 16, std::vector<int32_t>{200}, 32}}) {
          if (threads == 2 && *std::max_element(lens.begin(), lens.end()) < 512) continue;  // no split either way
          DecodeCase c;
          c.dtype = DType::kBF16, c.i8 = i8, c.B = B, c.Sq = Sq, c.Nq = Nq, c.Nkv = Nkv, c.D = D, c.Dv = Dv, c.lens = lens;
          c.block_size = bs;
          const auto o = testutil::run_decode(*impl, c, uint64_t(D + Nq));
          EXPECT_TRUE(o.pass()) << threads << " threads, " << impl->name << " " << c.name() << ": " << o.message();
        }
  }
  set_num_threads(0);
}

// A decode workspace sized for more threads serves fewer, KV-split partials included. The
// split count is not monotone in the thread count (B = 1, Sq = 4, 32 / 8 heads: three
// threads split further than four, whose partials outgrew a thread's scratch): sizes at
// 1-8 threads never fall as the count grows, and a 3-thread call runs in the workspace
// sized at 4, for paged (bf16) and MLA decode.
TEST(PagedDecode, WorkspaceSizedForMoreThreadsServesFewer) {
  const int64_t D = 128, bs = 16, maxb = 64;
  for (auto [B, Sq, Nq, Nkv] : {std::tuple{1, 4, 32, 8}, {2, 3, 32, 1}, {3, 2, 16, 2}, {1, 3, 16, 16}}) {
    const int64_t slots = B * maxb * bs;
    std::vector<uint16_t> q(size_t(B * Sq * Nq * D), f32_to_bf16(0.5f)), kc(size_t(slots * Nkv * D), f32_to_bf16(0.25f)),
        out(size_t(B * Sq * Nq * D));
    std::vector<int32_t> tab(size_t(B * maxb)), lens(size_t(B), int32_t(maxb * bs));
    std::iota(tab.begin(), tab.end(), 0);
    PagedDecodeParams p{.q = make_view(q.data(), DType::kBF16, {B, Sq, Nq, D}),
                        .k_cache = make_view(kc.data(), DType::kBF16, {slots, Nkv * D}),
                        .v_cache = make_view(kc.data(), DType::kBF16, {slots, Nkv * D}),
                        .block_tables = make_view(tab.data(), DType::kI32, {B, maxb}),
                        .seq_lens = make_view(lens.data(), DType::kI32, {B}), .block_size = bs, .kv_heads = Nkv,
                        .out = make_view(out.data(), DType::kBF16, {B, Sq, Nq, D})};
    std::vector<uint16_t> mla_q(size_t(B * Sq * Nq * 576), f32_to_bf16(0.5f)), latent(size_t(slots * 576), f32_to_bf16(0.25f)),
        mla_out(size_t(B * Sq * Nq * 512));
    MlaDecodeParams m{.q = make_view(mla_q.data(), DType::kBF16, {B, Sq, Nq, 576}),
                      .cache = make_view(latent.data(), DType::kBF16, {slots, 576}),
                      .block_tables = p.block_tables, .seq_lens = p.seq_lens, .block_size = bs, .kv_lora_rank = 512,
                      .out = make_view(mla_out.data(), DType::kBF16, {B, Sq, Nq, 512}), .scale = 0.05f};
    size_t paged_prev = 0, mla_prev = 0, paged_at4 = 0, mla_at4 = 0;
    for (int t = 1; t <= 8; ++t) {
      ThreadScope scope(t);
      const size_t pw = paged_decode_attention_workspace_size(p), mw = mla_decode_attention_workspace_size(m);
      EXPECT_GE(pw, paged_prev) << "paged B=" << B << " Sq=" << Sq << " Nq=" << Nq << " Nkv=" << Nkv << " at " << t << " threads";
      EXPECT_GE(mw, mla_prev) << "mla B=" << B << " Sq=" << Sq << " Nq=" << Nq << " at " << t << " threads";
      paged_prev = pw, mla_prev = mw;
      if (t == 4) paged_at4 = pw, mla_at4 = mw;
    }
    ThreadScope three(3);
    std::vector<uint8_t> ws(std::max(paged_at4, mla_at4));
    Status st = paged_decode_attention(p, {ws.data(), paged_at4});
    EXPECT_TRUE(st.ok()) << st.message();
    st = mla_decode_attention(m, {ws.data(), mla_at4});
    EXPECT_TRUE(st.ok()) << st.message();
  }
}

// Decode at a context past 2^24 tokens (the block table maps every block but the last
// to one physical block, so the cache stays small): the newest token (position L - 1 =
// 2^24 + 1, not a float) has the largest score by far and must dominate the output. Key
// positions are int64; a kernel that compares them as floats drops that key. Against the
// reference row (every head has the same q, so one row serves all 16), the best kernel
// only: 16M keys.
TEST(PagedDecode, ContextPast2To24Tokens) {
  const int64_t L = (int64_t(1) << 24) + 2, bs = 1024, D = 32, Nq = 16, blocks = (L + bs - 1) / bs, slots = 2 * bs;
  testing::Rng rng(3);
  std::vector<uint16_t> q(size_t(Nq * D), f32_to_bf16(1.0f)), k(size_t(slots * D)), v(size_t(slots * D)), out(size_t(Nq * D));
  for (auto* x : {&k, &v})
    for (auto& e : *x) e = f32_to_bf16(rng.uniform());
  const int64_t newest = bs + (L - 1) % bs;  // slot of key L - 1 (the last block is physical block 1)
  for (int64_t d = 0; d < D; ++d) k[size_t(newest * D + d)] = f32_to_bf16(5.0f);
  std::vector<int32_t> table(size_t(blocks), 0), lens = {int32_t(L)};
  table.back() = 1;
  std::vector<float> lse(size_t(Nq), NAN);
  const PagedDecodeParams p{.q = make_view(q.data(), DType::kBF16, {1, 1, Nq, D}), .k_cache = make_view(k.data(), DType::kBF16, {slots, D}),
                            .v_cache = make_view(v.data(), DType::kBF16, {slots, D}),
                            .block_tables = make_view(table.data(), DType::kI32, {1, blocks}),
                            .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = bs, .kv_heads = 1,
                            .out = make_view(out.data(), DType::kBF16, {1, 1, Nq, D}), .lse = make_view(lse.data(), DType::kF32, {1, Nq, 1})};
  const auto* impl = paged_registry().runnable().front();
  std::vector<uint8_t> ws(paged_decode_attention_workspace_size(p));
  ASSERT_TRUE(paged_run(impl->fn(), p, {ws.data(), ws.size()}).ok());
  auto slot = [&](int64_t j) { return int64_t(table[size_t(j / bs)]) * bs + j % bs; };
  auto row = [&](bool bf16_steps) {
    return testutil::naive_row(
        D, D, L, 1.0 / std::sqrt(double(D)), 0.0, -INFINITY, [&](int64_t d) { return double(bf16_to_f32(q[size_t(d)])); },
        [&](int64_t j, int64_t d) { return double(bf16_to_f32(k[size_t(slot(j) * D + d)])); },
        [&](int64_t j, int64_t d) { return double(bf16_to_f32(v[size_t(slot(j) * D + d)])); }, [](int64_t, double*) { return true; },
        bf16_steps);
  };
  const testutil::RowRef rr = row(false), rn = row(true);
  std::vector<double> got, ref, naive, glse, rlse;
  for (int64_t h = 0; h < Nq; ++h) {
    for (int64_t d = 0; d < D; ++d) {
      got.push_back(bf16_to_f32(out[size_t(h * D + d)]));
      ref.push_back(rr.out[size_t(d)]), naive.push_back(rn.out[size_t(d)]);
    }
    glse.push_back(lse[size_t(h)]), rlse.push_back(rr.lse);
  }
  const auto co = testutil::compare_out(got, ref, &naive), cl = testutil::compare_lse(glse, rlse);
  EXPECT_TRUE(co.pass) << impl->name << " out: " << co.message;
  EXPECT_TRUE(cl.pass) << impl->name << " lse: " << cl.message;
}

// MLA decode of 9-32 rows: a latent of 160 (a last 32-column V chunk), 11 / 13 / 24
// heads' rows, bf16 and i8 latent caches, blocks of 16 and 32, split at 2 threads.
TEST(MlaDecode, JobsOf9To32RowsLatentOf160) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto* impl : mla_registry().runnable())
      for (bool i8 : {false, true})
        for (auto [B, Sq, Nq, rank, rope, lens, bs] : {std::tuple{1, 1, 16, 160, 32, std::vector<int32_t>{600}, 32},
                                                       {1, 1, 11, 160, 32, std::vector<int32_t>{530}, 16},
                                                       {2, 1, 13, 96, 32, std::vector<int32_t>{300, 131}, 16},
                                                       {1, 2, 12, 64, 64, std::vector<int32_t>{700}, 16}}) {
          if (threads == 2 && *std::max_element(lens.begin(), lens.end()) < 512) continue;
          DecodeCase c;
          c.mla = true, c.i8 = i8, c.dtype = DType::kBF16, c.B = B, c.Sq = Sq, c.Nq = Nq, c.Nkv = 1, c.D = rank + rope, c.Dv = rank;
          c.lens = lens, c.block_size = bs;
          const auto o = testutil::run_decode(*impl, c, uint64_t(rank + Nq + (i8 ? 7 : 0)));
          EXPECT_TRUE(o.pass()) << threads << " threads, " << impl->name << " " << c.name() << ": " << o.message();
        }
  }
  set_num_threads(0);
}

// End to end with the writer: kv_rms_norm_rope_cache fills a bf16 cache and the i8
// layout from the same kv rows; MLA decode over the i8 one must agree with decode over
// the bf16 one to within the latent's quantisation (a layout mismatch between writer and
// reader would not).
TEST(MlaDecode, ReadsTheI8LayoutKvRmsNormRopeCacheWrites) {
  const int64_t T = 300, rank = 512, rope = 64, W = rank + rope, H = 16, bs = 64, blocks = (T + bs - 1) / bs + 1;
  const int64_t slots = blocks * bs;
  testing::Rng rng(5);
  std::vector<uint16_t> kv(static_cast<size_t>(T * W)), w(static_cast<size_t>(rank)), q(static_cast<size_t>(H * W));
  std::vector<uint16_t> cache(static_cast<size_t>(slots * W)), rc(static_cast<size_t>(slots * rope));
  for (auto& v : kv) v = f32_to_bf16(rng.uniform(-1, 1));
  for (auto& v : w) v = f32_to_bf16(rng.uniform(0.5, 1.5));
  for (auto& v : q) v = f32_to_bf16(rng.uniform(-1, 1));
  std::vector<int8_t> lat(static_cast<size_t>(slots * rank));
  std::vector<float> sc(static_cast<size_t>(slots));
  std::vector<int32_t> pos(static_cast<size_t>(T)), slot(static_cast<size_t>(T)), table(static_cast<size_t>(blocks)), lens = {int32_t(T)};
  for (int64_t b = 0; b < blocks; ++b) table[size_t(b)] = int32_t(blocks - 1 - b);  // reversed block order
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t), slot[size_t(t)] = table[size_t(t / bs)] * int32_t(bs) + int32_t(t % bs);
  RopeTable tab;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = rope, .max_positions = T}, &tab).ok());
  KvRmsNormRopeCacheParams wp{.kv = make_view(kv.data(), DType::kBF16, {T, W}), .weight = make_view(w.data(), DType::kBF16, {rank}),
                              .positions = make_view(pos.data(), DType::kI32, {T}), .cos = tab.cos(), .sin = tab.sin(),
                              .slots = make_view(slot.data(), DType::kI32, {T}), .cache = make_view(cache.data(), DType::kBF16, {slots, W}),
                              .kv_lora_rank = rank};
  ASSERT_TRUE(kv_rms_norm_rope_cache(wp).ok());
  wp.cache = make_view(lat.data(), DType::kI8, {slots, rank});
  wp.cache_scales = make_view(sc.data(), DType::kF32, {slots});
  wp.rope_cache = make_view(rc.data(), DType::kBF16, {slots, rope});
  ASSERT_TRUE(kv_rms_norm_rope_cache(wp).ok());
  std::vector<uint16_t> o16(static_cast<size_t>(H * rank)), o8(static_cast<size_t>(H * rank));
  MlaDecodeParams p{.q = make_view(q.data(), DType::kBF16, {1, 1, H, W}), .cache = make_view(cache.data(), DType::kBF16, {slots, W}),
                    .block_tables = make_view(table.data(), DType::kI32, {1, blocks}), .seq_lens = make_view(lens.data(), DType::kI32, {1}),
                    .block_size = bs, .kv_lora_rank = rank, .out = make_view(o16.data(), DType::kBF16, {1, 1, H, rank}), .scale = 0.1f};
  std::vector<uint8_t> ws(mla_decode_attention_workspace_size(p));
  ASSERT_TRUE(mla_decode_attention(p, {ws.data(), ws.size()}).ok());
  p.cache = wp.cache, p.cache_scales = wp.cache_scales, p.rope_cache = wp.rope_cache;
  p.out = make_view(o8.data(), DType::kBF16, {1, 1, H, rank});
  ws.resize(mla_decode_attention_workspace_size(p));
  ASSERT_TRUE(mla_decode_attention(p, {ws.data(), ws.size()}).ok());
  double num = 0, den = 0;
  for (size_t i = 0; i < o16.size(); ++i) {
    const double a = bf16_to_f32(o16[i]), b = bf16_to_f32(o8[i]);
    num += (a - b) * (a - b), den += a * a;
  }
  EXPECT_LT(num / den, 1e-3) << "nmse between decode over the i8 and the bf16 cache";
}

TEST(AttentionUpdate, MergesPartialsLikeOnePass) {
  // Attention over 40 keys == merge of attention over keys [0,25) and [25,40).
  const int64_t Skv = 40, D = 32, Nq = 3;
  testing::Rng rng(4);
  std::vector<float> q(Nq * D), k(Skv * D), v(Skv * D);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = rng.uniform();
  auto attend = [&](int64_t j0, int64_t j1, float* out, float* lse) {
    FlashAttentionParams p{.q = make_view(q.data(), DType::kF32, {1, 1, Nq, D}),
                           .k = make_view(k.data() + j0 * D, DType::kF32, {1, j1 - j0, 1, D}),
                           .v = make_view(v.data() + j0 * D, DType::kF32, {1, j1 - j0, 1, D}),
                           .out = make_view(out, DType::kF32, {1, 1, Nq, D}), .lse = make_view(lse, DType::kF32, {1, Nq, 1})};
    std::vector<uint8_t> ws(flash_attention_workspace_size(p));
    ASSERT_TRUE(flash_attention(p, {ws.data(), ws.size()}).ok());
  };
  std::vector<float> full(Nq * D), lfull(Nq), parts(2 * Nq * D), lparts(2 * Nq), merged(Nq * D), lmerged(Nq);
  attend(0, Skv, full.data(), lfull.data());
  attend(0, 25, parts.data(), lparts.data());
  attend(25, Skv, parts.data() + Nq * D, lparts.data() + Nq);
  ASSERT_TRUE(attention_update({.outs = make_view(parts.data(), DType::kF32, {2, Nq, D}),
                                .lses = make_view(lparts.data(), DType::kF32, {2, Nq}),
                                .out = make_view(merged.data(), DType::kF32, {Nq, D}), .lse = make_view(lmerged.data(), DType::kF32, {Nq})})
                  .ok());
  for (int64_t i = 0; i < Nq * D; ++i) EXPECT_NEAR(merged[size_t(i)], full[size_t(i)], 2e-6) << i;
  for (int64_t i = 0; i < Nq; ++i) EXPECT_NEAR(lmerged[size_t(i)], lfull[size_t(i)], 2e-6);
  // All partials empty: zero output, -inf lse.
  std::fill(lparts.begin(), lparts.end(), -INFINITY);
  ASSERT_TRUE(attention_update({.outs = make_view(parts.data(), DType::kF32, {2, Nq, D}),
                                .lses = make_view(lparts.data(), DType::kF32, {2, Nq}),
                                .out = make_view(merged.data(), DType::kF32, {Nq, D}), .lse = make_view(lmerged.data(), DType::kF32, {Nq})})
                  .ok());
  EXPECT_EQ(merged[0], 0.0f);
  EXPECT_EQ(lmerged[0], -INFINITY);
}

// attention_update against a merge in double written here: per row
//   m = max_i lse_i, w_i = exp(lse_i - m), out = sum_i w_i O_i / sum_i w_i, lse = m + log sum_i w_i.
// Three partials; rows where some are empty (lse = -inf, outputs NaN: the API says they
// contribute nothing) and others finite, all empty (out exactly 0, lse -inf), one far
// below the rest, large lses; Dv = 300 crosses a 256-column chunk. f32 and bf16 out with
// padded rows, poisoned with NaN, the padding checked for its sentinel.
TEST(AttentionUpdate, ThreePartialsSomeEmptyAgainstDoubleMerge) {
  constexpr int64_t P = 3, R = 8, Dv = 300;
  constexpr float I = INFINITY;
  const float lse_of[R][P] = {{-1.0f, 0.5f, 2.0f}, {-I, 0.3f, -0.7f}, {1.0f, -I, 4.0f}, {2.5f, -I, -I},
                              {-I, -I, -I},        {0.0f, -200.0f, 1.0f}, {80.0f, 85.0f, 79.0f}, {-I, -3.0f, -I}};
  testing::Rng rng(8);
  std::vector<float> outs(size_t(P * R * Dv)), lses(size_t(P * R));
  for (int64_t i = 0; i < P; ++i)
    for (int64_t r = 0; r < R; ++r) {
      lses[size_t(i * R + r)] = lse_of[r][i];
      for (int64_t d = 0; d < Dv; ++d) outs[size_t((i * R + r) * Dv + d)] = lse_of[r][i] == -I ? NAN : rng.uniform(-3, 3);
    }
  std::vector<double> ref, rlse;
  testutil::merge_ref(outs, lses, P, R, Dv, ref, rlse);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    testutil::Stored out(dt, {R, Dv}, /*inner=*/5);
    out.fill([] { return NAN; });
    std::vector<float> lse(size_t(R), NAN);
    const Status st = attention_update({.outs = make_view(outs.data(), DType::kF32, {P, R, Dv}),
                                        .lses = make_view(lses.data(), DType::kF32, {P, R}), .out = out.view(),
                                        .lse = make_view(lse.data(), DType::kF32, {R})});
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<double> got, glse(lse.begin(), lse.end());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t d = 0; d < Dv; ++d) got.push_back(out.get(r * out.strides[0] + d));
    const auto co = testutil::compare_merged(got, ref, dt == DType::kBF16), cl = testutil::compare_lse(glse, rlse);
    EXPECT_TRUE(co.pass) << dtype_name(dt) << " out: " << co.message;
    EXPECT_TRUE(cl.pass) << dtype_name(dt) << " lse: " << cl.message;
    for (int64_t d = 0; d < Dv; ++d) ASSERT_EQ(got[size_t(4 * Dv + d)], 0.0) << dtype_name(dt) << " all-empty row, column " << d;
    EXPECT_EQ(out.check_padding("out"), "") << dtype_name(dt);
  }
}

TEST(AttentionBadInput, MessagesNameTheArgument) {
  std::vector<float> q(2 * 4 * 64), k(2 * 3 * 64), out(2 * 4 * 64);
  FlashAttentionParams p{.q = make_view(q.data(), DType::kF32, {1, 2, 4, 64}), .k = make_view(k.data(), DType::kF32, {1, 2, 3, 64}),
                         .v = make_view(k.data(), DType::kF32, {1, 2, 3, 64}), .out = make_view(out.data(), DType::kF32, {1, 2, 4, 64})};
  std::vector<uint8_t> ws(1 << 20);
  Status st = flash_attention(p, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("Nq=4 must be a multiple of kv heads Nkv=3"), std::string::npos) << st.message();
  p.k = make_view(k.data(), DType::kF32, {1, 2, 2, 48});
  p.v = make_view(k.data(), DType::kF32, {1, 2, 2, 48});
  st = flash_attention(p, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("k.sizes[3]=48 but q.sizes[3]=64: head dims must match"), std::string::npos) << st.message();
  p.k = make_view(k.data(), DType::kF32, {1, 2, 2, 64});
  p.v = make_view(k.data(), DType::kF32, {1, 2, 2, 64});
  st = flash_attention(p, {ws.data(), 16});
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.message();
  EXPECT_NE(st.message().find("flash_attention: workspace.bytes=16 but flash_attention_workspace_size()="), std::string::npos) << st.message();
  st = flash_attention(p, {nullptr, ws.size()});  // enough bytes, no address: not "too small"
  EXPECT_NE(st.message().find("flash_attention: workspace.data is null"), std::string::npos) << st.message();
  p.k.dtype = DType::kBF16;
  EXPECT_NE(flash_attention(p, {ws.data(), ws.size()}).message().find("k.dtype=bf16 but q.dtype=f32"), std::string::npos);
  std::vector<int32_t> tables = {0, 9}, lens = {20};
  PagedDecodeParams d{.q = make_view(q.data(), DType::kF32, {1, 1, 4, 64}), .k_cache = make_view(k.data(), DType::kF32, {6, 64}),
                      .v_cache = make_view(k.data(), DType::kF32, {6, 64}), .block_tables = make_view(tables.data(), DType::kI32, {1, 2}),
                      .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = 2, .kv_heads = 1,
                      .out = make_view(out.data(), DType::kF32, {1, 1, 4, 64})};
  st = paged_decode_attention(d, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("seq_lens[0]=20 must be >= Sq=1 and fit max_blocks=2 blocks of block_size=2"), std::string::npos)
      << st.message();
  lens[0] = 4;
  st = paged_decode_attention(d, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("block_tables[0][1]=9 is outside [0, 3)"), std::string::npos) << st.message();

  // i8 K / V caches come together, with their scales, and scales only with them.
  std::vector<int8_t> k8(6 * 64);
  std::vector<float> ks(6);
  d.k_cache = make_view(k8.data(), DType::kI8, {6, 64});
  st = paged_decode_attention(d, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("k_cache / v_cache dtype (i8 / f32) must both be q.dtype=f32 or both i8"), std::string::npos) << st.message();
  d.v_cache = make_view(k8.data(), DType::kI8, {6, 64});
  st = paged_decode_attention(d, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("k_scales.rank=0 but must be 1"), std::string::npos) << st.message();
  d.k_scales = make_view(ks.data(), DType::kF32, {6});
  d.v_scales = make_view(ks.data(), DType::kF32, {4});
  st = paged_decode_attention(d, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("v_scales must be f32 [num_slots=6] with i8 caches, got f32 [4]"), std::string::npos) << st.message();
  d.k_cache = d.v_cache = make_view(k.data(), DType::kF32, {6, 64});
  st = paged_decode_attention(d, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("k_scales is for i8 caches, but the caches are f32"), std::string::npos) << st.message();

  // MLA with an i8 latent: the scales and the rope part must come with it, and only with it.
  std::vector<int8_t> lat(6 * 48);
  std::vector<float> sc(6), rope(6 * 16);
  MlaDecodeParams m{.q = make_view(q.data(), DType::kF32, {1, 1, 4, 64}), .cache = make_view(lat.data(), DType::kI8, {6, 48}),
                    .block_tables = make_view(tables.data(), DType::kI32, {1, 2}), .seq_lens = make_view(lens.data(), DType::kI32, {1}),
                    .block_size = 2, .kv_lora_rank = 48, .out = make_view(out.data(), DType::kF32, {1, 1, 4, 48})};
  tables[1] = 1;
  st = mla_decode_attention(m, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("cache_scales.rank=0 but must be 1"), std::string::npos) << st.message();
  m.cache_scales = make_view(sc.data(), DType::kF32, {5});
  st = mla_decode_attention(m, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("cache_scales must be f32 [num_slots=6] with an i8 cache, got f32 [5]"), std::string::npos) << st.message();
  m.cache_scales = make_view(sc.data(), DType::kF32, {6});
  m.rope_cache = make_view(rope.data(), DType::kF32, {6, 8});
  st = mla_decode_attention(m, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("rope_cache must be f32 [num_slots=6, rope_dim=16] with an i8 cache, got f32 [6, 8]"), std::string::npos)
      << st.message();
  m.rope_cache = make_view(rope.data(), DType::kF32, {6, 16});
  EXPECT_TRUE(mla_decode_attention(m, {ws.data(), mla_decode_attention_workspace_size(m)}).ok());
  m.cache = make_view(lat.data(), DType::kI8, {6, 64});
  st = mla_decode_attention(m, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("an i8 cache must be [num_slots, kv_lora_rank=48], got [6, 64]"), std::string::npos) << st.message();
  m.cache = make_view(k.data(), DType::kF32, {6, 64});
  st = mla_decode_attention(m, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("cache_scales / rope_cache are for an i8 cache, but cache is f32"), std::string::npos) << st.message();
}

// Inputs a fuzz sweep found reading or writing out of bounds, or accepted silently: each
// must be an error that names the argument.
TEST(AttentionBadInput, FuzzFindings) {
  std::vector<float> q(5 * 2 * 8), k(6 * 2 * 8), out(5 * 2 * 8), lse(64);
  std::vector<int32_t> cq = {0, 5}, ck = {0, 6};
  std::vector<uint8_t> ws(1 << 20);
  auto err = [](const Status& st) { return st.ok() ? std::string("ok") : st.message(); };
  // TND: out with fewer heads than q was written past its end; v with more kv heads read past.
  FlashAttentionParams t{.q = make_view(q.data(), DType::kF32, {5, 2, 8}), .k = make_view(k.data(), DType::kF32, {6, 2, 8}),
                         .v = make_view(k.data(), DType::kF32, {6, 2, 8}), .out = make_view(out.data(), DType::kF32, {5, 1, 8}),
                         .layout = AttnLayout::kTND, .cu_seqlens_q = make_view(cq.data(), DType::kI32, {2}),
                         .cu_seqlens_kv = make_view(ck.data(), DType::kI32, {2})};
  EXPECT_NE(err(flash_attention(t, {ws.data(), ws.size()})).find("out 1 but k has Nkv=2 and q Nq=2"), std::string::npos);
  t.out = make_view(out.data(), DType::kF32, {5, 2, 8});
  EXPECT_EQ(err(flash_attention(t, {ws.data(), ws.size()})), "ok");
  t.v = make_view(k.data(), DType::kF32, {3, 4, 8});
  t.v.sizes[0] = 6;
  EXPECT_NE(err(flash_attention(t, {ws.data(), ws.size()})).find("v has 4 heads"), std::string::npos);
  t.v = make_view(k.data(), DType::kF32, {6, 2, 8});
  // Negative strides on sinks / lse, overlapping outputs, non-finite attributes.
  std::vector<float> sinks(2);
  t.sinks = make_view(sinks.data(), DType::kF32, {2}, {-1});
  EXPECT_EQ(err(flash_attention(t, {ws.data(), ws.size()})), "flash_attention: sinks.strides[0]=-1 is negative (negative strides are not supported)");
  t.sinks = {};
  t.out = make_view(out.data(), DType::kF32, {5, 2, 8}, {0, 8, 1});
  EXPECT_NE(err(flash_attention(t, {ws.data(), ws.size()})).find("out.strides[0]=0 repeats its elements"), std::string::npos);
  t.out = make_view(out.data(), DType::kF32, {5, 2, 8});
  t.softcap = NAN;
  EXPECT_NE(err(flash_attention(t, {ws.data(), ws.size()})).find("softcap=nan must be finite"), std::string::npos);
  t.softcap = 0.0f;
  t.scale = INFINITY;
  EXPECT_EQ(err(flash_attention(t, {ws.data(), ws.size()})), "flash_attention: scale=inf must be finite");
  t.scale = 0.0f;
  // A window past any sequence is unbounded, not a position overflow.
  t.window_left = INT64_MAX;
  t.window_right = INT64_MAX;
  EXPECT_EQ(err(flash_attention(t, {ws.data(), ws.size()})), "ok");
  // Null views whose sizes multiply past int64 got past `numel() > 0 && !data`.
  t.q = make_view(nullptr, DType::kF32, {int64_t(1) << 32, int64_t(1) << 32, 8});
  EXPECT_FALSE(flash_attention(t, {ws.data(), ws.size()}).ok());

  // Paged decode: a negative block_tables row stride read before the table; scale NaN.
  std::vector<int32_t> tables = {0, 1}, lens = {2, 2};
  PagedDecodeParams d{.q = make_view(q.data(), DType::kF32, {2, 1, 2, 8}), .k_cache = make_view(k.data(), DType::kF32, {4, 8}),
                      .v_cache = make_view(k.data(), DType::kF32, {4, 8}),
                      .block_tables = make_view(tables.data(), DType::kI32, {2, 1}, {-1, 1}),
                      .seq_lens = make_view(lens.data(), DType::kI32, {2}), .block_size = 2, .kv_heads = 1,
                      .out = make_view(out.data(), DType::kF32, {2, 1, 2, 8})};
  EXPECT_EQ(err(paged_decode_attention(d, {ws.data(), ws.size()})),
            "paged_decode_attention: block_tables.strides[0]=-1 is negative (negative strides are not supported)");
  d.block_tables = make_view(tables.data(), DType::kI32, {2, 2}, {1, 1});  // rows overlap
  EXPECT_NE(err(paged_decode_attention(d, {ws.data(), ws.size()})).find("block_tables must be i32 [B=2, max_blocks] with contiguous rows"),
            std::string::npos);
  d.block_tables = make_view(tables.data(), DType::kI32, {2, 1});
  EXPECT_EQ(err(paged_decode_attention(d, {ws.data(), paged_decode_attention_workspace_size(d)})), "ok");
  d.scale = NAN;
  EXPECT_NE(err(paged_decode_attention(d, {ws.data(), ws.size()})).find("scale=nan must be finite"), std::string::npos);
  d.scale = 0.0f;
  d.block_size = int64_t(1) << 62;  // max_blocks * block_size wrapped
  EXPECT_NE(err(paged_decode_attention(d, {ws.data(), ws.size()})), "ok");

  // attention_update: lse written at a negative stride; outs sized past int64 with null data.
  std::vector<float> outs(2 * 3 * 4), lses(2 * 3), o(3 * 4);
  AttentionUpdateParams u{.outs = make_view(outs.data(), DType::kF32, {2, 3, 4}), .lses = make_view(lses.data(), DType::kF32, {2, 3}),
                          .out = make_view(o.data(), DType::kF32, {3, 4}), .lse = make_view(lse.data() + 8, DType::kF32, {3}, {-1})};
  EXPECT_EQ(err(attention_update(u)), "attention_update: lse.strides[0]=-1 is negative (negative strides are not supported)");
  u.lse = {};
  u.out = make_view(o.data(), DType::kF32, {3, 4}, {0, 1});
  EXPECT_NE(err(attention_update(u)).find("out.strides[0]=0 repeats its elements"), std::string::npos);
  u.out = make_view(o.data(), DType::kF32, {3, 4});
  u.outs = make_view(nullptr, DType::kF32, {int64_t(1) << 62, 3, 4});
  EXPECT_NE(err(attention_update(u)), "ok");

  // Zero query heads passed the Nq % Nkv check, then the job tiling divided by zero
  // (SIGFPE, in the decode workspace queries too).
  std::vector<int32_t> one_block = {0}, one_len = {1};
  FlashAttentionParams f0{.q = make_view(q.data(), DType::kF32, {1, 1, 0, 8}), .k = make_view(k.data(), DType::kF32, {1, 3, 2, 8}),
                          .v = make_view(k.data(), DType::kF32, {1, 3, 2, 8}), .out = make_view(out.data(), DType::kF32, {1, 1, 0, 8})};
  EXPECT_EQ(flash_attention_workspace_size(f0), 0u);
  EXPECT_EQ(err(flash_attention(f0, {ws.data(), ws.size()})), "flash_attention: q has Nq=0 heads; need at least one");
  PagedDecodeParams d0{.q = make_view(q.data(), DType::kF32, {1, 1, 0, 8}), .k_cache = make_view(k.data(), DType::kF32, {4, 8}),
                       .v_cache = make_view(k.data(), DType::kF32, {4, 8}), .block_tables = make_view(one_block.data(), DType::kI32, {1, 1}),
                       .seq_lens = make_view(one_len.data(), DType::kI32, {1}), .block_size = 4, .kv_heads = 1,
                       .out = make_view(out.data(), DType::kF32, {1, 1, 0, 8})};
  EXPECT_EQ(paged_decode_attention_workspace_size(d0), 0u);
  EXPECT_EQ(err(paged_decode_attention(d0, {ws.data(), ws.size()})), "paged_decode_attention: q.sizes[2]=0 query heads; need at least one");
  MlaDecodeParams m0{.q = make_view(q.data(), DType::kF32, {1, 1, 0, 8}), .cache = make_view(k.data(), DType::kF32, {4, 8}),
                     .block_tables = d0.block_tables, .seq_lens = d0.seq_lens, .block_size = 4, .kv_lora_rank = 4,
                     .out = make_view(out.data(), DType::kF32, {1, 1, 0, 4}), .scale = 0.1f};
  EXPECT_EQ(mla_decode_attention_workspace_size(m0), 0u);
  EXPECT_EQ(err(mla_decode_attention(m0, {ws.data(), ws.size()})), "mla_decode_attention: q.sizes[2]=0 query heads; need at least one");
}

// Outputs (and the workspace, where splits keep their partials) are written while other
// jobs still read q, the caches and the tables that address them: any overlap is an
// error naming both views. (Found by a fuzzer: attention_update merged rows it had
// already overwritten, without a word.) Shapes that would overflow kv_heads * D are
// errors too, not undefined behaviour.
TEST(AttentionBadInput, OutputsApartFromInputsAndWorkspace) {
  std::vector<float> q(4 * 8), k(4 * 8), v(4 * 8), out(4 * 8), lse(8);
  std::vector<uint8_t> ws(1 << 20);
  auto err = [](const Status& st) { return st.ok() ? std::string("ok") : st.message(); };
  FlashAttentionParams f{.q = make_view(q.data(), DType::kF32, {1, 4, 1, 8}), .k = make_view(k.data(), DType::kF32, {1, 4, 1, 8}),
                         .v = make_view(v.data(), DType::kF32, {1, 4, 1, 8}), .out = make_view(out.data(), DType::kF32, {1, 4, 1, 8})};
  EXPECT_EQ(err(flash_attention(f, {ws.data(), ws.size()})), "ok");
  f.out = f.k;
  EXPECT_EQ(err(flash_attention(f, {ws.data(), ws.size()})), "flash_attention: out overlaps k (an output must not share memory with an input)");
  f.out = make_view(out.data(), DType::kF32, {1, 4, 1, 8});
  f.lse = make_view(out.data() + 28, DType::kF32, {1, 1, 4});
  EXPECT_EQ(err(flash_attention(f, {ws.data(), ws.size()})), "flash_attention: out and lse overlap (outputs must not share memory)");
  f.lse = {};
  // A workspace over q (q's bytes only: the overlap is found before the size is checked).
  const Status in_ws = flash_attention(f, {reinterpret_cast<uint8_t*>(q.data()), q.size() * sizeof(float)});
  EXPECT_EQ(err(in_ws), "flash_attention: workspace overlaps q (an output must not share memory with an input)");
  // Past the bytes the op asks for, the caller's arena may hold the outputs.
  const size_t fneed = flash_attention_workspace_size(f);
  std::vector<uint8_t> arena(fneed + 4 * 8 * sizeof(float) + 64);
  f.out = make_view(arena.data() + fneed + 64, DType::kF32, {1, 4, 1, 8});
  EXPECT_EQ(err(flash_attention(f, {arena.data(), arena.size()})), "ok");
  f.out = make_view(out.data(), DType::kF32, {1, 4, 1, 8});

  std::vector<int32_t> table = {0}, len = {4};
  PagedDecodeParams d{.q = make_view(q.data(), DType::kF32, {1, 1, 1, 8}), .k_cache = make_view(k.data(), DType::kF32, {4, 8}),
                      .v_cache = make_view(v.data(), DType::kF32, {4, 8}), .block_tables = make_view(table.data(), DType::kI32, {1, 1}),
                      .seq_lens = make_view(len.data(), DType::kI32, {1}), .block_size = 4, .kv_heads = 1,
                      .out = make_view(out.data(), DType::kF32, {1, 1, 1, 8})};
  EXPECT_EQ(err(paged_decode_attention(d, {ws.data(), ws.size()})), "ok");
  d.lse = make_view(table.data(), DType::kF32, {1, 1, 1});
  EXPECT_EQ(err(paged_decode_attention(d, {ws.data(), ws.size()})),
            "paged_decode_attention: lse overlaps block_tables (an output must not share memory with an input)");
  d.lse = {};
  d.out = make_view(v.data() + 8, DType::kF32, {1, 1, 1, 8});
  EXPECT_EQ(err(paged_decode_attention(d, {ws.data(), ws.size()})),
            "paged_decode_attention: out overlaps v_cache (an output must not share memory with an input)");
  d.out = make_view(out.data(), DType::kF32, {1, 1, 1, 8});
  // kv_heads * D past int64: with no batch q has no elements, so Nq (and kv_heads) may be
  // 2^62; the product is never formed (UBSan aborted on it).
  PagedDecodeParams big = d;
  big.q = make_view(q.data(), DType::kF32, {0, 1, int64_t(1) << 62, 8});
  big.out = make_view(out.data(), DType::kF32, {0, 1, int64_t(1) << 62, 8});
  big.kv_heads = int64_t(1) << 62;
  EXPECT_EQ(err(paged_decode_attention(big, {ws.data(), ws.size()})),
            "paged_decode_attention: k_cache.sizes[1]=8 but must be kv_heads * D = 4611686018427387904 * 8");
  EXPECT_EQ(paged_decode_attention_workspace_size(big), 0u);

  MlaDecodeParams m{.q = make_view(q.data(), DType::kF32, {1, 1, 1, 8}), .cache = make_view(k.data(), DType::kF32, {4, 8}),
                    .block_tables = d.block_tables, .seq_lens = d.seq_lens, .block_size = 4, .kv_lora_rank = 4,
                    .out = make_view(out.data(), DType::kF32, {1, 1, 1, 4})};
  EXPECT_EQ(err(mla_decode_attention(m, {ws.data(), ws.size()})), "ok");
  m.out = make_view(k.data() + 4, DType::kF32, {1, 1, 1, 4});
  EXPECT_EQ(err(mla_decode_attention(m, {ws.data(), ws.size()})),
            "mla_decode_attention: out overlaps cache (an output must not share memory with an input)");

  std::vector<float> outs(2 * 3 * 4), lses(2 * 3, 0.0f), merged(3 * 4);
  AttentionUpdateParams u{.outs = make_view(outs.data(), DType::kF32, {2, 3, 4}), .lses = make_view(lses.data(), DType::kF32, {2, 3}),
                          .out = make_view(merged.data(), DType::kF32, {3, 4})};
  EXPECT_EQ(err(attention_update(u)), "ok");
  u.out = make_view(outs.data() + 4, DType::kF32, {3, 4});
  EXPECT_EQ(err(attention_update(u)), "attention_update: out overlaps outs (an output must not share memory with an input)");
  // No rows: nothing to lay out, whatever the strides (numpy's for np.empty((2, 0, 4))).
  u.outs = make_view(outs.data(), DType::kF32, {2, 0, 4}, {4, 4, 1});
  u.lses = make_view(lses.data(), DType::kF32, {2, 0}, {1, 1});
  u.out = make_view(merged.data(), DType::kF32, {0, 4});
  EXPECT_EQ(err(attention_update(u)), "ok");
}

// Zero query tokens write nothing: make_view gives the dims above an empty one stride 0,
// which the output overlap check took for repeated elements.
TEST(AttentionBadInput, ZeroQueryTokensAreNoOps) {
  std::vector<float> kv(2 * 3 * 2 * 8, 0.5f), lse(4, -7.0f);
  std::vector<int32_t> cq = {0, 0, 0}, ck = {0, 3, 6};
  std::vector<uint8_t> ws(1 << 20);
  for (AttnLayout layout : {AttnLayout::kBSND, AttnLayout::kBNSD}) {
    const bool bsnd = layout == AttnLayout::kBSND;
    const TensorView q = bsnd ? make_view(nullptr, DType::kF32, {2, 0, 2, 8}) : make_view(nullptr, DType::kF32, {2, 2, 0, 8});
    const TensorView kv4 = bsnd ? make_view(kv.data(), DType::kF32, {2, 3, 2, 8}) : make_view(kv.data(), DType::kF32, {2, 2, 3, 8});
    FlashAttentionParams p{.q = q, .k = kv4, .v = kv4, .out = q,
                           .lse = make_view(nullptr, DType::kF32, {2, 2, 0}), .layout = layout};
    const Status st = flash_attention(p, {ws.data(), flash_attention_workspace_size(p)});
    EXPECT_TRUE(st.ok()) << (bsnd ? "BSND: " : "BNSD: ") << st.message();
  }
  FlashAttentionParams t{.q = make_view(nullptr, DType::kF32, {0, 2, 8}), .k = make_view(kv.data(), DType::kF32, {6, 2, 8}),
                         .v = make_view(kv.data(), DType::kF32, {6, 2, 8}), .out = make_view(nullptr, DType::kF32, {0, 2, 8}),
                         .lse = make_view(nullptr, DType::kF32, {2, 0}), .layout = AttnLayout::kTND,
                         .cu_seqlens_q = make_view(cq.data(), DType::kI32, {3}), .cu_seqlens_kv = make_view(ck.data(), DType::kI32, {3})};
  const Status st = flash_attention(t, {ws.data(), flash_attention_workspace_size(t)});
  EXPECT_TRUE(st.ok()) << "TND: " << st.message();
}

TEST(AttentionDispatch, SelectedRespectsMaxIsa) {
  for (const auto* reg : {&flash_registry(), &paged_registry(), &mla_registry()}) {
    const auto* impl = reg->find(selected_impl(reg->op()));
    ASSERT_NE(impl, nullptr) << reg->op();
    EXPECT_LE(int(impl->isa), int(active_isa()));
    if (dispatch::forced_impl(reg->op()).empty()) {  // else OPTX_IMPL's choice
      EXPECT_EQ(reg->runnable().front(), impl);
    }
  }
  FlashCase c;
  EXPECT_TRUE(testutil::run_flash(*flash_registry().runnable().front(), c).pass());
}

}  // namespace
}  // namespace optx::attn_detail
