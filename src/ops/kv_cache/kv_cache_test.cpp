// kv_cache family: block pool and sequences, kv_cache_write (incl. i8), gather_pa_kv_cache,
// the fused MLA / QKV cache writes against double references and against their unfused
// compositions (bitwise), and bad inputs.
#include <gtest/gtest.h>

#include <cmath>

#include <cstring>
#include <tuple>

#include "ops/kv_cache/kv_cache_testutil.h"
#include "testing/aligned.h"
#include "testing/alloc_count.h"
#include "ops/norm/norm_internal.h"
#include "ops/rope/rope_internal.h"

namespace optx::kv_detail {
namespace {

using testutil::Typed;

// The plain write of the unfused side of a fused-vs-unfused comparison: the same ISA's,
// else the best this CPU runs (its copies and quantiser give the same bits in every unit).
const dispatch::Impl<WriteFn>* write_impl_for(const char* fused_impl) {
  if (const auto* w = write_registry().find(fused_impl)) return w;
  return write_registry().runnable().front();
}

TEST(KvPool, AllocateReleaseAndFullPool) {
  KvBlockPool pool;
  ASSERT_TRUE(KvBlockPool::create({.num_blocks = 8, .block_size = 4, .row = 3, .planes = 2, .dtype = DType::kBF16}, &pool).ok());
  EXPECT_EQ(pool.num_slots(), 32);
  EXPECT_EQ(pool.plane(1).sizes[0], 32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.plane(0).data) % 64, 0u);
  EXPECT_TRUE(pool.scales(0).empty());
  int32_t b[8];
  ASSERT_TRUE(pool.allocate(6, b).ok());
  EXPECT_EQ(pool.free_blocks(), 2);
  const Status full = pool.allocate(3, b + 6);
  EXPECT_EQ(full.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(full.message().find("requested 3 blocks but only 2 of 8 are free"), std::string::npos) << full.message();
  EXPECT_EQ(pool.free_blocks(), 2);  // all or nothing
  std::sort(b, b + 6);
  EXPECT_EQ(std::unique(b, b + 6), b + 6);  // distinct
  const int32_t twice[2] = {b[0], b[0]};
  EXPECT_FALSE(pool.release(twice, 2).ok());
  EXPECT_EQ(pool.free_blocks(), 2);  // nothing released by a bad call
  const int32_t bogus = 99;
  EXPECT_NE(pool.release(&bogus, 1).message().find("blocks[0]=99"), std::string::npos);
  ASSERT_TRUE(pool.release(b, 6).ok());
  EXPECT_EQ(pool.free_blocks(), 8);
  EXPECT_FALSE(pool.release(b, 1).ok());  // double free
  KvBlockPool i8;
  ASSERT_TRUE(KvBlockPool::create({.num_blocks = 2, .block_size = 2, .row = 5, .planes = 1, .dtype = DType::kI8}, &i8).ok());
  EXPECT_EQ(i8.scales(0).sizes[0], 4);
  KvBlockPool bad;
  EXPECT_NE(KvBlockPool::create({.num_blocks = 0, .row = 4}, &bad).message().find("num_blocks=0"), std::string::npos);
}

TEST(KvPool, MovedFromPoolIsEmpty) {
  KvBlockPool a;
  ASSERT_TRUE(KvBlockPool::create({.num_blocks = 4, .block_size = 2, .row = 3, .planes = 1}, &a).ok());
  int32_t b[2];
  ASSERT_TRUE(a.allocate(2, b).ok());
  KvBlockPool moved(std::move(a));
  // The moved-from pool owns nothing: it hands out no blocks, takes none back (it once
  // indexed its emptied in-use table here), and gives no views.
  EXPECT_EQ(a.num_slots(), 0);
  EXPECT_EQ(a.free_blocks(), 0);
  EXPECT_TRUE(a.plane(0).empty());
  const Status r = a.release(b, 1);
  EXPECT_NE(r.message().find("is not an allocated block of this pool"), std::string::npos) << r.message();
  EXPECT_EQ(a.allocate(1, b + 1).code(), StatusCode::kOutOfMemory);
  // The new owner still knows which blocks are out.
  EXPECT_EQ(moved.free_blocks(), 2);
  ASSERT_TRUE(moved.release(b, 2).ok());
  EXPECT_EQ(moved.free_blocks(), 4);
  KvBlockPool assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.num_slots(), 8);
  EXPECT_EQ(moved.num_slots(), 0);
}

TEST(KvPool, SequencesSpanManyBlocks) {
  KvBlockPool pool;
  ASSERT_TRUE(KvBlockPool::create({.num_blocks = 40, .block_size = 16, .row = 8, .planes = 1}, &pool).ok());
  KvSequence a(32), b(32);
  ASSERT_TRUE(a.reserve(pool, 1).ok());
  EXPECT_EQ(a.num_blocks(), 1);
  ASSERT_TRUE(b.reserve(pool, 100).ok());  // 7 blocks
  ASSERT_TRUE(a.reserve(pool, 300).ok());  // grows to 19 blocks
  EXPECT_EQ(a.num_blocks(), 19);
  EXPECT_EQ(pool.free_blocks(), 40 - 19 - 7);
  EXPECT_FALSE(a.reserve(pool, 600).ok());  // table capacity 32 blocks = 512 tokens
  const Status full = b.reserve(pool, 32 * 16);
  EXPECT_EQ(full.code(), StatusCode::kOutOfMemory) << full.message();
  EXPECT_EQ(b.num_blocks(), 7);  // unchanged after a failed reserve
  // Slots of the two sequences never collide.
  std::vector<int64_t> seen;
  for (int64_t p = 0; p < 300; ++p) seen.push_back(a.slot(p, 16));
  for (int64_t p = 0; p < 100; ++p) seen.push_back(b.slot(p, 16));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(a.slot(17, 16), int64_t(a.block_table()[1]) * 16 + 1);
  // Past the reserved blocks, negative, or after release: -1 (skipped by kv_cache_write),
  // not a slot in a block the pool hands to another sequence.
  EXPECT_EQ(b.slot(7 * 16, 16), -1);
  EXPECT_EQ(b.slot(-1, 16), -1);
  EXPECT_EQ(b.slot(0, 0), -1);
  ASSERT_TRUE(a.release(pool).ok());
  EXPECT_EQ(a.slot(0, 16), -1);
  // A table past what can be allocated: no exception from the constructor, an error from
  // reserve (the vector threw std::length_error out of the constructor before).
  KvSequence huge(INT64_MAX);
  const Status st = huge.reserve(pool, 16);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("block table of max_blocks=9223372036854775807 entries could not be allocated"), std::string::npos)
      << st.message();
  ASSERT_TRUE(b.release(pool).ok());
  EXPECT_EQ(pool.free_blocks(), 40);
}

// No heap allocation inside a call (DESIGN.md) for the cache ops and the norm / rope ops
// they fuse, on one and two threads, after a first call. Before, selecting the
// implementation copied the op's name, and gather_pa_kv_cache and kv_rms_norm_rope_cache
// (names past 15 characters) allocated on every call.
TEST(KvCacheWrite, NoHeapAllocationInsideACall) {
  const int64_t T = 40, H = 64, bs = 16, slots_n = 64, hq = 4, hkv = 2, d = 32, R = 48, rd = 16;
  RopeTable tab, tab16;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = d, .max_positions = 64}, &tab).ok());
  ASSERT_TRUE(RopeTable::build({.rotary_dim = rd, .max_positions = 64}, &tab16).ok());
  std::vector<uint16_t> x(T * H, 0x3f80), res(T * H, 0x3f80), w(H, 0x3f80), o(T * H), cache(slots_n * H), out(T * H);
  std::vector<uint16_t> qkv(T * (hq + 2 * hkv) * d, 0x3f80), q(T * hq * d), kc(slots_n * hkv * d), vc(slots_n * hkv * d);
  std::vector<uint16_t> kv(T * (R + rd), 0x3f80), mla(slots_n * (R + rd));
  std::vector<int32_t> slots(T), pos(T), bt = {3, 0, 2}, lens = {T};
  for (int64_t t = 0; t < T; ++t) slots[size_t(t)] = int32_t((t / bs == 0 ? 3 : t / bs == 1 ? 0 : 2) * bs + t % bs), pos[size_t(t)] = int32_t(t);
  const TensorView sl = make_view(slots.data(), DType::kI32, {T}), ps = make_view(pos.data(), DType::kI32, {T});
  auto calls = [&] {
    Status st = rms_norm({.x = make_view(x.data(), DType::kBF16, {T, H}), .weight = make_view(w.data(), DType::kBF16, {H}),
                          .out = make_view(o.data(), DType::kBF16, {T, H})});
    if (st.ok())
      st = add_rms_norm({.x = make_view(x.data(), DType::kBF16, {T, H}), .residual = make_view(res.data(), DType::kBF16, {T, H}),
                         .weight = make_view(w.data(), DType::kBF16, {H}), .out = make_view(o.data(), DType::kBF16, {T, H})});
    if (st.ok())
      st = rope({.q = make_view(q.data(), DType::kBF16, {T, hq, d}), .positions = ps, .cos = tab.cos(), .sin = tab.sin()});
    if (st.ok())
      st = kv_cache_write({.k = make_view(x.data(), DType::kBF16, {T, H}), .slots = sl, .k_cache = make_view(cache.data(), DType::kBF16, {slots_n, H})});
    if (st.ok())
      st = gather_pa_kv_cache({.k_cache = make_view(cache.data(), DType::kBF16, {slots_n, H}), .block_tables = make_view(bt.data(), DType::kI32, {1, 3}),
                               .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = bs,
                               .k_out = make_view(out.data(), DType::kBF16, {T, H})});
    if (st.ok())
      st = qkv_rope_cache({.qkv = make_view(qkv.data(), DType::kBF16, {T, (hq + 2 * hkv) * d}), .q_heads = hq, .kv_heads = hkv, .head_dim = d,
                           .positions = ps, .cos = tab.cos(), .sin = tab.sin(), .slots = sl,
                           .k_cache = make_view(kc.data(), DType::kBF16, {slots_n, hkv * d}),
                           .v_cache = make_view(vc.data(), DType::kBF16, {slots_n, hkv * d}), .q_out = make_view(q.data(), DType::kBF16, {T, hq, d})});
    if (st.ok())
      st = kv_rms_norm_rope_cache({.kv = make_view(kv.data(), DType::kBF16, {T, R + rd}), .weight = make_view(w.data(), DType::kBF16, {R}),
                                   .positions = ps, .cos = tab16.cos(), .sin = tab16.sin(), .slots = sl,
                                   .cache = make_view(mla.data(), DType::kBF16, {slots_n, R + rd}), .kv_lora_rank = R});
    return st;
  };
  testing::expect_no_heap_allocation(calls, "the cache / norm / rope ops");
}

