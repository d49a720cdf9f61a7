// GEMM case runner shared by gemm_test.cpp and `optx verify`: builds inputs for a case,
// runs one implementation, and compares with an independent double-precision evaluation
// of the definition computed here from the plain input arrays (never from packed data).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ops/gemm/gemm_internal.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx::gemm_detail::testutil {

enum class Bias { kNone, kF32, kBF16 };

struct Case {
  int64_t M = 1, N = 1, K = 1;
  DType a = DType::kF32, b = DType::kF32, c = DType::kF32;
  bool packed = true;
  bool b_kn = false;
  int64_t lda_pad = 0, ldb_pad = 0, ldc_pad = 0;  // extra elements per row (strided views; B unpacked)
  float alpha = 1.0f, beta = 0.0f;
  Bias bias = Bias::kNone;
  bool swiglu = false;  // B is [gate; up] (N = 2I), C [M, I] = silu(A gate^T) * (A up^T)
  PackLayout layout = PackLayout::kAuto;  // packed B only

  std::string name() const {
    std::ostringstream os;
    os << "a=" << dtype_name(a) << " b=" << dtype_name(b) << " c=" << dtype_name(c) << " M=" << M << " N=" << N
       << " K=" << K << " packed=" << packed << " kn=" << b_kn << " lda_pad=" << lda_pad << " ldb_pad=" << ldb_pad << " ldc_pad=" << ldc_pad
       << " alpha=" << alpha << " beta=" << beta << " bias="
       << (bias == Bias::kNone ? "none" : bias == Bias::kF32 ? "f32" : "bf16") << (swiglu ? " act=swiglu" : "")
       << (layout == PackLayout::kPanels ? " layout=panels" : layout == PackLayout::kStrips ? " layout=strips" : "");
    return os.str();
  }
};

struct Outcome {
  Status status;
  testing::CompareResult cmp;
};

// Holds a value array as typed storage plus its exact double values.
struct Buffer {
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  std::vector<int8_t> i8;
  std::vector<double> val;
  void* data(DType t) {
    return t == DType::kF32 ? static_cast<void*>(f32.data())
         : t == DType::kBF16 ? static_cast<void*>(b16.data())
                             : static_cast<void*>(i8.data());
  }
  void fill(DType t, int64_t n, testing::Rng& rng) {
    val.resize(size_t(n));
    if (t == DType::kF32) {
      f32.resize(size_t(n));
      testing::fill_f32(f32.data(), n, rng);
      for (int64_t i = 0; i < n; ++i) val[i] = f32[i];
    } else if (t == DType::kBF16) {
      b16.resize(size_t(n));
      testing::fill_bf16(b16.data(), n, rng);
      for (int64_t i = 0; i < n; ++i) val[i] = bf16_to_f32(b16[i]);
    } else {
      i8.resize(size_t(n));
      testing::fill_i8(i8.data(), n, rng);
      for (int64_t i = 0; i < n; ++i) val[i] = i8[i];
    }
  }
};

