// 64-bit index math: caches of more than 2^32 elements. The pools are reserved with
// mmap(MAP_NORESERVE) and only the pages of the rows a test writes are ever touched, so
// a 10 GB cache costs a few pages. Rows written near the top of such a pool by
// kv_cache_write, read back by gather_pa_kv_cache and attended over by the decode ops
// must give bit for bit what the same rows give in a small pool: a slot * row product
// computed in 32 bits (signed or not) would land elsewhere, or fault.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "optx/attention.h"
#include "optx/kv_cache.h"
#include "testing/rng.h"

namespace optx {
namespace {

// A virtual buffer; pages materialise on first touch (zero pages for reads).
class Reserved {
 public:
  explicit Reserved(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    p_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Reserved() {
    if (p_) munmap(p_, bytes_);
  }
  Reserved(const Reserved&) = delete;
  Reserved& operator=(const Reserved&) = delete;
  void* data() const { return p_; }

 private:
  void* p_;
  size_t bytes_;
};

constexpr int64_t k4G = int64_t(1) << 32;  // beyond int32 and uint32 index math

// Writes the rows (token t -> slot slot_of(t)) with kv_cache_write into a cache of
// `dtype` (bf16, or i8 with per-slot scales), then checks each written row at the byte
// offset computed here in 64 bits: a bf16 row is the input itself, an i8 row is non-zero
// (the rows are random) and its scale is set.
template <class SlotOf>
void write_rows(const std::vector<uint16_t>& rows, int64_t T, int64_t row, DType dtype, void* cache, float* scales, int64_t num_slots,
                SlotOf slot_of) {
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) slots[size_t(t)] = slot_of(t);
  const bool i8 = dtype == DType::kI8;
  const Status st = kv_cache_write({.k = make_view(const_cast<uint16_t*>(rows.data()), DType::kBF16, {T, row}),
                                    .slots = make_view(slots.data(), DType::kI64, {T}),
                                    .k_cache = make_view(cache, dtype, {num_slots, row}),
                                    .k_scales = i8 ? make_view(scales, DType::kF32, {num_slots}) : TensorView{}});
  ASSERT_TRUE(st.ok()) << st.message();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slots[size_t(t)];
    const char* at = static_cast<const char*>(cache) + size_t(s) * size_t(row) * (i8 ? 1 : 2);
    if (!i8) {
      ASSERT_EQ(std::memcmp(at, rows.data() + t * row, size_t(row) * 2), 0) << "token " << t << " not at slot " << s;
      continue;
    }
    int nonzero = 0;
    for (int64_t i = 0; i < row; ++i) nonzero += at[i] != 0;
    ASSERT_GT(nonzero, 0) << "token " << t << " not at slot " << s;
    ASSERT_GT(scales[s], 0.0f) << "token " << t << "'s scale not at slot " << s;
  }
}

TEST(Index64, MlaDecodeOverThePoolsTopBlocks) {
  const int64_t D = 576, Dv = 512, Nq = 16, bs = 64, ctx = 100, blocks = 2;
  const int64_t num_slots = int64_t(1) << 23;  // 4.8e9 elements: past 2^31 and 2^32
  ASSERT_GT(num_slots * D, k4G);
  Reserved big(size_t(num_slots * D) * 2);
  if (!big.data()) GTEST_SKIP() << "cannot reserve " << num_slots * D * 2 / (1 << 20) << " MiB of address space";
  testing::Rng rng(64);
  std::vector<uint16_t> rows(static_cast<size_t>(ctx * D)), q(static_cast<size_t>(Nq * D));
  testing::fill_bf16(rows.data(), ctx * D, rng);
  testing::fill_bf16(q.data(), Nq * D, rng);
  // The same rows in the last two blocks of the big pool (in reverse order) and in blocks
  // 0 and 1 of a small one.
  const int64_t top = num_slots / bs - 1;
  std::vector<int32_t> big_table = {int32_t(top), int32_t(top - 1)}, small_table = {0, 1};
  std::vector<uint16_t> small(static_cast<size_t>(blocks * bs * D));
  ASSERT_NO_FATAL_FAILURE(write_rows(rows, ctx, D, DType::kBF16, big.data(), nullptr, num_slots,
                                     [&](int64_t t) { return big_table[size_t(t / bs)] * bs + t % bs; }));
  ASSERT_NO_FATAL_FAILURE(write_rows(rows, ctx, D, DType::kBF16, small.data(), nullptr, blocks * bs, [&](int64_t t) { return t; }));
  std::vector<int32_t> lens = {int32_t(ctx)};
  auto decode = [&](void* cache, int64_t slots, std::vector<int32_t>& table) {
    std::vector<uint16_t> out(static_cast<size_t>(Nq * Dv), 0x7fc0);
    MlaDecodeParams p{.q = make_view(q.data(), DType::kBF16, {1, 1, Nq, D}), .cache = make_view(cache, DType::kBF16, {slots, D}),
                      .block_tables = make_view(table.data(), DType::kI32, {1, blocks}),
                      .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = bs, .kv_lora_rank = Dv,
                      .out = make_view(out.data(), DType::kBF16, {1, 1, Nq, Dv}), .scale = 0.07f};
    std::vector<uint8_t> ws(mla_decode_attention_workspace_size(p));
    const Status st = mla_decode_attention(p, {ws.data(), ws.size()});
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  };
  const std::vector<uint16_t> want = decode(small.data(), blocks * bs, small_table);
  const std::vector<uint16_t> got = decode(big.data(), num_slots, big_table);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 2), 0);
  EXPECT_NE(want[0], 0x7fc0) << "the output was written";

  // gather_pa_kv_cache brings the rows back in token order.
  std::vector<uint16_t> back(rows.size(), 0);
  const Status st = gather_pa_kv_cache({.k_cache = make_view(big.data(), DType::kBF16, {num_slots, D}),
                                        .block_tables = make_view(big_table.data(), DType::kI32, {1, blocks}),
                                        .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = bs,
                                        .k_out = make_view(back.data(), DType::kBF16, {ctx, D})});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(back, rows);
}