// Writes T tokens into a pool through sequences, gathers them back, compares bit for bit.
TEST(KvCacheWrite, RoundTripThroughGather) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (const auto* wi : write_registry().runnable())
      for (const auto* gi : gather_registry().runnable()) {
        const int64_t row = 24, bs = 4;
        KvBlockPool pool;
        ASSERT_TRUE(KvBlockPool::create({.num_blocks = 16, .block_size = bs, .row = row, .planes = 2, .dtype = dt}, &pool).ok());
        const int64_t lens[3] = {9, 0, 13};
        KvSequence seq[3] = {KvSequence(8), KvSequence(8), KvSequence(8)};
        const int64_t T = 22;
        Typed k(dt, size_t(T * row)), v(dt, size_t(T * row));
        testing::Rng rng(3);
        for (int64_t i = 0; i < T * row; ++i) k.set(size_t(i), rng.uniform()), v.set(size_t(i), rng.uniform());
        std::vector<int64_t> slots;
        for (int s = 0; s < 3; ++s) {
          ASSERT_TRUE(seq[s].reserve(pool, lens[s]).ok());
          for (int64_t p = 0; p < lens[s]; ++p) slots.push_back(seq[s].slot(p, bs));
        }
        WriteArgs wa;
        ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(k.data(), dt, {T, row}), .v = make_view(v.data(), dt, {T, row}),
                                               .slots = make_view(slots.data(), DType::kI64, {T}),
                                               .k_cache = pool.plane(0), .v_cache = pool.plane(1)},
                            &wa)
                        .ok());
        ASSERT_TRUE(wi->fn(wa).ok());
        std::vector<int32_t> tables(3 * 8, -7), sl = {9, 0, 13};
        for (int s = 0; s < 3; ++s)
          for (int64_t j = 0; j < seq[s].num_blocks(); ++j) tables[size_t(s * 8 + j)] = seq[s].block_table()[j];
        Typed ko(dt, size_t(T * row)), vo(dt, size_t(T * row));
        GatherArgs ga;
        ASSERT_TRUE(to_args(GatherKvParams{.k_cache = pool.plane(0), .v_cache = pool.plane(1),
                                           .block_tables = make_view(tables.data(), DType::kI32, {3, 8}),
                                           .seq_lens = make_view(sl.data(), DType::kI32, {3}), .block_size = bs,
                                           .k_out = make_view(ko.data(), dt, {T, row}), .v_out = make_view(vo.data(), dt, {T, row})},
                            &ga)
                        .ok());
        ASSERT_TRUE(gi->fn(ga).ok());
        const size_t bytes = size_t(T * row) * dtype_size(dt);
        EXPECT_EQ(std::memcmp(k.data(), ko.data(), bytes), 0) << wi->name << "/" << gi->name;
        EXPECT_EQ(std::memcmp(v.data(), vo.data(), bytes), 0) << wi->name << "/" << gi->name;
      }
}

TEST(KvCacheWrite, SkipsMinusOneAndQuantizesI8) {
  const int64_t T = 4, row = 33, slots_n = 8;
  std::vector<float> k(T * row);
  testing::Rng rng(11);
  for (auto& x : k) x = rng.uniform(-5, 5);
  for (int64_t i = 0; i < row; ++i) k[size_t(2 * row + i)] = 0.0f;  // all-zero row: scale 0
  std::vector<int8_t> cache(slots_n * row, 99);
  std::vector<float> scales(slots_n, -1.0f);
  std::vector<int32_t> slots = {5, -1, 2, 0};
  for (const auto* impl : write_registry().runnable()) {
    std::fill(cache.begin(), cache.end(), int8_t(99));
    std::fill(scales.begin(), scales.end(), -1.0f);
    WriteArgs a;
    ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(k.data(), DType::kF32, {T, row}),
                                           .slots = make_view(slots.data(), DType::kI32, {T}),
                                           .k_cache = make_view(cache.data(), DType::kI8, {slots_n, row}),
                                           .k_scales = make_view(scales.data(), DType::kF32, {slots_n})},
                        &a)
                    .ok());
    ASSERT_TRUE(impl->fn(a).ok());
    for (int64_t s : {1, 3, 4, 6, 7}) EXPECT_EQ(scales[size_t(s)], -1.0f) << "slot " << s << " must be untouched";
    EXPECT_EQ(scales[2], 0.0f);
    for (int64_t t : {0, 2, 3}) {
      const int64_t s = slots[size_t(t)];
      double amax = 0;
      for (int64_t i = 0; i < row; ++i) amax = std::max(amax, std::fabs(double(k[size_t(t * row + i)])));
      for (int64_t i = 0; i < row; ++i) {
        const double want = amax > 0 ? std::nearbyint(double(k[size_t(t * row + i)]) * 127.0 / amax) : 0.0;
        EXPECT_LE(std::fabs(double(cache[size_t(s * row + i)]) - want), 1.0) << impl->name << " t=" << t << " i=" << i;  // +-1 LSB
        EXPECT_NEAR(double(cache[size_t(s * row + i)]) * scales[size_t(s)], k[size_t(t * row + i)], amax / 127.0) << impl->name;
      }
    }
  }
}

// One cache plane as kv_cache_write sees it: same dtype as the rows (sentinel 512, exact in
// bf16) or i8 (codes 99 and scales -1 as sentinels), so unwritten slots can be checked
// byte for byte.
struct CachePlane {
  DType dt;
  Typed same;
  std::vector<int8_t> q;
  std::vector<float> scales;
  CachePlane(DType cache_dt, DType row_dt, int64_t slots, int64_t row)
      : dt(cache_dt), same(row_dt, cache_dt == DType::kI8 ? 0 : size_t(slots * row)),
        q(cache_dt == DType::kI8 ? size_t(slots * row) : 0, int8_t(99)), scales(cache_dt == DType::kI8 ? size_t(slots) : 0, -1.0f) {
    for (size_t i = 0; i < same.f.size() + same.h.size(); ++i) same.set(i, 512.0f);
  }
  TensorView view(int64_t slots, int64_t row) {
    return dt == DType::kI8 ? make_view(q.data(), DType::kI8, {slots, row}) : make_view(same.data(), same.dt, {slots, row});
  }
  TensorView scale_view(int64_t slots) { return dt == DType::kI8 ? make_view(scales.data(), DType::kF32, {slots}) : TensorView{}; }
  // Bytes of slot s.
  std::vector<uint8_t> slot_bytes(int64_t s, int64_t row) const {
    const uint8_t* base = dt == DType::kI8 ? reinterpret_cast<const uint8_t*>(q.data())
                          : same.dt == DType::kF32 ? reinterpret_cast<const uint8_t*>(same.f.data())
                                                   : reinterpret_cast<const uint8_t*>(same.h.data());
    const size_t es = dt == DType::kI8 ? 1 : dtype_size(same.dt);
    std::vector<uint8_t> b(base + size_t(s * row) * es, base + size_t((s + 1) * row) * es);
    if (dt == DType::kI8) {
      const uint8_t* sc = reinterpret_cast<const uint8_t*>(&scales[size_t(s)]);
      b.insert(b.end(), sc, sc + 4);
    }
    return b;
  }
};

