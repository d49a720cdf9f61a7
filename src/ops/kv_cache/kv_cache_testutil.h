// Case runners shared by kv_cache_test.cpp and `optx verify` for the fused cache writes:
// random inputs, random slots (some -1; distinct, or repeating, where the later token's
// row must win), one implementation, then every written cache row and q_out row compared
// with the definitions evaluated here in double; rows of skipped slots must stay untouched.
#pragma once

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "ops/kv_cache/kv_cache_internal.h"
#include "testing/aligned.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx::kv_detail::testutil {

struct Typed {  // storage in f32 or bf16 with exact double values
  DType dt;
  testing::AlignedVector<float> f;  // aligned: rows take the streaming-store paths
  testing::AlignedVector<uint16_t> h;
  Typed(DType d, size_t n) : dt(d), f(d == DType::kF32 ? n : 0), h(d == DType::kBF16 ? n : 0) {}
  void* data() { return dt == DType::kF32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  double get(size_t i) const { return dt == DType::kF32 ? double(f[i]) : double(bf16_to_f32(h[i])); }
  void set(size_t i, float v) {
    if (dt == DType::kF32) f[i] = v;
    else h[i] = f32_to_bf16(v);
  }
};

// Slots for T tokens in [0, num_slots), every fifth -1; distinct, or with `repeat` drawn
// independently (so slots recur, always once T exceeds num_slots).
inline std::vector<int64_t> make_slots(int64_t T, int64_t num_slots, testing::Rng& rng, bool repeat = false) {
  if (repeat) {
    std::vector<int64_t> s(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) s[size_t(t)] = t % 5 == 3 ? -1 : rng.below(num_slots);
    return s;
  }
  std::vector<int64_t> all(static_cast<size_t>(num_slots));
  for (int64_t i = 0; i < num_slots; ++i) all[size_t(i)] = i;
  for (int64_t i = num_slots - 1; i > 0; --i) std::swap(all[size_t(i)], all[size_t(rng.below(i + 1))]);
  std::vector<int64_t> s(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) s[size_t(t)] = t % 5 == 3 ? -1 : all[size_t(t)];
  return s;
}

// Whether token t is the last to name its slot (the row the cache must hold).
inline std::vector<bool> last_writers(const std::vector<int64_t>& slots, int64_t num_slots) {
  std::vector<int64_t> last(static_cast<size_t>(num_slots), -1);
  for (size_t t = 0; t < slots.size(); ++t)
    if (slots[t] >= 0) last[size_t(slots[t])] = int64_t(t);
  std::vector<bool> is_last(slots.size(), false);
  for (int64_t l : last)
    if (l >= 0) is_last[size_t(l)] = true;
  return is_last;
}

inline void rotate_ref(const double* x, const float* c, const float* s, int64_t d, RopeStyle st, double* y, double* mag) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    int64_t ia = i, ib = i + half, oa = i, ob = i + half;
    if (st == RopeStyle::kInterleaved) ia = oa = 2 * i, ib = ob = 2 * i + 1;
    if (st == RopeStyle::kInterleavedToHalf) ia = 2 * i, ib = 2 * i + 1;
    y[oa] = x[ia] * c[i] - x[ib] * s[i];
    y[ob] = x[ib] * c[i] + x[ia] * s[i];
    mag[oa] = std::fabs(x[ia] * c[i]) + std::fabs(x[ib] * s[i]);
    mag[ob] = std::fabs(x[ib] * c[i]) + std::fabs(x[ia] * s[i]);
  }
}

struct MlaCase {
  DType dtype = DType::kBF16;
  int64_t T = 5, rank = 512, rope_dim = 64, num_slots = 64;
  RopeStyle style = RopeStyle::kInterleaved;
  bool pos64 = false;
  bool i8 = false;  // i8 latent cache + scales, rope part in rope_cache
  bool repeat = false;  // slots recur (make_slots)
  std::string name() const {
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << (i8 ? " cache=i8" : "") << (repeat ? " repeat" : "") << " T=" << T << " rank=" << rank << " rope_dim=" << rope_dim
       << " slots=" << num_slots << " style=" << int(style) << " pos=" << (pos64 ? "i64" : "i32");
    return os.str();
  }
};

struct Outcome {
  Status status;
  testing::CompareResult cmp;
};