// bf16 caches, and i8 caches with per-slot scales: 5.4e9 elements per plane either way, so
// the i8 byte offsets pass 2^32 too.
TEST(Index64, PagedDecodeOverThePoolsTopBlocks) {
  for (DType cd : {DType::kBF16, DType::kI8}) {
    SCOPED_TRACE(dtype_name(cd));
    const bool i8 = cd == DType::kI8;
    const int64_t Nkv = 8, D = 128, Nq = 32, bs = 16, ctx = 40, blocks = 3, row = Nkv * D, es = i8 ? 1 : 2;
    const int64_t num_slots = (int64_t(1) << 22) + (int64_t(1) << 20);  // 5.4e9 elements per plane
    ASSERT_GT(num_slots * row, k4G);
    Reserved kbig(size_t(num_slots * row * es)), vbig(size_t(num_slots * row * es));
    Reserved ksc(size_t(num_slots) * 4), vsc(size_t(num_slots) * 4);
    if (!kbig.data() || !vbig.data() || !ksc.data() || !vsc.data())
      GTEST_SKIP() << "cannot reserve 2 x " << num_slots * row * es / (1 << 20) << " MiB";
    testing::Rng rng(65);
    std::vector<uint16_t> k(static_cast<size_t>(ctx * row)), v(k.size()), q(static_cast<size_t>(Nq * D));
    testing::fill_bf16(k.data(), ctx * row, rng);
    testing::fill_bf16(v.data(), ctx * row, rng);
    testing::fill_bf16(q.data(), Nq * D, rng);
    const int64_t top = num_slots / bs - 1;
    std::vector<int32_t> big_table = {int32_t(top), int32_t(top - 7), int32_t(top - 2)}, small_table = {0, 1, 2};
    std::vector<uint8_t> ksmall(size_t(blocks * bs * row * es)), vsmall(ksmall.size());
    std::vector<float> kss(static_cast<size_t>(blocks * bs)), vss(kss.size());
    float* kbs = static_cast<float*>(ksc.data());
    float* vbs = static_cast<float*>(vsc.data());
    auto big_slot = [&](int64_t t) { return big_table[size_t(t / bs)] * bs + t % bs; };
    auto small_slot = [](int64_t t) { return t; };
    ASSERT_NO_FATAL_FAILURE(write_rows(k, ctx, row, cd, kbig.data(), kbs, num_slots, big_slot));
    ASSERT_NO_FATAL_FAILURE(write_rows(v, ctx, row, cd, vbig.data(), vbs, num_slots, big_slot));
    ASSERT_NO_FATAL_FAILURE(write_rows(k, ctx, row, cd, ksmall.data(), kss.data(), blocks * bs, small_slot));
    ASSERT_NO_FATAL_FAILURE(write_rows(v, ctx, row, cd, vsmall.data(), vss.data(), blocks * bs, small_slot));
    std::vector<int32_t> lens = {int32_t(ctx)};
    auto decode = [&](void* kc, void* vc, float* ks, float* vs, int64_t slots, std::vector<int32_t>& table) {
      std::vector<uint16_t> out(static_cast<size_t>(Nq * D), 0x7fc0);
      PagedDecodeParams p{.q = make_view(q.data(), DType::kBF16, {1, 1, Nq, D}), .k_cache = make_view(kc, cd, {slots, row}),
                          .v_cache = make_view(vc, cd, {slots, row}),
                          .k_scales = i8 ? make_view(ks, DType::kF32, {slots}) : TensorView{},
                          .v_scales = i8 ? make_view(vs, DType::kF32, {slots}) : TensorView{},
                          .block_tables = make_view(table.data(), DType::kI32, {1, blocks}),
                          .seq_lens = make_view(lens.data(), DType::kI32, {1}), .block_size = bs, .kv_heads = Nkv,
                          .out = make_view(out.data(), DType::kBF16, {1, 1, Nq, D})};
      std::vector<uint8_t> ws(paged_decode_attention_workspace_size(p));
      const Status st = paged_decode_attention(p, {ws.data(), ws.size()});
      EXPECT_TRUE(st.ok()) << st.message();
      return out;
    };
    const std::vector<uint16_t> want = decode(ksmall.data(), vsmall.data(), kss.data(), vss.data(), blocks * bs, small_table);
    const std::vector<uint16_t> got = decode(kbig.data(), vbig.data(), kbs, vbs, num_slots, big_table);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 2), 0);
    EXPECT_NE(want[0], 0x7fc0) << "the output was written";
  }
}

}  // namespace
}  // namespace optx