// kv_cache_write per implementation, f32 and bf16 rows, each plane into a cache of the rows'
// dtype or i8 (k and v independently, so the V plane and v_scales are covered too):
// same-dtype slots equal the row bit for bit; i8 slots have scale = max|row| / 127 and
// codes within 1 LSB of row * 127 / max|row| (an all-zero v row: scale 0, codes 0); slots
// no token maps to — including where a token has slot -1 — keep their sentinel bytes.
TEST(KvCacheWrite, EveryImplementationAnyPlaneDtypeAndSkippedSlots) {
  const int64_t T = 9, row = 37, S = 16;  // row not a multiple of 16 (vector tails)
  for (const auto* impl : write_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (DType kc_dt : {dt, DType::kI8})
        for (DType vc_dt : {dt, DType::kI8}) {
          const std::string what = std::string(impl->name) + " rows=" + dtype_name(dt) + " k_cache=" + dtype_name(kc_dt) +
                                   " v_cache=" + dtype_name(vc_dt);
          testing::Rng rng(uint64_t(int(dt) * 4 + int(kc_dt) * 2 + int(vc_dt)));
          Typed k(dt, size_t(T * row)), v(dt, size_t(T * row));
          for (int64_t i = 0; i < T * row; ++i) k.set(size_t(i), rng.uniform(-5, 5)), v.set(size_t(i), rng.uniform(-0.01f, 0.01f));
          for (int64_t i = 0; i < row; ++i) v.set(size_t(6 * row + i), 0.0f);  // token 6: all-zero v row
          const std::vector<int64_t> slots = testutil::make_slots(T, S, rng);  // tokens 3 and 8 skip (-1)
          std::vector<int32_t> s32(slots.begin(), slots.end());
          const bool i64 = dt == DType::kF32;  // i64 slots with f32 rows, i32 with bf16
          CachePlane kc(kc_dt, dt, S, row), vc(vc_dt, dt, S, row);
          const CachePlane kc0 = kc, vc0 = vc;
          WriteArgs a;
          ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(k.data(), dt, {T, row}), .v = make_view(v.data(), dt, {T, row}),
                                                 .slots = i64 ? make_view(const_cast<int64_t*>(slots.data()), DType::kI64, {T})
                                                              : make_view(s32.data(), DType::kI32, {T}),
                                                 .k_cache = kc.view(S, row), .v_cache = vc.view(S, row),
                                                 .k_scales = kc.scale_view(S), .v_scales = vc.scale_view(S)},
                              &a)
                          .ok())
              << what;
          ASSERT_TRUE(impl->fn(a).ok()) << what;
          std::vector<bool> written(static_cast<size_t>(S), false);
          for (int64_t t = 0; t < T; ++t) {
            const int64_t s = slots[size_t(t)];
            if (s < 0) continue;
            written[size_t(s)] = true;
            for (int w = 0; w < 2; ++w) {
              const Typed& src = w ? v : k;
              const CachePlane& c = w ? vc : kc;
              const char* plane = w ? "v" : "k";
              if (c.dt != DType::kI8) {
                for (int64_t i = 0; i < row; ++i)
                  ASSERT_EQ(c.same.get(size_t(s * row + i)), src.get(size_t(t * row + i))) << what << " " << plane << " t=" << t << " i=" << i;
                continue;
              }
              double amax = 0;
              for (int64_t i = 0; i < row; ++i) amax = std::max(amax, std::fabs(src.get(size_t(t * row + i))));
              EXPECT_NEAR(c.scales[size_t(s)], amax / 127, amax / 127 * 1e-6) << what << " " << plane << " scale t=" << t;
              for (int64_t i = 0; i < row; ++i) {
                const int code = c.q[size_t(s * row + i)];
                const double exact = amax > 0 ? src.get(size_t(t * row + i)) * 127 / amax : 0.0;
                ASSERT_LE(std::fabs(code - exact), amax > 0 ? 1.0 : 0.0) << what << " " << plane << " t=" << t << " i=" << i;
                ASSERT_GE(code, -127) << what;
              }
            }
          }
          for (int64_t s = 0; s < S; ++s)
            if (!written[size_t(s)]) {
              EXPECT_EQ(kc.slot_bytes(s, row), kc0.slot_bytes(s, row)) << what << ": k slot " << s << " written but no token maps to it";
              EXPECT_EQ(vc.slot_bytes(s, row), vc0.slot_bytes(s, row)) << what << ": v slot " << s << " written but no token maps to it";
            }
        }
}

// f32 rows [T, row] written by one implementation into an i8 cache of S slots (codes
// start at 99, scales at -1), k plane only.
struct I8Write {
  std::vector<int8_t> codes;
  std::vector<float> scales;
};
I8Write write_i8(const dispatch::Impl<WriteFn>& impl, const std::vector<float>& rows, int64_t T, int64_t row,
                 const std::vector<int32_t>& slots, int64_t S) {
  I8Write w{std::vector<int8_t>(size_t(S * row), 99), std::vector<float>(size_t(S), -1.0f)};
  WriteArgs a;
  EXPECT_TRUE(to_args(KvCacheWriteParams{.k = make_view(const_cast<float*>(rows.data()), DType::kF32, {T, row}),
                                         .slots = make_view(const_cast<int32_t*>(slots.data()), DType::kI32, {T}),
                                         .k_cache = make_view(w.codes.data(), DType::kI8, {S, row}),
                                         .k_scales = make_view(w.scales.data(), DType::kF32, {S})},
                      &a)
                  .ok());
  EXPECT_TRUE(impl.fn(a).ok()) << impl.name;
  return w;
}

// Non-finite values in an i8 write are defined, the same in every implementation: a NaN
// is left out of max|x| and gets code 0; a row with an inf has scale inf and codes 0 (the
// inf's too: inf * (127 / inf) is NaN).
TEST(KvCacheWrite, I8RowsWithNanAndInfAreDefined) {
  const int64_t T = 2, row = 37, S = 4;  // 37: vector body and tail
  std::vector<float> k(size_t(T * row));
  for (int64_t i = 0; i < T * row; ++i) k[size_t(i)] = float(i % row - 18) * 0.25f;  // max|x| 4.5 in each row
  k[5] = NAN, k[size_t(row + 9)] = INFINITY;
  const std::vector<int32_t> slots = {2, 0};
  for (const auto* impl : write_registry().runnable()) {
    const auto [kc, ks] = write_i8(*impl, k, T, row, slots, S);
    EXPECT_EQ(ks[2], 4.5f / 127.0f) << impl->name;
    for (int64_t i = 0; i < row; ++i) {
      const int want = i == 5 ? 0 : int(std::nearbyint(double(k[size_t(i)]) * 127.0 / 4.5));
      EXPECT_EQ(kc[size_t(2 * row + i)], want) << impl->name << " i=" << i;
      EXPECT_EQ(kc[size_t(0 * row + i)], 0) << impl->name << " inf row, i=" << i;
    }
    EXPECT_EQ(ks[0], INFINITY) << impl->name;
  }
}

// Every implementation gives the reference's codes, including where x * (127 / max|x|)
// is within half an ulp of a .5: 2.25 * fl(127 / 4.5) = 63.4999981 rounds to 63.5 -> 64
// (an FMA of the product and the rounding constant gave 63 in the AVX units). Also a row
// whose max|x| is so small that 127 / max|x| overflows (its codes keep their signs).
TEST(KvCacheWrite, I8CodesEqualAcrossImplementations) {
  const std::vector<float> rows = {4.5f, 2.25f, -2.25f, 1.125f, 1e-37f, -5e-38f, 0.0f, 2.5e-38f};
  const std::vector<int8_t> want = {127, 64, -64, 32, 127, -64, 0, 32};  // by hand: x * 127 / max|x|, nearest even
  const std::vector<int32_t> slots = {0, 1};
  for (const auto* impl : write_registry().runnable()) EXPECT_EQ(write_i8(*impl, rows, 2, 4, slots, 2).codes, want) << impl->name;
}

// bf16 rows of every length around the AVX2 unit's 32-value steps give every
// implementation the codes rne(fl(x * fl(127 / max|x|))) clamped to +-127, computed here
// with nearbyint rather than the kernels' rounding constant; the halfway products of the
// 4.5 / 2.25 rows (63.5 -> 64, -63.5 -> -64) sit inside the vector steps.
TEST(KvCacheWrite, I8CodesOfBf16RowsEveryLength) {
  testing::Rng rng(7);
  for (int64_t row : {1, 31, 32, 33, 64, 95, 1024}) {
    const int64_t T = 3, S = 5;
    std::vector<uint16_t> x(size_t(T * row));
    for (auto& v : x) v = f32_to_bf16(rng.uniform(-5, 5));
    for (int64_t i = 0; i < row; ++i) x[size_t(row + i)] = f32_to_bf16(i % 3 == 0 ? 2.25f : i % 3 == 1 ? -2.25f : 1.0f);
    x[size_t(row + row / 2)] = f32_to_bf16(4.5f);  // token 1: max|x| 4.5, the rest halfway cases
    const std::vector<int32_t> slots = {4, 0, 2};
    for (const auto* impl : write_registry().runnable()) {
      std::vector<int8_t> codes(size_t(S * row), 99);
      std::vector<float> scales(size_t(S), -1.0f);
      WriteArgs a;
      ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(x.data(), DType::kBF16, {T, row}),
                                             .slots = make_view(const_cast<int32_t*>(slots.data()), DType::kI32, {T}),
                                             .k_cache = make_view(codes.data(), DType::kI8, {S, row}),
                                             .k_scales = make_view(scales.data(), DType::kF32, {S})},
                          &a)
                      .ok());
      ASSERT_TRUE(impl->fn(a).ok()) << impl->name;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t s = slots[size_t(t)];
        float amax = 0.0f;
        for (int64_t i = 0; i < row; ++i) amax = std::max(amax, std::fabs(bf16_to_f32(x[size_t(t * row + i)])));
        EXPECT_EQ(scales[size_t(s)], amax / 127.0f) << impl->name << " row=" << row << " t=" << t;
        const volatile float inv = 127.0f / amax;
        for (int64_t i = 0; i < row; ++i) {
          const volatile float y = bf16_to_f32(x[size_t(t * row + i)]) * inv;
          const int want = std::clamp(int(std::nearbyint(double(y))), -127, 127);
          ASSERT_EQ(codes[size_t(s * row + i)], want) << impl->name << " row=" << row << " t=" << t << " i=" << i;
        }
      }
    }
  }
}

