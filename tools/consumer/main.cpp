// Downstream smoke test: a 2x2 GEMM through the installed headers and library.
#include <cstdio>
#include <vector>

#include "optx/gemm.h"

int main() {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4] = {};
  optx::GemmParams p{.a = optx::make_view(a, optx::DType::kF32, {2, 2}),
                     .b = optx::make_view(b, optx::DType::kF32, {2, 2}),
                     .c = optx::make_view(c, optx::DType::kF32, {2, 2})};
  std::vector<unsigned char> ws(optx::gemm_workspace_size(p));
  const optx::Status st = optx::gemm(p, {ws.data(), ws.size()});
  if (!st.ok() || c[0] != 1 || c[1] != 2 || c[2] != 3 || c[3] != 4) {
    std::printf("consumer: FAILED %s\n", st.message().c_str());
    return 1;
  }
  std::printf("consumer: optx %s ok (gemm impl %s)\n", optx::version(), optx::selected_impl("gemm").c_str());
  return 0;
}
