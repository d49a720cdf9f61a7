// `optx bench` rows for rope: q [T, 32, 128] and k [T, 8, 128] bf16 rotated in place
// (NeoX style) against `basic`, HF's eager composition: gather cos/sin rows by position
// into [T, D] tensors, rotate_half(x) materialised, x * cos, rotate_half(x) * sin, add —
// one multi-threaded pass each over preallocated buffers. Bytes: read + write q and k.
#include <omp.h>

#include <string>
#include <vector>

#include "bench/basic_ops.h"
#include "bench/bench.h"
#include "ops/rope/rope_internal.h"
#include "testing/aligned.h"
#include "testing/rng.h"

namespace optx::rope_detail {
namespace {

void bench_rope(bench::Context& ctx) {
  const int64_t T = 4096, Hq = 32, Hk = 8, D = 128, H = Hq + Hk;
  RopeTable table;
  bench::check(RopeTable::build({.rotary_dim = D, .max_positions = 8192}, &table));
  testing::Rng rng(9);
  const int64_t n = T * H * D;  // q and k stored as one [T, 40, 128] block per set
  // Sets of 40 MiB rotated call by call, enough to span bench::dram_working_set() (twice
  // the LLC), so every call streams its rows from DRAM.
  const int kSets = int((bench::dram_working_set() + size_t(n) * 2 - 1) / (size_t(n) * 2));
  std::vector<testing::AlignedVector<uint16_t>> x(size_t(kSets), testing::AlignedVector<uint16_t>(static_cast<size_t>(n)));
  for (auto& v : x) testing::fill_bf16(v.data(), n, rng);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
  const double bytes = 2.0 * double(n) * 2;
  const std::string cs = "dtype=bf16 T=4096 Hq=32 Hk=8 D=128 style=half";
  int set = 0;
  bench::Record r{.op = "rope", .case_ = cs, .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = selected_impl("rope");
  auto optx_fn = [&] {
    uint16_t* base = x[size_t(set++ % kSets)].data();
    bench::check(rope({.q = make_view(base, DType::kBF16, {T, Hq, D}, {H * D, D, 1}),
                .k = make_view(base + Hq * D, DType::kBF16, {T, Hk, D}, {H * D, D, 1}),
                .positions = make_view(pos.data(), DType::kI32, {T}), .cos = table.cos(), .sin = table.sin()}));
  };

  testing::AlignedVector<float> cosr(static_cast<size_t>(T * D)), sinr(static_cast<size_t>(T * D));
  testing::AlignedVector<uint16_t> rh(static_cast<size_t>(n)), a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  const int th = ctx.threads;
  bench::Record bb{.op = "rope", .case_ = cs, .impl = "basic", .roof = bench::Roof::kMemory};
  bb.peak_bytes = double((cosr.size() + sinr.size()) * 4 + (rh.size() + a.size() + b.size()) * 2);
  bb.note = "gather cos/sin, rotate_half, x*cos, rh*sin, add";
  const float* ct = static_cast<const float*>(table.cos().data);
  const float* st = static_cast<const float*>(table.sin().data);
  auto basic_fn = [&] {
    uint16_t* xs = x[size_t(set++ % kSets)].data();
#pragma omp parallel for num_threads(th)
    for (int64_t t = 0; t < T; ++t) {
      bench::basic::gather_cos_row(ct + pos[size_t(t)] * (D / 2), D / 2, cosr.data() + t * D);
      bench::basic::gather_cos_row(st + pos[size_t(t)] * (D / 2), D / 2, sinr.data() + t * D);
    }
#pragma omp parallel for num_threads(th)
    for (int64_t r_ = 0; r_ < T * H; ++r_) bench::basic::rotate_half_bf16(xs + r_ * D, rh.data() + r_ * D, D);
#pragma omp parallel for num_threads(th)
    for (int64_t r_ = 0; r_ < T * H; ++r_) bench::basic::mul_bf16_f32(xs + r_ * D, cosr.data() + (r_ / H) * D, a.data() + r_ * D, D);
#pragma omp parallel for num_threads(th)
    for (int64_t r_ = 0; r_ < T * H; ++r_) bench::basic::mul_bf16_f32(rh.data() + r_ * D, sinr.data() + (r_ / H) * D, b.data() + r_ * D, D);
#pragma omp parallel for num_threads(th)
    for (int64_t r_ = 0; r_ < T * H; ++r_) bench::basic::add_bf16(a.data() + r_ * D, b.data() + r_ * D, xs + r_ * D, D);
  };
  ctx.add_interleaved(r, optx_fn, bb, basic_fn, 0, bytes);
}

OPTX_REGISTER_BENCH("rope", bench_rope);

}  // namespace
}  // namespace optx::rope_detail