// T = 0: valid, and writes nothing (through the public entry point and each implementation).
TEST(KvCacheWrite, ZeroTokensWriteNothing) {
  const int64_t row = 8, S = 4;
  std::vector<uint16_t> k(row), cache(S * row, 0x4400);
  std::vector<int8_t> qc(S * row, 99);
  std::vector<float> scales(S, -1.0f);
  std::vector<int32_t> slots(1, 0);
  const KvCacheWriteParams p{.k = make_view(k.data(), DType::kBF16, {0, row}), .v = make_view(k.data(), DType::kBF16, {0, row}),
                             .slots = make_view(slots.data(), DType::kI32, {0}),
                             .k_cache = make_view(cache.data(), DType::kBF16, {S, row}),
                             .v_cache = make_view(qc.data(), DType::kI8, {S, row}), .v_scales = make_view(scales.data(), DType::kF32, {S})};
  {
    const Status st = kv_cache_write(p);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  for (const auto* impl : write_registry().runnable()) {
    WriteArgs a;
    ASSERT_TRUE(to_args(p, &a).ok());
    ASSERT_TRUE(impl->fn(a).ok()) << impl->name;
  }
  EXPECT_EQ(cache, std::vector<uint16_t>(S * row, 0x4400));
  EXPECT_EQ(qc, std::vector<int8_t>(S * row, 99));
  EXPECT_EQ(scales, std::vector<float>(S, -1.0f));
}

// i8 caches through gather_pa_kv_cache, per implementation: rows written by kv_cache_write
// into an i8 pool (both planes), gathered back per sequence. Codes and scales must equal
// the pool's slots bit for bit (outputs start as 99 / NaN, so a row left out fails), and
// dequantise to the written bf16 values within one step.
TEST(GatherPaKvCache, Int8CachesWithScalesEveryImplementation) {
  const int64_t row = 40, bs = 4, max_blocks = 8;
  KvBlockPool pool;
  ASSERT_TRUE(KvBlockPool::create({.num_blocks = 16, .block_size = bs, .row = row, .planes = 2, .dtype = DType::kI8}, &pool).ok());
  const std::vector<int32_t> lens = {9, 0, 13, 1};
  const int64_t B = int64_t(lens.size()), T = 23;
  std::vector<KvSequence> seq(static_cast<size_t>(B), KvSequence(max_blocks));
  std::vector<int64_t> slots;
  for (int64_t b = 0; b < B; ++b) {
    ASSERT_TRUE(seq[size_t(b)].reserve(pool, lens[size_t(b)]).ok());
    for (int64_t p = 0; p < lens[size_t(b)]; ++p) slots.push_back(seq[size_t(b)].slot(p, bs));
  }
  ASSERT_EQ(int64_t(slots.size()), T);
  testing::Rng rng(17);
  std::vector<uint16_t> k(size_t(T * row)), v(size_t(T * row));
  testing::fill_bf16(k.data(), T * row, rng, -4, 4);
  testing::fill_bf16(v.data(), T * row, rng, -0.5, 0.5);
  ASSERT_TRUE(kv_cache_write({.k = make_view(k.data(), DType::kBF16, {T, row}), .v = make_view(v.data(), DType::kBF16, {T, row}),
                              .slots = make_view(slots.data(), DType::kI64, {T}), .k_cache = pool.plane(0), .v_cache = pool.plane(1),
                              .k_scales = pool.scales(0), .v_scales = pool.scales(1)})
                  .ok());
  std::vector<int32_t> tables(size_t(B * max_blocks), -7);  // unused entries stay invalid
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < seq[size_t(b)].num_blocks(); ++j) tables[size_t(b * max_blocks + j)] = seq[size_t(b)].block_table()[j];
  for (const auto* gi : gather_registry().runnable()) {
    std::vector<int8_t> ko(size_t(T * row), 99), vo(size_t(T * row), 99);
    std::vector<float> ks(size_t(T), NAN), vs(size_t(T), NAN);
    GatherArgs ga;
    ASSERT_TRUE(to_args(GatherKvParams{.k_cache = pool.plane(0), .v_cache = pool.plane(1), .k_scales = pool.scales(0),
                                       .v_scales = pool.scales(1), .block_tables = make_view(tables.data(), DType::kI32, {B, max_blocks}),
                                       .seq_lens = make_view(const_cast<int32_t*>(lens.data()), DType::kI32, {B}), .block_size = bs,
                                       .k_out = make_view(ko.data(), DType::kI8, {T, row}), .v_out = make_view(vo.data(), DType::kI8, {T, row}),
                                       .k_scales_out = make_view(ks.data(), DType::kF32, {T}),
                                       .v_scales_out = make_view(vs.data(), DType::kF32, {T})},
                        &ga)
                    .ok());
    ASSERT_TRUE(gi->fn(ga).ok()) << gi->name;
    for (int w = 0; w < 2; ++w) {
      const int8_t* codes = static_cast<const int8_t*>(pool.plane(w).data);
      const float* scales = static_cast<const float*>(pool.scales(w).data);
      const std::vector<int8_t>& out = w ? vo : ko;
      const std::vector<float>& out_s = w ? vs : ks;
      const std::vector<uint16_t>& src = w ? v : k;
      for (int64_t r = 0; r < T; ++r) {  // gathered row r is written token r (sequences in order)
        const int64_t s = slots[size_t(r)];
        ASSERT_EQ(out_s[size_t(r)], scales[s]) << gi->name << " plane " << w << " row " << r;
        ASSERT_EQ(std::memcmp(out.data() + r * row, codes + s * row, size_t(row)), 0) << gi->name << " plane " << w << " row " << r;
        for (int64_t i = 0; i < row; ++i)
          ASSERT_NEAR(out[size_t(r * row + i)] * double(out_s[size_t(r)]), bf16_to_f32(src[size_t(r * row + i)]), 1.0001 * out_s[size_t(r)])
              << gi->name << " plane " << w << " row " << r << " i " << i;
      }
    }
  }
}

// Writes and gathers of >= simd::kStreamMinBytes take the non-temporal path (aligned
// whole lines, the rest by memcpy): 1040 tokens of bf16 rows of 2080 values (4160 bytes,
// 65 lines: cache rows 64-byte aligned) into blocks scattered over a pool, then gathered
// back, on every implementation; each row must arrive intact and nothing else change.
TEST(KvCacheWrite, LargeWritesAndGathersStreamEveryImplementation) {
  const int64_t row = 2080, bs = 16, blocks = 128, S = blocks * bs, T = 1040;
  ASSERT_GE(2 * T * row * 2, simd::kStreamMinBytes);
  testing::Rng rng(23);
  std::vector<uint16_t> k(size_t(T * row)), v(size_t(T * row));
  testing::fill_bf16(k.data(), T * row, rng, -3, 3);
  testing::fill_bf16(v.data(), T * row, rng, -3, 3);
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) order[size_t(b)] = int32_t(b);
  for (int64_t b = blocks - 1; b > 0; --b) std::swap(order[size_t(b)], order[size_t(rng.below(b + 1))]);
  const std::vector<int32_t> lens = {600, 0, 440};
  const int64_t B = 3, max_blocks = 40;
  std::vector<int32_t> tables(static_cast<size_t>(B * max_blocks), 0), slots(static_cast<size_t>(T));
  for (int64_t b = 0, t = 0, next = 0; b < B; ++b)
    for (int64_t p = 0; p < lens[size_t(b)]; ++p, ++t) {
      if (p % bs == 0) tables[size_t(b * max_blocks + p / bs)] = order[size_t(next++)];
      slots[size_t(t)] = int32_t(tables[size_t(b * max_blocks + p / bs)] * bs + p % bs);
    }
  for (const auto* wi : write_registry().runnable()) {
    testing::AlignedVector<uint16_t> kc(size_t(S * row), 0x7fc1), vc(size_t(S * row), 0x7fc1);  // NaN sentinels
    WriteArgs wa;
    ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(k.data(), DType::kBF16, {T, row}), .v = make_view(v.data(), DType::kBF16, {T, row}),
                                           .slots = make_view(slots.data(), DType::kI32, {T}),
                                           .k_cache = make_view(kc.data(), DType::kBF16, {S, row}),
                                           .v_cache = make_view(vc.data(), DType::kBF16, {S, row})},
                        &wa)
                    .ok());
    ASSERT_TRUE(wa.stream);
    ASSERT_TRUE(wi->fn(wa).ok()) << wi->name;
    std::vector<bool> written(static_cast<size_t>(S), false);
    for (int64_t t = 0; t < T; ++t) {
      written[size_t(slots[size_t(t)])] = true;
      ASSERT_EQ(std::memcmp(kc.data() + slots[size_t(t)] * row, k.data() + t * row, size_t(row) * 2), 0) << wi->name << " k t=" << t;
      ASSERT_EQ(std::memcmp(vc.data() + slots[size_t(t)] * row, v.data() + t * row, size_t(row) * 2), 0) << wi->name << " v t=" << t;
    }
    for (int64_t s = 0; s < S; ++s)
      if (!written[size_t(s)]) {
        ASSERT_EQ(kc[size_t(s * row)], 0x7fc1) << wi->name << " slot " << s << " was not written to";
        ASSERT_EQ(vc[size_t(s * row + row - 1)], 0x7fc1) << wi->name << " slot " << s << " was not written to";
      }
    for (const auto* gi : gather_registry().runnable()) {
      testing::AlignedVector<uint16_t> ko(size_t(T * row), 0x7fc1), vo(size_t(T * row), 0x7fc1);
      GatherArgs ga;
      ASSERT_TRUE(to_args(GatherKvParams{.k_cache = make_view(kc.data(), DType::kBF16, {S, row}),
                                         .v_cache = make_view(vc.data(), DType::kBF16, {S, row}),
                                         .block_tables = make_view(tables.data(), DType::kI32, {B, max_blocks}),
                                         .seq_lens = make_view(const_cast<int32_t*>(lens.data()), DType::kI32, {B}), .block_size = bs,
                                         .k_out = make_view(ko.data(), DType::kBF16, {T, row}),
                                         .v_out = make_view(vo.data(), DType::kBF16, {T, row})},
                          &ga)
                      .ok());
      ASSERT_TRUE(ga.stream);
      ASSERT_TRUE(gi->fn(ga).ok()) << gi->name;
      ASSERT_EQ(std::memcmp(ko.data(), k.data(), size_t(T * row) * 2), 0) << wi->name << " then " << gi->name;
      ASSERT_EQ(std::memcmp(vo.data(), v.data(), size_t(T * row) * 2), 0) << wi->name << " then " << gi->name;
    }
  }
}

TEST(KvRmsNormRopeCache, EveryImplementationMatchesReference) {
  for (const auto* impl : mla_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [rank, rd, style] : {std::tuple{512, 64, RopeStyle::kInterleaved}, {7, 2, RopeStyle::kHalf},
                                     {1, 16, RopeStyle::kInterleavedToHalf}, {769, 64, RopeStyle::kHalf}})
        for (int64_t T : {0, 1, 9, 24}) {  // 24: float caches' lockstep halves (AVX-512 units) at 1 and 2 threads
          testutil::MlaCase c;
          c.dtype = dt, c.rank = rank, c.rope_dim = rd, c.style = style, c.T = T, c.pos64 = T == 9;
          const auto o = testutil::run_mla(*impl, c, uint64_t(rank + T));
          ASSERT_TRUE(o.status.ok()) << impl->name << " " << c.name() << ": " << o.status.message();
          EXPECT_TRUE(o.cmp.pass) << impl->name << " " << c.name() << ": " << o.cmp.message;
        }
}

