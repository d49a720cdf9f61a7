// Portable microkernels: plain C++ the compiler may vectorise with the baseline ISA only.
#include <cstring>

#include "ops/gemm/gemm_kernels.h"

#include "simd/simd_scalar.h"
#define OPTX_ISA_NS scalar
#define OPTX_GEMM_SIMD ::optx::simd::Scalar
#include "ops/gemm/gemm_epilogue_inl.h"

namespace optx::gemm_detail::scalar {
namespace {

void start_tile(int m, float* acc, bool accumulate) {
  if (!accumulate) std::memset(acc, 0, sizeof(float) * size_t(m) * kNR);
}

void kern_f32(int m, int64_t kc, const float* a, const void* bv, float* acc,
              bool accumulate, const Prefetch& /*no software prefetch here*/) {
  start_tile(m, acc, accumulate);
  const float* b = static_cast<const float*>(bv);
  for (int r = 0; r < m; ++r) {
    float* c = acc + r * kNR;
    for (int64_t k = 0; k < kc; ++k) {
      const float av = a[k * kMR + r];
      const float* bk = b + k * kNR;
      for (int n = 0; n < kNR; ++n) c[n] += av * bk[n];
    }
  }
}

void kern_bf16b(int m, int64_t kc, const float* a, const void* bv, float* acc,
                bool accumulate, const Prefetch& /*no software prefetch here*/) {
  start_tile(m, acc, accumulate);
  const uint16_t* b = static_cast<const uint16_t*>(bv);
  for (int r = 0; r < m; ++r) {
    float* c = acc + r * kNR;
    for (int64_t k = 0; k < kc; ++k) {
      const float av = a[k * kMR + r];
      const uint16_t* bk = b + (k / 2) * 2 * kNR + (k & 1);
      for (int n = 0; n < kNR; ++n) c[n] += av * bf16_to_f32(bk[2 * n]);
    }
  }
}

void kern_i8b(int m, int64_t kc, const float* a, const void* bv, float* acc,
              bool accumulate, const Prefetch& /*no software prefetch here*/) {
  start_tile(m, acc, accumulate);
  const int8_t* b = static_cast<const int8_t*>(bv);
  for (int r = 0; r < m; ++r) {
    float* c = acc + r * kNR;
    for (int64_t k = 0; k < kc; ++k) {
      const float av = a[k * kMR + r];
      const int8_t* bk = b + k * kNR;
      for (int n = 0; n < kNR; ++n) c[n] += av * float(bk[n]);
    }
  }
}

}  // namespace
}  // namespace optx::gemm_detail::scalar

namespace optx::gemm_detail {
const KernelTable& kernels_scalar() {
  static const KernelTable t{scalar::kern_f32, scalar::kern_bf16b, scalar::kern_i8b, nullptr,
                             scalar::epilogue};
  return t;
}
}  // namespace optx::gemm_detail
