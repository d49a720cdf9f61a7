// `optx verify` cases for rms_norm and add_rms_norm: every runnable implementation, both
// dtypes, DeepSeek hidden sizes and odd ones, strided rows, aliasing, large magnitudes.
#include <tuple>

#include "ops/norm/norm_testutil.h"
#include "tools/verify.h"

namespace optx::norm_detail {
namespace {

void verify_norm(std::vector<verify::Record>& out, bool add) {
  {
    const auto& reg = add ? add_rms_norm_registry() : rms_norm_registry();
    for (const auto* impl : reg.runnable())
      for (DType dt : {DType::kF32, DType::kBF16})
        for (auto [T, H, pad, alias, scale] : {std::tuple{1, 1, 0, false, 1.0f}, {3, 7, 2, true, 1.0f}, {17, 769, 0, false, 1.0f},
                                              {5, 5125, 3, false, 1.0f}, {9, 7168, 0, true, 1.0f}, {4, 2048, 0, false, 3e3f},
                                              {33, 576, 1, false, 1e-3f}}) {
          testutil::Case c;
          c.add = add, c.dtype = dt, c.T = T, c.H = H, c.pad = pad, c.out_aliases_x = alias, c.scale = scale;
          const auto o = testutil::run_case(*impl, c, uint64_t(H * 7 + T));
          out.push_back(verify::make_record(reg.op(), impl->name, c.name(), o.status, o.cmp));
        }
  }
}

void verify_rms_norm(std::vector<verify::Record>& out) { verify_norm(out, false); }
void verify_add_rms_norm(std::vector<verify::Record>& out) { verify_norm(out, true); }
OPTX_REGISTER_VERIFY("rms_norm", verify_rms_norm);
OPTX_REGISTER_VERIFY("add_rms_norm", verify_add_rms_norm);

}  // namespace
}  // namespace optx::norm_detail
