// rms_norm / add_rms_norm: every runnable implementation against the double reference on
// edge shapes; fused == unfused bit for bit; bad inputs -> Status naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ops/norm/norm_testutil.h"

namespace optx::norm_detail {
namespace {

using testutil::Case;

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (bool add : {false, true})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int64_t H : {1, 7, 16, 17, 769, 5125, 7168})
        for (int64_t T : {0, 1, 3, 5, 9, 12}) {  // 9, 12: a thread's rows in two lockstep halves (AVX-512 units), odd and even
          Case c;
          c.add = add, c.dtype = dt, c.H = H, c.T = T;
          c.stream = T == 5 || T == 12;
          c.pad = (H + T) % 3 == 0 ? 5 : 0;
          c.out_aliases_x = (H + T) % 4 == 1;
          c.eps = H == 1 ? 0.0f : 1e-6f;
          cs.push_back(c);
        }
  Case big;  // large magnitudes: squares near 1e8 stay finite in f32
  big.scale = 1e4f, big.H = 300, big.T = 2;
  cs.push_back(big);
  big.dtype = DType::kBF16, big.add = true;
  cs.push_back(big);
  return cs;
}

void check_all(const dispatch::Registry<NormFn>& reg, bool add) {
  for (const auto* impl : reg.runnable())
    for (Case c : cases()) {
      if (c.add != add) continue;
      const auto o = testutil::run_case(*impl, c);
      ASSERT_TRUE(o.status.ok()) << impl->name << " " << c.name() << ": " << o.status.message();
      EXPECT_TRUE(o.cmp.pass) << reg.op() << " " << impl->name << " " << c.name() << ": " << o.cmp.message;
    }
}

TEST(RmsNorm, EveryImplementationMatchesReference) { check_all(rms_norm_registry(), false); }
TEST(AddRmsNorm, EveryImplementationMatchesReference) { check_all(add_rms_norm_registry(), true); }

TEST(AddRmsNorm, FusedEqualsUnfusedBitwise) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t H : {7, 769, 5125}) {
      const int64_t T = 3;
      testing::Rng rng{uint64_t(H)};
      testutil::Mat x(dt, size_t(T * H)), res(dt, size_t(T * H)), w(dt, size_t(H)), out(dt, size_t(T * H)),
          out2(dt, size_t(T * H));
      for (int64_t i = 0; i < T * H; ++i) x.set(size_t(i), rng.uniform()), res.set(size_t(i), rng.uniform());
      for (int64_t i = 0; i < H; ++i) w.set(size_t(i), rng.uniform());
      const auto fused_impl = add_rms_norm_registry().runnable();
      for (size_t k = 0; k < fused_impl.size(); ++k) {
        const auto* fi = fused_impl[k];
        const auto* ui = rms_norm_registry().find(fi->name);
        ASSERT_NE(ui, nullptr);
        testutil::Mat r1 = res, r2 = res;
        Rows a, b;
        ASSERT_TRUE(to_rows(AddRmsNormParams{.x = make_view(x.data(), dt, {T, H}), .residual = make_view(r1.data(), dt, {T, H}),
                                             .weight = make_view(w.data(), dt, {H}), .out = make_view(out.data(), dt, {T, H})},
                            &a)
                        .ok());
        ASSERT_TRUE(fi->fn(a).ok());
        // Unfused: residual += x as its own elementwise op (f32 add, rounded), then rms_norm.
        for (int64_t i = 0; i < T * H; ++i) r2.set(size_t(i), float(r2.get(size_t(i))) + float(x.get(size_t(i))));
        ASSERT_TRUE(to_rows(RmsNormParams{.x = make_view(r2.data(), dt, {T, H}), .weight = make_view(w.data(), dt, {H}),
                                          .out = make_view(out2.data(), dt, {T, H})},
                            &b)
                        .ok());
        ASSERT_TRUE(ui->fn(b).ok());
        const size_t bytes = size_t(T * H) * dtype_size(dt);
        EXPECT_EQ(std::memcmp(r1.data(), r2.data(), bytes), 0) << fi->name << " residual H=" << H;
        EXPECT_EQ(std::memcmp(out.data(), out2.data(), bytes), 0) << fi->name << " out H=" << H << " " << dtype_name(dt);
      }
    }
}

