// Case runner shared by norm_test.cpp and `optx verify`: builds inputs, runs one
// implementation, and checks it against a double-precision evaluation made here from the
// plain inputs. The residual of add_rms_norm must match its definition exactly.
#pragma once

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ops/norm/norm_internal.h"
#include "testing/aligned.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx::norm_detail::testutil {

struct Case {
  bool add = false;  // add_rms_norm instead of rms_norm
  DType dtype = DType::kF32;
  int64_t T = 1, H = 1;
  int64_t pad = 0;           // extra elements per row of x / residual / out
  bool out_aliases_x = false;
  float eps = 1e-6f;
  float scale = 1.0f;        // input magnitude
  bool stream = false;       // non-temporal stores for out (by default only for >= simd::kStreamMinBytes)
  std::string name() const {
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << " T=" << T << " H=" << H << " pad=" << pad
       << " alias=" << out_aliases_x << " eps=" << eps << " scale=" << scale << " stream=" << stream;
    return os.str();
  }
};

struct Outcome {
  Status status;
  testing::CompareResult cmp;
};

struct Mat {  // typed storage + exact values
  DType dt;
  testing::AlignedVector<float> f;  // aligned: rows take the streaming-store paths
  testing::AlignedVector<uint16_t> h;
  explicit Mat(DType d, size_t n) : dt(d), f(d == DType::kF32 ? n : 0), h(d == DType::kBF16 ? n : 0) {}
  void* data() { return dt == DType::kF32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  double get(size_t i) const { return dt == DType::kF32 ? double(f[i]) : double(bf16_to_f32(h[i])); }
  void set(size_t i, float v) {
    if (dt == DType::kF32) f[i] = v;
    else h[i] = f32_to_bf16(v);
  }
};

inline Outcome run_case(const dispatch::Impl<NormFn>& impl, const Case& c, uint64_t seed = 1) {
  testing::Rng rng(seed);
  const int64_t ld = c.H + c.pad;
  const size_t n = size_t(std::max<int64_t>(c.T * ld, 1));
  Mat x(c.dtype, n), res(c.dtype, n), out(c.dtype, n), w(c.dtype, size_t(std::max<int64_t>(c.H, 1)));
  for (size_t i = 0; i < n; ++i) {
    x.set(i, c.scale * rng.uniform());
    res.set(i, c.scale * rng.uniform());
    out.set(i, std::numeric_limits<float>::quiet_NaN());  // poisoned
  }
  for (int64_t i = 0; i < c.H; ++i) w.set(size_t(i), rng.uniform(0.5f, 1.5f));
  Mat x0 = x, res0 = res;

  Rows r;
  Status st;
  auto view = [&](Mat& m) { return make_view(m.data(), c.dtype, {c.T, c.H}, {ld, 1}); };
  TensorView outv = c.out_aliases_x ? view(x) : view(out);
  if (c.add)
    st = to_rows(AddRmsNormParams{.x = view(x), .residual = view(res), .weight = make_view(w.data(), c.dtype, {c.H}),
                                  .out = outv, .eps = c.eps},
                 &r);
  else
    st = to_rows(RmsNormParams{.x = view(x), .weight = make_view(w.data(), c.dtype, {c.H}), .out = outv, .eps = c.eps}, &r);
  if (!st.ok()) return {st, {}};
  r.stream_out = r.stream_out || c.stream;
  Outcome o;
  o.status = impl.fn(r);
  if (!o.status.ok()) return o;
  const Mat& got = c.out_aliases_x ? x : out;

  std::vector<double> g, ref, extra;
  const double u = testing::kEpsF32, ub = c.dtype == DType::kBF16 ? testing::kEpsBF16 : 0.0;
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<double> src(size_t(c.H));
    for (int64_t i = 0; i < c.H; ++i) {
      const size_t k = size_t(t * ld + i);
      if (c.add) {
        Mat one(c.dtype, 1);
        one.set(0, float(res0.get(k)) + float(x0.get(k)));
        if (!(res.get(k) == one.get(0) || (std::isnan(res.get(k)) && std::isnan(one.get(0))))) {
          o.cmp.pass = false;
          o.cmp.worst_index = int64_t(k);
          o.cmp.message = "residual at row " + std::to_string(t) + " col " + std::to_string(i) + " is " +
                          std::to_string(res.get(k)) + ", expected " + std::to_string(one.get(0));
          return o;
        }
        src[size_t(i)] = one.get(0);
      } else {
        src[size_t(i)] = x0.get(k);
      }
    }
    double ss = 0;
    for (double v : src) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(c.H) + double(c.eps));
    for (int64_t i = 0; i < c.H; ++i) {
      const double v = src[size_t(i)] * inv * w.get(size_t(i));
      ref.push_back(v);
      // f32 statistics over H terms drift by at most ~H*u relative in the sum, half of it
      // after the square root; plus the products' and the output's rounding.
      extra.push_back(std::fabs(v) * (double(c.H + 8) * u + ub));
      g.push_back(got.get(size_t(t * ld + i)));
    }
  }
  // Row padding of out (and of x when aliased) is never written.
  if (!c.out_aliases_x)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t i = c.H; i < ld; ++i)
        if (!std::isnan(out.get(size_t(t * ld + i)))) {
          o.cmp.pass = false;
          o.cmp.message = "wrote into row padding at row " + std::to_string(t);
          return o;
        }
  o.cmp = testing::compare(g, ref, testing::Tolerance{1e-6, 1e-6}, &extra);
  return o;
}

}  // namespace optx::norm_detail::testutil
