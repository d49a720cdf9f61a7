// Core runtime: conversions (round-to-nearest-even, NaN kept), views, CPU detection sanity,
// thread settings, C API errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>
#include <cstdint>
#include <cstring>
#include <limits>

#include "optx/optx.h"
#include "optx/runtime.h"
#include "optx/tensor.h"
#include "core/parallel.h"
#include "core/validate.h"

namespace optx {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Convert, Bf16RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);  // above tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  // max float rounds to Inf
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  const uint16_t nan = f32_to_bf16(from_bits(0x7f800001));  // payload only in low bits
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  for (uint32_t h = 0; h < 0x10000; ++h) {  // exact round trip of every bf16 non-NaN
    const float f = bf16_to_f32(uint16_t(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
}

TEST(Convert, F16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));    // smallest subnormal
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                  // rounds to Inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie to even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  // Against the hardware conversion semantics on values between representable halves.
  for (int i = 0; i < 20000; ++i) {
    const float f = std::ldexp(1.0f + float(i) / 20000.0f, (i % 40) - 26);
    const float back = f16_to_f32(f32_to_f16(f));
    // Correct rounding: no half lies strictly closer to f than the result.
    const uint16_t h = f32_to_f16(f);
    const float up = f16_to_f32(uint16_t(h + 1)), down = h ? f16_to_f32(uint16_t(h - 1)) : back;
    if (std::isfinite(up)) {
      ASSERT_LE(std::fabs(back - f), std::fabs(up - f)) << f;
    }
    ASSERT_LE(std::fabs(back - f), std::fabs(down - f)) << f;
  }
}

TEST(Views, ContiguityAndNumel) {
  float x[24];
  TensorView v = make_view(x, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.strides[0], 12);
  TensorView s = make_view(x, DType::kF32, {2, 3}, {8, 1});
  EXPECT_FALSE(s.is_contiguous());
  // No elements: contiguous whatever the strides (numpy gives np.empty((2, 0, 4)) strides
  // [4, 4, 1] in elements, where make_view gives [0, 4, 1]); a negative size never is.
  EXPECT_TRUE(make_view(x, DType::kF32, {2, 0, 4}, {4, 4, 1}).is_contiguous());
  EXPECT_TRUE(make_view(x, DType::kF32, {0, 3}, {1, 1}).is_contiguous());
  EXPECT_FALSE(make_view(x, DType::kF32, {0, -3}, {1, 1}).is_contiguous());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_STREQ(dtype_name(DType::kI64), "i64");
}

TEST(Views, CheckViewRejectsWhatOpsCannotIndex) {
  float x[4] = {};
  auto msg = [](const TensorView& v) { return check_view("op", "t", v).message(); };
  EXPECT_TRUE(check_view("op", "t", make_view(x, DType::kF32, {2, 2})).ok());
  EXPECT_TRUE(check_view("op", "t", make_view(nullptr, DType::kF32, {0, 5})).ok());  // no elements: no data needed
  EXPECT_TRUE(check_view("op", "t", TensorView{}).ok());
  EXPECT_TRUE(check_view("op", "t", make_view(x, DType::kF32, {int64_t(1) << 40}, {0})).ok());  // a broadcast
  EXPECT_EQ(msg(make_view(x, DType::kF32, {2, -1})), "op: t.sizes[1]=-1 is negative");
  EXPECT_EQ(msg(make_view(x, DType::kF32, {2, 2}, {-2, 1})), "op: t.strides[0]=-2 is negative (negative strides are not supported)");
  EXPECT_EQ(msg(make_view(nullptr, DType::kF32, {2, 2})), "op: t.data is null");
  TensorView r = make_view(x, DType::kF32, {1});
  r.rank = 7;
  EXPECT_EQ(msg(r), "op: t.rank=7 is outside [0, 6]");
  EXPECT_EQ(msg(make_view(x, static_cast<DType>(42), {2})), "op: t.dtype=42 is not a DType");
  EXPECT_STREQ(dtype_name(static_cast<DType>(42)), "DType(42)");  // what dtype checks before check_view print
  // Extents and counts past 2^48, including ones whose products wrap int64.
  EXPECT_NE(msg(make_view(x, DType::kF32, {int64_t(1) << 47, 2})).find("spans more than 2^48"), std::string::npos);
  EXPECT_FALSE(check_view("op", "t", make_view(x, DType::kBF16, {int64_t(1) << 32, int64_t(1) << 31}, {0, 0})).ok());
  EXPECT_FALSE(check_view("op", "t", make_view(x, DType::kF32, {3, 3}, {int64_t(1) << 62, 1})).ok());
  EXPECT_FALSE(check_view("op", "t", make_view(nullptr, DType::kF32, {int64_t(1) << 62, 8})).ok());
  EXPECT_EQ(make_view(nullptr, DType::kF32, {int64_t(1) << 62, 8}).numel(), INT64_MAX);
}