TEST(QkvRopeCache, EveryImplementationMatchesReference) {
  for (const auto* impl : qkv_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [hq, hkv, d, rd, style] : {std::tuple{4, 2, 64, 0, RopeStyle::kHalf}, {8, 1, 128, 64, RopeStyle::kInterleaved},
                                           {3, 3, 80, 80, RopeStyle::kInterleavedToHalf}, {6, 2, 96, 32, RopeStyle::kHalf}})
        for (int64_t T : {0, 1, 7})
          for (bool pos64 : {false, true}) {  // i32 positions with i64 slots, and the reverse
            testutil::QkvCase c;
            c.dtype = dt, c.hq = hq, c.hkv = hkv, c.d = d, c.rotary_dim = rd, c.style = style, c.T = T;
            c.stream_q = T == 7;
            c.pos64 = pos64;
            const auto o = testutil::run_qkv(*impl, c, uint64_t(d + T));
            ASSERT_TRUE(o.status.ok()) << impl->name << " " << c.name() << ": " << o.status.message();
            EXPECT_TRUE(o.cmp.pass) << impl->name << " " << c.name() << ": " << o.cmp.message;
          }
}

// A slot named twice keeps the later token's row, with every implementation and at two
// threads, whether the repeats fall in one thread's tokens, in two threads', or in two
// chunks of the op's duplicate check (T = 2100 > 2048); once they raced.
TEST(KvCacheFusedWrites, RepeatedSlotsKeepTheLaterToken) {
  set_num_threads(2);
  for (int64_t T : {24, 97, 2100}) {
    for (const auto* impl : mla_registry().runnable())
      for (bool i8 : {false, true}) {
        testutil::MlaCase c;
        c.dtype = DType::kBF16, c.rank = 16, c.rope_dim = 8, c.T = T, c.num_slots = 40, c.i8 = i8, c.repeat = true;
        const auto o = testutil::run_mla(*impl, c, uint64_t(T));
        ASSERT_TRUE(o.status.ok()) << impl->name << " " << c.name() << ": " << o.status.message();
        EXPECT_TRUE(o.cmp.pass) << impl->name << " " << c.name() << ": " << o.cmp.message;
      }
    for (const auto* impl : qkv_registry().runnable()) {
      testutil::QkvCase c;
      c.dtype = DType::kF32, c.hq = 2, c.hkv = 1, c.d = 16, c.T = T, c.num_slots = 40, c.repeat = true;
      const auto o = testutil::run_qkv(*impl, c, uint64_t(T));
      ASSERT_TRUE(o.status.ok()) << impl->name << " " << c.name() << ": " << o.status.message();
      EXPECT_TRUE(o.cmp.pass) << impl->name << " " << c.name() << ": " << o.cmp.message;
    }
    // kv_cache_write: bitwise the reference's (its copies and quantiser give the same bits
    // in every unit), f32 rows into an f32 k plane and an i8 v plane.
    const int64_t row = 24, S = 40;
    testing::Rng rng{uint64_t(T)};
    std::vector<float> k(size_t(T * row)), v(size_t(T * row));
    for (auto& x : k) x = rng.uniform(-4, 4);
    for (auto& x : v) x = rng.uniform(-4, 4);
    const std::vector<int64_t> slots = testutil::make_slots(T, S, rng, /*repeat=*/true);
    auto write = [&](const dispatch::Impl<WriteFn>& impl) {
      std::vector<float> kc(size_t(S * row), -7.0f), vs(size_t(S), -1.0f);
      std::vector<int8_t> vc(size_t(S * row), 99);
      WriteArgs a;
      EXPECT_TRUE(to_args(KvCacheWriteParams{.k = make_view(k.data(), DType::kF32, {T, row}), .v = make_view(v.data(), DType::kF32, {T, row}),
                                             .slots = make_view(const_cast<int64_t*>(slots.data()), DType::kI64, {T}),
                                             .k_cache = make_view(kc.data(), DType::kF32, {S, row}),
                                             .v_cache = make_view(vc.data(), DType::kI8, {S, row}),
                                             .v_scales = make_view(vs.data(), DType::kF32, {S})},
                          &a)
                      .ok());
      a.stream = true;  // the streaming stores too (by default only for large writes)
      EXPECT_TRUE(impl.fn(a).ok());
      return std::tuple{kc, vc, vs};
    };
    const auto want = write(*write_registry().find("reference"));
    // The reference itself: each written slot holds its last token's k row.
    const std::vector<bool> is_last = testutil::last_writers(slots, S);
    for (int64_t t = 0; t < T; ++t) {
      if (is_last[size_t(t)]) {
        ASSERT_EQ(std::memcmp(std::get<0>(want).data() + slots[size_t(t)] * row, k.data() + t * row, row * sizeof(float)), 0) << t;
      }
    }
    for (const auto* impl : write_registry().runnable()) EXPECT_TRUE(write(*impl) == want) << impl->name << " T=" << T;
  }
  set_num_threads(0);
}

// The unfused first half of an MLA cache write with implementation `impl`, in place on
// bf16 rows [T, rank + rd]: rms_norm over the latent, then interleaved rope on k_pe.
void unfused_norm_rope(const char* impl, uint16_t* rows, const uint16_t* w, const int32_t* pos, int64_t T, int64_t rank,
                       int64_t rd, const RopeTable& table) {
  const int64_t W = rank + rd;
  const auto* ni = norm_detail::rms_norm_registry().find(impl);
  const auto* ri = rope_detail::registry().find(impl);
  ASSERT_TRUE(ni && ri) << impl;
  norm_detail::Rows nr;
  ASSERT_TRUE(norm_detail::to_rows(RmsNormParams{.x = make_view(rows, DType::kBF16, {T, rank}, {W, 1}),
                                                 .weight = make_view(const_cast<uint16_t*>(w), DType::kBF16, {rank}),
                                                 .out = make_view(rows, DType::kBF16, {T, rank}, {W, 1})},
                                   &nr)
                  .ok());
  ASSERT_TRUE(ni->fn(nr).ok());
  rope_detail::Args ra;
  ASSERT_TRUE(rope_detail::to_args(RopeParams{.k = make_view(rows + rank, DType::kBF16, {T, 1, rd}, {W, rd, 1}),
                                              .positions = make_view(const_cast<int32_t*>(pos), DType::kI32, {T}),
                                              .cos = table.cos(), .sin = table.sin(), .style = RopeStyle::kInterleaved},
                                   &ra)
                  .ok());
  ASSERT_TRUE(ri->fn(ra).ok());
}

// fused == rms_norm + rope (the same implementation) + kv_cache_write, bit for bit.
TEST(KvRmsNormRopeCache, FusedEqualsUnfusedBitwise) {
  // 20 tokens: AVX-512 units run each thread's half in pairs of tokens in lockstep until
  // token 13's slot -1.
  const int64_t T = 20, rank = 512, rd = 64, W = rank + rd, S = 32;
  RopeTable table;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = rd, .max_positions = 100}, &table).ok());
  testing::Rng rng(21);
  std::vector<uint16_t> kv(T * W), w(rank);
  testing::fill_bf16(kv.data(), T * W, rng, -3, 3);
  testing::fill_bf16(w.data(), rank, rng, 0.5, 1.5);
  std::vector<int32_t> pos(T), slots(T);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t * 37 % 100), slots[size_t(t)] = t == 13 ? -1 : int32_t(t * 7 % S);
  for (const auto* fi : mla_registry().runnable()) {
    const auto* wi = write_impl_for(fi->name);
    std::vector<uint16_t> c1(S * W, 0), c2(S * W, 0), tmp(kv);
    MlaArgs a;
    ASSERT_TRUE(to_args(KvRmsNormRopeCacheParams{.kv = make_view(kv.data(), DType::kBF16, {T, W}),
                                                 .weight = make_view(w.data(), DType::kBF16, {rank}),
                                                 .positions = make_view(pos.data(), DType::kI32, {T}), .cos = table.cos(),
                                                 .sin = table.sin(), .slots = make_view(slots.data(), DType::kI32, {T}),
                                                 .cache = make_view(c1.data(), DType::kBF16, {S, W}), .kv_lora_rank = rank},
                        &a)
                    .ok());
    ASSERT_TRUE(fi->fn(a).ok());
    // Unfused: rms_norm(latent) in place, rope(k_pe) in place, then write the rows.
    unfused_norm_rope(fi->name, tmp.data(), w.data(), pos.data(), T, rank, rd, table);
    WriteArgs wa;
    ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(tmp.data(), DType::kBF16, {T, W}),
                                           .slots = make_view(slots.data(), DType::kI32, {T}),
                                           .k_cache = make_view(c2.data(), DType::kBF16, {S, W})},
                        &wa)
                    .ok());
    ASSERT_TRUE(wi->fn(wa).ok());
    EXPECT_EQ(c1, c2) << fi->name;
  }
}

