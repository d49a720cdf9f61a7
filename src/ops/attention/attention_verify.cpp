// `optx verify` cases for the attention family: every runnable implementation; lengths 1,
// 17, 113, 239, 1023; head dims 64-192 and MLA 576/512; GQA 1/3/4/8; causal, windows,
// masks, sinks, softcap, large logits; varlen with empty sequences; paged and MLA decode.
#include <tuple>

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
                                               {4, 2, 8, 1, 64, std::vector<int32_t>{2, 17, 113, 239}}}) {
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

OPTX_REGISTER_VERIFY("flash_attention", verify_flash);
OPTX_REGISTER_VERIFY("paged_decode_attention|mla_decode_attention", verify_decode);

}  // namespace
}  // namespace optx::attn_detail