inline Outcome run_mla(const dispatch::Impl<MlaFn>& impl, const MlaCase& c, uint64_t seed = 1) {
  testing::Rng rng(seed);
  const int64_t W = c.rank + c.rope_dim;
  RopeTable table;
  YarnScaling y;
  y.factor = 40, y.original_max_position_embeddings = 64, y.mscale = 0.707, y.mscale_all_dim = 0.707;
  Outcome o;
  o.status = RopeTable::build({.rotary_dim = c.rope_dim, .max_positions = 300, .yarn = y}, &table);
  if (!o.status.ok()) return o;
  // Float caches: rows of W; an i8 latent: codes [slots, rank] + scales, the rope part in
  // rope_cache [slots, rope_dim] (Typed `cache` then holds only that).
  const int64_t CW = c.i8 ? c.rope_dim : W, RO = c.i8 ? 0 : c.rank;  // rope part: row width and offset in `cache`
  Typed kv(c.dtype, size_t(std::max<int64_t>(c.T * W, 1))), w(c.dtype, size_t(c.rank)),
      cache(c.dtype, size_t(c.num_slots * CW));
  std::vector<int8_t> codes(c.i8 ? size_t(c.num_slots * c.rank) : 0, int8_t(99));
  std::vector<float> scales(c.i8 ? size_t(c.num_slots) : 0, 1024.0f);
  for (size_t i = 0; i < kv.f.size() + kv.h.size(); ++i) kv.set(i, rng.uniform(-3.0f, 3.0f));
  for (int64_t i = 0; i < c.rank; ++i) w.set(size_t(i), rng.uniform(0.5f, 1.5f));
  for (size_t i = 0; i < cache.f.size() + cache.h.size(); ++i) cache.set(i, 1024.0f);  // sentinel
  const std::vector<int64_t> slots = make_slots(c.T, c.num_slots, rng, c.repeat);
  const std::vector<bool> is_last = last_writers(slots, c.num_slots);
  std::vector<int32_t> s32(slots.begin(), slots.end()), p32(static_cast<size_t>(std::max<int64_t>(c.T, 1)));
  std::vector<int64_t> p64(p32.size());
  for (int64_t t = 0; t < c.T; ++t) p64[size_t(t)] = p32[size_t(t)] = int32_t(rng.below(300));
  KvRmsNormRopeCacheParams p{.kv = make_view(kv.data(), c.dtype, {c.T, W}), .weight = make_view(w.data(), c.dtype, {c.rank}),
                             .positions = c.pos64 ? make_view(p64.data(), DType::kI64, {c.T}) : make_view(p32.data(), DType::kI32, {c.T}),
                             .cos = table.cos(), .sin = table.sin(),
                             .slots = c.pos64 ? make_view(const_cast<int64_t*>(slots.data()), DType::kI64, {c.T})
                                              : make_view(s32.data(), DType::kI32, {c.T}),
                             .cache = make_view(cache.data(), c.dtype, {c.num_slots, W}), .kv_lora_rank = c.rank,
                             .style = c.style};
  if (c.i8) {
    p.cache = make_view(codes.data(), DType::kI8, {c.num_slots, c.rank});
    p.cache_scales = make_view(scales.data(), DType::kF32, {c.num_slots});
    p.rope_cache = make_view(cache.data(), c.dtype, {c.num_slots, c.rope_dim});
  }
  MlaArgs a;
  o.status = to_args(p, &a);
  if (!o.status.ok()) return o;
  o.status = impl.fn(a);
  if (!o.status.ok()) return o;

  std::vector<double> got, ref, extra;
  const double u = testing::kEpsF32, ub = c.dtype == DType::kBF16 ? testing::kEpsBF16 : 0.0;
  std::vector<bool> written(static_cast<size_t>(c.num_slots), false);
  std::vector<double> x(static_cast<size_t>(c.rope_dim)), yv(x.size()), mag(x.size());
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t slot = slots[size_t(t)];
    if (!is_last[size_t(t)]) continue;
    written[size_t(slot)] = true;
    double ss = 0;
    for (int64_t i = 0; i < c.rank; ++i) ss += kv.get(size_t(t * W + i)) * kv.get(size_t(t * W + i));
    const double inv = 1.0 / std::sqrt(ss / double(c.rank) + 1e-6);
    const double sc = c.i8 ? double(scales[size_t(slot)]) : 0.0;
    for (int64_t i = 0; i < c.rank; ++i) {
      const double v = kv.get(size_t(t * W + i)) * inv * w.get(size_t(i));
      ref.push_back(v);
      // i8: codes round the (dtype-rounded) value to the nearest step of the row's scale
      extra.push_back(std::fabs(v) * (double(c.rank + 8) * u + ub) + (c.i8 ? 0.5 * sc * (1 + 1e-6) : 0.0));
      got.push_back(c.i8 ? codes[size_t(slot * c.rank + i)] * sc : cache.get(size_t(slot * W + i)));
    }
    const int64_t pos = p64[size_t(t)], half = c.rope_dim / 2;
    for (int64_t i = 0; i < c.rope_dim; ++i) x[size_t(i)] = kv.get(size_t(t * W + c.rank + i));
    rotate_ref(x.data(), static_cast<const float*>(table.cos().data) + pos * half,
               static_cast<const float*>(table.sin().data) + pos * half, c.rope_dim, c.style, yv.data(), mag.data());
    for (int64_t i = 0; i < c.rope_dim; ++i) {
      ref.push_back(yv[size_t(i)]);
      extra.push_back(2 * u * mag[size_t(i)] + ub * std::fabs(yv[size_t(i)]));
      got.push_back(cache.get(size_t(slot * CW + RO + i)));
    }
  }
  for (int64_t s = 0; s < c.num_slots; ++s)
    if (!written[size_t(s)])
      for (int64_t i = 0; i < CW; ++i)
        if (cache.get(size_t(s * CW + i)) != 1024.0 || (c.i8 && (scales[size_t(s)] != 1024.0f ||
                                                                 std::any_of(codes.begin() + s * c.rank, codes.begin() + (s + 1) * c.rank,
                                                                             [](int8_t v) { return v != 99; })))) {
          o.cmp.pass = false;
          o.cmp.message = "slot " + std::to_string(s) + " was written but no token maps to it";
          return o;
        }
  o.cmp = testing::compare(got, ref, testing::Tolerance{1e-6, 0.0}, &extra);
  return o;
}