TEST(Views, CheckDisjointFindsOverlappingOutputs) {
  float x[64] = {};
  EXPECT_TRUE(check_disjoint("op", "t", make_view(x, DType::kF32, {2, 3, 4})).ok());
  EXPECT_TRUE(check_disjoint("op", "t", make_view(x, DType::kF32, {3, 4}, {1, 3})).ok());   // transposed
  EXPECT_TRUE(check_disjoint("op", "t", make_view(x, DType::kF32, {1, 4}, {0, 1})).ok());   // size-1 dims: any stride
  EXPECT_TRUE(check_disjoint("op", "t", make_view(x, DType::kF32, {2, 2, 4}, {16, 4, 1})).ok());  // padded rows
  EXPECT_EQ(check_disjoint("op", "t", make_view(x, DType::kF32, {3, 4}, {0, 1})).message(),
            "op: t.strides[0]=0 repeats its elements along dim 0 (size 3)");
  EXPECT_EQ(check_disjoint("op", "t", make_view(x, DType::kF32, {3, 4}, {3, 1})).message(),
            "op: t.strides[0]=3 makes elements overlap (it must exceed 3, the span of the dims with smaller strides)");
  EXPECT_FALSE(check_disjoint("op", "t", make_view(x, DType::kF32, {3, 4}, {2, 1})).ok());  // rows 2 apart, 4 long
  EXPECT_FALSE(check_disjoint("op", "t", make_view(x, DType::kF32, {2, 2, 4}, {8, 5, 1})).ok());
}

// views_overlap against the bytes each view covers: it may never miss a shared byte, and
// for row views with one row stride (the cases ops rely on to accept slices of one
// buffer) it must also never report one that is not there.
TEST(Views, OverlapMatchesTheBytesTheViewsCover) {
  std::vector<float> buf(96);
  uint32_t seed = 12345;
  auto rnd = [&](int n) { seed = seed * 1664525u + 1013904223u; return int((seed >> 8) % uint32_t(n)); };
  auto bytes = [&](const TensorView& t) {
    std::vector<uint8_t> m(buf.size() * 4, 0);
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      int64_t off = 0, r = i;
      for (int d = t.rank - 1; d >= 0; --d) { off += (r % t.sizes[d]) * t.strides[d]; r /= t.sizes[d]; }
      const int64_t b = (static_cast<float*>(t.data) - buf.data() + off) * 4;
      for (int k = 0; k < 4; ++k) m[size_t(b + k)] = 1;
    }
    return m;
  };
  int exact_cases = 0, hits = 0;
  for (int it = 0; it < 4000; ++it) {
    TensorView v[2];
    const int ld = 1 + rnd(12);  // shared row stride for the first dim half of the time
    for (auto& t : v) {
      const int rank = 1 + rnd(3);
      int64_t sizes[3], strides[3];
      for (int d = 0; d < rank; ++d) sizes[d] = 1 + rnd(4);
      if (rnd(2)) {  // dense inner dims, as ops' row views
        int64_t inner = 1;
        for (int d = rank - 1; d >= 1; --d) { strides[d] = inner; inner *= sizes[d]; }
        strides[0] = rnd(2) ? ld : rnd(14);
      } else {
        for (int d = 0; d < rank; ++d) strides[d] = rnd(9);
      }
      int64_t last = 0;
      for (int d = 0; d < rank; ++d) last += (sizes[d] - 1) * strides[d];
      const int off = rnd(int(buf.size() - last));
      t.data = buf.data() + off;
      t.rank = rank;
      for (int d = 0; d < rank; ++d) { t.sizes[d] = sizes[d]; t.strides[d] = strides[d]; }
    }
    const auto a = bytes(v[0]), b = bytes(v[1]);
    bool shared = false;
    for (size_t i = 0; i < a.size() && !shared; ++i) shared = a[i] && b[i];
    const bool got = views_overlap(v[0], v[1]);
    ASSERT_EQ(got, views_overlap(v[1], v[0])) << it;
    if (shared) {
      ASSERT_TRUE(got) << "missed a shared byte, case " << it;
    }
    bool dense = true;
    for (const auto& t : v)
      for (int d = t.rank - 1, inner = 1; d >= 1; inner *= int(t.sizes[d]), --d) dense &= t.sizes[d] == 1 || t.strides[d] == inner;
    if (dense && (v[0].sizes[0] == 1 || v[1].sizes[0] == 1 || v[0].strides[0] == v[1].strides[0])) {
      ++exact_cases;
      ASSERT_EQ(got, shared) << "case " << it;
    }
    hits += shared;
  }
  EXPECT_GT(exact_cases, 500);  // the generator reaches both kinds of case
  EXPECT_GT(hits, 500);
  EXPECT_LT(hits, 3500);
  const TensorView none;
  EXPECT_FALSE(views_overlap(none, make_view(buf.data(), DType::kF32, {4})));
}