inline Outcome run_case(const dispatch::Impl<GemmFn>& impl, const Case& cs, uint64_t seed = 1) {
  testing::Rng rng(seed);
  const int64_t M = cs.M, N = cs.N, K = cs.K;
  const int64_t Nc = cs.swiglu ? N / 2 : N;  // columns of C
  const int64_t lda = K + cs.lda_pad, ldc = Nc + cs.ldc_pad;
  Buffer A, B, S, Bias_, C;
  A.fill(cs.a, std::max<int64_t>(M * lda, 1), rng);
  B.fill(cs.b, std::max<int64_t>(N * K, 1), rng);
  const bool i8 = cs.b == DType::kI8;
  if (i8) {
    S.f32.resize(size_t(std::max<int64_t>(N, 1)));
    testing::fill_f32(S.f32.data(), N, rng, 0.001f, 0.02f);
  }
  const DType bias_t = cs.bias == Bias::kBF16 ? DType::kBF16 : DType::kF32;
  if (cs.bias != Bias::kNone) Bias_.fill(bias_t, std::max<int64_t>(N, 1), rng);
  C.fill(cs.c, std::max<int64_t>(M * ldc, 1), rng);
  if (cs.beta == 0.0f) {  // poison: beta == 0 must not read C
    for (auto& v : C.f32) v = std::numeric_limits<float>::quiet_NaN();
    for (auto& v : C.b16) v = 0x7fc0;
  }
  const std::vector<double> c_before = C.val;

  GemmParams p;
  p.a = make_view(A.data(cs.a), cs.a, {M, K}, {lda, 1});
  // B as stored: [N, K] or [K, N], rows ldb_pad elements apart beyond their length.
  const int64_t b_rows = cs.b_kn ? K : N, b_cols = cs.b_kn ? N : K, ldb = b_cols + cs.ldb_pad;
  TensorView bview = make_view(nullptr, cs.b, {b_rows, b_cols}, {ldb, 1});
  std::vector<float> bt_f32;
  std::vector<uint16_t> bt_b16;
  std::vector<int8_t> bt_i8;
  if (cs.b_kn || cs.ldb_pad > 0) {  // store the same logical matrix transposed and / or padded
    const size_t n = size_t(std::max<int64_t>(b_rows * ldb, 1));
    bt_f32.resize(cs.b == DType::kF32 ? n : 0);
    bt_b16.resize(cs.b == DType::kBF16 ? n : 0, 0x7fc0);  // padding: NaN, never read
    bt_i8.resize(cs.b == DType::kI8 ? n : 0);
    std::fill(bt_f32.begin(), bt_f32.end(), std::numeric_limits<float>::quiet_NaN());
    for (int64_t n_ = 0; n_ < N; ++n_)
      for (int64_t k = 0; k < K; ++k) {
        const size_t src = size_t(n_ * K + k), dst = size_t(cs.b_kn ? k * ldb + n_ : n_ * ldb + k);
        if (cs.b == DType::kF32) bt_f32[dst] = B.f32[src];
        else if (cs.b == DType::kBF16) bt_b16[dst] = B.b16[src];
        else bt_i8[dst] = B.i8[src];
      }
    bview.data = cs.b == DType::kF32 ? static_cast<void*>(bt_f32.data())
               : cs.b == DType::kBF16 ? static_cast<void*>(bt_b16.data())
                                      : static_cast<void*>(bt_i8.data());
  } else {
    bview.data = B.data(cs.b);
  }
  TensorView sview = i8 ? make_view(S.f32.data(), DType::kF32, {N}) : TensorView{};
  PackedWeights packed;
  if (cs.packed) {
    Status st = pack_weights({.w = bview, .scales = sview, .kn = cs.b_kn, .layout = cs.layout}, &packed);
    if (!st.ok()) return {st, {}};
    p.packed_b = &packed[0];
  } else {
    p.b = bview;
    p.b_kn = cs.b_kn;
    p.b_scales = sview;
  }
  if (cs.bias != Bias::kNone) p.bias = make_view(Bias_.data(bias_t), bias_t, {N});
  p.c = make_view(C.data(cs.c), cs.c, {M, Nc}, {ldc, 1});
  p.alpha = cs.alpha;
  p.beta = cs.beta;
  if (cs.swiglu) p.activation = GemmActivation::kSwiglu;

  std::vector<uint8_t> ws(gemm_workspace_size(p), 0xff);  // NaN floats: results must not depend on it
  Outcome out;
  out.status = run_impl(impl, p, {ws.data(), ws.size()});
  if (!out.status.ok()) return out;

  // Reference and its rounding allowance: f32 accumulation of K products may drift by
  // about K * eps * sum|a*b| (the classical bound, taken with a factor 2 of slack).
  std::vector<double> got, ref, extra;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < Nc; ++n) {
      // Row nb of B against row m of A: the scaled dot and its accumulation allowance.
      auto product = [&](int64_t nb, double* allow) {
        double dot = 0, absdot = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = A.val[size_t(m * lda + k)] * B.val[size_t(nb * K + k)];
          dot += t;
          absdot += std::fabs(t);
        }
        const double scale = double(cs.alpha) * (i8 ? double(S.f32[size_t(nb)]) : 1.0);
        *allow = 2.0 * double(K + 3) * testing::kEpsF32 * std::fabs(scale) * absdot;
        return scale * dot;
      };
      double r, allow;
      if (cs.swiglu) {
        // d(silu(g) u) = silu'(g) u dg + silu(g) du with |silu'| < 1.1; the kernels' exp
        // is a polynomial with relative error < 2e-7, well inside the f32 terms below.
        double eg, eu;
        const double g = product(n, &eg), u = product(Nc + n, &eu);
        const double silu = g / (1.0 + std::exp(-g));
        r = silu * u;
        allow = 1.1 * std::fabs(u) * eg + std::fabs(silu) * eu + 8.0 * testing::kEpsF32 * std::fabs(r);
      } else {
        r = product(n, &allow);
        double mag = 0;
        if (cs.bias != Bias::kNone) {
          r += Bias_.val[size_t(n)];
          mag += std::fabs(Bias_.val[size_t(n)]);
        }
        if (cs.beta != 0.0f) {
          const double cb = double(cs.beta) * c_before[size_t(m * ldc + n)];
          r += cb;
          mag += std::fabs(cb);
        }
        allow += 2.0 * double(K + 3) * testing::kEpsF32 * mag;
      }
      ref.push_back(r);
      if (cs.c == DType::kBF16) allow += testing::kEpsBF16 * (std::fabs(r) + allow);
      extra.push_back(allow);
      const size_t off = size_t(m * ldc + n);
      got.push_back(cs.c == DType::kF32 ? double(C.f32[off]) : double(bf16_to_f32(C.b16[off])));
    }
  // Columns past N in padded rows must be untouched (never write outside the output).
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = Nc; n < ldc; ++n) {
      const size_t off = size_t(m * ldc + n);
      const double now = cs.c == DType::kF32 ? double(C.f32[off]) : double(bf16_to_f32(C.b16[off]));
      const double was = c_before[off];
      if (!(now == was || (std::isnan(now) && (std::isnan(was) || cs.beta == 0.0f)))) {
        out.cmp.pass = false;
        out.cmp.message = "wrote into row padding at row " + std::to_string(m) + " col " + std::to_string(n);
        return out;
      }
    }
  out.cmp = testing::compare(got, ref, testing::Tolerance{1e-5, 1e-5}, &extra);
  return out;
}

}  // namespace optx::gemm_detail::testutil
