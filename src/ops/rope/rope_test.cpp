// rope: every runnable implementation against the formulas, all styles, partial and offset
// rotary slices, q/k with different head counts, strided heads; YaRN table properties;
// bad inputs -> Status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "ops/rope/rope_testutil.h"

namespace optx::rope_detail {
namespace {

using testutil::Case;

TEST(Rope, EveryImplementationMatchesReference) {
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (RopeStyle st : {RopeStyle::kHalf, RopeStyle::kInterleaved, RopeStyle::kInterleavedToHalf})
      for (auto [D, rd, off] : {std::tuple{64, 0, 0}, {128, 64, 0}, {192, 64, 128}, {80, 80, 0}, {96, 34, 62}, {2, 2, 0},
                                {576, 64, 512}}) {
        Case c;
        c.dtype = dt, c.style = st, c.D = D, c.rotary_dim = rd, c.rotary_offset = off;
        c.T = D == 2 ? 0 : 5;
        c.Hq = 3, c.Hk = D % 3 == 0 ? 1 : 2;
        c.pos64 = D % 2 == 0 && rd % 4 == 0;
        c.head_pad = off % 3;
        c.yarn_factor = D == 192 ? 40.0 : 1.0;
        cases.push_back(c);
      }
  Case one;  // T = 1, positions at the end of a long table
  one.T = 1, one.P = 9000, one.D = 128, one.yarn_factor = 4.0;  // original context P / 4 = 2250
  cases.push_back(one);
  for (const auto* impl : registry().runnable())
    for (const Case& c : cases) {
      const auto o = testutil::run_case(*impl, c, uint64_t(c.D + c.T));
      ASSERT_TRUE(o.status.ok()) << impl->name << " " << c.name() << ": " << o.status.message();
      EXPECT_TRUE(o.cmp.pass) << impl->name << " " << c.name() << ": " << o.cmp.message;
    }
}

// Finite YaRN parameters whose mscale_all_dim makes the scale's denominator zero (0.1 *
// mscale_all_dim * ln(factor) = -1) filled the tables with inf and NaN.
TEST(RopeTable, YarnScaleWithZeroDenominatorIsAnError) {
  RopeTable t;
  const Status st = RopeTable::build(
      {.rotary_dim = 4, .max_positions = 4, .yarn = {.factor = std::exp(1.0), .mscale = 1, .mscale_all_dim = -10}}, &t);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rope_table: yarn mscale=1 and mscale_all_dim=-10"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("must be finite and nonzero"), std::string::npos) << st.message();
}

TEST(RopeTable, YarnFactorOneIsPlainRope) {
  RopeTable plain, yarn1;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 64, .max_positions = 300}, &plain).ok());
  YarnScaling y;
  y.factor = 1.0, y.mscale = 0.707, y.mscale_all_dim = 0.707, y.original_max_position_embeddings = 64;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 64, .max_positions = 300, .yarn = y}, &yarn1).ok());
  for (int64_t i = 0; i < 300 * 32; ++i) {
    ASSERT_EQ(static_cast<float*>(plain.cos().data)[i], static_cast<float*>(yarn1.cos().data)[i]);
    ASSERT_EQ(static_cast<float*>(plain.sin().data)[i], static_cast<float*>(yarn1.sin().data)[i]);
  }
  // Plain RoPE against cos(p * theta^(-2i/d)) computed here.
  const double a = 299.0 * std::pow(10000.0, -2.0 * 5 / 64);
  EXPECT_NEAR(static_cast<float*>(plain.cos().data)[299 * 32 + 5], std::cos(a), 1e-6);
}

