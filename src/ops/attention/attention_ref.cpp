// Reference attention for one job: every score in double, a plain two-pass softmax, no
// blocking, no online rescaling — the definition the kernels are checked against.
#include <cmath>
#include <vector>

#include "ops/attention/attention_internal.h"

namespace optx::attn_detail {
namespace {
struct DequantRow {
  void operator()(const int8_t* x, float s, int64_t n, const void* rope, size_t rope_bytes, bool bf16, uint8_t* dst) const {
    dequant_i8_row(x, s, n, rope, rope_bytes, bf16, dst);
  }
};
double get(const void* p, bool bf16, int64_t i) {
  return bf16 ? double(bf16_to_f32(static_cast<const uint16_t*>(p)[i])) : double(static_cast<const float*>(p)[i]);
}
}  // namespace

void run_job_reference(const Config& c, const Job& j) {
  const int64_t n = j.kv_end - j.kv_begin;
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(n, 1))), o(static_cast<size_t>(c.Dv));
  for (int r = 0; r < j.nrows; ++r) {
    const Row& row = j.rows[r];
    double m = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t key = j.kv_begin + t;
      const void* k = j.kv.key(key, c.bf16, DequantRow{});
      double x = 0;
      for (int64_t d = 0; d < c.D; ++d) x += get(row.q, c.bf16, d) * get(k, c.bf16, d);
      x *= c.scale;
      if (c.softcap > 0.0f) x = c.softcap * std::tanh(x / c.softcap);
      if (row.bias) x += row.bias[key * row.bias_cs];
      if (!visible(c, row.qpos, j.offset, key) || (row.mask && row.mask[key * row.mask_cs] == 0)) x = -INFINITY;
      s[size_t(t)] = x;
      m = std::max(m, x);
    }
    if (row.sink != -INFINITY) m = std::max(m, double(row.sink));
    double l = 0;
    std::fill(o.begin(), o.end(), 0.0);
    if (m != -INFINITY) {
      for (int64_t t = 0; t < n; ++t) {
        if (s[size_t(t)] == -INFINITY) continue;
        const double p = std::exp(s[size_t(t)] - m);
        l += p;
        const void* v = j.kv.value(j.kv_begin + t, c.bf16, DequantRow{});
        for (int64_t d = 0; d < c.Dv; ++d) o[size_t(d)] += p * get(v, c.bf16, d);
      }
      if (row.sink != -INFINITY) l += std::exp(double(row.sink) - m);
    }
    const double inv = l > 0 ? 1.0 / l : 0.0;
    for (int64_t d = 0; d < c.Dv; ++d) {
      const float v = float(o[size_t(d)] * inv);
      if (c.partial) row.part_out[d] = v;
      else if (c.bf16) static_cast<uint16_t*>(row.out)[d] = f32_to_bf16(v);
      else static_cast<float*>(row.out)[d] = v;
    }
    if (row.lse) *row.lse = l > 0 ? float(m + std::log(l)) : -INFINITY;
  }
}

}  // namespace optx::attn_detail
