// Case runners shared by attention_test.cpp and `optx verify`: logical q/k/v made here,
// stored in the case's layout, run through one implementation, and compared with a naive
// double-precision softmax(q k^T) v computed here from the logical arrays.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "ops/attention/attention_internal.h"
#include "testing/compare.h"
#include "testing/rng.h"

namespace optx::attn_detail::testutil {

struct Outcome {
  Status status;
  testing::CompareResult out, lse;
  std::vector<double> got_out, got_lse;  // what was compared, in logical order (tests compare two runs)
  size_t ws_bytes = 0;                    // the workspace the op asked for (a KV split adds its partials)
  bool pass() const { return status.ok() && out.pass && lse.pass; }
  std::string message() const { return !status.ok() ? status.message() : !out.pass ? "out: " + out.message : "lse: " + lse.message; }
};

// Storage in f32 or bf16; values() holds what the kernel sees.
struct Buf {
  DType dt;
  std::vector<float> f;
  std::vector<uint16_t> h;
  Buf(DType d, size_t n) : dt(d), f(d == DType::kF32 ? n : 0), h(d == DType::kBF16 ? n : 0) {}
  void* data() { return dt == DType::kF32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  void set(size_t i, float v) {
    if (dt == DType::kF32) f[i] = v;
    else h[i] = f32_to_bf16(v);
  }
  double get(size_t i) const { return dt == DType::kF32 ? double(f[i]) : double(bf16_to_f32(h[i])); }
  uint32_t bits(size_t i) const {
    uint32_t u = 0;
    if (dt == DType::kF32) std::memcpy(&u, &f[i], 4);
    else u = h[i];
    return u;
  }
};

// A tensor stored packed, or padded: `inner` spare elements after every row of the last
// dimension and `outer` after every slice of each dimension above that, so the views'
// strides in the dims above D (heads and tokens, in either order, and the batch) exceed
// their packed sizes. Values are set by logical (packed) index, so a padded and a packed
// tensor filled from the same Rng hold the same values. The padding holds a sentinel the
// op must leave alone (check_padding).
struct Stored {
  static constexpr float kSentinel = 1234.5f;
  int rank = 0;
  int64_t sizes[kMaxRank] = {}, strides[kMaxRank] = {};
  int64_t numel = 1;
  Buf buf;
  Stored(DType dt, std::initializer_list<int64_t> sz, int64_t inner = 0, int64_t outer = 0) : buf(dt, 0) {
    for (int64_t x : sz) sizes[rank++] = x;
    strides[rank - 1] = 1;
    for (int d = rank - 2; d >= 0; --d) strides[d] = sizes[d + 1] * strides[d + 1] + (d == rank - 2 ? inner : outer);
    for (int d = 0; d < rank; ++d) numel *= sizes[d];
    buf = Buf(dt, size_t(std::max<int64_t>(sizes[0] * strides[0], 1)));  // trailing padding included
    for (size_t i = 0; i < buf.f.size() + buf.h.size(); ++i) buf.set(i, kSentinel);
  }
  // Element offset of logical (packed) index n.
  int64_t offset(int64_t n) const {
    int64_t o = 0;
    for (int d = rank - 1; d >= 0; --d) o += (n % sizes[d]) * strides[d], n /= sizes[d];
    return o;
  }
  // Sets every logical element, in packed order, to f().
  template <class F>
  void fill(F&& f) {
    for (int64_t n = 0; n < numel; ++n) buf.set(size_t(offset(n)), f());
  }
  double get(int64_t off) const { return buf.get(size_t(off)); }
  TensorView view() {
    TensorView t;
    t.data = buf.data(), t.dtype = buf.dt, t.rank = rank;
    std::copy(sizes, sizes + rank, t.sizes);
    std::copy(strides, strides + rank, t.strides);
    return t;
  }
  // "" if every element outside the logical tensor still holds the sentinel.
  std::string check_padding(const char* name) const {
    std::vector<bool> logical(buf.f.size() + buf.h.size(), false);
    for (int64_t n = 0; n < numel; ++n) logical[size_t(offset(n))] = true;
    Buf s(buf.dt, 1);
    s.set(0, kSentinel);
    for (size_t i = 0; i < logical.size(); ++i)
      if (!logical[i] && buf.bits(i) != s.bits(0))
        return std::string(name) + " padding element at offset " + std::to_string(i) + " was overwritten with " + std::to_string(buf.get(i));
    return "";
  }
};

// Marks a comparison failed with msg, unless it already failed (its message names the
// worst coordinate, which says more).
inline void fail_with(testing::CompareResult& r, const std::string& msg) {
  if (msg.empty() || !r.pass) return;
  r.pass = false;
  r.message = msg;
}

// x rounded to bf16 (through f32, to nearest even), as a bf16 tensor would store it.
inline double bf16_round(double x) { return double(bf16_to_f32(f32_to_bf16(float(x)))); }

// Naive attention for one query row over keys 0..Skv): returns lse, fills out. With
// bf16_steps it is the naive same-precision computation of the FlashAttention accuracy
// rule — what an eager bf16 framework computes: the scores stored in bf16 after each
// step (q.k, scale, softcap, bias), the softmax output stored in bf16, P.V accumulated
// wide and stored in bf16. Without it, everything stays in double: the reference.
struct RowRef {
  double lse;
  std::vector<double> out;
};
template <class QF, class KF, class VF, class Vis>
RowRef naive_row(int64_t D, int64_t Dv, int64_t Skv, double scale, double softcap, double sink, QF q, KF k, VF v, Vis visible_bias,
                 bool bf16_steps = false) {
  const auto st = [&](double x) { return bf16_steps ? bf16_round(x) : x; };
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(Skv, 1)));
  double m = -INFINITY;
  for (int64_t j = 0; j < Skv; ++j) {
    // Visibility first: hidden keys skip the dot product (long windowed cases stay cheap).
    double bias = 0;
    if (!visible_bias(j, &bias)) {
      s[size_t(j)] = -INFINITY;
      continue;
    }
    double x = 0;
    for (int64_t d = 0; d < D; ++d) x += q(d) * k(j, d);
    x = st(st(x) * scale);
    if (softcap > 0) x = st(softcap * std::tanh(x / softcap));
    x = st(x + bias);
    s[size_t(j)] = x;
    m = std::max(m, x);
  }
  if (sink != -INFINITY) m = std::max(m, sink);
  RowRef r{-INFINITY, std::vector<double>(static_cast<size_t>(Dv), 0.0)};
  if (m == -INFINITY) return r;
  double l = sink != -INFINITY ? std::exp(sink - m) : 0.0;
  for (int64_t j = 0; j < Skv; ++j)
    if (s[size_t(j)] != -INFINITY) l += std::exp(s[size_t(j)] - m);
  for (int64_t j = 0; j < Skv; ++j) {
    if (s[size_t(j)] == -INFINITY) continue;
    const double p = st(std::exp(s[size_t(j)] - m) / l);  // the softmax output, as stored
    for (int64_t d = 0; d < Dv; ++d) r.out[size_t(d)] += p * v(j, d);
  }
  for (auto& o : r.out) o = st(o);
  r.lse = m + std::log(l);
  return r;
}

