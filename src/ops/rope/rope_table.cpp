// RoPE tables in double precision, with DeepSeek's YaRN (HF DeepseekV2YarnRotaryEmbedding):
//   f_i       = theta^(-2i/d)
//   corr(r)   = d * ln(L_orig / (2 pi r)) / (2 ln theta)
//   low, high = floor(corr(beta_fast)), ceil(corr(beta_slow)), clamped to [0, d - 1]
//   ramp_i    = clamp((i - low) / (high - low), 0, 1)      (high == low: high += 0.001)
//   inv_freq  = f_i / factor * ramp_i + f_i * (1 - ramp_i)
//   cos, sin  = cos/sin(p * inv_freq) * m(factor, mscale) / m(factor, mscale_all_dim)
#include <algorithm>
#include <cmath>
#include <new>
#include <numbers>

#include "optx/rope.h"

namespace optx {

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

Status RopeTable::build(const RopeTableParams& p, RopeTable* out) {
  constexpr const char* op = "rope_table";
  if (!out) return Error(StatusCode::kInvalidArgument, op, ": out is null");
  if (p.rotary_dim < 2 || p.rotary_dim % 2 || p.rotary_dim > 1024)
    return Error(StatusCode::kInvalidArgument, op, ": rotary_dim=", p.rotary_dim, " must be even and in [2, 1024]");
  if (p.max_positions < 1 || p.max_positions > (int64_t(1) << 26))
    return Error(StatusCode::kInvalidArgument, op, ": max_positions=", p.max_positions, " must be in [1, 2^26]");
  if (!(p.theta > 1.0) || std::isinf(p.theta))
    return Error(StatusCode::kInvalidArgument, op, ": theta=", p.theta, " must be finite and > 1");
  const YarnScaling& y = p.yarn;
  // NaN or infinite yarn parameters would fill the tables with NaN (accepted silently before).
  for (double v : {y.factor, y.mscale, y.mscale_all_dim, y.beta_fast, y.beta_slow})
    if (!std::isfinite(v))
      return Error(StatusCode::kInvalidArgument, op, ": yarn factor=", y.factor, ", mscale=", y.mscale, ", mscale_all_dim=",
                   y.mscale_all_dim, ", beta_fast=", y.beta_fast, ", beta_slow=", y.beta_slow, " must all be finite");
  const bool yarn = y.factor > 1.0;
  if (yarn && (y.original_max_position_embeddings < 1 || !(y.beta_fast > 0) || !(y.beta_slow > 0)))
    return Error(StatusCode::kInvalidArgument, op, ": yarn needs original_max_position_embeddings=",
                 y.original_max_position_embeddings, " >= 1 and beta_fast=", y.beta_fast, ", beta_slow=", y.beta_slow, " > 0");
  // Two tables of max_positions x rotary_dim / 2 floats: at the limits (2^26 x 512) that
  // is 256 GiB, so the size is checked and the allocation failure returned, not thrown.
  constexpr int64_t kMaxTableEntries = int64_t(1) << 31;
  if (p.max_positions * (p.rotary_dim / 2) > kMaxTableEntries)
    return Error(StatusCode::kInvalidArgument, op, ": max_positions=", p.max_positions, " x rotary_dim/2=", p.rotary_dim / 2,
                 " exceeds 2^31 entries per table");
  const int64_t d = p.rotary_dim, half = d / 2;
  RopeTable t;
  t.positions_ = p.max_positions;
  t.half_ = half;
  t.inv_freq_.resize(size_t(half));
  double low = 0, high = 0;
  if (yarn) {
    auto corr = [&](double r) {
      return double(d) * std::log(double(y.original_max_position_embeddings) / (2.0 * std::numbers::pi * r)) /
             (2.0 * std::log(p.theta));
    };
    low = std::max(std::floor(corr(y.beta_fast)), 0.0);
    high = std::min(std::ceil(corr(y.beta_slow)), double(d - 1));
    if (high == low) high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    const double f = std::pow(p.theta, -2.0 * double(i) / double(d));
    if (!yarn) {
      t.inv_freq_[size_t(i)] = f;
      continue;
    }
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    t.inv_freq_[size_t(i)] = f / y.factor * ramp + f * (1.0 - ramp);
  }
  const double m = yarn ? yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim) : 1.0;
  // A zero denominator (mscale_all_dim = -10 / ln(factor)) passes the finiteness checks
  // above and filled the tables with inf and NaN.
  if (!std::isfinite(m) || m == 0.0)
    return Error(StatusCode::kInvalidArgument, op, ": yarn mscale=", y.mscale, " and mscale_all_dim=", y.mscale_all_dim,
                 " at factor=", y.factor, " give the attention scale ", yarn_mscale(y.factor, y.mscale), " / ",
                 yarn_mscale(y.factor, y.mscale_all_dim), "; it must be finite and nonzero");
  try {
    t.cos_.resize(size_t(p.max_positions * half));
    t.sin_.resize(size_t(p.max_positions * half));
  } catch (const std::bad_alloc&) {
    return Error(StatusCode::kOutOfMemory, op, ": cannot allocate two tables of ", p.max_positions * half, " floats");
  }
  for (int64_t pos = 0; pos < p.max_positions; ++pos)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(pos) * t.inv_freq_[size_t(i)];
      t.cos_[size_t(pos * half + i)] = float(std::cos(a) * m);
      t.sin_[size_t(pos * half + i)] = float(std::sin(a) * m);
    }
  *out = std::move(t);
  return Status::Ok();
}

TensorView RopeTable::cos() const {
  return make_view(const_cast<float*>(cos_.data()), DType::kF32, {positions_, half_});
}
TensorView RopeTable::sin() const {
  return make_view(const_cast<float*>(sin_.data()), DType::kF32, {positions_, half_});
}

}  // namespace optx