TEST(Views, CheckApartNamesBothArguments) {
  std::vector<float> buf(64);
  const TensorView qkv = make_view(buf.data(), DType::kF32, {4, 16});
  const TensorView q = make_view(buf.data(), DType::kF32, {4, 8}, {16, 1});
  const TensorView k = make_view(buf.data() + 8, DType::kF32, {4, 4}, {16, 1});
  const TensorView v = make_view(buf.data() + 12, DType::kF32, {4, 4}, {16, 1});
  EXPECT_TRUE(check_apart("op", {{"q", q}, {"k", k}}, {{"v", v}}).ok());  // column slices of one buffer
  EXPECT_EQ(check_apart("op", {{"q", q}, {"qkv", qkv}}, {}).message(), "op: q and qkv overlap (outputs must not share memory)");
  EXPECT_EQ(check_apart("op", {{"k", k}}, {{"v", v}, {"qkv", qkv}}).message(),
            "op: k overlaps qkv (an output must not share memory with an input)");
}

TEST(Cpu, FeatureImplications) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_bf16) {
    EXPECT_TRUE(f.avx512f);
  }
  if (f.avx512bw) {
    EXPECT_TRUE(f.avx512f);
  }
  EXPECT_LE(int(active_isa()), int(detected_isa()));
}

TEST(Threads, SetAndReset) {
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  set_num_threads(0);  // back to the default
  EXPECT_GE(num_threads(), 1);
}

// Inside a parallel region that cannot fork (nesting off, the default) ops plan for the
// one thread they will get; where nesting is allowed, for the set count; a ThreadScope
// wins either way.
TEST(Threads, OneInsideARegionThatCannotFork) {
  set_num_threads(3);
  const int levels = omp_get_max_active_levels();
  int seen[3][2] = {};
  for (int nested = 0; nested < 2; ++nested) {
    omp_set_max_active_levels(nested ? 2 : 1);
#pragma omp parallel num_threads(2)
    {
      const int t = omp_get_thread_num();
      seen[nested][t] = num_threads();
      if (!nested) {
        ThreadScope scope(4);
        seen[2][t] = num_threads();
      }
    }
  }
  omp_set_max_active_levels(levels);
  set_num_threads(0);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(seen[0][t], 1) << "thread " << t;
    EXPECT_EQ(seen[1][t], 3) << "thread " << t;
    EXPECT_EQ(seen[2][t], 4) << "thread " << t;
  }
}

// OMP_THREAD_LIMIT caps the team OpenMP forks, so it caps what ops plan for too, whether
// the count comes from set_num_threads or a ThreadScope (a scope past it planned splits
// and workspaces for threads that never came). Run by the core_thread_limit test, which
// sets OMP_THREAD_LIMIT=2; without a limit there is nothing to cap.
TEST(Threads, NeitherCountPassesTheThreadLimit) {
  const int limit = omp_get_thread_limit();
  if (limit > 64) GTEST_SKIP() << "OMP_THREAD_LIMIT not set (ctest core_thread_limit sets it)";
  set_num_threads(limit + 1);
  EXPECT_EQ(num_threads(), limit);
  {
    ThreadScope scope(limit + 2);
    EXPECT_EQ(num_threads(), limit);
  }
  set_num_threads(0);
}

// Found by review: set_num_threads(INT_MAX) (or OMP_NUM_THREADS) went to the ops' OpenMP
// teams, and libgomp exited the process allocating one; the counts stop at kMaxThreads.
TEST(Threads, CountsStopAtKMaxThreads) {
  set_num_threads(INT_MAX);
  EXPECT_LE(num_threads(), kMaxThreads);
  {
    ThreadScope scope(INT_MAX);
    EXPECT_LE(num_threads(), kMaxThreads);
  }
  set_num_threads(0);
}

// Found by review: a request within `align` of SIZE_MAX wrapped the round-up to a tiny
// block that was returned as if it held the bytes.
TEST(Alloc, RequestsThatWouldWrapFail) {
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - (size_t(2) << 20) + 2}) EXPECT_EQ(aligned_alloc_bytes(bytes), nullptr) << bytes;
  void* p = aligned_alloc_bytes(100);
  EXPECT_NE(p, nullptr);
  aligned_free(p);
}