// Tolerances. f32 accumulates in f32 with a polynomial exp (rel. error 2e-7) over up to
// 4097 keys: 1e-5 of max|ref| plus 1e-4 relative. bf16 follows the FlashAttention rule:
// the largest error against the double reference within twice the largest error of the
// naive same-precision computation (`naive`: naive_row with bf16_steps, same inputs) plus
// a floor of 1e-3 of max|ref| (a case whose naive rounding happens to be exact, e.g. one
// visible key, still allows the kernel's own P rounding). extra: per-element allowance
// on top (i8 caches: twice the error of rounding their dequantised values to bf16).
inline testing::CompareResult compare_out(const std::vector<double>& got, const std::vector<double>& ref,
                                          const std::vector<double>* naive, const std::vector<double>* extra = nullptr) {
  double mx = 0, naive_err = 0;
  for (double r : ref) mx = std::max(mx, std::fabs(r));
  if (naive)
    for (size_t i = 0; i < ref.size(); ++i)
      if (std::isfinite(ref[i])) naive_err = std::max(naive_err, std::fabs((*naive)[i] - ref[i]));
  const testing::Tolerance tol = naive ? testing::Tolerance{2.0 * naive_err + 1e-3 * mx + 1e-6, 0.0}
                                       : testing::Tolerance{1e-5 * mx + 1e-6, 1e-4};
  return testing::compare(got, ref, tol, extra);
}
inline testing::CompareResult compare_lse(const std::vector<double>& got, const std::vector<double>& ref,
                                          const std::vector<double>* extra = nullptr) {
  return testing::compare(got, ref, testing::Tolerance{2e-4, 1e-5}, extra);
}

