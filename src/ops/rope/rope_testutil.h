// Case runner shared by rope_test.cpp and `optx verify`: random q/k/positions, one
// implementation, compared with the formulas of optx/rope.h evaluated here in double.
#pragma once

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "ops/rope/rope_internal.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx::rope_detail::testutil {

struct Case {
  DType dtype = DType::kF32;
  int64_t T = 1, Hq = 1, Hk = 1, D = 64;
  int64_t rotary_dim = 0, rotary_offset = 0;
  RopeStyle style = RopeStyle::kHalf;
  bool pos64 = false;
  int64_t P = 64;           // table positions
  double yarn_factor = 1.0;
  int64_t head_pad = 0;     // extra elements between heads (strided views)
  std::string name() const {
    static const char* styles[] = {"half", "interleaved", "interleaved_to_half"};
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << " T=" << T << " Hq=" << Hq << " Hk=" << Hk << " D=" << D
       << " rotary_dim=" << (rotary_dim ? rotary_dim : D) << " offset=" << rotary_offset << " style=" << styles[int(style)]
       << " pos=" << (pos64 ? "i64" : "i32") << " P=" << P << " yarn=" << yarn_factor << " head_pad=" << head_pad;
    return os.str();
  }
};

struct Outcome {
  Status status;
  testing::CompareResult cmp;
};

inline Outcome run_case(const dispatch::Impl<RopeFn>& impl, const Case& c, uint64_t seed = 1) {
  testing::Rng rng(seed);
  const int64_t rd = c.rotary_dim ? c.rotary_dim : c.D, half = rd / 2, hs = c.D + c.head_pad;
  RopeTable table;
  YarnScaling y;
  y.factor = c.yarn_factor;
  y.original_max_position_embeddings = std::max<int64_t>(c.P / 4, 1);
  y.mscale = 0.707, y.mscale_all_dim = 0.707;
  Outcome o;
  o.status = RopeTable::build({.rotary_dim = rd, .max_positions = c.P, .yarn = y}, &table);
  if (!o.status.ok()) return o;

  const size_t nq = size_t(std::max<int64_t>(c.T * c.Hq * hs, 1)), nk = size_t(std::max<int64_t>(c.T * c.Hk * hs, 1));
  std::vector<float> qf(nq), kf(nk);
  std::vector<uint16_t> qh(nq), kh(nk);
  std::vector<double> q0(nq), k0(nk);
  auto fill = [&](std::vector<float>& f, std::vector<uint16_t>& h, std::vector<double>& v) {
    for (size_t i = 0; i < v.size(); ++i) {
      const float x = rng.uniform(-2.0f, 2.0f);
      f[i] = x;
      h[i] = f32_to_bf16(x);
      v[i] = c.dtype == DType::kF32 ? double(x) : double(bf16_to_f32(h[i]));
    }
  };
  fill(qf, qh, q0);
  fill(kf, kh, k0);
  std::vector<int32_t> p32(static_cast<size_t>(std::max<int64_t>(c.T, 1)));
  std::vector<int64_t> p64(p32.size());
  for (int64_t t = 0; t < c.T; ++t) p64[size_t(t)] = p32[size_t(t)] = int32_t(rng.below(c.P));
  const bool bf = c.dtype == DType::kBF16;
  RopeParams p;
  p.q = make_view(bf ? static_cast<void*>(qh.data()) : qf.data(), c.dtype, {c.T, c.Hq, c.D}, {c.Hq * hs, hs, 1});
  p.k = make_view(bf ? static_cast<void*>(kh.data()) : kf.data(), c.dtype, {c.T, c.Hk, c.D}, {c.Hk * hs, hs, 1});
  p.positions = make_view(c.pos64 ? static_cast<void*>(p64.data()) : p32.data(), c.pos64 ? DType::kI64 : DType::kI32, {c.T});
  p.cos = table.cos();
  p.sin = table.sin();
  p.rotary_dim = c.rotary_dim;
  p.rotary_offset = c.rotary_offset;
  p.style = c.style;
  Args a;
  o.status = to_args(p, &a);
  if (!o.status.ok()) return o;
  o.status = impl.fn(a);
  if (!o.status.ok()) return o;

  std::vector<double> got, ref, extra;
  const float* cos = static_cast<const float*>(table.cos().data);
  const float* sin = static_cast<const float*>(table.sin().data);
  const double u = testing::kEpsF32, ub = bf ? testing::kEpsBF16 : 0.0;
  for (int which = 0; which < 2; ++which) {
    const std::vector<double>& x0 = which ? k0 : q0;
    const int64_t H = which ? c.Hk : c.Hq;
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t pos = p64[size_t(t)];
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = (t * H + h) * hs;
        std::vector<double> y(static_cast<size_t>(c.D)), mag(static_cast<size_t>(c.D));
        for (int64_t i = 0; i < c.D; ++i) y[size_t(i)] = x0[size_t(base + i)];
        const int64_t o0 = base + c.rotary_offset;
        for (int64_t i = 0; i < half; ++i) {
          const double ci = cos[pos * half + i], si = sin[pos * half + i];
          int64_t ia, ib, oa, ob;  // inputs a (cos-side) and b, outputs for a and b
          if (c.style == RopeStyle::kHalf) ia = i, ib = i + half, oa = i, ob = i + half;
          else if (c.style == RopeStyle::kInterleaved) ia = 2 * i, ib = 2 * i + 1, oa = 2 * i, ob = 2 * i + 1;
          else ia = 2 * i, ib = 2 * i + 1, oa = i, ob = i + half;
          const double xa = x0[size_t(o0 + ia)], xb = x0[size_t(o0 + ib)];
          y[size_t(c.rotary_offset + oa)] = xa * ci - xb * si;
          y[size_t(c.rotary_offset + ob)] = xb * ci + xa * si;
          mag[size_t(c.rotary_offset + oa)] = std::fabs(xa * ci) + std::fabs(xb * si);
          mag[size_t(c.rotary_offset + ob)] = std::fabs(xb * ci) + std::fabs(xa * si);
        }
        for (int64_t i = 0; i < c.D; ++i) {
          const size_t k = size_t(base + i);
          got.push_back(which ? (bf ? double(bf16_to_f32(kh[k])) : double(kf[k])) : (bf ? double(bf16_to_f32(qh[k])) : double(qf[k])));
          ref.push_back(y[size_t(i)]);
          extra.push_back(2.0 * u * mag[size_t(i)] + ub * std::fabs(y[size_t(i)]));
        }
      }
    }
  }
  o.cmp = testing::compare(got, ref, testing::Tolerance{0.0, 0.0}, &extra);
  return o;
}

}  // namespace optx::rope_detail::testutil