// i8 latent: equals rms_norm -> kv_cache_write(i8) for the latent and rope ->
// kv_cache_write for the rope part, bit for bit; and dequantises to the reference norm.
TEST(KvRmsNormRopeCache, Int8LatentFusedEqualsUnfused) {
  const int64_t T = 7, rank = 512, rd = 64, W = rank + rd, S = 12;
  RopeTable table;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = rd, .max_positions = 64}, &table).ok());
  testing::Rng rng(8);
  std::vector<uint16_t> kv(T * W), w(rank);
  testing::fill_bf16(kv.data(), T * W, rng, -3, 3);
  testing::fill_bf16(w.data(), rank, rng, 0.5, 1.5);
  std::vector<int32_t> pos = {0, 1, 63, 5, 9, 2, 40}, slots = {11, 3, -1, 0, 7, 5, 1};
  std::vector<const dispatch::Impl<MlaFn>*> impls = mla_registry().runnable();
  for (const auto* fi : impls) {
    std::vector<int8_t> q1(S * rank, 5), q2(q1);
    std::vector<float> s1(S, -1.0f), s2(s1);
    std::vector<uint16_t> r1(S * rd, 0), r2(r1), tmp(kv);
    MlaArgs a;
    ASSERT_TRUE(to_args(KvRmsNormRopeCacheParams{.kv = make_view(kv.data(), DType::kBF16, {T, W}),
                                                 .weight = make_view(w.data(), DType::kBF16, {rank}),
                                                 .positions = make_view(pos.data(), DType::kI32, {T}), .cos = table.cos(),
                                                 .sin = table.sin(), .slots = make_view(slots.data(), DType::kI32, {T}),
                                                 .cache = make_view(q1.data(), DType::kI8, {S, rank}),
                                                 .cache_scales = make_view(s1.data(), DType::kF32, {S}),
                                                 .rope_cache = make_view(r1.data(), DType::kBF16, {S, rd}), .kv_lora_rank = rank},
                        &a)
                    .ok());
    ASSERT_TRUE(fi->fn(a).ok());
    if (std::string(fi->name) == "reference") continue;  // the composition below uses kernels
    const auto* wi = write_impl_for(fi->name);
    unfused_norm_rope(fi->name, tmp.data(), w.data(), pos.data(), T, rank, rd, table);
    WriteArgs wa, wr;
    ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(tmp.data(), DType::kBF16, {T, rank}, {W, 1}),
                                           .slots = make_view(slots.data(), DType::kI32, {T}),
                                           .k_cache = make_view(q2.data(), DType::kI8, {S, rank}),
                                           .k_scales = make_view(s2.data(), DType::kF32, {S})},
                        &wa)
                    .ok());
    ASSERT_TRUE(wi->fn(wa).ok());
    ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(tmp.data() + rank, DType::kBF16, {T, rd}, {W, 1}),
                                           .slots = make_view(slots.data(), DType::kI32, {T}),
                                           .k_cache = make_view(r2.data(), DType::kBF16, {S, rd})},
                        &wr)
                    .ok());
    ASSERT_TRUE(wi->fn(wr).ok());
    EXPECT_EQ(q1, q2) << fi->name;
    EXPECT_EQ(s1, s2) << fi->name;
    EXPECT_EQ(r1, r2) << fi->name;
    // Dequantised latent within one step of the double-precision norm.
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = slots[size_t(t)];
      if (slot < 0) continue;
      double ss = 0;
      for (int64_t i = 0; i < rank; ++i) ss += std::pow(double(bf16_to_f32(kv[size_t(t * W + i)])), 2);
      const double inv = 1.0 / std::sqrt(ss / rank + 1e-6);
      for (int64_t i = 0; i < rank; ++i) {
        const double want = bf16_to_f32(kv[size_t(t * W + i)]) * inv * bf16_to_f32(w[size_t(i)]);
        EXPECT_NEAR(q1[size_t(slot * rank + i)] * double(s1[size_t(slot)]), want, 1.01 * s1[size_t(slot)] + 0.01 * std::fabs(want))
            << fi->name << " t=" << t << " i=" << i;
      }
    }
  }
}

// fused == rope (the same implementation) + kv_cache_write, bit for bit, as
// optx/kv_cache.h promises for either dtype: f32 and bf16 rows, i32 and i64 positions.
TEST(QkvRopeCache, FusedEqualsUnfusedBitwise) {
  const int64_t T = 5, hq = 8, hkv = 2, d = 128, W = (hq + 2 * hkv) * d, S = 8;
  RopeTable table;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = d, .max_positions = 50}, &table).ok());
  const std::vector<int32_t> pos32 = {0, 1, 2, 49, 13};
  const std::vector<int64_t> pos64(pos32.begin(), pos32.end());
  std::vector<int64_t> slots = {3, -1, 7, 0, 1};
  for (DType dt : {DType::kBF16, DType::kF32})
    for (bool i64 : {false, true})
      for (const auto* fi : qkv_registry().runnable()) {
        const std::string what = std::string(fi->name) + " " + dtype_name(dt) + (i64 ? " i64" : " i32") + " positions";
        const auto* ri = rope_detail::registry().find(fi->name);
        const auto* wi = write_impl_for(fi->name);
        ASSERT_TRUE(ri && wi);
        testing::Rng rng(5);
        Typed qkv(dt, size_t(T * W)), tmp(dt, size_t(T * W)), q1(dt, size_t(T * hq * d));
        Typed k1(dt, size_t(S * hkv * d)), v1(dt, size_t(S * hkv * d)), k2(dt, size_t(S * hkv * d)), v2(dt, size_t(S * hkv * d));
        for (size_t i = 0; i < size_t(T * W); ++i) qkv.set(i, rng.uniform(-2, 2)), tmp.set(i, float(qkv.get(i)));
        for (size_t i = 0; i < size_t(S * hkv * d); ++i) k1.set(i, 0), v1.set(i, 0), k2.set(i, 0), v2.set(i, 0);
        const TensorView positions = i64 ? make_view(const_cast<int64_t*>(pos64.data()), DType::kI64, {T})
                                         : make_view(const_cast<int32_t*>(pos32.data()), DType::kI32, {T});
        QkvArgs a;
        ASSERT_TRUE(to_args(QkvRopeCacheParams{.qkv = make_view(qkv.data(), dt, {T, W}), .q_heads = hq, .kv_heads = hkv,
                                               .head_dim = d, .positions = positions, .cos = table.cos(), .sin = table.sin(),
                                               .slots = make_view(slots.data(), DType::kI64, {T}),
                                               .k_cache = make_view(k1.data(), dt, {S, hkv * d}),
                                               .v_cache = make_view(v1.data(), dt, {S, hkv * d}),
                                               .q_out = make_view(q1.data(), dt, {T, hq, d})},
                            &a)
                        .ok());
        ASSERT_TRUE(fi->fn(a).ok());
        // Unfused: rope on q and k in place in a copy of the rows, then write k and v.
        const size_t es = dtype_size(dt);
        auto at = [&](int64_t elem) { return static_cast<uint8_t*>(tmp.data()) + size_t(elem) * es; };
        rope_detail::Args ra;
        ASSERT_TRUE(rope_detail::to_args(RopeParams{.q = make_view(at(0), dt, {T, hq, d}, {W, d, 1}),
                                                    .k = make_view(at(hq * d), dt, {T, hkv, d}, {W, d, 1}),
                                                    .positions = positions, .cos = table.cos(), .sin = table.sin()},
                                         &ra)
                        .ok());
        ASSERT_TRUE(ri->fn(ra).ok());
        WriteArgs wa;
        ASSERT_TRUE(to_args(KvCacheWriteParams{.k = make_view(at(hq * d), dt, {T, hkv * d}, {W, 1}),
                                               .v = make_view(at((hq + hkv) * d), dt, {T, hkv * d}, {W, 1}),
                                               .slots = make_view(slots.data(), DType::kI64, {T}),
                                               .k_cache = make_view(k2.data(), dt, {S, hkv * d}),
                                               .v_cache = make_view(v2.data(), dt, {S, hkv * d})},
                            &wa)
                        .ok());
        ASSERT_TRUE(wi->fn(wa).ok());
        const size_t cache_bytes = size_t(S * hkv * d) * es;
        EXPECT_EQ(std::memcmp(k1.data(), k2.data(), cache_bytes), 0) << what << ": k cache";
        EXPECT_EQ(std::memcmp(v1.data(), v2.data(), cache_bytes), 0) << what << ": v cache";
        for (int64_t t = 0; t < T; ++t)
          EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(q1.data()) + size_t(t * hq * d) * es, at(t * W), size_t(hq * d) * es), 0)
              << what << ": q row " << t;
      }
}

TEST(KvCacheBadInput, MessagesNameTheArgument) {
  std::vector<uint16_t> k(4 * 8), cache(6 * 8);
  std::vector<int32_t> slots = {0, 6, 1, 2};
  KvCacheWriteParams p{.k = make_view(k.data(), DType::kBF16, {4, 8}), .slots = make_view(slots.data(), DType::kI32, {4}),
                       .k_cache = make_view(cache.data(), DType::kBF16, {6, 8})};
  Status st = kv_cache_write(p);
  EXPECT_NE(st.message().find("kv_cache_write: slots[1]=6 is outside [-1, 6)"), std::string::npos) << st.message();
  slots[1] = -1;
  EXPECT_TRUE(kv_cache_write(p).ok());
  p.k_cache = make_view(cache.data(), DType::kBF16, {6, 7});
  EXPECT_NE(kv_cache_write(p).message().find("k_cache.sizes=[6, 7]"), std::string::npos);
  p.k_cache = make_view(cache.data(), DType::kI8, {6, 8});
  EXPECT_NE(kv_cache_write(p).message().find("k_scales must be contiguous f32"), std::string::npos);
  p.k_cache = make_view(cache.data(), DType::kF32, {6, 8});
  EXPECT_NE(kv_cache_write(p).message().find("k_cache.dtype=f32 must be bf16 or i8"), std::string::npos);

  std::vector<int32_t> tables = {0, 5}, lens = {3};
  GatherKvParams g{.k_cache = make_view(cache.data(), DType::kBF16, {6, 8}), .block_tables = make_view(tables.data(), DType::kI32, {1, 2}),
                   .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = 2,
                   .k_out = make_view(k.data(), DType::kBF16, {3, 8})};
  st = gather_pa_kv_cache(g);
  EXPECT_NE(st.message().find("block_tables[0][1]=5 is outside [0, 3) (num_slots=6 / block_size=2)"), std::string::npos) << st.message();
  g.block_size = INT64_MAX;  // no whole block fits the cache: the message says why the range is empty
  EXPECT_NE(gather_pa_kv_cache(g).message().find("is outside [0, 0) (num_slots=6 / block_size=9223372036854775807)"), std::string::npos)
      << gather_pa_kv_cache(g).message();
  g.block_size = 2;
  lens[0] = 5;
  EXPECT_NE(gather_pa_kv_cache(g).message().find("seq_lens[0]=5"), std::string::npos);

  std::vector<uint16_t> kv(2 * 10), w(8);
  std::vector<int32_t> pos = {0, 1}, s2 = {0, 1};
  RopeTable table;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 2, .max_positions = 1}, &table).ok());
  KvRmsNormRopeCacheParams m{.kv = make_view(kv.data(), DType::kBF16, {2, 10}), .weight = make_view(w.data(), DType::kBF16, {8}),
                             .positions = make_view(pos.data(), DType::kI32, {2}), .cos = table.cos(), .sin = table.sin(),
                             .slots = make_view(s2.data(), DType::kI32, {2}),
                             .cache = make_view(cache.data(), DType::kBF16, {4, 10}), .kv_lora_rank = 8};
  st = kv_rms_norm_rope_cache(m);
  EXPECT_NE(st.message().find("kv_rms_norm_rope_cache: positions[1]=1 is outside the cos/sin table [0, 1)"), std::string::npos)
      << st.message();
  m.kv_lora_rank = 9;
  EXPECT_NE(kv_rms_norm_rope_cache(m).message().find("kv.sizes[1]=10 must be kv_lora_rank=9"), std::string::npos);

  // Found by review: scales for a plane the call does not have were ignored (and then
  // reported as overlapping inputs of the plane it has), where other stray arguments are
  // errors.
  std::vector<float> sc(6);
  slots[1] = 2;
  p.k_cache = make_view(cache.data(), DType::kBF16, {6, 8});
  p.v_scales = make_view(sc.data(), DType::kF32, {6});
  EXPECT_EQ(kv_cache_write(p).message(), "kv_cache_write: v_scales given without v");
  lens[0] = 3, tables[1] = 1;
  ASSERT_TRUE(gather_pa_kv_cache(g).ok()) << gather_pa_kv_cache(g).message();
  g.v_scales = make_view(sc.data(), DType::kF32, {6});
  EXPECT_EQ(gather_pa_kv_cache(g).message(), "gather_pa_kv_cache: v_scales given without v_cache");
  g.v_scales = {};
  g.v_scales_out = make_view(sc.data(), DType::kF32, {3});
  EXPECT_EQ(gather_pa_kv_cache(g).message(), "gather_pa_kv_cache: v_scales_out given without v_cache");
}

