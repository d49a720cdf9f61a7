// References for the kv_cache family: the definitions, one element at a time, statistics
// and rotations in double. kv_cache_write and gather_pa_kv_cache move bytes, so their
// reference is a plain per-token copy (and the shared i8 quantiser).
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/kv_cache/kv_cache_internal.h"

namespace optx::kv_detail {
namespace {
double get(const void* base, bool bf16, int64_t i) {
  return bf16 ? double(bf16_to_f32(static_cast<const uint16_t*>(base)[i])) : double(static_cast<const float*>(base)[i]);
}
void put(void* base, bool bf16, int64_t i, double v) {
  if (bf16) static_cast<uint16_t*>(base)[i] = f32_to_bf16(float(v));
  else static_cast<float*>(base)[i] = float(v);
}
// Rotates x[0..d) (double) per the style into y.
void rotate(const double* x, const float* c, const float* s, int64_t d, RopeStyle style, double* y) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    int64_t ia = i, ib = i + half, oa = i, ob = i + half;
    if (style == RopeStyle::kInterleaved) ia = oa = 2 * i, ib = ob = 2 * i + 1;
    if (style == RopeStyle::kInterleavedToHalf) ia = 2 * i, ib = 2 * i + 1;
    y[oa] = x[ia] * c[i] - x[ib] * s[i];
    y[ob] = x[ib] * c[i] + x[ia] * s[i];
  }
}
}  // namespace

Status write_reference(const WriteArgs& a) {
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t slot = a.slot(t);
    if (slot < 0) continue;
    for (int w = 0; w < 2; ++w) {
      const Plane& src = w ? a.v : a.k;
      const Plane& dst = w ? a.v_cache : a.k_cache;
      if (!src.base) continue;
      const bool bf = src.dtype == DType::kBF16;
      if (dst.dtype == DType::kI8) {
        std::vector<float> row(static_cast<size_t>(a.row));
        for (int64_t i = 0; i < a.row; ++i) row[size_t(i)] = float(get(src.base, bf, t * src.ld + i));
        quantize_row_i8(row.data(), a.row, static_cast<int8_t*>(dst.base) + slot * dst.ld, dst.scales + slot);
      } else {
        for (int64_t i = 0; i < a.row; ++i) put(dst.base, bf, slot * dst.ld + i, get(src.base, bf, t * src.ld + i));
      }
    }
  }
  return Status::Ok();
}

Status gather_reference(const GatherArgs& a) {
  int64_t r = 0;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t p = 0; p < a.seq_lens[b]; ++p, ++r) {
      const int64_t slot = int64_t(a.block_tables[b * a.max_blocks + p / a.block_size]) * a.block_size + p % a.block_size;
      for (int w = 0; w < 2; ++w) {
        const Plane& c = w ? a.v_cache : a.k_cache;
        const Plane& o = w ? a.v_out : a.k_out;
        if (!c.base) continue;
        const size_t es = dtype_size(c.dtype);
        for (int64_t i = 0; i < a.row; ++i)
          std::memcpy(static_cast<uint8_t*>(o.base) + size_t(r * o.ld + i) * es,
                      static_cast<const uint8_t*>(c.base) + size_t(slot * c.ld + i) * es, es);
        if (c.scales) o.scales[r] = c.scales[slot];
      }
    }
  return Status::Ok();
}

Status mla_reference(const MlaArgs& a) {
  std::vector<double> x(static_cast<size_t>(a.rope_dim)), y(static_cast<size_t>(a.rope_dim));
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t slot = a.slot(t);
    if (slot < 0) continue;
    const int64_t src = t * a.ldkv, dst = slot * a.ldc;
    double ss = 0;
    for (int64_t i = 0; i < a.rank; ++i) ss += get(a.kv, a.bf16, src + i) * get(a.kv, a.bf16, src + i);
    const double inv = 1.0 / std::sqrt(ss / double(a.rank) + double(a.eps));
    if (a.i8) {  // the normalised row, rounded to kv's dtype, then the shared quantiser
      std::vector<float> lat(static_cast<size_t>(a.rank));
      for (int64_t i = 0; i < a.rank; ++i) {
        const float v = float(get(a.kv, a.bf16, src + i) * inv * get(a.weight, a.bf16, i));
        lat[size_t(i)] = a.bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
      }
      quantize_row_i8(lat.data(), a.rank, static_cast<int8_t*>(a.cache) + dst, a.scales + slot);
    } else {
      for (int64_t i = 0; i < a.rank; ++i)
        put(a.cache, a.bf16, dst + i, get(a.kv, a.bf16, src + i) * inv * get(a.weight, a.bf16, i));
    }
    const int64_t pos = a.rope.position(t);
    for (int64_t i = 0; i < a.rope_dim; ++i) x[size_t(i)] = get(a.kv, a.bf16, src + a.rank + i);
    rotate(x.data(), a.rope.cos + pos * a.rope.cs_stride, a.rope.sin + pos * a.rope.cs_stride, a.rope_dim, a.rope.style, y.data());
    void* rbase = a.i8 ? a.rope_cache : a.cache;
    const int64_t roff = a.i8 ? slot * a.ldr : dst + a.rank;
    for (int64_t i = 0; i < a.rope_dim; ++i) put(rbase, a.bf16, roff + i, y[size_t(i)]);
  }
  return Status::Ok();
}

Status qkv_reference(const QkvArgs& a) {
  const int64_t rd = a.rope.rotary_dim;
  std::vector<double> x(static_cast<size_t>(a.d)), y(static_cast<size_t>(a.d));
  auto head = [&](int64_t src, void* dst_base, int64_t dst, bool rot, const float* c, const float* s) {
    for (int64_t i = 0; i < a.d; ++i) x[size_t(i)] = y[size_t(i)] = get(a.qkv, a.bf16, src + i);
    if (rot) rotate(x.data(), c, s, rd, a.rope.style, y.data());
    for (int64_t i = 0; i < a.d; ++i) put(dst_base, a.bf16, dst + i, y[size_t(i)]);
  };
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t pos = a.rope.position(t), src = t * a.ldqkv;
    const float* c = a.rope.cos + pos * a.rope.cs_stride;
    const float* s = a.rope.sin + pos * a.rope.cs_stride;
    for (int64_t h = 0; h < a.hq; ++h) head(src + h * a.d, a.q_out, t * a.ldq_t + h * a.ldq_h, true, c, s);
    const int64_t slot = a.slot(t);
    if (slot < 0) continue;
    for (int64_t h = 0; h < a.hkv; ++h) {
      head(src + (a.hq + h) * a.d, a.k_cache, slot * a.ldk + h * a.d, true, c, s);
      head(src + (a.hq + a.hkv + h) * a.d, a.v_cache, slot * a.ldv + h * a.d, false, c, s);
    }
  }
  return Status::Ok();
}

}  // namespace optx::kv_detail