TEST(RmsNorm, ThreadCountIndependent) {
  const int64_t T = 37, H = 513;
  testing::Rng rng(5);
  std::vector<uint16_t> x(static_cast<size_t>(T * H)), w(static_cast<size_t>(H)), o1(static_cast<size_t>(T * H)), o2(static_cast<size_t>(T * H));
  testing::fill_bf16(x.data(), T * H, rng);
  testing::fill_bf16(w.data(), H, rng);
  auto run = [&](int threads, std::vector<uint16_t>& o) {
    set_num_threads(threads);
    ASSERT_TRUE(rms_norm({.x = make_view(x.data(), DType::kBF16, {T, H}), .weight = make_view(w.data(), DType::kBF16, {H}),
                          .out = make_view(o.data(), DType::kBF16, {T, H})})
                    .ok());
  };
  run(1, o1);
  run(2, o2);
  set_num_threads(0);
  EXPECT_EQ(o1, o2);
}

struct NormBadInput : ::testing::Test {
  std::vector<float> x = std::vector<float>(4 * 8, 1.0f), r = std::vector<float>(4 * 8, 1.0f),
                     w = std::vector<float>(8, 1.0f), o = std::vector<float>(4 * 8);
  AddRmsNormParams good() {
    return {.x = make_view(x.data(), DType::kF32, {4, 8}), .residual = make_view(r.data(), DType::kF32, {4, 8}),
            .weight = make_view(w.data(), DType::kF32, {8}), .out = make_view(o.data(), DType::kF32, {4, 8})};
  }
  void expect(const AddRmsNormParams& p, const std::string& needle) {
    const Status st = add_rms_norm(p);
    ASSERT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find("add_rms_norm"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  }
};
TEST_F(NormBadInput, Arguments) {
  auto p = good();
  p.x.data = nullptr;
  expect(p, "x.data is null");
  p = good();
  p.weight = make_view(w.data(), DType::kF32, {7});
  expect(p, "weight must be [H=8]");
  p = good();
  p.out = make_view(o.data(), DType::kF32, {4, 7});
  expect(p, "out.sizes=[4, 7]");
  p = good();
  p.residual.dtype = DType::kBF16;
  expect(p, "residual.dtype=bf16");
  p = good();
  p.x.dtype = DType::kI8;
  expect(p, "x.dtype=i8");
  p = good();
  p.out = p.residual;
  expect(p, "out overlaps residual");
  p = good();
  p.x.strides[0] = -8;
  expect(p, "x.strides[0]=-8 is negative");
  p = good();
  p.residual.strides[0] = 4;
  expect(p, "residual.strides[0]=4");
  p = good();
  p.eps = -1.0f;
  expect(p, "eps=-1");
  p.eps = INFINITY;
  expect(p, "eps=inf must be finite and >= 0");
  const Status st = rms_norm({.x = make_view(x.data(), DType::kF32, {4, 8}), .weight = make_view(w.data(), DType::kF32, {8}),
                              .out = make_view(nullptr, DType::kF32, {4, 8})});
  EXPECT_NE(st.message().find("rms_norm: out.data is null"), std::string::npos) << st.message();
}

// Found by review: the norms ran no extent check, so a row stride near 2^62 wrapped row 1's
// offset to 64 bytes before out and was written there; out shifted one element into
// residual (or x) passed the pointer-equality test and read rows already written.
TEST_F(NormBadInput, WrappingStridesAndPartialOverlaps) {
  std::vector<float> guard(64 + 4 * 8, -7.0f);
  auto p = good();
  p.out = make_view(guard.data() + 64, DType::kF32, {4, 8});
  p.out.strides[0] = (int64_t(1) << 62) - 16;
  expect(p, "spans more than 2^");
  for (int i = 0; i < 64; ++i) ASSERT_EQ(guard[size_t(i)], -7.0f) << "written before out at " << i - 64;
  const Status st = rms_norm({.x = p.x, .weight = p.weight, .out = p.out});
  EXPECT_NE(st.message().find("rms_norm: out ["), std::string::npos) << st.message();
  p = good();
  p.out = make_view(r.data() + 1, DType::kF32, {3, 8});
  p.x = make_view(x.data(), DType::kF32, {3, 8});
  p.residual = make_view(r.data(), DType::kF32, {3, 8});
  expect(p, "out overlaps residual");
  p = good();
  p.out = make_view(x.data() + 8, DType::kF32, {3, 8});
  p.x = make_view(x.data(), DType::kF32, {3, 8});
  p.residual = make_view(r.data(), DType::kF32, {3, 8});
  expect(p, "out overlaps x without being x itself");
  p = good();
  p.out = p.x;  // in place stays legal
  EXPECT_TRUE(add_rms_norm(p).ok());
  // Found by review: out or residual over weight was accepted, and rows written before
  // later rows read the weight.
  p = good();
  p.weight = make_view(o.data() + 8, DType::kF32, {8});
  expect(p, "out overlaps weight (an output must not share memory with an input)");
  p = good();
  p.weight = make_view(r.data(), DType::kF32, {8});
  expect(p, "residual overlaps weight");
  const Status st2 = rms_norm({.x = p.x, .weight = make_view(o.data(), DType::kF32, {8}), .out = make_view(o.data(), DType::kF32, {4, 8})});
  EXPECT_EQ(st2.message(), "rms_norm: out overlaps weight (an output must not share memory with an input)");
  p = good();
  p.residual = make_view(x.data() + 4, DType::kF32, {4, 8});  // x's rows shifted half a row
  p.residual.sizes[0] = 3, p.x.sizes[0] = 3, p.out.sizes[0] = 3;
  expect(p, "residual overlaps x without being x itself");
}

// Views that share one buffer without sharing bytes stay legal: x and out as the column
// halves of a [T, 2H] buffer (row stride 2H), residual and out likewise. The span test of
// the first version refused them.
TEST_F(NormBadInput, ColumnHalvesOfOneBufferAreApart) {
  std::vector<float> buf(4 * 16), res(4 * 16, 0.5f), want(4 * 8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = 0.1f * float(i % 13) - 0.6f;
  const TensorView left = make_view(buf.data(), DType::kF32, {4, 8}, {16, 1}), right = make_view(buf.data() + 8, DType::kF32, {4, 8}, {16, 1});
  ASSERT_TRUE(rms_norm({.x = left, .weight = make_view(w.data(), DType::kF32, {8}), .out = make_view(want.data(), DType::kF32, {4, 8})}).ok());
  const Status st = rms_norm({.x = left, .weight = make_view(w.data(), DType::kF32, {8}), .out = right});
  ASSERT_TRUE(st.ok()) << st.message();
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t h = 0; h < 8; ++h) EXPECT_EQ(buf[size_t(t * 16 + 8 + h)], want[size_t(t * 8 + h)]);
  const Status st2 = add_rms_norm({.x = make_view(x.data(), DType::kF32, {4, 8}), .residual = make_view(res.data(), DType::kF32, {4, 8}, {16, 1}),
                                   .weight = make_view(w.data(), DType::kF32, {8}), .out = make_view(res.data() + 8, DType::kF32, {4, 8}, {16, 1})});
  EXPECT_TRUE(st2.ok()) << st2.message();
}

TEST(NormDispatch, SelectedRespectsMaxIsa) {
  for (const auto* reg : {&rms_norm_registry(), &add_rms_norm_registry()}) {
    const std::string sel = selected_impl(reg->op());
    const auto* impl = reg->find(sel);
    ASSERT_NE(impl, nullptr) << sel;
    EXPECT_LE(int(impl->isa), int(active_isa()));
    if (dispatch::forced_impl(reg->op()).empty()) {  // else OPTX_IMPL's choice
      EXPECT_EQ(reg->runnable().front()->name, sel);
    }
    Case c;
    c.add = reg == &add_rms_norm_registry(), c.H = 100, c.T = 2, c.dtype = DType::kBF16;
    const auto o = testutil::run_case(*impl, c);
    EXPECT_TRUE(o.status.ok() && o.cmp.pass) << o.cmp.message;
  }
}

}  // namespace
}  // namespace optx::norm_detail