// Found by review: empty i8 calls were rejected for their (empty) scale views' null data;
// a v_cache of another dtype than k_cache (even i64) was copied; a head-major q_out,
// which rope() takes, was refused by a token-major stride rule.
TEST(KvCacheBadInput, EmptyI8CallsMixedCachesAndHeadMajorQ) {
  std::vector<int8_t> c8(8 * 4);
  std::vector<float> scales(8), f(8 * 4, 1.0f);
  std::vector<int64_t> c64(8 * 4, 7);
  std::vector<int32_t> bt = {0, 1}, lens = {0, 0};
  GatherKvParams g{.k_cache = make_view(c8.data(), DType::kI8, {8, 4}), .k_scales = make_view(scales.data(), DType::kF32, {8}),
                   .block_tables = make_view(bt.data(), DType::kI32, {2, 1}), .seq_lens = make_view(lens.data(), DType::kI32, {2}),
                   .block_size = 4, .k_out = make_view(nullptr, DType::kI8, {0, 4}), .k_scales_out = make_view(nullptr, DType::kF32, {0})};
  Status st = gather_pa_kv_cache(g);
  EXPECT_TRUE(st.ok()) << st.message();
  const KvCacheWriteParams w{.k = make_view(nullptr, DType::kBF16, {0, 4}), .slots = make_view(nullptr, DType::kI32, {0}),
                             .k_cache = make_view(nullptr, DType::kI8, {0, 4}), .k_scales = make_view(nullptr, DType::kF32, {0})};
  st = kv_cache_write(w);
  EXPECT_TRUE(st.ok()) << st.message();
  lens = {1, 0};
  std::vector<float> ko(4);
  std::vector<int64_t> vo(4);
  const GatherKvParams mixed{.k_cache = make_view(f.data(), DType::kF32, {8, 4}), .v_cache = make_view(c64.data(), DType::kI64, {8, 4}),
                             .block_tables = g.block_tables, .seq_lens = g.seq_lens, .block_size = 4,
                             .k_out = make_view(ko.data(), DType::kF32, {1, 4}), .v_out = make_view(vo.data(), DType::kI64, {1, 4})};
  EXPECT_EQ(gather_pa_kv_cache(mixed).message(), "gather_pa_kv_cache: v_cache.dtype=i64 but k_cache.dtype=f32");
  EXPECT_EQ(vo[0], 0) << "written despite the error";

  // q_out head-major: [T, H, D] over [H, T, D] storage, against the token-major result.
  const int64_t T = 3, hq = 2, hkv = 1, d = 4;
  RopeTable tab;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 4, .max_positions = 8}, &tab).ok());
  std::vector<float> qkv(T * (hq + 2 * hkv) * d), q_tm(T * hq * d), q_hm(T * hq * d), kc(8 * d), vc(8 * d);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(i % 7) - 3.0f;
  std::vector<int32_t> pos = {0, 1, 2}, sl = {0, 1, 2};
  QkvRopeCacheParams q{.qkv = make_view(qkv.data(), DType::kF32, {T, (hq + 2 * hkv) * d}), .q_heads = hq, .kv_heads = hkv, .head_dim = d,
                       .positions = make_view(pos.data(), DType::kI32, {T}), .cos = tab.cos(), .sin = tab.sin(),
                       .slots = make_view(sl.data(), DType::kI32, {T}), .k_cache = make_view(kc.data(), DType::kF32, {8, d}),
                       .v_cache = make_view(vc.data(), DType::kF32, {8, d}), .q_out = make_view(q_tm.data(), DType::kF32, {T, hq, d})};
  ASSERT_TRUE(qkv_rope_cache(q).ok());
  q.q_out = make_view(q_hm.data(), DType::kF32, {T, hq, d}, {d, T * d, 1});
  st = qkv_rope_cache(q);
  ASSERT_TRUE(st.ok()) << st.message();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < d; ++i) EXPECT_EQ(q_hm[size_t(h * T * d + t * d + i)], q_tm[size_t((t * hq + h) * d + i)]);
  q.q_out = make_view(q_hm.data(), DType::kF32, {T, hq, d}, {d, 2, 1});  // heads overlap
  EXPECT_NE(qkv_rope_cache(q).message().find("qkv_rope_cache: q_out.strides"), std::string::npos) << qkv_rope_cache(q).message();
}

// Found by review: index tensors inside an output were checked, then overwritten and read
// again (a slot or table entry could then address outside the cache), and outputs sharing
// memory (k_cache = v_cache, scales of both planes in one array) raced. Each is an error
// naming both arguments, with nothing written; slices of one buffer that do not touch
// stay accepted.
TEST(KvCacheBadInput, OverlapsOfOutputsAndIndexTensors) {
  const int64_t T = 2, row = 8, S = 8;
  std::vector<float> k(T * row, 1.0f), cache(S * row + 64, 0.0f), cache2(S * row, 0.0f);
  std::vector<int32_t> slots = {0, 1};
  KvCacheWriteParams p{.k = make_view(k.data(), DType::kF32, {T, row}), .v = make_view(k.data(), DType::kF32, {T, row}),
                       .slots = make_view(slots.data(), DType::kI32, {T}),
                       .k_cache = make_view(cache.data(), DType::kF32, {S, row}), .v_cache = make_view(cache.data(), DType::kF32, {S, row})};
  EXPECT_EQ(kv_cache_write(p).message(), "kv_cache_write: k_cache and v_cache overlap (outputs must not share memory)");
  // Slots stored in the cache's last row: slot 0's row written first would rewrite them.
  int32_t* in_cache = reinterpret_cast<int32_t*>(cache.data() + (S - 1) * row);
  in_cache[0] = 0, in_cache[1] = 1;
  p.v = {}, p.v_cache = {};
  p.slots = make_view(in_cache, DType::kI32, {T});
  EXPECT_EQ(kv_cache_write(p).message(), "kv_cache_write: k_cache overlaps slots (an output must not share memory with an input)");
  // The halves of one [S, 2 * row] buffer are apart: k and v planes side by side.
  p.slots = make_view(slots.data(), DType::kI32, {T});
  p.v = p.k;
  p.k_cache = make_view(cache.data(), DType::kF32, {S / 2, row}, {2 * row, 1});
  p.v_cache = make_view(cache.data() + row, DType::kF32, {S / 2, row}, {2 * row, 1});
  EXPECT_TRUE(kv_cache_write(p).ok()) << kv_cache_write(p).message();
  // i8 planes whose scales share one array.
  std::vector<int8_t> c8(S * row), v8(S * row);
  std::vector<float> sc(S);
  const KvCacheWriteParams shared{.k = p.k, .v = p.k, .slots = p.slots, .k_cache = make_view(c8.data(), DType::kI8, {S, row}),
                                  .v_cache = make_view(v8.data(), DType::kI8, {S, row}),
                                  .k_scales = make_view(sc.data(), DType::kF32, {S}), .v_scales = make_view(sc.data(), DType::kF32, {S})};
  EXPECT_EQ(kv_cache_write(shared).message(), "kv_cache_write: k_scales and v_scales overlap (outputs must not share memory)");

  // gather: the block table inside the output it addresses.
  std::vector<int32_t> lens = {2};
  std::vector<float> out(2 * row + 8);
  int32_t* table_in_out = reinterpret_cast<int32_t*>(out.data() + row);
  table_in_out[0] = 0;
  GatherKvParams g{.k_cache = make_view(cache2.data(), DType::kF32, {S, row}), .block_tables = make_view(table_in_out, DType::kI32, {1, 1}),
                   .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = 4,
                   .k_out = make_view(out.data(), DType::kF32, {2, row})};
  EXPECT_EQ(gather_pa_kv_cache(g).message(), "gather_pa_kv_cache: k_out overlaps block_tables (an output must not share memory with an input)");
  g.block_tables = make_view(slots.data(), DType::kI32, {1, 1});
  g.k_out = make_view(cache2.data(), DType::kF32, {2, row});  // the output inside the cache it reads
  EXPECT_EQ(gather_pa_kv_cache(g).message(), "gather_pa_kv_cache: k_out overlaps k_cache (an output must not share memory with an input)");
  g.k_out = make_view(out.data(), DType::kF32, {2, row});
  g.k_scales_out = make_view(sc.data(), DType::kF32, {2});
  EXPECT_EQ(gather_pa_kv_cache(g).message(), "gather_pa_kv_cache: k_scales_out given but the cache is f32");

  // MLA: positions inside the cache.
  std::vector<float> kv(T * 10, 0.5f), w(8, 1.0f), mcache(S * 10, 0.0f);
  RopeTable table;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 2, .max_positions = 4}, &table).ok());
  int32_t* pos_in_cache = reinterpret_cast<int32_t*>(mcache.data() + 7 * 10);
  pos_in_cache[0] = 0, pos_in_cache[1] = 1;
  std::vector<int32_t> pos = {0, 1};
  KvRmsNormRopeCacheParams m{.kv = make_view(kv.data(), DType::kF32, {T, 10}), .weight = make_view(w.data(), DType::kF32, {8}),
                             .positions = make_view(pos_in_cache, DType::kI32, {T}), .cos = table.cos(), .sin = table.sin(),
                             .slots = make_view(slots.data(), DType::kI32, {T}), .cache = make_view(mcache.data(), DType::kF32, {S, 10}),
                             .kv_lora_rank = 8};
  EXPECT_EQ(kv_rms_norm_rope_cache(m).message(),
            "kv_rms_norm_rope_cache: cache overlaps positions (an output must not share memory with an input)");
  m.positions = make_view(pos.data(), DType::kI32, {T});
  EXPECT_TRUE(kv_rms_norm_rope_cache(m).ok());

  // qkv_rope_cache: one cache for k and v, and q_out over the qkv rows it reads.
  const int64_t d = 4, W = 3 * d;
  RopeTable t4;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 4, .max_positions = 4}, &t4).ok());
  std::vector<float> qkv(T * W, 0.25f), kc(S * d), vc(S * d), q(T * d);
  QkvRopeCacheParams x{.qkv = make_view(qkv.data(), DType::kF32, {T, W}), .q_heads = 1, .kv_heads = 1, .head_dim = d,
                       .positions = make_view(pos.data(), DType::kI32, {T}), .cos = t4.cos(), .sin = t4.sin(),
                       .slots = make_view(slots.data(), DType::kI32, {T}), .k_cache = make_view(kc.data(), DType::kF32, {S, d}),
                       .v_cache = make_view(kc.data(), DType::kF32, {S, d}), .q_out = make_view(q.data(), DType::kF32, {T, 1, d})};
  EXPECT_EQ(qkv_rope_cache(x).message(), "qkv_rope_cache: k_cache and v_cache overlap (outputs must not share memory)");
  x.v_cache = make_view(vc.data(), DType::kF32, {S, d});
  x.q_out = make_view(qkv.data() + d, DType::kF32, {T, 1, d}, {W, d, 1});  // over the k heads
  EXPECT_EQ(qkv_rope_cache(x).message(), "qkv_rope_cache: q_out overlaps qkv (an output must not share memory with an input)");
  x.q_out = make_view(q.data(), DType::kF32, {T, 1, d});
  EXPECT_TRUE(qkv_rope_cache(x).ok());
}

