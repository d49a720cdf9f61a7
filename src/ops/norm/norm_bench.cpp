// `optx bench` rows for rms_norm and add_rms_norm: the fused op against `basic`, the
// composition an eager framework runs (HF's RMSNorm: add; to f32; pow; mean; * rsqrt;
// to bf16; * weight), each op a separate multi-threaded pass over preallocated
// intermediates. Bytes counted for optx are the fewest the op must move: read x (and the
// residual), write the residual and out.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/basic_ops.h"
#include "bench/bench.h"
#include "ops/norm/norm_internal.h"
#include "testing/rng.h"

namespace optx::norm_detail {
namespace {

// Runs fn(t) for rows t in parallel: one "kernel launch" per basic op.
template <class Fn>
void rows(int threads, int64_t T, Fn fn) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < T; ++t) fn(t);
}

void bench_case(bench::Context& ctx, bool add, int64_t T, int64_t H) {
  const int64_t n = T * H;
  const size_t b16 = size_t(n) * 2;
  // Sets of activations rotated call by call: between two uses of one set rms_norm
  // touches 352 MiB and add_rms_norm 704 MiB, well past the 300 MiB L3 the VM reports
  // (add_rms_norm then still runs at or above the memcpy copy figure: its four streams
  // per core beat memcpy's two).
  const int kSets = 3;
  std::vector<std::unique_ptr<bench::Buffer>> x, res, out;
  testing::Rng rng(3);
  for (int s = 0; s < kSets; ++s) {
    x.emplace_back(new bench::Buffer(b16));
    res.emplace_back(new bench::Buffer(b16));
    out.emplace_back(new bench::Buffer(b16));
    testing::fill_bf16(x.back()->as<uint16_t>(), n, rng);
    testing::fill_bf16(res.back()->as<uint16_t>(), n, rng);
    testing::fill_bf16(out.back()->as<uint16_t>(), n, rng);
  }
  std::vector<uint16_t> w(static_cast<size_t>(H));
  testing::fill_bf16(w.data(), H, rng, 0.5f, 1.5f);
  const float eps = 1e-6f;
  const std::string cs = "dtype=bf16 T=" + std::to_string(T) + " H=" + std::to_string(H);
  const char* op = add ? "add_rms_norm" : "rms_norm";
  const double bytes = double(b16) * (add ? 4 : 2);

  int set = 0;
  bench::Record r{.op = op, .case_ = cs, .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = selected_impl(op);
  auto optx_fn = [&] {
    const int s = set++ % kSets;
    auto v = [&](bench::Buffer& b) { return make_view(b.data(), DType::kBF16, {T, H}); };
    if (add)
      bench::check(add_rms_norm({.x = v(*x[s]), .residual = v(*res[s]), .weight = make_view(w.data(), DType::kBF16, {H}),
                          .out = v(*out[s]), .eps = eps}));
    else
      bench::check(rms_norm({.x = v(*x[s]), .weight = make_view(w.data(), DType::kBF16, {H}), .out = v(*out[s]), .eps = eps}));
  };

  // basic: intermediates allocated and touched once, outside the timed region.
  bench::Buffer h32(size_t(n) * 4), sq32(size_t(n) * 4), hb(b16);
  std::vector<float> var(static_cast<size_t>(T));
  const int th = ctx.threads;
  bench::Record b{.op = op, .case_ = cs, .impl = "basic", .roof = bench::Roof::kMemory};
  b.peak_bytes = double(h32.bytes() + sq32.bytes() + hb.bytes() + var.size() * 4);
  b.note = add ? "add, to_f32, pow, mean, *rsqrt, to_bf16, *w" : "to_f32, pow, mean, *rsqrt, to_bf16, *w";
  namespace bo = ::optx::bench::basic;
  auto basic_fn = [&] {
    const int s = set++ % kSets;
    const uint16_t* src = x[s]->as<uint16_t>();
    if (add) {
      rows(th, T, [&](int64_t t) { bo::add_bf16(res[s]->as<uint16_t>() + t * H, x[s]->as<uint16_t>() + t * H, res[s]->as<uint16_t>() + t * H, H); });
      src = res[s]->as<uint16_t>();
    }
    rows(th, T, [&](int64_t t) { bo::bf16_to_f32_op(src + t * H, h32.as<float>() + t * H, H); });
    rows(th, T, [&](int64_t t) { bo::square_f32(h32.as<float>() + t * H, sq32.as<float>() + t * H, H); });
    rows(th, T, [&](int64_t t) { var[size_t(t)] = bo::mean_f32(sq32.as<float>() + t * H, H); });
    rows(th, T, [&](int64_t t) { bo::scale_f32(h32.as<float>() + t * H, 1.0f / std::sqrt(var[size_t(t)] + eps), H); });
    rows(th, T, [&](int64_t t) { bo::f32_to_bf16_op(h32.as<float>() + t * H, hb.as<uint16_t>() + t * H, H); });
    rows(th, T, [&](int64_t t) { bo::mul_bf16(hb.as<uint16_t>() + t * H, w.data(), out[s]->as<uint16_t>() + t * H, H); });
  };
  const auto tm = ctx.time_interleaved({optx_fn, basic_fn});
  ctx.add(r, tm[0], 0, bytes);
  // Same useful bytes as optx, so GB/s compare directly (basic really moves ~5x more).
  ctx.add(b, tm[1], 0, bytes);
}

void bench_norm(bench::Context& ctx) {
  if (ctx.wants("add_rms_norm")) bench_case(ctx, true, 4096, 7168);
  if (ctx.wants("rms_norm")) bench_case(ctx, false, 4096, 7168);
  if (!ctx.quick && ctx.wants("add_rms_norm")) bench_case(ctx, true, 4096, 4096);
}

OPTX_REGISTER_BENCH("rms_norm|add_rms_norm", bench_norm);

}  // namespace
}  // namespace optx::norm_detail
