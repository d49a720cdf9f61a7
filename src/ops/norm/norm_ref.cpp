// References: statistics and products in double. The residual sum is defined as the f32
// sum of the two stored values, rounded to the dtype (what any f32-computing kernel stores).
#include <cmath>

#include "ops/norm/norm_internal.h"

namespace optx::norm_detail {
namespace {
double get(const Rows& r, const void* base, int64_t ld, int64_t t, int64_t i) {
  return r.bf16 ? double(bf16_to_f32(static_cast<const uint16_t*>(base)[t * ld + i]))
                : double(static_cast<const float*>(base)[t * ld + i]);
}
void put(const Rows& r, void* base, int64_t ld, int64_t t, int64_t i, double v) {
  if (r.bf16) static_cast<uint16_t*>(base)[t * ld + i] = f32_to_bf16(float(v));
  else static_cast<float*>(base)[t * ld + i] = float(v);
}
void norm_row(const Rows& r, const void* src, int64_t lds, int64_t t) {
  double ss = 0;
  for (int64_t i = 0; i < r.H; ++i) ss += get(r, src, lds, t, i) * get(r, src, lds, t, i);
  const double inv = 1.0 / std::sqrt(ss / double(r.H) + double(r.eps));
  for (int64_t i = 0; i < r.H; ++i) put(r, r.out, r.ldo, t, i, get(r, src, lds, t, i) * inv * get(r, r.weight, 0, 0, i));
}
}  // namespace

Status rms_norm_reference(const Rows& r) {
  for (int64_t t = 0; t < r.T; ++t) norm_row(r, r.x, r.ldx, t);
  return Status::Ok();
}

Status add_rms_norm_reference(const Rows& r) {
  for (int64_t t = 0; t < r.T; ++t) {
    for (int64_t i = 0; i < r.H; ++i) {
      const float sum = float(get(r, r.residual, r.ldr, t, i)) + float(get(r, r.x, r.ldx, t, i));
      put(r, r.residual, r.ldr, t, i, sum);
    }
    norm_row(r, r.residual, r.ldr, t);
  }
  return Status::Ok();
}

}  // namespace optx::norm_detail