// attention_update's definition in double: out[r] = sum_i e^(lse_i - m) outs[i][r] /
// sum_i e^(lse_i - m), lse[r] = m + log(sum); partials with lse -inf (their outs may hold
// anything) are skipped, a row with none gives 0 and -inf. outs [P, R, Dv], lses [P, R].
inline void merge_ref(const std::vector<float>& outs, const std::vector<float>& lses, int64_t P, int64_t R, int64_t Dv,
                      std::vector<double>& out, std::vector<double>& lse) {
  out.assign(size_t(R * Dv), 0.0), lse.assign(size_t(R), -INFINITY);
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY, sum = 0;
    for (int64_t i = 0; i < P; ++i) m = std::max(m, double(lses[size_t(i * R + r)]));
    for (int64_t i = 0; i < P && m > -INFINITY; ++i) {
      const double l = lses[size_t(i * R + r)];
      if (l == -INFINITY) continue;
      const double w = std::exp(l - m);
      sum += w;
      for (int64_t x = 0; x < Dv; ++x) out[size_t(r * Dv + x)] += w * double(outs[size_t((i * R + r) * Dv + x)]);
    }
    if (sum == 0) continue;
    for (int64_t x = 0; x < Dv; ++x) out[size_t(r * Dv + x)] /= sum;
    lse[size_t(r)] = m + std::log(sum);
  }
}
// The merge is a weighted average in f32, then (bf16) one round-to-nearest: the unit
// round-off times |ref| (at least RNE's half ulp; a truncating store's errors, up to an
// ulp, do not fit) — not flash attention's tolerance.
inline testing::CompareResult compare_merged(const std::vector<double>& got, const std::vector<double>& ref, bool bf16) {
  const double eps = bf16 ? testing::kEpsBF16 + 4 * testing::kEpsF32 : 4 * testing::kEpsF32;
  return testing::compare(got, ref, {1e-6, eps});
}

struct FlashCase {
  DType dtype = DType::kF32;
  AttnLayout layout = AttnLayout::kBSND;
  int64_t B = 1, Sq = 17, Skv = 17, Nq = 4, Nkv = 2, D = 64, Dv = 64;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  bool mask = false, bias = false, sinks = false;
  // Broadcast shapes: mask [B|1, Nq|1, Sq, Skv] and bias likewise (true: the full dim).
  bool mask_b = true, mask_h = false, bias_b = false, bias_h = true;
  bool bias_inf = false;  // bias -inf at about one entry in four and the whole of row 1 of the first slice (an additive mask)
  int64_t mask_band = 0;  // > 0: the mask shows each row the keys within mask_band of its diagonal, nothing else
  bool strided = false;  // q, k, v, out padded (Stored), each with its own padding
  bool lse = true;       // false: no lse output (an empty view)
  float softcap = 0.0f, scale = 0.0f, magnitude = 1.0f;
  std::vector<int32_t> lens_q, lens_kv;  // TND only
  std::string name() const {
    static const char* ls[] = {"BSND", "BNSD", "TND"};
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << " layout=" << ls[int(layout)] << " B=" << B << " Sq=" << Sq << " Skv=" << Skv << " Nq=" << Nq
       << " Nkv=" << Nkv << " D=" << D << " Dv=" << Dv << " causal=" << causal << " window=" << wl << "," << wr << " mask=" << mask
       << " bias=" << bias << " sinks=" << sinks << " softcap=" << softcap << " mag=" << magnitude;
    // Only when not the default, so verify's row names stay as they were.
    if (mask) os << " mask_shape=" << (mask_b ? "B" : "1") << "," << (mask_h ? "N" : "1");
    if (mask_band > 0) os << " mask_band=" << mask_band;
    if (bias_inf) os << " bias_inf";
    if (bias) os << " bias_shape=" << (bias_b ? "B" : "1") << "," << (bias_h ? "N" : "1");
    if (scale != 0.0f) os << " scale=" << scale;
    if (strided) os << " strided";
    if (!lse) os << " no_lse";
    if (layout == AttnLayout::kTND) {
      os << " lens=";
      for (size_t i = 0; i < lens_q.size(); ++i) os << (i ? "/" : "") << lens_q[i] << ":" << lens_kv[i];
    }
    return os.str();
  }
};

