// `optx verify` cases for the cache family (every runnable implementation): kv_cache_write
// and gather_pa_kv_cache in f32 / bf16 / int8; the fused cache writes with DeepSeek MLA
// rows (512 + 64; float and i8 latent caches), odd latent widths, all rope styles; Llama /
// GQA qkv rows.
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>

#include "ops/kv_cache/kv_cache_testutil.h"
#include "tools/verify.h"

namespace optx::kv_detail {
namespace {

void verify_mla(std::vector<verify::Record>& out) {
  for (const auto* impl : mla_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (bool i8 : {false, true})
      for (auto [T, rank, rd, style] : {std::tuple{33, 512, 64, RopeStyle::kInterleaved}, {17, 512, 64, RopeStyle::kInterleavedToHalf},
                                        {5, 769, 32, RopeStyle::kHalf}, {1, 7, 2, RopeStyle::kInterleaved}}) {
        testutil::MlaCase c;
        c.dtype = dt, c.T = T, c.rank = rank, c.rope_dim = rd, c.style = style, c.num_slots = 96, c.pos64 = T % 2 == 0, c.i8 = i8;
        const auto o = testutil::run_mla(*impl, c, uint64_t(T * rank));
        out.push_back(verify::make_record("kv_rms_norm_rope_cache", impl->name, c.name(), o.status, o.cmp));
      }
}

void verify_qkv(std::vector<verify::Record>& out) {
  for (const auto* impl : qkv_registry().runnable())
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [T, hq, hkv, d, rd, style] : {std::tuple{17, 32, 8, 128, 0, RopeStyle::kHalf}, {9, 16, 16, 64, 64, RopeStyle::kInterleaved},
                                              {5, 12, 4, 80, 40, RopeStyle::kHalf}, {3, 4, 1, 256, 128, RopeStyle::kInterleavedToHalf}}) {
        testutil::QkvCase c;
        c.dtype = dt, c.T = T, c.hq = hq, c.hkv = hkv, c.d = d, c.rotary_dim = rd, c.style = style, c.num_slots = 40;
        const auto o = testutil::run_qkv(*impl, c, uint64_t(T * d));
        out.push_back(verify::make_record("qkv_rope_cache", impl->name, c.name(), o.status, o.cmp));
      }
}

// One element of a byte buffer holding f32, bf16 or int8 values, as a double.
double element(const uint8_t* base, DType dt, int64_t i) {
  if (dt == DType::kF32) {
    float v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  }
  if (dt == DType::kBF16) {
    uint16_t v;
    std::memcpy(&v, base + 2 * i, 2);
    return bf16_to_f32(v);
  }
  return int8_t(base[i]);
}

constexpr uint8_t kSentinel = 0x5a;  // every cache byte before the call

// kv_cache_write: K and V rows into distinct random slots (every fifth token -1) of
// sentinel-filled caches. Float caches must hold the inputs exactly; int8 rows must
// dequantise to the input within 1 LSB of the row's scale amax / 127 and carry that
// scale; every slot no token names must keep all its bytes (rows and scales).
void verify_write(std::vector<verify::Record>& out) {
  for (const auto* impl : write_registry().runnable())
    for (DType in : {DType::kF32, DType::kBF16})
      for (bool i8 : {false, true})
        for (auto [T, row] : {std::pair<int64_t, int64_t>{37, 576}, {9, 33}, {1, 1024}}) {
          const int64_t S = 64;
          const DType cd = i8 ? DType::kI8 : in;
          testing::Rng rng(uint64_t(T * row) + i8);
          testutil::Typed k(in, size_t(T * row)), v(in, size_t(T * row));
          for (int64_t i = 0; i < T * row; ++i) k.set(size_t(i), rng.uniform(-3, 3)), v.set(size_t(i), rng.uniform(-3, 3));
          if (T > 2)
            for (int64_t i = 0; i < row; ++i) k.set(size_t(2 * row + i), 0.0f);  // all-zero row: scale 0
          std::vector<int64_t> slots = testutil::make_slots(T, S, rng);
          const size_t cbytes = size_t(S * row) * dtype_size(cd);
          testing::AlignedVector<uint8_t> kc(cbytes, kSentinel), vc(cbytes, kSentinel);
          std::vector<float> ks(static_cast<size_t>(S)), vs(static_cast<size_t>(S));
          std::memset(ks.data(), kSentinel, ks.size() * 4), std::memset(vs.data(), kSentinel, vs.size() * 4);
          KvCacheWriteParams p{.k = make_view(k.data(), in, {T, row}), .v = make_view(v.data(), in, {T, row}),
                               .slots = make_view(slots.data(), DType::kI64, {T}), .k_cache = make_view(kc.data(), cd, {S, row}),
                               .v_cache = make_view(vc.data(), cd, {S, row}),
                               .k_scales = i8 ? make_view(ks.data(), DType::kF32, {S}) : TensorView{},
                               .v_scales = i8 ? make_view(vs.data(), DType::kF32, {S}) : TensorView{}};
          WriteArgs a;
          Status st = to_args(p, &a);
          if (st.ok()) st = impl->fn(a);
          std::vector<int64_t> token(size_t(S), -1);
          for (int64_t t = 0; t < T; ++t)
            if (slots[size_t(t)] >= 0) token[size_t(slots[size_t(t)])] = t;
          std::vector<double> got, ref, extra;
          for (int plane = 0; plane < 2; ++plane) {
            const testutil::Typed& x = plane ? v : k;
            const uint8_t* c = plane ? vc.data() : kc.data();
            const float* sc = plane ? vs.data() : ks.data();
            for (int64_t s = 0; s < S; ++s) {
              const int64_t t = token[size_t(s)];
              if (t < 0) {  // untouched: the number of changed bytes must be 0
                const size_t rb = size_t(row) * dtype_size(cd);
                double changed = 0;
                for (size_t b = 0; b < rb; ++b) changed += c[size_t(s) * rb + b] != kSentinel;
                if (i8)
                  for (int b = 0; b < 4; ++b) changed += reinterpret_cast<const uint8_t*>(&sc[s])[b] != kSentinel;
                got.push_back(changed), ref.push_back(0), extra.push_back(0);
                continue;
              }
              double amax = 0;
              for (int64_t i = 0; i < row; ++i) amax = std::max(amax, std::fabs(x.get(size_t(t * row + i))));
              const double lsb = amax / 127.0;
              for (int64_t i = 0; i < row; ++i) {
                const double e = element(c, cd, s * row + i);
                if (i8 && amax == 0) {  // scale 0: the codes themselves must be 0 (any code times 0 would pass)
                  got.push_back(e), ref.push_back(0), extra.push_back(0);
                  continue;
                }
                got.push_back(i8 ? e * sc[s] : e), ref.push_back(x.get(size_t(t * row + i))), extra.push_back(i8 ? lsb : 0.0);
              }
              if (i8) got.push_back(sc[s]), ref.push_back(lsb), extra.push_back(1e-6 * lsb);
            }
          }
          const std::string cs = std::string("in=") + dtype_name(in) + " cache=" + dtype_name(cd) + " T=" + std::to_string(T) +
                                 " row=" + std::to_string(row) + " slots=64 skipped=every5th";  // slot -1 for every 5th token
          out.push_back(verify::make_record("kv_cache_write", impl->name, cs, st, testing::compare(got, ref, {0, 0}, &extra)));
        }
}

// gather_pa_kv_cache: caches filled directly with random values (not through
// kv_cache_write), blocks handed out in random order; each output row must be its slot's
// row bit for bit (and its scale, int8), and the row past the output untouched.
void verify_gather(std::vector<verify::Record>& out) {
  for (const auto* impl : gather_registry().runnable())
    for (DType cd : {DType::kF32, DType::kBF16, DType::kI8}) {
      const int64_t bs = 16, row = 72, nblocks = 24, S = nblocks * bs, B = 5, max_blocks = 8;
      std::vector<int32_t> lens = {0, 5, 16, 17, 100};
      testing::Rng rng(uint64_t(cd) + 7);
      const size_t es = dtype_size(cd);
      testing::AlignedVector<uint8_t> kc(size_t(S * row) * es), vc(kc.size());
      for (int64_t i = 0; i < S * row; ++i)
        for (uint8_t* c : {kc.data(), vc.data()}) {
          const float x = rng.uniform(-2, 2);
          const uint16_t h = f32_to_bf16(x);
          if (cd == DType::kF32) std::memcpy(c + 4 * i, &x, 4);
          else if (cd == DType::kBF16) std::memcpy(c + 2 * i, &h, 2);
          else c[i] = uint8_t(int8_t(std::lround(x * 60)));
        }
      std::vector<float> ks(static_cast<size_t>(S)), vs(static_cast<size_t>(S));
      for (int64_t s = 0; s < S; ++s) ks[size_t(s)] = rng.uniform(0.01f, 1), vs[size_t(s)] = rng.uniform(0.01f, 1);
      std::vector<int32_t> ids(static_cast<size_t>(nblocks)), tables(static_cast<size_t>(B * max_blocks), -1);
      std::iota(ids.begin(), ids.end(), 0);
      for (int64_t i = nblocks - 1; i > 0; --i) std::swap(ids[size_t(i)], ids[size_t(rng.below(i + 1))]);
      for (int64_t b = 0, next = 0; b < B; ++b)
        for (int64_t j = 0; j * bs < lens[size_t(b)]; ++j) tables[size_t(b * max_blocks + j)] = ids[size_t(next++)];
      const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t(0));
      testing::AlignedVector<uint8_t> ko(size_t((total + 1) * row) * es, kSentinel), vo(ko.size(), kSentinel);
      std::vector<float> kso(size_t(total + 1), -1.0f), vso(kso.size(), -1.0f);
      const bool i8 = cd == DType::kI8;
      GatherKvParams p{.k_cache = make_view(kc.data(), cd, {S, row}), .v_cache = make_view(vc.data(), cd, {S, row}),
                       .k_scales = i8 ? make_view(ks.data(), DType::kF32, {S}) : TensorView{},
                       .v_scales = i8 ? make_view(vs.data(), DType::kF32, {S}) : TensorView{},
                       .block_tables = make_view(tables.data(), DType::kI32, {B, max_blocks}),
                       .seq_lens = make_view(lens.data(), DType::kI32, {B}), .block_size = bs,
                       .k_out = make_view(ko.data(), cd, {total, row}), .v_out = make_view(vo.data(), cd, {total, row}),
                       .k_scales_out = i8 ? make_view(kso.data(), DType::kF32, {total}) : TensorView{},
                       .v_scales_out = i8 ? make_view(vso.data(), DType::kF32, {total}) : TensorView{}};
      GatherArgs a;
      Status st = to_args(p, &a);
      if (st.ok()) st = impl->fn(a);
      std::vector<double> got, ref;
      for (int plane = 0; plane < 2; ++plane) {
        const uint8_t* c = plane ? vc.data() : kc.data();
        const uint8_t* o = plane ? vo.data() : ko.data();
        const float* sc = plane ? vs.data() : ks.data();
        const float* so = plane ? vso.data() : kso.data();
        for (int64_t b = 0, r = 0; b < B; ++b)
          for (int64_t pos = 0; pos < lens[size_t(b)]; ++pos, ++r) {
            const int64_t slot = int64_t(tables[size_t(b * max_blocks + pos / bs)]) * bs + pos % bs;
            for (int64_t i = 0; i < row; ++i) got.push_back(element(o, cd, r * row + i)), ref.push_back(element(c, cd, slot * row + i));
            if (i8) got.push_back(so[r]), ref.push_back(sc[slot]);
          }
        double changed = 0;  // the row past the output
        for (size_t b = size_t(total * row) * es; b < size_t((total + 1) * row) * es; ++b) changed += o[b] != kSentinel;
        got.push_back(changed), ref.push_back(0);
      }
      const std::string cs = std::string("cache=") + dtype_name(cd) + " B=5 lens=0,5,16,17,100 block=16 row=72";
      out.push_back(verify::make_record("gather_pa_kv_cache", impl->name, cs, st, testing::compare(got, ref, {0, 0})));
    }
}

OPTX_REGISTER_VERIFY("kv_cache_write", verify_write);
OPTX_REGISTER_VERIFY("gather_pa_kv_cache", verify_gather);
OPTX_REGISTER_VERIFY("kv_rms_norm_rope_cache", verify_mla);
OPTX_REGISTER_VERIFY("qkv_rope_cache", verify_qkv);

}  // namespace
}  // namespace optx::kv_detail
