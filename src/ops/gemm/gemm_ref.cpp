// Reference GEMM: the definition, in double precision, with no blocking and no packing
// tricks beyond reading packed weights through PackedMatrix::at.
#include "ops/gemm/gemm_internal.h"

#include <cmath>

namespace optx::gemm_detail {
namespace {
double load(const TensorView& t, int64_t i0, int64_t i1) {
  const int64_t off = i0 * t.strides[0] + (t.rank > 1 ? i1 * t.strides[1] : 0);
  switch (t.dtype) {
    case DType::kF32: return static_cast<const float*>(t.data)[off];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(t.data)[off]);
    case DType::kI8: return static_cast<const int8_t*>(t.data)[off];
    default: return 0.0;
  }
}
}  // namespace

Status gemm_reference(const GemmParams& p, Workspace) {
  const int64_t M = p.a.sizes[0], K = p.a.sizes[1];
  const int64_t N = p.c.sizes[1];
  const bool swiglu = p.activation == GemmActivation::kSwiglu;
  const DType bt = p.packed_b ? p.packed_b->dtype : p.b.dtype;
  // Row n of B times A's row m, scaled (i8 weights) and times alpha.
  auto dot = [&](int64_t m, int64_t n) {
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      double b;
      if (p.packed_b) b = p.packed_b->at(n, k);
      else b = p.b_kn ? load(p.b, k, n) : load(p.b, n, k);
      acc += load(p.a, m, k) * b;
    }
    double scale = 1.0;
    if (bt == DType::kI8) scale = p.packed_b ? p.packed_b->scales[n] : load(p.b_scales, n, 0);
    return double(p.alpha) * scale * acc;
  };
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double v;
      if (swiglu) {
        const double g = dot(m, n);
        v = g / (1.0 + std::exp(-g)) * dot(m, N + n);
      } else {
        v = dot(m, n);
      }
      if (!p.bias.empty()) v += load(p.bias, n, 0);
      const int64_t off = m * p.c.strides[0] + n * p.c.strides[1];
      if (p.c.dtype == DType::kF32) {
        float* c = static_cast<float*>(p.c.data) + off;
        if (p.beta != 0.0f) v += double(p.beta) * *c;
        *c = float(v);
      } else {
        uint16_t* c = static_cast<uint16_t*>(p.c.data) + off;
        if (p.beta != 0.0f) v += double(p.beta) * bf16_to_f32(*c);
        *c = f32_to_bf16(float(v));
      }
    }
  }
  return Status::Ok();
}

}  // namespace optx::gemm_detail