TEST(RopeTable, DeepSeekYarnRamp) {
  // DeepSeek-V2/V3: d 64, theta 1e4, L_orig 4096, beta 32/1 -> correction range [10, 23]:
  // dims below 10 keep theta^(-2i/d), dims above 23 are divided by the factor.
  YarnScaling y;
  y.factor = 40.0, y.original_max_position_embeddings = 4096, y.beta_fast = 32, y.beta_slow = 1;
  y.mscale = 1.0, y.mscale_all_dim = 1.0;
  RopeTable t;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 64, .max_positions = 8, .yarn = y}, &t).ok());
  for (int i = 0; i < 32; ++i) {
    const double f = std::pow(10000.0, -2.0 * i / 64);
    if (i <= 10) {
      EXPECT_DOUBLE_EQ(t.inv_freq()[size_t(i)], f) << i;
    }
    if (i >= 23) {
      EXPECT_DOUBLE_EQ(t.inv_freq()[size_t(i)], f / 40.0) << i;
    }
    if (i > 10 && i < 23) {
      const double ramp = (i - 10.0) / 13.0;
      EXPECT_NEAR(t.inv_freq()[size_t(i)], f / 40.0 * ramp + f * (1 - ramp), 1e-15) << i;
    }
  }
  EXPECT_NEAR(yarn_mscale(40.0, 0.707), 0.1 * 0.707 * std::log(40.0) + 1.0, 1e-15);
  EXPECT_NEAR(yarn_mscale(40.0, 0.707), 1.260804, 1e-6);  // V2-Lite m, from the model card arithmetic
  EXPECT_EQ(yarn_mscale(1.0, 0.707), 1.0);
  // mscale != mscale_all_dim scales cos/sin: position 0 gives cos = m ratio.
  y.mscale = 1.0, y.mscale_all_dim = 0.5;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 64, .max_positions = 2, .yarn = y}, &t).ok());
  EXPECT_NEAR(static_cast<float*>(t.cos().data)[0], yarn_mscale(40, 1.0) / yarn_mscale(40, 0.5), 1e-6);
}

// |table - exact| for a value stored as f32 from a double: one rounding (2^-24 relative),
// plus slack for the last bits of p * inv_freq, which this file computes in a different
// order than rope_table.cpp.
void expect_table_value(float got, double want, const std::string& what) {
  const double slack = 1e-10;
  EXPECT_LE(std::fabs(double(got) - want), testing::kEpsF32 * (std::fabs(want) + slack) + slack) << what << " got " << got << " want " << want;
}

// Plain RoPE: cos and sin at positions > 0 against cos/sin(p / theta^(2i/d)) computed here
// (every i, several positions up to the table's end, two theta / d pairs).
TEST(RopeTable, PlainCosSinMatchDoubleFormula) {
  for (auto [d, theta] : {std::pair<int64_t, double>{64, 10000.0}, {128, 500000.0}}) {
    const int64_t P = 5000, half = d / 2;
    RopeTable t;
    ASSERT_TRUE(RopeTable::build({.rotary_dim = d, .max_positions = P, .theta = theta}, &t).ok());
    const float* cos = static_cast<const float*>(t.cos().data);
    const float* sin = static_cast<const float*>(t.sin().data);
    for (int64_t p : {1, 2, 7, 100, 1023, 4095, 4999})
      for (int64_t i = 0; i < half; ++i) {
        const double inv_freq = 1.0 / std::pow(theta, double(2 * i) / double(d));
        const std::string what = "d=" + std::to_string(d) + " theta=" + std::to_string(theta) + " p=" + std::to_string(p) +
                                 " i=" + std::to_string(i);
        expect_table_value(cos[p * half + i], std::cos(double(p) * inv_freq), what + " cos");
        expect_table_value(sin[p * half + i], std::sin(double(p) * inv_freq), what + " sin");
      }
  }
}

