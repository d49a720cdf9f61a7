// `optx bench` rows for the cache-write family.
//
// kv_rms_norm_rope_cache, bf16, T = 4096 tokens of [512 | 64] (DeepSeek MLA), written as
// a prefill into 64-slot blocks scattered over a 128 Ki-slot pool: optx against `basic`, the eager composition (norm as to_f32,
// pow, mean, * rsqrt, to_bf16, * w; rope as HF does it: de-interleave, gather cos/sin,
// rotate_half, two products, add; then cat and index_copy into the cache). Bytes counted:
// read kv, write the cache rows. Inputs rotate over enough sets that the working set
// (inputs + pool) spans bench::dram_working_set() (twice the LLC).
// qkv_rope_cache, bf16, T = 4096, 32 q heads / 8 kv heads of 128: bytes = read qkv, write
// q_out and the k / v cache rows.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bench/basic_ops.h"
#include "bench/bench.h"
#include "ops/kv_cache/kv_cache_internal.h"
#include "testing/aligned.h"
#include "testing/rng.h"

namespace optx::kv_detail {
namespace {

namespace bo = ::optx::bench::basic;

// Slots of a prefill in a paged cache: the tokens fill whole blocks of kBlock consecutive
// slots, the blocks themselves scattered over the pool (distinct, random order), as a
// long-running block pool hands them out.
constexpr int64_t kBlock = 64;
std::vector<int32_t> paged_slots(int64_t T, int64_t num_slots, testing::Rng& rng) {
  const int64_t blocks = num_slots / kBlock, need = (T + kBlock - 1) / kBlock;
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) ids[size_t(b)] = int32_t(b);
  for (int64_t b = 0; b < need; ++b) std::swap(ids[size_t(b)], ids[size_t(b + rng.below(blocks - b))]);
  std::vector<int32_t> s(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) s[size_t(t)] = int32_t(ids[size_t(t / kBlock)] * kBlock + t % kBlock);
  return s;
}

// Input sets to rotate so that they and `fixed` bytes (pool, outputs) span the DRAM
// working set.
int sets_for(double fixed, double set_bytes) {
  return int(std::max(2.0, std::ceil((double(bench::dram_working_set()) - fixed) / set_bytes)));
}

void bench_mla(bench::Context& ctx) {
  const int64_t T = 4096, R = 512, RD = 64, W = R + RD, S = 128 * 1024;
  const int sets = sets_for(double(S * W * 2), double(T * W * 2));
  testing::Rng rng(17);
  KvBlockPool pool;
  bench::check(KvBlockPool::create({.num_blocks = S / kBlock, .block_size = kBlock, .row = W, .planes = 1, .dtype = DType::kBF16}, &pool));
  RopeTable table;
  bench::check(RopeTable::build({.rotary_dim = RD, .max_positions = 8192}, &table));
  std::vector<testing::AlignedVector<uint16_t>> kv(sets, testing::AlignedVector<uint16_t>(static_cast<size_t>(T * W)));
  std::vector<std::vector<int32_t>> slots;
  for (auto& v : kv) {
    testing::fill_bf16(v.data(), T * W, rng, -2, 2);
    slots.push_back(paged_slots(T, S, rng));
  }
  std::vector<uint16_t> w(static_cast<size_t>(R));
  testing::fill_bf16(w.data(), R, rng, 0.5f, 1.5f);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
  const double bytes = 2.0 * double(T * W) * 2;
  const std::string cs = "dtype=bf16 T=4096 H=576";
  int set = 0;
  bench::Record r{.op = "kv_rms_norm_rope_cache", .case_ = cs, .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = selected_impl("kv_rms_norm_rope_cache");
  auto optx_fn = [&] {
    const size_t s = size_t(set++ % sets);
    bench::check(kv_rms_norm_rope_cache({.kv = make_view(kv[s].data(), DType::kBF16, {T, W}), .weight = make_view(w.data(), DType::kBF16, {R}),
                                  .positions = make_view(pos.data(), DType::kI32, {T}), .cos = table.cos(), .sin = table.sin(),
                                  .slots = make_view(slots[s].data(), DType::kI32, {T}), .cache = pool.plane(0), .kv_lora_rank = R}));
  };

  // basic, intermediates preallocated and touched
  testing::AlignedVector<float> h32(static_cast<size_t>(T * R)), sq(h32.size()), var(static_cast<size_t>(T)), cosr(static_cast<size_t>(T * RD)),
      sinr(cosr.size());
  testing::AlignedVector<uint16_t> hb(static_cast<size_t>(T * R)), lat(hb.size()), de(static_cast<size_t>(T * RD)), rh(de.size()), a(de.size()),
      b(de.size()), kr(de.size()), cat(static_cast<size_t>(T * W));
  const int th = ctx.threads;
  bench::Record bb{.op = "kv_rms_norm_rope_cache", .case_ = cs, .impl = "basic", .roof = bench::Roof::kMemory};
  bb.peak_bytes = double((h32.size() + sq.size() + cosr.size() + sinr.size()) * 4 +
                         (hb.size() + lat.size() + 5 * de.size() + cat.size()) * 2);
  bb.note = "norm: 6 ops; rope: deinterleave, gather, rotate_half, 2 mul, add; cat; index_copy";
  uint16_t* cache = static_cast<uint16_t*>(pool.plane(0).data);
  const float* ct = static_cast<const float*>(table.cos().data);
  const float* st = static_cast<const float*>(table.sin().data);
  auto basic_fn = [&] {
    const size_t s = size_t(set++ % sets);
    const uint16_t* x = kv[s].data();
#define ROWS for (int64_t t = 0; t < T; ++t)
#pragma omp parallel for num_threads(th)
    ROWS bo::bf16_to_f32_op(x + t * W, h32.data() + t * R, R);
#pragma omp parallel for num_threads(th)
    ROWS bo::square_f32(h32.data() + t * R, sq.data() + t * R, R);
#pragma omp parallel for num_threads(th)
    ROWS var[size_t(t)] = bo::mean_f32(sq.data() + t * R, R);
#pragma omp parallel for num_threads(th)
    ROWS bo::scale_f32(h32.data() + t * R, 1.0f / std::sqrt(var[size_t(t)] + 1e-6f), R);
#pragma omp parallel for num_threads(th)
    ROWS bo::f32_to_bf16_op(h32.data() + t * R, hb.data() + t * R, R);
#pragma omp parallel for num_threads(th)
    ROWS bo::mul_bf16(hb.data() + t * R, w.data(), lat.data() + t * R, R);
#pragma omp parallel for num_threads(th)
    ROWS bo::deinterleave_bf16(x + t * W + R, de.data() + t * RD, RD);
#pragma omp parallel for num_threads(th)
    ROWS {
      bo::gather_cos_row(ct + pos[size_t(t)] * (RD / 2), RD / 2, cosr.data() + t * RD);
      bo::gather_cos_row(st + pos[size_t(t)] * (RD / 2), RD / 2, sinr.data() + t * RD);
    }
#pragma omp parallel for num_threads(th)
    ROWS bo::rotate_half_bf16(de.data() + t * RD, rh.data() + t * RD, RD);
#pragma omp parallel for num_threads(th)
    ROWS bo::mul_bf16_f32(de.data() + t * RD, cosr.data() + t * RD, a.data() + t * RD, RD);
#pragma omp parallel for num_threads(th)
    ROWS bo::mul_bf16_f32(rh.data() + t * RD, sinr.data() + t * RD, b.data() + t * RD, RD);
#pragma omp parallel for num_threads(th)
    ROWS bo::add_bf16(a.data() + t * RD, b.data() + t * RD, kr.data() + t * RD, RD);
#pragma omp parallel for num_threads(th)
    ROWS {
      std::memcpy(cat.data() + t * W, lat.data() + t * R, size_t(R) * 2);
      std::memcpy(cat.data() + t * W + R, kr.data() + t * RD, size_t(RD) * 2);
    }
#pragma omp parallel for num_threads(th)
    ROWS std::memcpy(cache + int64_t(slots[s][size_t(t)]) * W, cat.data() + t * W, size_t(W) * 2);
#undef ROWS
  };
  ctx.add_interleaved(r, optx_fn, bb, basic_fn, 0, bytes);
}

void bench_qkv(bench::Context& ctx) {
  const int64_t T = 4096, HQ = 32, HKV = 8, D = 128, W = (HQ + 2 * HKV) * D, S = 32 * 1024;
  const int sets = sets_for(double(S * 2 * HKV * D * 2 + T * HQ * D * 2), double(T * W * 2));
  testing::Rng rng(23);
  KvBlockPool pool;
  bench::check(KvBlockPool::create({.num_blocks = S / kBlock, .block_size = kBlock, .row = HKV * D, .planes = 2, .dtype = DType::kBF16}, &pool));
  RopeTable table;
  bench::check(RopeTable::build({.rotary_dim = D, .max_positions = 8192}, &table));
  std::vector<testing::AlignedVector<uint16_t>> qkv(sets, testing::AlignedVector<uint16_t>(static_cast<size_t>(T * W)));
  std::vector<std::vector<int32_t>> slots;
  for (auto& v : qkv) {
    testing::fill_bf16(v.data(), T * W, rng, -2, 2);
    slots.push_back(paged_slots(T, S, rng));
  }
  testing::AlignedVector<uint16_t> q(static_cast<size_t>(T * HQ * D));  // as an engine's activations
  testing::fill_bf16(q.data(), T * HQ * D, rng);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
  const double bytes = double(T) * (W + HQ * D + 2 * HKV * D) * 2;
  int set = 0;
  bench::Record r{.op = "qkv_rope_cache", .case_ = "dtype=bf16 T=4096 Hq=32 Hkv=8 D=128", .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = selected_impl("qkv_rope_cache");
  ctx.add(r, ctx.time_it([&] {
    const size_t s = size_t(set++ % sets);
    bench::check(qkv_rope_cache({.qkv = make_view(qkv[s].data(), DType::kBF16, {T, W}), .q_heads = HQ, .kv_heads = HKV, .head_dim = D,
                          .positions = make_view(pos.data(), DType::kI32, {T}), .cos = table.cos(), .sin = table.sin(),
                          .slots = make_view(slots[s].data(), DType::kI32, {T}), .k_cache = pool.plane(0), .v_cache = pool.plane(1),
                          .q_out = make_view(q.data(), DType::kBF16, {T, HQ, D})}));
  }),
          0, bytes);
}

// kv_cache_write: T = 4096 tokens of K and V, 8 KV heads x 128 (2 KiB rows), into 64-slot
// blocks scattered over a 64 Ki-slot pool; bf16 and an i8 cache. `basic` is what an eager
// framework does: index_copy (one memcpy per row; ordinary stores read each scattered
// destination line first) and, for i8, abs-max per row, divide, round, clamp and cast to
// an i8 buffer before the index_copy. Bytes: read k and v, write the cache rows (and scales).
void bench_write(bench::Context& ctx, bool i8) {
  const int64_t T = 4096, row = 8 * 128, S = 64 * 1024;
  const DType cdt = i8 ? DType::kI8 : DType::kBF16;
  const size_t ces = i8 ? 1 : 2;
  const int sets = sets_for(double(2 * S * row) * double(ces), double(2 * T * row * 2));
  testing::Rng rng(29);
  KvBlockPool pool;
  bench::check(KvBlockPool::create({.num_blocks = S / kBlock, .block_size = kBlock, .row = row, .planes = 2, .dtype = cdt}, &pool));
  std::vector<testing::AlignedVector<uint16_t>> k(sets, testing::AlignedVector<uint16_t>(static_cast<size_t>(T * row))), v = k;
  std::vector<std::vector<int32_t>> slots;
  for (int s = 0; s < sets; ++s) {
    testing::fill_bf16(k[size_t(s)].data(), T * row, rng, -2, 2);
    testing::fill_bf16(v[size_t(s)].data(), T * row, rng, -2, 2);
    slots.push_back(paged_slots(T, S, rng));
  }
  const double bytes = double(T * row) * (2 * 2 + 2 * double(ces)) + (i8 ? double(T) * 2 * 4 : 0.0);
  const std::string cs = std::string("dtype=bf16 T=4096 Hkv=8 D=128") + (i8 ? " cache=i8" : "");
  int set = 0;
  bench::Record r{.op = "kv_cache_write", .case_ = cs, .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = selected_impl("kv_cache_write");
  auto optx_fn = [&] {
    const size_t s = size_t(set++ % sets);
    bench::check(kv_cache_write({.k = make_view(k[s].data(), DType::kBF16, {T, row}), .v = make_view(v[s].data(), DType::kBF16, {T, row}),
                                 .slots = make_view(slots[s].data(), DType::kI32, {T}), .k_cache = pool.plane(0), .v_cache = pool.plane(1),
                                 .k_scales = i8 ? pool.scales(0) : TensorView{}, .v_scales = i8 ? pool.scales(1) : TensorView{}}));
  };
  testing::AlignedVector<float> amax(static_cast<size_t>(T)), qf(static_cast<size_t>(T * row));
  testing::AlignedVector<int8_t> q8(static_cast<size_t>(T * row));
  const int th = ctx.threads;
  bench::Record bb{.op = "kv_cache_write", .case_ = cs, .impl = "basic", .roof = bench::Roof::kMemory};
  bb.peak_bytes = i8 ? double(amax.size() * 4 + qf.size() * 4 + q8.size()) : 0.0;
  bb.note = i8 ? "abs-max, divide, round, clamp, cast, index_copy (per plane)" : "index_copy (per plane)";
  auto basic_fn = [&] {
    const size_t s = size_t(set++ % sets);
    for (int w = 0; w < 2; ++w) {
      const uint16_t* x = (w ? v : k)[s].data();
      if (!i8) {
        uint16_t* c = static_cast<uint16_t*>(pool.plane(w).data);
#pragma omp parallel for num_threads(th)
        for (int64_t t = 0; t < T; ++t) std::memcpy(c + int64_t(slots[s][size_t(t)]) * row, x + t * row, size_t(row) * 2);
        continue;
      }
      float* sc = static_cast<float*>(pool.scales(w).data);
      int8_t* c = static_cast<int8_t*>(pool.plane(w).data);
#pragma omp parallel for num_threads(th)
      for (int64_t t = 0; t < T; ++t) amax[size_t(t)] = bo::absmax_bf16(x + t * row, row);
#pragma omp parallel for num_threads(th)
      for (int64_t t = 0; t < T; ++t) bo::div_bf16_to_f32(x + t * row, amax[size_t(t)] / 127.0f, qf.data() + t * row, row);
#pragma omp parallel for num_threads(th)
      for (int64_t t = 0; t < T; ++t) bo::round_clamp_f32(qf.data() + t * row, -127.0f, 127.0f, row);
#pragma omp parallel for num_threads(th)
      for (int64_t t = 0; t < T; ++t) bo::f32_to_i8(qf.data() + t * row, q8.data() + t * row, row);
#pragma omp parallel for num_threads(th)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t slot = slots[s][size_t(t)];
        std::memcpy(c + slot * row, q8.data() + t * row, size_t(row));
        sc[slot] = amax[size_t(t)] / 127.0f;
      }
    }
  };
  ctx.add_interleaved(r, optx_fn, bb, basic_fn, 0, bytes);
}

// gather_pa_kv_cache: 4 sequences of 4096 tokens (64-slot blocks scattered over the pool)
// into contiguous K and V, bf16, 8 KV heads x 128. `basic`: one memcpy per row (an
// index_select by slot), ordinary stores. Bytes: read the rows, write them.
void bench_gather(bench::Context& ctx) {
  const int64_t B = 4, L = 4096, row = 8 * 128, total = B * L, nb = L / kBlock;
  const int sets = sets_for(double(2 * total * row * 2), double(2 * total * row * 2));
  // Each set reads its own blocks, scattered over a pool of all sets' blocks: sets that
  // drew from one 256 MiB pool shared blocks (a quarter of a call's came from the call
  // before), so part of each call was served from cache.
  const int64_t S = int64_t(sets) * total;
  testing::Rng rng(31);
  KvBlockPool pool;
  bench::check(KvBlockPool::create({.num_blocks = S / kBlock, .block_size = kBlock, .row = row, .planes = 2, .dtype = DType::kBF16}, &pool));
  for (int w = 0; w < 2; ++w) testing::fill_bf16(static_cast<uint16_t*>(pool.plane(w).data), S * row, rng, -2, 2);
  std::vector<std::vector<int32_t>> tables = bench::disjoint_tables(sets, B * nb, rng);
  std::vector<int32_t> lens(static_cast<size_t>(B), int32_t(L));
  testing::AlignedVector<uint16_t> ko(static_cast<size_t>(total * row)), vo(ko.size());
  const double bytes = 2.0 * double(total * row) * 2 * 2;
  const std::string cs = "dtype=bf16 B=4 ctx=4096 Hkv=8 D=128";
  int set = 0;
  bench::Record r{.op = "gather_pa_kv_cache", .case_ = cs, .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = selected_impl("gather_pa_kv_cache");
  auto optx_fn = [&] {
    const size_t s = size_t(set++ % sets);
    bench::check(gather_pa_kv_cache({.k_cache = pool.plane(0), .v_cache = pool.plane(1),
                                     .block_tables = make_view(tables[s].data(), DType::kI32, {B, nb}),
                                     .seq_lens = make_view(lens.data(), DType::kI32, {B}), .block_size = kBlock,
                                     .k_out = make_view(ko.data(), DType::kBF16, {total, row}),
                                     .v_out = make_view(vo.data(), DType::kBF16, {total, row})}));
  };
  const int th = ctx.threads;
  bench::Record bb{.op = "gather_pa_kv_cache", .case_ = cs, .impl = "basic", .roof = bench::Roof::kMemory};
  bb.note = "index_select by slot (per plane)";
  auto basic_fn = [&] {
    const size_t s = size_t(set++ % sets);
    for (int w = 0; w < 2; ++w) {
      const uint16_t* c = static_cast<const uint16_t*>(pool.plane(w).data);
      uint16_t* o = (w ? vo : ko).data();
#pragma omp parallel for num_threads(th)
      for (int64_t i = 0; i < total; ++i) {
        const int64_t slot = int64_t(tables[s][size_t(i / kBlock)]) * kBlock + i % kBlock;
        std::memcpy(o + i * row, c + slot * row, size_t(row) * 2);
      }
    }
  };
  ctx.add_interleaved(r, optx_fn, bb, basic_fn, 0, bytes);
}

void bench_kv(bench::Context& ctx) {
  if (ctx.wants("kv_rms_norm_rope_cache")) bench_mla(ctx);
  if (ctx.wants("qkv_rope_cache")) bench_qkv(ctx);
}
void bench_plain(bench::Context& ctx) {
  if (ctx.wants("kv_cache_write")) {
    bench_write(ctx, false);
    bench_write(ctx, true);
  }
  if (ctx.wants("gather_pa_kv_cache")) bench_gather(ctx);
}

OPTX_REGISTER_BENCH("kv_rms_norm_rope_cache|qkv_rope_cache", bench_kv);
OPTX_REGISTER_BENCH("kv_cache_write|gather_pa_kv_cache", bench_plain);

}  // namespace
}  // namespace optx::kv_detail
