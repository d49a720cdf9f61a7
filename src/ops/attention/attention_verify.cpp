// `optx verify` cases for the attention family: every runnable implementation; lengths 1,
// 17, 113, 239, 1023; head dims 64-192 and MLA 576/512; GQA 1/3/4/8; causal, windows,
// masks, sinks, softcap, large logits; varlen with empty sequences; paged and MLA decode;
// Sq or Skv 4097 (few rows over 4097 keys: split along the keys at 2 threads);
// attention_update against a double-precision merge.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ops/attention/attention_testutil.h"
#include "tools/verify.h"

namespace optx::attn_detail {
namespace {

void rec(std::vector<verify::Record>& out, const char* op, const char* impl, const std::string& name, const testutil::Outcome& o) {
  testing::CompareResult c = o.out;
  if (o.out.pass && !o.lse.pass) c = o.lse;
  c.pass = o.out.pass && o.lse.pass;
  out.push_back(verify::make_record(op, impl, name, o.status, c));
}

void verify_flash(std::vector<verify::Record>& out) {
  for (const auto* impl : flash_registry().runnable()) {
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [Sq, Skv, D, Dv, Nq, Nkv, causal] : {std::tuple{239, 239, 128, 128, 2, 1, true}, {17, 1023, 64, 64, 8, 1, true},
                                                    {113, 113, 192, 128, 3, 3, true}, {1, 1023, 96, 96, 4, 4, false},
                                                    {239, 17, 80, 80, 4, 2, true}}) {
        testutil::FlashCase c;
        c.dtype = dt, c.Sq = Sq, c.Skv = Skv, c.D = D, c.Dv = Dv, c.Nq = Nq, c.Nkv = Nkv, c.causal = causal;
        rec(out, "flash_attention", impl->name, c.name(), testutil::run_flash(*impl, c, uint64_t(Sq + Skv)));
      }
    // 4097 keys / queries (a GQA pair of heads, D 64, so the double reference stays quick):
    // a long causal prefix for 17 queries, and 4097 unmasked queries over 113 keys.
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [Sq, Skv, causal] : {std::tuple{17, 4097, true}, {4097, 113, false}}) {
        testutil::FlashCase c;
        c.dtype = dt, c.Sq = Sq, c.Skv = Skv, c.D = 64, c.Dv = 64, c.Nq = 2, c.Nkv = 1, c.causal = causal;
        rec(out, "flash_attention", impl->name, c.name(), testutil::run_flash(*impl, c, uint64_t(Sq * Skv)));
      }
    for (DType dt : {DType::kF32, DType::kBF16}) {  // MQA decode, one job: its keys split across threads, sinks in one split
      testutil::FlashCase c;
      c.dtype = dt, c.Sq = 1, c.Skv = 4097, c.D = 128, c.Dv = 128, c.Nq = 16, c.Nkv = 1, c.causal = true, c.sinks = true;
      rec(out, "flash_attention", impl->name, c.name(), testutil::run_flash(*impl, c, 7));
    }
    testutil::FlashCase c;  // masks, sinks, softcap, large logits, windows
    c.Sq = 33, c.Skv = 65, c.Nq = 4, c.Nkv = 1, c.mask = true, c.bias = true, c.sinks = true, c.softcap = 30.0f;
    rec(out, "flash_attention", impl->name, c.name(), testutil::run_flash(*impl, c, 3));
    c.mask = c.bias = c.sinks = false, c.softcap = 0, c.magnitude = 1e4f, c.wl = 8, c.wr = 0;
    rec(out, "flash_attention", impl->name, c.name(), testutil::run_flash(*impl, c, 4));
    testutil::FlashCase v;  // varlen
    v.layout = AttnLayout::kTND, v.Nq = 8, v.Nkv = 2, v.causal = true, v.lens_q = {0, 31, 1, 64}, v.lens_kv = {3, 31, 77, 64};
    rec(out, "flash_attention", impl->name, v.name(), testutil::run_flash(*impl, v, 5));
  }
}