// Runs one case and compares out and lse with naive_row. Beyond the tolerances: a row with
// no visible key must be exactly 0 (lse -inf without a sink), and with c.strided the
// padding of out must keep its sentinel.
inline Outcome run_flash(const dispatch::Impl<KernelsFn>& impl, const FlashCase& c, uint64_t seed = 1) {
  testing::Rng rng(seed);
  const bool tnd = c.layout == AttnLayout::kTND;
  const int64_t B = tnd ? int64_t(c.lens_q.size()) : c.B;
  std::vector<int32_t> cu_q(size_t(B) + 1, 0), cu_kv(size_t(B) + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    cu_q[size_t(b + 1)] = cu_q[size_t(b)] + (tnd ? c.lens_q[size_t(b)] : int32_t(c.Sq));
    cu_kv[size_t(b + 1)] = cu_kv[size_t(b)] + (tnd ? c.lens_kv[size_t(b)] : int32_t(c.Skv));
  }
  const int64_t Tq = cu_q[size_t(B)], Tkv = cu_kv[size_t(B)];
  // Each tensor in the case's layout; with c.strided padded, each differently so that a
  // kernel using one tensor's strides for another fails.
  auto make = [&](int64_t N, int64_t S, int64_t Dd, int64_t T, int64_t inner, int64_t outer) {
    if (!c.strided) inner = outer = 0;
    if (tnd) return Stored(c.dtype, {T, N, Dd}, inner, outer);
    if (c.layout == AttnLayout::kBSND) return Stored(c.dtype, {B, S, N, Dd}, inner, outer);
    return Stored(c.dtype, {B, N, S, Dd}, inner, outer);
  };
  Stored q = make(c.Nq, c.Sq, c.D, Tq, 3, 5), k = make(c.Nkv, c.Skv, c.D, Tkv, 1, 7), v = make(c.Nkv, c.Skv, c.Dv, Tkv, 6, 2),
         out = make(c.Nq, c.Sq, c.Dv, Tq, 2, 9);
  // Element offset of (sequence b, position pos, head h) in t.
  auto off = [&](const Stored& t, bool isq, int64_t b, int64_t pos, int64_t h) -> int64_t {
    if (tnd) return ((isq ? cu_q : cu_kv)[size_t(b)] + pos) * t.strides[0] + h * t.strides[1];
    if (c.layout == AttnLayout::kBSND) return b * t.strides[0] + pos * t.strides[1] + h * t.strides[2];
    return b * t.strides[0] + h * t.strides[1] + pos * t.strides[2];
  };
  q.fill([&] { return c.magnitude * rng.uniform(); });
  k.fill([&] { return rng.uniform(); });
  v.fill([&] { return rng.uniform(); });
  out.fill([] { return NAN; });  // poisoned
  std::vector<float> lse(size_t(std::max<int64_t>(tnd ? c.Nq * Tq : B * c.Nq * c.Sq, 1)), NAN);
  std::vector<int8_t> mask;
  std::vector<float> bias, sinks;
  const int64_t mB = c.mask_b ? B : 1, mN = c.mask_h ? c.Nq : 1, bB = c.bias_b ? B : 1, bN = c.bias_h ? c.Nq : 1;
  if (c.mask) {  // roughly one key in five hidden, plus the whole of row 0 of the first slice
    mask.resize(size_t(mB * mN * c.Sq * c.Skv));
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = rng.below(5) != 0;
    for (int64_t j = 0; j < c.Skv; ++j) mask[size_t(j)] = 0;
    if (c.mask_band > 0)
      for (size_t i = 0; i < mask.size(); ++i) {
        const int64_t row = int64_t(i) / c.Skv % c.Sq, key = int64_t(i) % c.Skv, d = row + c.Skv - c.Sq - key;
        mask[i] = d > -c.mask_band && d < c.mask_band;
      }
  }
  if (c.bias) {
    bias.resize(size_t(bB * bN * c.Sq * c.Skv));
    for (auto& x : bias) x = rng.uniform(-2, 2);
    if (c.bias_inf) {
      for (auto& x : bias)
        if (rng.below(4) == 0) x = -INFINITY;
      for (int64_t j = 0; j < c.Skv && c.Sq > 1; ++j) bias[size_t(c.Skv + j)] = -INFINITY;
    }
  }
  if (c.sinks) {
    sinks.resize(size_t(c.Nq));
    for (auto& x : sinks) x = rng.uniform(-1, 3);
  }
  FlashAttentionParams p;
  p.layout = c.layout;
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.out = out.view();
  if (c.lse) p.lse = tnd ? make_view(lse.data(), DType::kF32, {c.Nq, Tq}) : make_view(lse.data(), DType::kF32, {B, c.Nq, c.Sq});
  if (tnd) {
    p.cu_seqlens_q = make_view(cu_q.data(), DType::kI32, {B + 1});
    p.cu_seqlens_kv = make_view(cu_kv.data(), DType::kI32, {B + 1});
  }
  p.scale = c.scale;
  p.causal = c.causal;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.softcap = c.softcap;
  if (c.mask) p.mask = make_view(mask.data(), DType::kI8, {mB, mN, c.Sq, c.Skv});
  if (c.bias) p.bias = make_view(bias.data(), DType::kF32, {bB, bN, c.Sq, c.Skv});
  // With c.strided, mask and bias are every other element of buffers twice as long, the
  // others poison (0 hides a key, NaN spoils a score): a kernel assuming unit column
  // strides fails.
  std::vector<int8_t> mask2;
  std::vector<float> bias2;
  if (c.strided && c.mask) {
    mask2.assign(2 * mask.size(), 0);
    for (size_t i = 0; i < mask.size(); ++i) mask2[2 * i] = mask[i];
    p.mask = make_view(mask2.data(), DType::kI8, {mB, mN, c.Sq, c.Skv}, {2 * mN * c.Sq * c.Skv, 2 * c.Sq * c.Skv, 2 * c.Skv, 2});
  }
  if (c.strided && c.bias) {
    bias2.assign(2 * bias.size(), NAN);
    for (size_t i = 0; i < bias.size(); ++i) bias2[2 * i] = bias[i];
    p.bias = make_view(bias2.data(), DType::kF32, {bB, bN, c.Sq, c.Skv}, {2 * bN * c.Sq * c.Skv, 2 * c.Sq * c.Skv, 2 * c.Skv, 2});
  }
  if (c.sinks) p.sinks = make_view(sinks.data(), DType::kF32, {c.Nq});
  Outcome o;
  std::vector<uint8_t> ws(o.ws_bytes = flash_attention_workspace_size(p));
  o.status = flash_run(impl.fn(), p, {ws.data(), ws.size()});
  if (!o.status.ok()) return o;

  std::vector<double> ref, rlse, naive;
  std::vector<double>&got = o.got_out, &glse = o.got_lse;
  const bool bf16 = c.dtype == DType::kBF16;
  std::string empty_row_error;
  const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(double(c.D));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t Sq = cu_q[size_t(b + 1)] - cu_q[size_t(b)], Skv = cu_kv[size_t(b + 1)] - cu_kv[size_t(b)];
    for (int64_t h = 0; h < c.Nq; ++h) {
      const int64_t g = h / (c.Nq / c.Nkv);
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t diag = i + Skv - Sq;
        int64_t seen = 0;  // visible keys of this row
        auto vis = [&](int64_t j, double* bias_out) {
          if (c.causal && j > diag) return false;
          if (c.wl >= 0 && j < diag - c.wl) return false;
          if (c.wr >= 0 && j > diag + c.wr) return false;
          if (c.mask && mask[size_t((((c.mask_b ? b : 0) * mN + (c.mask_h ? h : 0)) * c.Sq + i) * c.Skv + j)] == 0) return false;
          if (c.bias) *bias_out = bias[size_t((((c.bias_b ? b : 0) * bN + (c.bias_h ? h : 0)) * c.Sq + i) * c.Skv + j)];
          ++seen;
          return true;
        };
        auto row = [&](bool bf16_steps) {
          return naive_row(
              c.D, c.Dv, Skv, scale, c.softcap, c.sinks ? double(sinks[size_t(h)]) : -INFINITY,
              [&](int64_t d) { return q.get(off(q, true, b, i, h) + d); }, [&](int64_t j, int64_t d) { return k.get(off(k, false, b, j, g) + d); },
              [&](int64_t j, int64_t d) { return v.get(off(v, false, b, j, g) + d); }, vis, bf16_steps);
        };
        const RowRef rr = row(false);
        if (bf16) {
          const RowRef rn = row(true);
          naive.insert(naive.end(), rn.out.begin(), rn.out.end());
        }
        for (int64_t d = 0; d < c.Dv; ++d) {
          ref.push_back(rr.out[size_t(d)]);
          got.push_back(out.get(off(out, true, b, i, h) + d));
          if (seen == 0 && got.back() != 0.0 && empty_row_error.empty())
            empty_row_error = "row (b=" + std::to_string(b) + ", h=" + std::to_string(h) + ", i=" + std::to_string(i) +
                              ") sees no key but out[" + std::to_string(d) + "]=" + std::to_string(got.back()) + ", not 0";
        }
        if (c.lse) {
          rlse.push_back(rr.lse);
          glse.push_back(tnd ? lse[size_t(h * Tq + cu_q[size_t(b)] + i)] : lse[size_t((b * c.Nq + h) * c.Sq + i)]);
        }
      }
    }
  }
  o.out = compare_out(got, ref, bf16 ? &naive : nullptr);
  fail_with(o.out, empty_row_error);
  if (c.strided) fail_with(o.out, out.check_padding("out"));
  o.lse = compare_lse(glse, rlse);  // exact -inf for rows without keys: Inf positions must match
  return o;
}