// Every item once, in contiguous chunks of at least min_chunk (the last may be shorter),
// on 1-3 threads and for n around the chunk sizes.
TEST(Threads, ParallelChunksCoverEachItemOnce) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 31, 32, 33, 100, 256, 4097}) {
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> got;
      parallel_chunks(n, 32, 4, [&](int64_t b, int64_t e) {
        std::lock_guard<std::mutex> lock(mu);
        got.emplace_back(b, e);
      });
      std::sort(got.begin(), got.end());
      int64_t at = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].first, at) << "threads=" << threads << " n=" << n;
        EXPECT_GT(got[i].second, got[i].first);
        if (i + 1 < got.size()) {
          EXPECT_GE(got[i].second - got[i].first, 32);
        }
        at = got[i].second;
      }
      EXPECT_EQ(at, n) << "threads=" << threads;
    }
  }
  set_num_threads(0);
}

TEST(CApi, ErrorsAreCodesWithMessages) {
  optx_gemm_params p{};
  EXPECT_EQ(optx_gemm(&p, nullptr, 0), OPTX_INVALID_ARGUMENT);
  EXPECT_NE(std::string(optx_last_error()).find("gemm: a.rank=0"), std::string::npos) << optx_last_error();
  char buf[32];
  EXPECT_EQ(optx_selected_impl("gemm", buf, sizeof buf), OPTX_OK);
  EXPECT_GT(std::strlen(buf), 0u);
  EXPECT_EQ(optx_selected_impl("no_such_op", buf, sizeof buf), OPTX_INVALID_ARGUMENT);
  // A real call through the C API.
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 0, 1, 0}, c[4] = {};
  p.a = {a, OPTX_F32, 2, {2, 3}, {3, 1}};
  p.b = {b, OPTX_F32, 2, {2, 3}, {3, 1}};
  p.c = {c, OPTX_F32, 2, {2, 2}, {2, 1}};
  p.alpha = 1.0f;
  std::vector<unsigned char> ws(optx_gemm_workspace_size(&p));
  ASSERT_EQ(optx_gemm(&p, ws.data(), ws.size()), OPTX_OK) << optx_last_error();
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_EQ(c[1], 2.0f);
  EXPECT_EQ(c[2], 4.0f);
  EXPECT_EQ(c[3], 5.0f);
  // A C enum past DType's 8 bits wrapped onto a valid one (256: f32) and ran; a rank past
  // 6 was reported as 6.
  optx_gemm_params bad = p;
  const int past = 256;  // as a C caller may pass it: the enum's storage holds any int
  std::memcpy(&bad.a.dtype, &past, sizeof past);
  EXPECT_EQ(optx_gemm_workspace_size(&bad), 0u);
  EXPECT_STREQ(optx_last_error(), "gemm: a.dtype=256 is not an optx_dtype");
  EXPECT_EQ(optx_gemm(&bad, ws.data(), ws.size()), OPTX_INVALID_ARGUMENT);
  EXPECT_STREQ(optx_last_error(), "gemm: a.dtype=256 is not an optx_dtype");
  bad = p;
  bad.c.rank = 9;
  EXPECT_EQ(optx_gemm(&bad, ws.data(), ws.size()), OPTX_INVALID_ARGUMENT);
  EXPECT_NE(std::string(optx_last_error()).find("gemm: c.rank=9"), std::string::npos) << optx_last_error();
  // The size query refuses with the same message gemm() gives, data pointers aside.
  bad = p;
  bad.c.sizes[1] = 3;
  bad.a.data = nullptr;
  EXPECT_EQ(optx_gemm_workspace_size(&bad), 0u);
  const std::string size_msg = optx_last_error();
  EXPECT_NE(size_msg.find("gemm: "), std::string::npos) << size_msg;
  EXPECT_NE(size_msg.find("c.sizes=[2, 3]"), std::string::npos) << size_msg;
  bad.a.data = a;
  EXPECT_EQ(optx_gemm(&bad, ws.data(), ws.size()), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(size_msg, optx_last_error());
  EXPECT_EQ(optx_gemm_workspace_size(nullptr), 0u);
  EXPECT_STREQ(optx_last_error(), "gemm: params is null");
  bad = p;
  bad.b.rank = -1;
  EXPECT_EQ(optx_gemm(&bad, ws.data(), ws.size()), OPTX_INVALID_ARGUMENT);
  EXPECT_NE(std::string(optx_last_error()).find("gemm: b.rank=-1"), std::string::npos) << optx_last_error();
}

// Asked before validation (op argument checks), a view's rank and sizes must not read past
// its arrays or overflow.
TEST(Tensor, ContiguityAndCountOfInvalidViews) {
  TensorView v = make_view(nullptr, DType::kF32, {int64_t(1) << 40, int64_t(1) << 40});
  EXPECT_FALSE(v.is_contiguous());  // 2^80 elements: the running extent overflowed
  EXPECT_EQ(v.numel(), INT64_MAX);
  v.rank = 9;
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(v.numel(), INT64_MAX);
  v.rank = -1;
  EXPECT_FALSE(v.is_contiguous());
}

}  // namespace
}  // namespace optx