void verify_decode(std::vector<verify::Record>& out) {
  for (const auto* impl : paged_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (bool i8 : {false, true})
        for (auto [B, Sq, Nq, Nkv, D, lens] : {std::tuple{1, 1, 32, 8, 128, std::vector<int32_t>{1023}},
                                               {4, 2, 8, 1, 64, std::vector<int32_t>{2, 17, 113, 239}},
                                               // speculative decoding: 3 new tokens over 32 / 8 heads
                                               {2, 3, 32, 8, 128, std::vector<int32_t>{4, 1023}}}) {
        testutil::DecodeCase c;
        c.dtype = dt, c.i8 = i8, c.B = B, c.Sq = Sq, c.Nq = Nq, c.Nkv = Nkv, c.D = D, c.Dv = D, c.lens = lens;
        rec(out, "paged_decode_attention", impl->name, c.name(), testutil::run_decode(*impl, c, uint64_t(B)));
      }
  for (const auto* impl : mla_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (bool i8 : {false, true}) {
        testutil::DecodeCase c;
        c.mla = true, c.i8 = i8, c.dtype = dt, c.B = 2, c.Sq = 1, c.Nq = 16, c.Nkv = 1, c.D = 576, c.Dv = 512, c.lens = {17, 239};
        c.block_size = 64;
        rec(out, "mla_decode_attention", impl->name, c.name(), testutil::run_decode(*impl, c, 9));
      }
}

// attention_update: P partials per row with random lse (some -inf: empty partials, whose
// outputs hold garbage that must not leak), one row with every partial empty; against
// testutil::merge_ref, the merge in double.
void verify_update(std::vector<verify::Record>& out) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto [P, R, Dv] : {std::tuple<int64_t, int64_t, int64_t>{3, 37, 80}, {1, 5, 512}, {8, 130, 16}}) {
      testing::Rng rng(uint64_t(P * R * Dv));
      std::vector<float> outs(size_t(P * R * Dv)), lses(size_t(P * R)), lse(size_t(R), NAN);
      for (auto& x : outs) x = rng.uniform(-3, 3);
      for (int64_t i = 0; i < P * R; ++i) lses[size_t(i)] = rng.below(4) == 0 ? -INFINITY : rng.uniform(-20, 20);
      for (int64_t i = 0; i < P; ++i) lses[size_t(i * R)] = -INFINITY;  // row 0: nothing attended
      for (int64_t i = 0; i < P * R; ++i)
        if (lses[size_t(i)] == -INFINITY)
          for (int64_t x = 0; x < Dv; ++x) outs[size_t(i * Dv + x)] = NAN;
      std::vector<float> of(size_t(R * Dv), NAN);
      std::vector<uint16_t> ob(size_t(R * Dv), 0x7fc0);  // bf16 NaN
      void* o = dt == DType::kF32 ? static_cast<void*>(of.data()) : static_cast<void*>(ob.data());
      const Status st = attention_update({.outs = make_view(outs.data(), DType::kF32, {P, R, Dv}),
                                          .lses = make_view(lses.data(), DType::kF32, {P, R}),
                                          .out = make_view(o, dt, {R, Dv}), .lse = make_view(lse.data(), DType::kF32, {R})});
      std::vector<double> ref, rlse, got;
      testutil::merge_ref(outs, lses, P, R, Dv, ref, rlse);
      for (int64_t i = 0; i < R * Dv; ++i) got.push_back(dt == DType::kF32 ? double(of[size_t(i)]) : double(bf16_to_f32(ob[size_t(i)])));
      for (int64_t r = 0; r < R; ++r) got.push_back(lse[size_t(r)]), ref.push_back(rlse[size_t(r)]);
      const std::string cs = std::string("dtype=") + dtype_name(dt) + " P=" + std::to_string(P) + " R=" + std::to_string(R) + " Dv=" +
                             std::to_string(Dv) + " neg_inf_partials=1 empty_row=1";
      out.push_back(verify::make_record("attention_update", "generic", cs, st, testutil::compare_merged(got, ref, dt == DType::kBF16)));
    }
}

OPTX_REGISTER_VERIFY("flash_attention", verify_flash);
OPTX_REGISTER_VERIFY("attention_update", verify_update);
OPTX_REGISTER_VERIFY("paged_decode_attention|mla_decode_attention", verify_decode);

}  // namespace
}  // namespace optx::attn_detail