// DeepSeek's YaRN rotary embedding as HF's DeepseekV2YarnRotaryEmbedding defines it
// (reference/deepseek-architectures.md 1.4), written out here rather than taken from
// optx: the correction range from beta_fast / beta_slow, the linear ramp between, the
// blend of interpolated (f / factor) and extrapolated (f) frequencies, and cos/sin times
// m(factor, mscale) / m(factor, mscale_all_dim).
struct YarnRef {
  int64_t d;
  double base, factor, L_orig, beta_fast, beta_slow, mscale, mscale_all_dim;
  double low = 0, high = 0;
  std::vector<double> inv_freq;
  double scale = 1;
  static double get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }
  void build() {
    // Dimension index whose wavelength turns num_rotations times over the original context.
    auto correction_dim = [&](double num_rotations) {
      return double(d) * std::log(L_orig / (num_rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    low = std::max(std::floor(correction_dim(beta_fast)), 0.0);
    high = std::min(std::ceil(correction_dim(beta_slow)), double(d - 1));
    const double hi = low == high ? high + 0.001 : high;
    for (int64_t i = 0; i < d / 2; ++i) {
      const double freq_extra = 1.0 / std::pow(base, double(2 * i) / double(d));
      const double freq_inter = 1.0 / (factor * std::pow(base, double(2 * i) / double(d)));
      const double ramp = std::clamp((double(i) - low) / (hi - low), 0.0, 1.0);
      const double extra_mask = 1.0 - ramp;  // HF's inv_freq_mask: 1 keeps the original frequency
      inv_freq.push_back(freq_inter * (1.0 - extra_mask) + freq_extra * extra_mask);
    }
    scale = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim);
  }
};

// DeepSeek-V3 (mscale = mscale_all_dim = 1), V2-Lite (0.707 / 0.707) and a config whose
// two mscales differ (so cos/sin carry a factor != 1): factor 40, original context 4096,
// beta 32 / 1, d 64, theta 1e4. cos and sin at positions inside and well beyond the
// original context, every frequency index.
TEST(RopeTable, DeepSeekYarnCosSinBeyondOriginalContext) {
  struct Config {
    const char* name;
    double mscale, mscale_all_dim;
  };
  for (const Config& c : {Config{"V3", 1.0, 1.0}, Config{"V2-Lite", 0.707, 0.707}, Config{"mscale 1 / all_dim 0.707", 1.0, 0.707}}) {
    YarnRef ref{.d = 64, .base = 10000, .factor = 40, .L_orig = 4096, .beta_fast = 32, .beta_slow = 1, .mscale = c.mscale,
                .mscale_all_dim = c.mscale_all_dim};
    ref.build();
    EXPECT_EQ(ref.low, 10) << c.name;  // the published V2/V3 correction range
    EXPECT_EQ(ref.high, 23) << c.name;
    YarnScaling y;
    y.factor = 40, y.original_max_position_embeddings = 4096, y.beta_fast = 32, y.beta_slow = 1;
    y.mscale = c.mscale, y.mscale_all_dim = c.mscale_all_dim;
    const int64_t P = 32768, half = 32;
    RopeTable t;
    ASSERT_TRUE(RopeTable::build({.rotary_dim = 64, .max_positions = P, .theta = 10000, .yarn = y}, &t).ok());
    const float* cos = static_cast<const float*>(t.cos().data);
    const float* sin = static_cast<const float*>(t.sin().data);
    for (int64_t p : {1, 100, 4095, 4096, 4097, 8191, 16384, 32767})
      for (int64_t i = 0; i < half; ++i) {
        const double a = double(p) * ref.inv_freq[size_t(i)];
        const std::string what = std::string(c.name) + " p=" + std::to_string(p) + " i=" + std::to_string(i);
        expect_table_value(cos[p * half + i], std::cos(a) * ref.scale, what + " cos");
        expect_table_value(sin[p * half + i], std::sin(a) * ref.scale, what + " sin");
      }
  }
}

TEST(Rope, BadInputs) {
  RopeTable t;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 8, .max_positions = 10}, &t).ok());
  std::vector<float> q(2 * 2 * 8);
  std::vector<int32_t> pos = {0, 10};
  RopeParams p{.q = make_view(q.data(), DType::kF32, {2, 2, 8}), .positions = make_view(pos.data(), DType::kI32, {2}),
               .cos = t.cos(), .sin = t.sin()};
  auto expect = [](const RopeParams& p, const std::string& needle) {
    const Status st = rope(p);
    ASSERT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find("rope: "), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  expect(p, "positions[1]=10 is outside the cos/sin table [0, 10)");
  pos[1] = -1;
  expect(p, "positions[1]=-1");
  pos[1] = 3;
  EXPECT_TRUE(rope(p).ok());
  auto b = p;
  b.rotary_dim = 6;
  expect(b, "cos must be f32 [P, rotary_dim/2=3]");
  b = p;
  b.rotary_offset = 2;
  expect(b, "rotary_offset=2 + rotary_dim=8 exceeds q.sizes[2]=8");
  b = p;
  b.q.strides[2] = 2;
  expect(b, "q.strides[2]=2");
  b = p;
  b.q = {};
  expect(b, "q and k are both empty");
  b = p;
  b.positions.dtype = DType::kF32;
  expect(b, "positions.dtype=f32");
  b = p;
  b.rotary_dim = 7;
  expect(b, "rotary_dim=7");
  // Found by review: a q of rank 2 or 4 with the default rotary_dim (0: the head size)
  // was reported as "rotary_dim=0 must be even", not as q's rank.
  b = p;
  b.q = make_view(q.data(), DType::kF32, {2, 16});
  expect(b, "q.rank=2 but must be 3");
  b = p;
  b.q = make_view(q.data(), DType::kF32, {2, 1, 2, 8});
  expect(b, "q.rank=4 but must be 3");
  RopeTable bad;
  EXPECT_FALSE(RopeTable::build({.rotary_dim = 3}, &bad).ok());

  // Found by review: k over q (both rotated in place, by several threads) and positions
  // inside q (read again after rows were rotated) were accepted; the message named q for
  // a k-only call.
  b = p;
  b.k = p.q;
  expect(b, "q and k overlap (outputs must not share memory)");
  std::fill(q.begin(), q.end(), 0.0f);  // positions 0 as i32 bits
  b = p;
  b.positions = make_view(q.data() + 8, DType::kI32, {2});
  expect(b, "q overlaps positions (an output must not share memory with an input)");
  b = p;
  b.k = p.q, b.q = {};
  b.k.dtype = DType::kI8;
  expect(b, "k.dtype=i8 but must be f32 or bf16");
  // q and k heads side by side in one fused row stay legal.
  std::vector<float> qk(2 * 3 * 8, 0.5f);
  b = p;
  b.q = make_view(qk.data(), DType::kF32, {2, 2, 8}, {24, 8, 1});
  b.k = make_view(qk.data() + 16, DType::kF32, {2, 1, 8}, {24, 8, 1});
  EXPECT_TRUE(rope(b).ok()) << rope(b).message();

  // Found by a fuzz sweep: an offset near INT64_MAX wrapped offset + rotary_dim and rotated
  // memory before q; zero strides had threads rotating one element twice; a table the
  // size limits allowed (2^26 x 512) threw std::bad_alloc out of build; non-finite yarn
  // parameters filled the tables with NaN.
  b = p;
  b.rotary_offset = INT64_MAX - 4;
  expect(b, "exceeds q.sizes[2]=8");
  b = p;
  b.q.strides[1] = 0;
  expect(b, "q.strides[1]=0 repeats its elements");
  b = p;
  b.q.strides[0] = -16;
  expect(b, "q.strides[0]=-16 is negative");
  EXPECT_EQ(RopeTable::build({.rotary_dim = 1024, .max_positions = int64_t(1) << 26}, &bad).message(),
            "rope_table: max_positions=67108864 x rotary_dim/2=512 exceeds 2^31 entries per table");
  EXPECT_NE(RopeTable::build({.rotary_dim = 8, .yarn = {.factor = INFINITY}}, &bad).message().find("must all be finite"), std::string::npos);
  EXPECT_NE(RopeTable::build({.rotary_dim = 8, .yarn = {.factor = 4, .mscale = NAN}}, &bad).message().find("must all be finite"),
            std::string::npos);
  EXPECT_NE(RopeTable::build({.rotary_dim = 8, .theta = INFINITY}, &bad).message().find("theta=inf must be finite"), std::string::npos);
}

TEST(RopeDispatch, SelectedRespectsMaxIsa) {
  const auto* impl = registry().find(selected_impl("rope"));
  ASSERT_NE(impl, nullptr);
  EXPECT_LE(int(impl->isa), int(active_isa()));
  if (dispatch::forced_impl("rope").empty()) {  // else OPTX_IMPL's choice
    EXPECT_EQ(registry().runnable().front(), impl);
  }
  Case c;
  c.T = 3, c.style = RopeStyle::kInterleaved, c.dtype = DType::kBF16;
  EXPECT_TRUE(testutil::run_case(*impl, c).cmp.pass);
}

}  // namespace
}  // namespace optx::rope_detail