struct QkvCase {
  DType dtype = DType::kBF16;
  int64_t T = 5, hq = 4, hkv = 2, d = 64, rotary_dim = 0, num_slots = 32;
  RopeStyle style = RopeStyle::kHalf;
  bool stream_q = false;  // non-temporal stores for q_out (by default only for >= simd::kStreamMinBytes)
  bool pos64 = false;     // i64 positions (and i32 slots) instead of i32 positions and i64 slots
  bool repeat = false;    // slots recur (make_slots)
  std::string name() const {
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << (repeat ? " repeat" : "") << " T=" << T << " Hq=" << hq << " Hkv=" << hkv << " D=" << d
       << " rotary_dim=" << (rotary_dim ? rotary_dim : d) << " slots=" << num_slots << " style=" << int(style)
       << " stream_q=" << stream_q << " pos=" << (pos64 ? "i64" : "i32");
    return os.str();
  }
};

inline Outcome run_qkv(const dispatch::Impl<QkvFn>& impl, const QkvCase& c, uint64_t seed = 1) {
  testing::Rng rng(seed);
  const int64_t rd = c.rotary_dim ? c.rotary_dim : c.d, W = (c.hq + 2 * c.hkv) * c.d, kvw = c.hkv * c.d;
  RopeTable table;
  Outcome o;
  o.status = RopeTable::build({.rotary_dim = rd, .max_positions = 500}, &table);
  if (!o.status.ok()) return o;
  Typed qkv(c.dtype, size_t(std::max<int64_t>(c.T * W, 1))), kc(c.dtype, size_t(c.num_slots * kvw)),
      vc(c.dtype, size_t(c.num_slots * kvw)), q(c.dtype, size_t(std::max<int64_t>(c.T * c.hq * c.d, 1)));
  for (size_t i = 0; i < qkv.f.size() + qkv.h.size(); ++i) qkv.set(i, rng.uniform(-2.0f, 2.0f));
  for (size_t i = 0; i < kc.f.size() + kc.h.size(); ++i) kc.set(i, 512.0f), vc.set(i, 512.0f);  // sentinels exact in bf16
  for (size_t i = 0; i < q.f.size() + q.h.size(); ++i) q.set(i, NAN);
  const std::vector<int64_t> slots = make_slots(c.T, c.num_slots, rng, c.repeat);
  const std::vector<bool> is_last = last_writers(slots, c.num_slots);
  std::vector<int32_t> pos(static_cast<size_t>(std::max<int64_t>(c.T, 1))), s32(slots.begin(), slots.end());
  for (int64_t t = 0; t < c.T; ++t) pos[size_t(t)] = int32_t(rng.below(500));
  std::vector<int64_t> p64(pos.begin(), pos.end());
  QkvRopeCacheParams p{.qkv = make_view(qkv.data(), c.dtype, {c.T, W}), .q_heads = c.hq, .kv_heads = c.hkv, .head_dim = c.d,
                       .positions = c.pos64 ? make_view(p64.data(), DType::kI64, {c.T}) : make_view(pos.data(), DType::kI32, {c.T}),
                       .cos = table.cos(), .sin = table.sin(), .rotary_dim = c.rotary_dim, .style = c.style,
                       .slots = c.pos64 ? make_view(s32.data(), DType::kI32, {c.T})
                                        : make_view(const_cast<int64_t*>(slots.data()), DType::kI64, {c.T}),
                       .k_cache = make_view(kc.data(), c.dtype, {c.num_slots, kvw}),
                       .v_cache = make_view(vc.data(), c.dtype, {c.num_slots, kvw}),
                       .q_out = make_view(q.data(), c.dtype, {c.T, c.hq, c.d})};
  QkvArgs a;
  o.status = to_args(p, &a);
  if (!o.status.ok()) return o;
  a.stream_q = a.stream_q || c.stream_q;
  o.status = impl.fn(a);
  if (!o.status.ok()) return o;

  std::vector<double> got, ref, extra;
  const double u = testing::kEpsF32, ub = c.dtype == DType::kBF16 ? testing::kEpsBF16 : 0.0;
  std::vector<double> x(static_cast<size_t>(c.d)), y(x.size()), mag(x.size());
  auto head = [&](int64_t src, bool rot, const Typed& out, int64_t dst, int64_t p_) {
    for (int64_t i = 0; i < c.d; ++i) x[size_t(i)] = y[size_t(i)] = qkv.get(size_t(src + i)), mag[size_t(i)] = 0;
    if (rot)
      rotate_ref(x.data(), static_cast<const float*>(table.cos().data) + p_ * (rd / 2),
                 static_cast<const float*>(table.sin().data) + p_ * (rd / 2), rd, c.style, y.data(), mag.data());
    for (int64_t i = 0; i < c.d; ++i) {
      ref.push_back(y[size_t(i)]);
      extra.push_back(2 * u * mag[size_t(i)] + ub * std::fabs(y[size_t(i)]));
      got.push_back(out.get(size_t(dst + i)));
    }
  };
  std::vector<bool> written(static_cast<size_t>(c.num_slots), false);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < c.hq; ++h) head(t * W + h * c.d, true, q, (t * c.hq + h) * c.d, pos[size_t(t)]);
    const int64_t slot = slots[size_t(t)];
    if (!is_last[size_t(t)]) continue;
    written[size_t(slot)] = true;
    for (int64_t h = 0; h < c.hkv; ++h) {
      head(t * W + (c.hq + h) * c.d, true, kc, slot * kvw + h * c.d, pos[size_t(t)]);
      head(t * W + (c.hq + c.hkv + h) * c.d, false, vc, slot * kvw + h * c.d, pos[size_t(t)]);
    }
  }
  for (int64_t s = 0; s < c.num_slots; ++s)
    if (!written[size_t(s)])
      for (int64_t i = 0; i < kvw; ++i)
        if (kc.get(size_t(s * kvw + i)) != 512.0 || vc.get(size_t(s * kvw + i)) != 512.0) {
          o.cmp.pass = false;
          o.cmp.message = "slot " + std::to_string(s) + " was written but no token maps to it";
          return o;
        }
  o.cmp = testing::compare(got, ref, testing::Tolerance{0.0, 0.0}, &extra);
  return o;
}

}  // namespace optx::kv_detail::testutil
