// Reference RoPE: the definitions in optx/rope.h, in double, one element at a time.
#include <vector>

#include "ops/rope/rope_internal.h"

namespace optx::rope_detail {

Status rope_reference(const Args& a) {
  const int64_t d = a.rotary_dim, half = d / 2;
  std::vector<double> x(static_cast<size_t>(d)), y(static_cast<size_t>(d));
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t pos = a.position(t);
    const float* c = a.cos + pos * a.cs_stride;
    const float* s = a.sin + pos * a.cs_stride;
    for (const HeadSet* hs : {&a.q, &a.k})
      for (int64_t h = 0; h < hs->heads; ++h) {
        const int64_t off = t * hs->st + h * hs->sh + a.rotary_offset;
        for (int64_t i = 0; i < d; ++i)
          x[size_t(i)] = a.bf16 ? bf16_to_f32(static_cast<uint16_t*>(hs->x)[off + i]) : static_cast<float*>(hs->x)[off + i];
        for (int64_t i = 0; i < half; ++i) {
          const double ci = c[i], si = s[i];
          switch (a.style) {
            case RopeStyle::kHalf:
              y[size_t(i)] = x[size_t(i)] * ci - x[size_t(i + half)] * si;
              y[size_t(i + half)] = x[size_t(i + half)] * ci + x[size_t(i)] * si;
              break;
            case RopeStyle::kInterleaved:
              y[size_t(2 * i)] = x[size_t(2 * i)] * ci - x[size_t(2 * i + 1)] * si;
              y[size_t(2 * i + 1)] = x[size_t(2 * i + 1)] * ci + x[size_t(2 * i)] * si;
              break;
            case RopeStyle::kInterleavedToHalf:
              y[size_t(i)] = x[size_t(2 * i)] * ci - x[size_t(2 * i + 1)] * si;
              y[size_t(i + half)] = x[size_t(2 * i + 1)] * ci + x[size_t(2 * i)] * si;
              break;
          }
        }
        for (int64_t i = 0; i < d; ++i) {
          if (a.bf16) static_cast<uint16_t*>(hs->x)[off + i] = f32_to_bf16(float(y[size_t(i)]));
          else static_cast<float*>(hs->x)[off + i] = float(y[size_t(i)]);
        }
      }
  }
  return Status::Ok();
}

}  // namespace optx::rope_detail
