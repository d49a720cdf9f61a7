// `optx verify` cases for the fused cache writes (every runnable implementation): DeepSeek
// MLA rows (512 + 64), odd latent widths, all rope styles; Llama / GQA qkv rows.
#include <tuple>

#include "ops/kv_cache/kv_cache_testutil.h"
#include "tools/verify.h"

namespace optx::kv_detail {
namespace {

void verify_mla(std::vector<verify::Record>& out) {
  for (const auto* impl : mla_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [T, rank, rd, style] : {std::tuple{33, 512, 64, RopeStyle::kInterleaved}, {17, 512, 64, RopeStyle::kInterleavedToHalf},
                                        {5, 769, 32, RopeStyle::kHalf}, {1, 7, 2, RopeStyle::kInterleaved}}) {
        testutil::MlaCase c;
        c.dtype = dt, c.T = T, c.rank = rank, c.rope_dim = rd, c.style = style, c.num_slots = 96, c.pos64 = T % 2 == 0;
        const auto o = testutil::run_mla(*impl, c, uint64_t(T * rank));
        out.push_back(verify::make_record("kv_rms_norm_rope_cache", impl->name, c.name(), o.status, o.cmp));
      }
}

void verify_qkv(std::vector<verify::Record>& out) {
  for (const auto* impl : qkv_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [T, hq, hkv, d, rd, style] : {std::tuple{17, 32, 8, 128, 0, RopeStyle::kHalf}, {9, 16, 16, 64, 64, RopeStyle::kInterleaved},
                                              {5, 12, 4, 80, 40, RopeStyle::kHalf}, {3, 4, 1, 256, 128, RopeStyle::kInterleavedToHalf}}) {
        testutil::QkvCase c;
        c.dtype = dt, c.T = T, c.hq = hq, c.hkv = hkv, c.d = d, c.rotary_dim = rd, c.style = style, c.num_slots = 40;
        const auto o = testutil::run_qkv(*impl, c, uint64_t(T * d));
        out.push_back(verify::make_record("qkv_rope_cache", impl->name, c.name(), o.status, o.cmp));
      }
}

OPTX_REGISTER_VERIFY("kv_rms_norm_rope_cache", verify_mla);
OPTX_REGISTER_VERIFY("qkv_rope_cache", verify_qkv);

}  // namespace
}  // namespace optx::kv_detail
