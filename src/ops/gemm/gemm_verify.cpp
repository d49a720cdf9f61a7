// `optx verify` cases for gemm: every runnable implementation x dtype combination x shapes
// (tile edges, 1023, strided views, beta/bias/alpha, large magnitudes, fused SwiGLU).
#include <tuple>

#include "ops/gemm/gemm_testutil.h"
#include "tools/verify.h"

namespace optx::gemm_detail {
namespace {

void verify_gemm(std::vector<verify::Record>& out) {
  using testutil::Bias;
  using testutil::Case;
  const DType combos[][3] = {
      {DType::kF32, DType::kF32, DType::kF32},   {DType::kF32, DType::kF32, DType::kBF16},
      {DType::kBF16, DType::kBF16, DType::kF32}, {DType::kBF16, DType::kBF16, DType::kBF16},
      {DType::kF32, DType::kBF16, DType::kF32},  {DType::kF32, DType::kI8, DType::kF32},
      {DType::kBF16, DType::kI8, DType::kBF16},
  };
  struct Shape {
    int64_t M, N, K;
    bool packed;
    int64_t pad;
    float alpha, beta;
    Bias bias;
    bool kn;  // B stored [K, N]
  };
  const Shape shapes[] = {
      {1, 1023, 1023, true, 0, 1.0f, 0.0f, Bias::kNone, false},     // decode GEMV
      {16, 257, 511, true, 3, 1.0f, 1.0f, Bias::kF32, false},       // decode batch, beta
      {33, 129, 257, false, 0, -2.0f, 0.5f, Bias::kBF16, true},     // unpacked B [K, N]
      {4, 1023, 1025, false, 2, 1.0f, 0.5f, Bias::kF32, false},     // decode, unpacked [N, K]
      {3, 1030, 1023, false, 3, 1.0f, 0.0f, Bias::kNone, true},     // decode, unpacked [K, N] (P V)
      {113, 17, 1023, true, 1, 1.0f, 0.0f, Bias::kF32, false},      // long K, narrow N
      {130, 200, 64, false, 0, 1e3f, 0.0f, Bias::kNone, false},     // large magnitude outputs
      {1023, 7, 17, true, 0, 1.0f, 0.0f, Bias::kNone, false},       // tall, tiny N and K
  };
  for (const auto* impl : registry().runnable()) {
    for (const auto& t : combos) {
      for (const auto& s : shapes) {
        Case c;
        c.M = s.M, c.N = s.N, c.K = s.K;
        c.a = t[0], c.b = t[1], c.c = t[2];
        c.packed = s.packed;
        c.lda_pad = s.pad;
        c.ldc_pad = s.pad;
        c.ldb_pad = s.packed ? 0 : s.pad;
        c.alpha = s.alpha;
        c.beta = s.beta;
        c.bias = s.bias;
        c.b_kn = s.kn;
        const auto o = testutil::run_case(*impl, c, uint64_t(s.M * 131 + s.K));
        out.push_back(verify::make_record("gemm", impl->name, c.name(), o.status, o.cmp));
      }
      // Fused SwiGLU epilogue: decode, an AMX-sized block with K tail, many row blocks.
      for (auto [M, I, K] : {std::tuple{1, 192, 1023}, {33, 128, 257}, {130, 64, 64}}) {
        Case c;
        c.M = M, c.N = 2 * I, c.K = K;
        c.a = t[0], c.b = t[1], c.c = t[2];
        c.swiglu = true;
        c.ldc_pad = M % 2 ? 3 : 0;
        const auto o = testutil::run_case(*impl, c, uint64_t(M * 17 + K));
        out.push_back(verify::make_record("gemm", impl->name, c.name(), o.status, o.cmp));
      }
    }
  }
}

OPTX_REGISTER_VERIFY("gemm", verify_gemm);

}  // namespace
}  // namespace optx::gemm_detail
