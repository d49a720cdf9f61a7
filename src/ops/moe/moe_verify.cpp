// `optx verify` cases for the MoE family: routers of DeepSeek V2 / V3 / V4 kinds against
// the independent reference (exact ids, weights to 1e-5); routing (plain and int8 rows,
// expert ranges), expert offsets and finalize against plain loops; grouped GEMM (+ SwiGLU)
// under both schedules against per-expert double-precision products; whole moe_forward
// layers against a double evaluation of the same model.
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>

#include "ops/moe/moe_testutil.h"
#include "testing/compare.h"
#include "testing/rng.h"
#include "tools/verify.h"

namespace optx {
namespace {

void verify_gating(std::vector<verify::Record>& out) {
  moe_testutil::for_each_gating_impl([&](const std::string&) {
  struct C {
    const char* name;
    MoeScore score;
    int64_t E, k, ng, tg;
    MoeGroupScore gs;
    bool bias, renorm;
    float scaling;
    bool tks = false, softmax_api = false;  // top-k then softmax; via moe_gating_topk_softmax
  };
  const C cases[] = {{"score=softmax E=64 k=6", MoeScore::kSoftmax, 64, 6, 1, 1, MoeGroupScore::kMax, false, false, 1.0f},
                     {"score=softmax E=72 k=6", MoeScore::kSoftmax, 72, 6, 1, 1, MoeGroupScore::kMax, false, false, 1.0f},  // a vector tail
                     {"score=sigmoid E=40 k=3", MoeScore::kSigmoid, 40, 3, 1, 1, MoeGroupScore::kMax, false, false, 1.0f},
                     {"score=softmax E=160 k=6 groups=8/3 group_score=max", MoeScore::kSoftmax, 160, 6, 8, 3, MoeGroupScore::kMax, false, false, 16.0f},
                     {"score=sigmoid E=256 k=8 groups=8/4 group_score=top2 bias=1 renorm=1", MoeScore::kSigmoid, 256, 8, 8, 4, MoeGroupScore::kTop2Sum, true, true, 2.5f},
                     {"score=sqrt_softplus E=64 k=6 bias=1 renorm=1", MoeScore::kSqrtSoftplus, 64, 6, 1, 1, MoeGroupScore::kMax, true, true, 1.5f},
                     {"score=softmax E=8 k=2 renorm=1", MoeScore::kSoftmax, 8, 2, 1, 1, MoeGroupScore::kMax, false, true, 1.0f, false, true},
                     {"score=softmax E=60 k=4 order=topk_then_softmax", MoeScore::kSoftmax, 60, 4, 1, 1, MoeGroupScore::kMax, false, false, 1.0f, true, true}};
  for (const C& c : cases) {
    const int64_t T = 300;
    testing::Rng rng(uint64_t(c.E));
    std::vector<float> logits(static_cast<size_t>(T * c.E)), bias(static_cast<size_t>(c.E));
    for (auto& x : logits) x = rng.uniform(-4, 4);
    for (auto& x : bias) x = rng.uniform(-0.5f, 0.5f);
    std::vector<int32_t> ids(static_cast<size_t>(T * c.k));
    std::vector<float> w(static_cast<size_t>(T * c.k));
    MoeGatingParams p{.logits = make_view(logits.data(), DType::kF32, {T, c.E}),
                      .bias = c.bias ? make_view(bias.data(), DType::kF32, {c.E}) : TensorView{},
                      .topk_ids = make_view(ids.data(), DType::kI32, {T, c.k}), .topk_weights = make_view(w.data(), DType::kF32, {T, c.k}),
                      .score = c.score, .n_group = c.ng, .topk_group = c.tg, .group_score = c.gs, .renormalize = c.renorm,
                      .topk_then_softmax = c.tks, .routed_scaling_factor = c.scaling};
    const Status st = c.softmax_api ? moe_gating_topk_softmax({.logits = p.logits, .topk_ids = p.topk_ids, .topk_weights = p.topk_weights,
                                                               .renormalize = c.renorm, .topk_then_softmax = c.tks})
                                    : moe_gating_topk(p);
    std::vector<double> got, ref;
    bool ids_ok = true;
    int64_t bad = -1;
    for (int64_t t = 0; st.ok() && t < T; ++t) {
      std::vector<double> l(logits.begin() + t * c.E, logits.begin() + (t + 1) * c.E), b;
      if (c.bias) b.assign(bias.begin(), bias.end());
      std::vector<int> rid;
      std::vector<double> rw;
      moe_testutil::gating_ref(l, b, p, c.k, rid, rw);
      for (int64_t j = 0; j < c.k; ++j) {
        if (ids[size_t(t * c.k + j)] != rid[size_t(j)] && ids_ok) ids_ok = false, bad = t * c.k + j;
        got.push_back(w[size_t(t * c.k + j)]);
        ref.push_back(rw[size_t(j)]);
      }
    }
    testing::CompareResult cmp = testing::compare(got, ref, {1e-6, 1e-5});
    if (!ids_ok) cmp.pass = false, cmp.worst_index = bad, cmp.message = "expert ids differ from the reference";
    const char* op = c.softmax_api ? "moe_gating_topk_softmax" : "moe_gating_topk";
    out.push_back(verify::make_record(op, selected_impl(op),
                                      std::string("T=300 ") + c.name, st, cmp));
  }
  });
}

OPTX_REGISTER_VERIFY("moe_gating_topk|moe_gating_topk_softmax", verify_gating);

// Skewed group sizes with empty groups; at 1 thread each GEMM runs split, at 2+ threads
// the expert queue runs (with the 400-row group cut into row tiles). N = 144 puts SwiGLU
// through the f32 buffer (I = 72), N = 256 into the GEMM epilogue (I = 128); int8 output
// rows are dequantised and held to 1 LSB of their row scale.
void verify_grouped_n(std::vector<verify::Record>& out, int64_t N) {
  const int64_t E = 16, K = 200, I = N / 2;
  testing::Rng rng(11);
  std::vector<int64_t> counts(static_cast<size_t>(E));
  for (int64_t g = 0; g < E; ++g) counts[size_t(g)] = g % 5 == 1 ? 0 : int64_t(rng.below(40));
  counts[3] = 400;
  const int64_t M = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  std::vector<int64_t> offs(counts.size());
  std::partial_sum(counts.begin(), counts.end(), offs.begin());
  std::vector<uint16_t> x(static_cast<size_t>(M * K)), w(static_cast<size_t>(E * N * K));
  testing::fill_bf16(x.data(), M * K, rng);
  testing::fill_bf16(w.data(), E * N * K, rng);
  PackedWeights pw;
  const Status packed = pack_weights({.w = make_view(w.data(), DType::kBF16, {E, N, K})}, &pw);
  // Reference: out[r, n] in double from the same bf16 values.
  std::vector<double> ref(static_cast<size_t>(M * N));
  for (int64_t g = 0, r = 0; g < E; ++g)
    for (int64_t i = 0; i < counts[size_t(g)]; ++i, ++r)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(bf16_to_f32(x[size_t(r * K + k)])) * bf16_to_f32(w[size_t((g * N + n) * K + k)]);
        ref[size_t(r * N + n)] = acc;
      }
  std::vector<double> hr(static_cast<size_t>(M * I));
  for (int64_t r = 0; r < M; ++r)
    for (int64_t i = 0; i < I; ++i) hr[size_t(r * I + i)] = moe_testutil::silu(ref[size_t(r * N + i)]) * ref[size_t(r * N + I + i)];
  const int all = num_threads();
  for (int threads : {1, all > 1 ? all : 2}) {
    set_num_threads(threads);
    const std::string schedule = threads == 1 ? "split" : "queue";
    const std::string cs = "dtype=bf16 E=16 M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=200 threads=" +
                           std::to_string(threads) + " schedule=" + schedule;
    std::vector<float> y(static_cast<size_t>(M * N));
    GroupedMatmulParams p{.x = make_view(x.data(), DType::kBF16, {M, K}), .weights = &pw,
                          .group_offsets = make_view(offs.data(), DType::kI64, {E}), .out = make_view(y.data(), DType::kF32, {M, N})};
    std::vector<uint8_t> ws(grouped_matmul_workspace_size(p));
    Status st = packed.ok() ? grouped_matmul(p, {ws.data(), ws.size()}) : packed;
    std::vector<double> got(y.begin(), y.end());
    out.push_back(verify::make_record("grouped_matmul", selected_impl("gemm"), cs, st, testing::compare(got, ref, {1e-4, 1e-4})));
    std::vector<float> h(static_cast<size_t>(M * I));
    GroupedMatmulSwigluParams q{.x = p.x, .weights = &pw, .group_offsets = p.group_offsets, .out = make_view(h.data(), DType::kF32, {M, I})};
    std::vector<uint8_t> ws2(grouped_matmul_swiglu_workspace_size(q));
    st = packed.ok() ? grouped_matmul_swiglu(q, {ws2.data(), ws2.size()}) : packed;
    std::vector<double> hg(h.begin(), h.end());
    out.push_back(verify::make_record("grouped_matmul_swiglu", selected_impl("gemm"), cs, st, testing::compare(hg, hr, {1e-4, 1e-4})));
    std::vector<int8_t> hq(static_cast<size_t>(M * I));
    std::vector<float> hs(static_cast<size_t>(M));
    q.out = make_view(hq.data(), DType::kI8, {M, I});
    q.out_scales = make_view(hs.data(), DType::kF32, {M});
    std::vector<uint8_t> ws3(grouped_matmul_swiglu_workspace_size(q));
    st = packed.ok() ? grouped_matmul_swiglu(q, {ws3.data(), ws3.size()}) : packed;
    std::vector<double> dq(hq.size()), lsb(hq.size());
    for (int64_t r = 0; r < M; ++r)
      for (int64_t i = 0; i < I; ++i) {
        dq[size_t(r * I + i)] = double(hq[size_t(r * I + i)]) * hs[size_t(r)];
        lsb[size_t(r * I + i)] = hs[size_t(r)];
      }
    out.push_back(verify::make_record("grouped_matmul_swiglu", selected_impl("gemm"), cs + " out=i8", st,
                                      testing::compare(dq, hr, {1e-4, 1e-4}, &lsb)));
  }
  set_num_threads(all);
}

void verify_grouped(std::vector<verify::Record>& out) {
  verify_grouped_n(out, 144);
  verify_grouped_n(out, 256);
}

OPTX_REGISTER_VERIFY("grouped_matmul|grouped_matmul_swiglu", verify_grouped);

// moe_init_routing: T = 100 tokens, top-6 of 64 experts, H = 72 (not a multiple of 16),
// all experts or the range [16, 40) (expert parallelism). The stable (token, k) order per
// expert is rebuilt here; row_map, inverse (-1 when dropped), counts, offsets and the rows
// must match exactly (int8 rows: within 1 LSB, scale = max|row| / 127), and rows past the
// kept count keep their NaN / sentinel.
void verify_routing(std::vector<verify::Record>& out) {
  const int64_t T = 100, k = 6, E = 64, H = 72, N = T * k;
  testing::Rng rng(31);
  std::vector<float> xf(static_cast<size_t>(T * H));
  for (auto& v : xf) v = rng.uniform(-2, 2);
  for (int64_t h = 0; h < H; ++h) xf[size_t(5 * H + h)] = 0.0f;  // an all-zero token: int8 scale 0
  std::vector<uint16_t> xb(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token, skewed to the low ids
    std::vector<int32_t> pick;
    while (int64_t(pick.size()) < k) {
      const int32_t e = int32_t(rng.below(rng.below(2) ? 16 : E));
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    std::copy(pick.begin(), pick.end(), ids.begin() + t * k);
  }
  for (DType in : {DType::kF32, DType::kBF16})
    for (bool i8 : {false, true})
      for (auto [e0, e1] : {std::pair<int64_t, int64_t>{0, E}, {16, 40}}) {
        const DType od = i8 ? DType::kI8 : in;
        std::vector<uint8_t> rows(size_t(N * H) * dtype_size(od), 0xff);  // f32 / bf16 NaN, int8 -1
        std::vector<float> scales(static_cast<size_t>(N), NAN);
        std::vector<int32_t> row_map(static_cast<size_t>(N), -2), inverse(static_cast<size_t>(N), -2);
        std::vector<int64_t> counts(static_cast<size_t>(E), -2), offsets(static_cast<size_t>(E), -2);
        void* x = in == DType::kF32 ? static_cast<void*>(xf.data()) : static_cast<void*>(xb.data());
        const Status st = moe_init_routing({.x = make_view(x, in, {T, H}), .topk_ids = make_view(ids.data(), DType::kI32, {T, k}),
                                            .num_experts = E, .expert_begin = e0, .expert_end = e1,
                                            .sorted_rows = make_view(rows.data(), od, {N, H}),
                                            .row_scales = i8 ? make_view(scales.data(), DType::kF32, {N}) : TensorView{},
                                            .row_map = make_view(row_map.data(), DType::kI32, {N}),
                                            .inverse = make_view(inverse.data(), DType::kI32, {N}),
                                            .counts = make_view(counts.data(), DType::kI64, {E}),
                                            .offsets = make_view(offsets.data(), DType::kI64, {E})});
        auto xv = [&](int64_t t, int64_t h) {
          return in == DType::kF32 ? double(xf[size_t(t * H + h)]) : double(bf16_to_f32(xb[size_t(t * H + h)]));
        };
        auto got_row = [&](int64_t pos, int64_t h) {
          const size_t i = size_t(pos * H + h);
          if (od == DType::kF32) {
            float v;
            std::memcpy(&v, rows.data() + 4 * i, 4);
            return double(v);
          }
          if (od == DType::kBF16) {
            uint16_t v;
            std::memcpy(&v, rows.data() + 2 * i, 2);
            return double(bf16_to_f32(v));
          }
          return double(int8_t(rows[i])) * scales[size_t(pos)];
        };
        std::vector<double> got, ref, extra;
        auto exact = [&](double g, double r) { got.push_back(g), ref.push_back(r), extra.push_back(0); };
        std::vector<int32_t> inv_ref(static_cast<size_t>(N), -1);
        int64_t pos = 0;
        for (int64_t e = 0; e < E; ++e) {
          const bool kept = e >= e0 && e < e1;
          const int64_t start = pos;
          for (int64_t i = 0; i < N && kept; ++i)
            if (ids[size_t(i)] == e) {
              const int64_t t = i / k;
              double amax = 0;
              for (int64_t h = 0; h < H; ++h) amax = std::max(amax, std::fabs(xv(t, h)));
              exact(row_map[size_t(pos)], double(i));
              for (int64_t h = 0; h < H; ++h) {
                if (i8 && amax == 0) exact(double(int8_t(rows[size_t(pos * H + h)])), 0.0);  // scale 0: codes must be 0
                else got.push_back(got_row(pos, h)), ref.push_back(xv(t, h)), extra.push_back(i8 ? amax / 127 : 0);
              }
              if (i8) got.push_back(scales[size_t(pos)]), ref.push_back(amax / 127), extra.push_back(amax / 127 * 1e-6);
              inv_ref[size_t(i)] = int32_t(pos++);
            }
          exact(double(counts[size_t(e)]), double(pos - start));
          exact(double(offsets[size_t(e)]), double(pos));
        }
        for (int64_t i = 0; i < N; ++i) exact(inverse[size_t(i)], inv_ref[size_t(i)]);
        double touched = 0;  // rows past the kept count: still all 0xff
        for (size_t b = size_t(pos * H) * dtype_size(od); b < rows.size(); ++b) touched += rows[b] != 0xff;
        exact(touched, 0);
        const std::string cs = std::string("x=") + dtype_name(in) + " rows=" + dtype_name(od) + " T=100 k=6 E=64 H=72 experts=[" +
                               std::to_string(e0) + "," + std::to_string(e1) + ")";
        out.push_back(verify::make_record("moe_init_routing", "generic", cs, st, testing::compare(got, ref, {0, 0}, &extra)));
      }
  // moe_compute_expert_tokens: ascending ids with empty experts (and none past 50).
  std::vector<int32_t> sorted;
  for (int32_t e = 0; e < 50; ++e)
    for (int64_t n = int64_t(rng.below(4)) * (e % 7 != 3); n > 0; --n) sorted.push_back(e);
  std::vector<int64_t> offs(static_cast<size_t>(E), -1);
  const Status st = moe_compute_expert_tokens(make_view(sorted.data(), DType::kI32, {int64_t(sorted.size())}),
                                              make_view(offs.data(), DType::kI64, {E}));
  std::vector<double> got(offs.begin(), offs.end()), ref;
  for (int32_t e = 0; e < E; ++e) ref.push_back(double(std::count_if(sorted.begin(), sorted.end(), [&](int32_t v) { return v <= e; })));
  out.push_back(verify::make_record("moe_compute_expert_tokens", "generic",
                                    "N=" + std::to_string(sorted.size()) + " E=64 max_id=50", st,  // empty experts, none past 50
                                    testing::compare(got, ref, {0, 0})));
}

OPTX_REGISTER_VERIFY("moe_init_routing|moe_compute_expert_tokens", verify_routing);

// moe_finalize_routing: out[t] = sum_k w[t,k] y[inverse[t,k]] (+ shared) (+ residual),
// dropped (t, k) skipped; f32 and bf16, each optional term present or absent.
void verify_finalize(std::vector<verify::Record>& out) {
  const int64_t T = 37, k = 6, H = 72, R = T * k;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto [with_shared, with_res] : {std::pair{true, true}, {false, true}, {true, false}, {false, false}}) {
      testing::Rng rng(uint64_t(41 + with_shared + 2 * with_res));
      auto vals = [&](int64_t n) {
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = dt == DType::kBF16 ? bf16_to_f32(f32_to_bf16(rng.uniform(-2, 2))) : rng.uniform(-2, 2);
        return v;
      };
      std::vector<float> y = vals(R * H), sh = vals(T * H), res = vals(T * H), w = vals(T * k);
      std::vector<int32_t> inv(static_cast<size_t>(R));
      std::iota(inv.begin(), inv.end(), 0);
      for (int64_t i = R - 1; i > 0; --i) std::swap(inv[size_t(i)], inv[size_t(rng.below(i + 1))]);
      for (int64_t i = 0; i < R; i += 5) inv[size_t(i)] = -1;  // dropped (expert outside this rank's range)
      std::vector<uint16_t> yb, shb, resb;
      auto view = [&](std::vector<float>& v, std::vector<uint16_t>& b, int64_t rows) {
        if (dt == DType::kF32) return make_view(v.data(), dt, {rows, H});
        b.resize(v.size());
        for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
        return make_view(b.data(), dt, {rows, H});
      };
      std::vector<float> of(static_cast<size_t>(T * H), NAN);
      std::vector<uint16_t> ob(static_cast<size_t>(T * H), 0x7fc0);
      const Status st = moe_finalize_routing(
          {.y = view(y, yb, R), .inverse = make_view(inv.data(), DType::kI32, {R}), .weights = make_view(w.data(), DType::kF32, {T, k}),
           .shared = with_shared ? view(sh, shb, T) : TensorView{}, .residual = with_res ? view(res, resb, T) : TensorView{},
           .out = dt == DType::kF32 ? make_view(of.data(), dt, {T, H}) : make_view(ob.data(), dt, {T, H})});
      std::vector<double> got, ref, extra;
      moe_testutil::finalize_ref(y.data(), inv.data(), w.data(), with_shared ? sh.data() : nullptr, with_res ? res.data() : nullptr, T, k,
                                 H, dt == DType::kBF16, ref, extra);
      for (int64_t i = 0; i < T * H; ++i) got.push_back(dt == DType::kF32 ? double(of[size_t(i)]) : double(bf16_to_f32(ob[size_t(i)])));
      const std::string cs = std::string("dtype=") + dtype_name(dt) + " T=37 k=6 H=72 shared=" + (with_shared ? "1" : "0") +
                             " residual=" + (with_res ? "1" : "0") + " dropped=every5th";  // every 5th routed row dropped
      out.push_back(verify::make_record("moe_finalize_routing", "generic", cs, st, testing::compare(got, ref, {0, 0}, &extra)));
    }
}

OPTX_REGISTER_VERIFY("moe_finalize_routing", verify_finalize);

// moe_forward: whole layers (router, gating, routing, grouped gate/up + SwiGLU, grouped
// down, shared experts, finalize) against a double evaluation of the same model
// (moe_testutil::run_moe_forward), for a DeepSeek-V2 style router (softmax, top-6 of 16)
// and a V3 style one (sigmoid + selection bias, 4 groups of which 2 by top-2 sums, top-4,
// renormalised, scaled by 2.5). H = 40 is not a multiple of 16; I = 24 runs SwiGLU
// through the buffer, I = 64 in the GEMM epilogue. T = 1 takes the split schedule, T = 7
// and 128 the queue (2 threads or more).
void verify_forward(std::vector<verify::Record>& out) {
  const int all = num_threads();
  set_num_threads(std::max(all, 2));
  for (DType dt : {DType::kF32, DType::kBF16})
    for (bool v3 : {false, true})
      for (auto [T, I] : {std::pair<int64_t, int64_t>{1, 64}, {7, 24}, {128, 64}}) {
        moe_testutil::LayerCase c;
        c.dt = dt, c.T = T, c.H = 40, c.E = 16, c.I = I, c.Is = 2 * I, c.k = v3 ? 4 : 6, c.renorm = v3;
        if (v3) {
          c.score = MoeScore::kSigmoid, c.bias = true, c.n_group = 4, c.topk_group = 2, c.gs = MoeGroupScore::kTop2Sum;
          c.scaling = 2.5f;
        }
        const moe_testutil::LayerOutcome o = moe_testutil::run_moe_forward(c, uint64_t(T * I + v3));
        out.push_back(verify::make_record("moe_forward", selected_impl("gemm"), c.name(), o.status, o.cmp));
      }
  set_num_threads(all);
}

OPTX_REGISTER_VERIFY("moe_forward", verify_forward);

}  // namespace
}  // namespace optx