// Inputs a fuzz sweep found crashing, wrapping or writing out of bounds: each must be an
// error naming the argument, with nothing written.
TEST(KvCacheBadInput, NegativeAndWrappingSizes) {
  std::vector<uint16_t> k(4 * 8), cache(6 * 8);
  std::vector<int32_t> slots = {0, 1, 2, 3};
  auto expect_error = [](const Status& st, const std::string& part) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(part), std::string::npos) << st.message();
  };
  // A negative row length used to pass (the checks only looked at rows > 1) and reach
  // memcpy as a huge size.
  expect_error(kv_cache_write({.k = make_view(k.data(), DType::kBF16, {4, -1}), .slots = make_view(slots.data(), DType::kI32, {4}),
                               .k_cache = make_view(cache.data(), DType::kBF16, {6, -1})}),
               "kv_cache_write: k.sizes[1]=-1 is negative");
  expect_error(kv_cache_write({.k = make_view(k.data(), DType::kBF16, {-1, 8}), .slots = make_view(slots.data(), DType::kI32, {-1}),
                               .k_cache = make_view(cache.data(), DType::kBF16, {6, 8})}),
               "k.sizes[0]=-1 is negative");
  std::vector<int32_t> tables = {0, 1}, lens = {3};
  GatherKvParams g{.k_cache = make_view(cache.data(), DType::kBF16, {6, -1}), .block_tables = make_view(tables.data(), DType::kI32, {1, 2}),
                   .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = 2,
                   .k_out = make_view(k.data(), DType::kBF16, {3, -1})};
  expect_error(gather_pa_kv_cache(g), "k_cache.sizes[1]=-1 is negative");
  g.k_cache = make_view(cache.data(), DType::kBF16, {6, 8});
  g.k_out = make_view(k.data(), DType::kBF16, {3, 8});
  g.block_size = int64_t(1) << 62;  // max_blocks * block_size wrapped
  EXPECT_FALSE(gather_pa_kv_cache(g).ok());
  g.block_size = 2;
  g.block_tables = make_view(tables.data(), DType::kI32, {2, 1}, {-1, 1});
  g.seq_lens = make_view(lens.data(), DType::kI32, {2}, {0});
  expect_error(gather_pa_kv_cache(g), "block_tables.strides[0]=-1 is negative");

  // qkv_rope_cache: T = -1 reached the kernels as row -1; head counts whose row width wraps
  // to 0 matched a zero-width qkv.
  RopeTable table;
  ASSERT_TRUE(RopeTable::build({.rotary_dim = 4, .max_positions = 4}, &table).ok());
  std::vector<uint16_t> x(2 * 12), q(2 * 4), kc(4 * 4), vc(4 * 4);
  std::vector<int32_t> pos = {0, 1};
  QkvRopeCacheParams qp{.qkv = make_view(x.data(), DType::kBF16, {-1, 12}), .q_heads = 1, .kv_heads = 1, .head_dim = 4,
                        .positions = make_view(pos.data(), DType::kI32, {-1}), .cos = table.cos(), .sin = table.sin(),
                        .slots = make_view(slots.data(), DType::kI32, {-1}), .k_cache = make_view(kc.data(), DType::kBF16, {4, 4}),
                        .v_cache = make_view(vc.data(), DType::kBF16, {4, 4}), .q_out = make_view(q.data(), DType::kBF16, {-1, 1, 4})};
  expect_error(qkv_rope_cache(qp), "qkv.sizes[0]=-1 is negative");
  qp.qkv = make_view(x.data(), DType::kBF16, {2, 0});
  qp.q_heads = (int64_t(1) << 62) - 2;
  expect_error(qkv_rope_cache(qp), "exceeds 2^48");

  // kv_rms_norm_rope_cache: kv_lora_rank = INT64_MIN made width - rank overflow.
  std::vector<uint16_t> kv(2 * 10), w(8);
  KvRmsNormRopeCacheParams m{.kv = make_view(kv.data(), DType::kBF16, {2, 10}), .weight = make_view(w.data(), DType::kBF16, {8}),
                             .positions = make_view(pos.data(), DType::kI32, {2}), .cos = table.cos(), .sin = table.sin(),
                             .slots = make_view(slots.data(), DType::kI32, {2}),
                             .cache = make_view(cache.data(), DType::kBF16, {4, 10}), .kv_lora_rank = INT64_MIN};
  expect_error(kv_rms_norm_rope_cache(m), "kv_lora_rank=");
  m.kv_lora_rank = 8;
  m.eps = INFINITY;
  expect_error(kv_rms_norm_rope_cache(m), "eps=inf must be finite");
}

TEST(KvPoolBadInput, SizesThatWrapAndNullBlocks) {
  KvBlockPool pool;
  // num_blocks x block_size x row wrapped to a ~64-byte pool that views then indexed as huge.
  EXPECT_FALSE(KvBlockPool::create({.num_blocks = 1, .block_size = int64_t(1) << 62, .row = 4, .planes = 1, .dtype = DType::kF32}, &pool).ok());
  EXPECT_FALSE(KvBlockPool::create({.num_blocks = 4, .block_size = int64_t(1) << 61, .row = 1, .planes = 1, .dtype = DType::kF32}, &pool).ok());
  EXPECT_FALSE(KvBlockPool::create({.num_blocks = 1, .block_size = int64_t(1) << 40, .row = int64_t(1) << 30, .planes = 1}, &pool).ok());
  ASSERT_TRUE(KvBlockPool::create({.num_blocks = 2, .block_size = 4, .row = 8, .planes = 1}, &pool).ok());
  EXPECT_EQ(pool.release(nullptr, 1).message(), "kv_pool.release: blocks is null (n=1)");
  EXPECT_EQ(pool.allocate(-1, nullptr).message(), "kv_pool.allocate: n=-1 is negative");
  KvSequence seq(4);
  EXPECT_FALSE(seq.reserve(pool, INT64_MAX).ok());  // tokens + block_size - 1 wrapped to 0 blocks
  EXPECT_FALSE(seq.reserve(pool, -100).ok());
  EXPECT_EQ(seq.num_blocks(), 0);
  EXPECT_EQ(pool.free_blocks(), 2);
}

TEST(KvCacheDispatch, SelectedRespectsMaxIsa) {
  for (const char* op : {"kv_rms_norm_rope_cache", "qkv_rope_cache"}) {
    const std::string sel = selected_impl(op);
    const bool mla = std::string(op) == "kv_rms_norm_rope_cache";
    const Isa isa = mla ? mla_registry().find(sel)->isa : qkv_registry().find(sel)->isa;
    EXPECT_LE(int(isa), int(active_isa())) << op;
    const bool forced = !dispatch::forced_impl(op).empty();  // OPTX_IMPL's choice, else the best runnable
    if (mla) {
      if (!forced) {
        EXPECT_EQ(mla_registry().runnable().front()->name, sel);
      }
      EXPECT_TRUE(testutil::run_mla(*mla_registry().find(sel), {}).cmp.pass);
    } else {
      if (!forced) {
        EXPECT_EQ(qkv_registry().runnable().front()->name, sel);
      }
      EXPECT_TRUE(testutil::run_qkv(*qkv_registry().find(sel), {}).cmp.pass);
    }
  }
}

}  // namespace
}  // namespace optx::kv_detail