struct DecodeCase {
  DType dtype = DType::kBF16;
  bool mla = false;
  bool i8 = false;  // i8 caches with f32 per-token scales (MLA: the latent; rope part in dtype)
  int64_t B = 2, Sq = 1, Nq = 8, Nkv = 2, D = 64, Dv = 64;  // mla: D = rank + rope, Dv = rank, Nkv = 1
  std::vector<int32_t> lens = {37, 130};
  int64_t block_size = 16;
  bool strided = false;  // q and out padded (Stored), out's padding checked for its sentinel
  int denormal_every = 0;  // > 0: every n-th K and V value is a denormal (+-1e-39)
  std::string name() const {
    std::ostringstream os;
    os << "dtype=" << dtype_name(dtype) << (i8 ? " cache=i8" : "") << " B=" << B << " Sq=" << Sq << " Nq=" << Nq << " Nkv=" << Nkv << " D=" << D << " Dv=" << Dv
       << " block=" << block_size << " lens=";
    for (size_t i = 0; i < lens.size(); ++i) os << (i ? "/" : "") << lens[i];
    if (strided) os << " strided";
    if (denormal_every) os << " denormals=1/" << denormal_every;
    return os.str();
  }
};

inline Outcome run_decode(const dispatch::Impl<KernelsFn>& impl, const DecodeCase& c, uint64_t seed = 1) {
  testing::Rng rng(seed);
  const int64_t bs = c.block_size;
  int64_t max_blocks = 0, total_blocks = 0;
  for (int32_t l : c.lens) {
    max_blocks = std::max<int64_t>(max_blocks, (l + bs - 1) / bs);
    total_blocks += (l + bs - 1) / bs;
  }
  const int64_t num_blocks = total_blocks + 3, slots = num_blocks * bs;
  // Scattered block ids: sequence b's blocks are taken from a shuffled list.
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) ids[size_t(i)] = int32_t(i);
  for (int64_t i = num_blocks - 1; i > 0; --i) std::swap(ids[size_t(i)], ids[size_t(rng.below(i + 1))]);
  std::vector<int32_t> tables(size_t(c.B * max_blocks), -1);
  int64_t next = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = 0; j * bs < c.lens[size_t(b)]; ++j) tables[size_t(b * max_blocks + j)] = ids[size_t(next++)];
  const int64_t kw = c.Nkv * c.D, vw = c.Nkv * c.Dv;
  Buf kc(c.dtype, size_t(slots * kw)), vc(c.dtype, size_t(c.mla ? 1 : slots * vw));
  Stored q(c.dtype, {c.B, c.Sq, c.Nq, c.D}, c.strided ? 3 : 0, c.strided ? 5 : 0),
      out(c.dtype, {c.B, c.Sq, c.Nq, c.Dv}, c.strided ? 2 : 0, c.strided ? 9 : 0);
  auto at = [](const Stored& t, int64_t b, int64_t i, int64_t h) { return b * t.strides[0] + i * t.strides[1] + h * t.strides[2]; };
  for (size_t i = 0; i < kc.f.size() + kc.h.size(); ++i) kc.set(i, rng.uniform());
  for (size_t i = 0; i < vc.f.size() + vc.h.size(); ++i) vc.set(i, rng.uniform());
  auto denormals = [&](Buf& x, double sign) {  // every denormal_every-th value, alternating signs
    for (size_t i = 0; c.denormal_every > 0 && i < x.f.size() + x.h.size(); i += size_t(c.denormal_every)) x.set(i, i % 2 ? sign * 1e-39 : -sign * 1e-39);
  };
  denormals(kc, 1.0);
  denormals(vc, -1.0);
  q.fill([&] { return rng.uniform(-2, 2); });
  out.fill([] { return NAN; });  // poisoned
  std::vector<float> lse(size_t(c.B * c.Nq * c.Sq), NAN);
  std::vector<int32_t> lens(c.lens);
  Outcome o;
  std::vector<uint8_t> ws;
  const TensorView qv = q.view();
  const TensorView ov = out.view();
  const TensorView lv = make_view(lse.data(), DType::kF32, {c.B, c.Nq, c.Sq});
  const TensorView tv = make_view(tables.data(), DType::kI32, {c.B, max_blocks});
  const TensorView sv = make_view(lens.data(), DType::kI32, {c.B});
  // i8 caches: per-token symmetric quantisation of the values kc / vc hold (scale = max|x|
  // / 127, some tokens all zero): MLA's latent (the first Dv values of kc's rows, the rope
  // part moving to rc), or the whole K and V rows. The reference uses value * scale
  // exactly; kc / vc are replaced by those values rounded to dtype, the naive
  // same-precision computation whose error (doubled) the result may have on top of the
  // usual bound.
  const int64_t rope = c.mla ? c.D - c.Dv : 0;
  struct Plane {
    std::vector<int8_t> q;
    std::vector<float> scales;
    int64_t width = 0;
    double exact(int64_t slot, int64_t d) const { return double(q[size_t(slot * width + d)]) * double(scales[size_t(slot)]); }
  };
  auto quantize = [&](Buf& buf, int64_t row, int64_t width, Plane& pl) {
    pl.width = width;
    pl.q.resize(size_t(slots * width));
    pl.scales.resize(size_t(slots));
    for (int64_t s = 0; s < slots; ++s) {
      const bool zero = s % 7 == 3;
      double amax = 0;
      for (int64_t d = 0; d < width; ++d) amax = std::max(amax, std::abs(buf.get(size_t(s * row + d))));
      const float sc = zero ? 0.0f : float(amax / 127);
      pl.scales[size_t(s)] = sc;
      for (int64_t d = 0; d < width; ++d) {
        const int8_t x = zero ? 0 : int8_t(std::lrint(buf.get(size_t(s * row + d)) / sc));
        pl.q[size_t(s * width + d)] = x;
        buf.set(size_t(s * row + d), float(x) * sc);  // rounds to dtype as the op does
      }
    }
  };
  Plane k8, v8;
  Buf rc(c.dtype, c.i8 ? size_t(slots * rope) : 0);
  if (c.i8 && c.mla) {
    quantize(kc, kw, c.Dv, k8);
    for (int64_t s = 0; s < slots; ++s)
      for (int64_t d = 0; d < rope; ++d) rc.set(size_t(s * rope + d), float(kc.get(size_t(s * kw + c.Dv + d))));
  } else if (c.i8) {
    quantize(kc, kw, kw, k8);
    quantize(vc, vw, vw, v8);
  }
  if (c.mla) {
    MlaDecodeParams p{.q = qv, .cache = make_view(kc.data(), c.dtype, {slots, c.D}), .block_tables = tv, .seq_lens = sv,
                      .block_size = bs, .kv_lora_rank = c.Dv, .out = ov, .lse = lv, .scale = 0.1f};
    if (c.i8) {
      p.cache = make_view(k8.q.data(), DType::kI8, {slots, c.Dv});
      p.cache_scales = make_view(k8.scales.data(), DType::kF32, {slots});
      p.rope_cache = make_view(rc.data(), c.dtype, {slots, rope});
    }
    ws.resize(o.ws_bytes = mla_decode_attention_workspace_size(p));
    o.status = mla_run(impl.fn(), p, {ws.data(), ws.size()});
  } else {
    PagedDecodeParams p{.q = qv, .k_cache = make_view(kc.data(), c.dtype, {slots, kw}), .v_cache = make_view(vc.data(), c.dtype, {slots, vw}),
                        .block_tables = tv, .seq_lens = sv, .block_size = bs, .kv_heads = c.Nkv, .out = ov, .lse = lv};
    if (c.i8) {
      p.k_cache = make_view(k8.q.data(), DType::kI8, {slots, kw}), p.v_cache = make_view(v8.q.data(), DType::kI8, {slots, vw});
      p.k_scales = make_view(k8.scales.data(), DType::kF32, {slots}), p.v_scales = make_view(v8.scales.data(), DType::kF32, {slots});
    }
    ws.resize(o.ws_bytes = paged_decode_attention_workspace_size(p));
    o.status = paged_run(impl.fn(), p, {ws.data(), ws.size()});
  }
  if (!o.status.ok()) return o;
  std::vector<double> ref, rlse, ref_naive, lse_naive, naive;
  std::vector<double>&got = o.got_out, &glse = o.got_lse;
  const bool bf16 = c.dtype == DType::kBF16;
  const double scale = c.mla ? 0.1 : 1.0 / std::sqrt(double(c.D));
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t L = c.lens[size_t(b)];
    auto slot = [&](int64_t j) { return int64_t(tables[size_t(b * max_blocks + j / bs)]) * bs + j % bs; };
    for (int64_t i = 0; i < c.Sq; ++i)
      for (int64_t h = 0; h < c.Nq; ++h) {
        const int64_t g = h / (c.Nq / c.Nkv), diag = L - c.Sq + i;
        auto row_ref = [&](bool exact, bool bf16_steps) {
          auto key = [&](int64_t j, int64_t d) {  // MLA: V is the K row's prefix
            const int64_t x = c.mla ? d : g * c.D + d;
            return exact && c.i8 && (!c.mla || d < c.Dv) ? k8.exact(slot(j), x) : kc.get(size_t(slot(j) * kw + x));
          };
          auto value = [&](int64_t j, int64_t d) {
            if (c.mla) return key(j, d);
            return exact && c.i8 ? v8.exact(slot(j), g * c.Dv + d) : vc.get(size_t(slot(j) * vw + g * c.Dv + d));
          };
          return naive_row(
              c.D, c.Dv, L, scale, 0.0, -INFINITY, [&](int64_t d) { return q.get(at(q, b, i, h) + d); }, key,
              value, [&](int64_t j, double*) { return j <= diag; }, bf16_steps);
        };
        const RowRef rr = row_ref(true, false);
        const RowRef rn = c.i8 ? row_ref(false, false) : rr;  // i8: the stored values rounded to bf16
        if (bf16) {
          const RowRef rb = row_ref(false, true);
          naive.insert(naive.end(), rb.out.begin(), rb.out.end());
        }
        for (int64_t d = 0; d < c.Dv; ++d) {
          ref.push_back(rr.out[size_t(d)]);
          ref_naive.push_back(rn.out[size_t(d)]);
          got.push_back(out.get(at(out, b, i, h) + d));
        }
        rlse.push_back(rr.lse);
        lse_naive.push_back(rn.lse);
        glse.push_back(lse[size_t((b * c.Nq + h) * c.Sq + i)]);
      }
  }
  // i8: twice the error of rounding the dequantised values to bf16 (zero otherwise); for
  // the output of a bf16 q, the FlashAttention rule's naive computation (compare_out)
  // starts from those rounded values and covers it.
  auto twice_naive = [](const std::vector<double>& naive, const std::vector<double>& exact) {
    std::vector<double> e(exact.size());
    for (size_t i = 0; i < e.size(); ++i) e[i] = std::isfinite(exact[i]) ? 2.0 * std::fabs(naive[i] - exact[i]) : 0.0;
    return e;
  };
  const std::vector<double> extra_out = twice_naive(ref_naive, ref), extra_lse = twice_naive(lse_naive, rlse);
  o.out = compare_out(got, ref, bf16 ? &naive : nullptr, bf16 ? nullptr : &extra_out);
  if (c.strided) fail_with(o.out, out.check_padding("out"));
  o.lse = compare_lse(glse, rlse, &extra_lse);
  return o;
}

}  // namespace optx::attn_detail::testutil
