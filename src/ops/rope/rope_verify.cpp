// `optx verify` cases for rope: every runnable implementation, styles, DeepSeek MLA slices
// (64 trailing of 192 and of 576), Llama-style heads, YaRN tables, positions past the
// original context.
#include <tuple>

#include "ops/rope/rope_testutil.h"
#include "tools/verify.h"

namespace optx::rope_detail {
namespace {

void verify_rope(std::vector<verify::Record>& out) {
  for (const auto* impl : registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (RopeStyle st : {RopeStyle::kHalf, RopeStyle::kInterleaved, RopeStyle::kInterleavedToHalf})
        for (auto [T, Hq, Hk, D, rd, off, yarn] : {std::tuple{17, 16, 1, 192, 64, 128, 40.0}, {9, 1, 1, 576, 64, 512, 40.0},
                                                   {33, 32, 8, 128, 0, 0, 1.0}, {5, 7, 3, 80, 80, 0, 4.0}}) {
          testutil::Case c;
          c.dtype = dt, c.style = st, c.T = T, c.Hq = Hq, c.Hk = Hk, c.D = D, c.rotary_dim = rd, c.rotary_offset = off;
          c.yarn_factor = yarn, c.P = 9000, c.pos64 = T % 2 == 1;
          const auto o = testutil::run_case(*impl, c, uint64_t(T * D));
          out.push_back(verify::make_record("rope", impl->name, c.name(), o.status, o.cmp));
        }
}

OPTX_REGISTER_VERIFY("rope", verify_rope);

}  // namespace
}  // namespace optx::rope_detail
