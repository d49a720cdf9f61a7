// `optx bench` rows for gemm, side by side with OpenBLAS and oneDNN in the same run (and
// PyTorch's torch.mm on the 2048^3 cases, where its peer is loaded: bench/torch_peer.h).
//
// Compute-bound cases (M = N = K = 2048) are judged against the FMA / bf16-dot peaks;
// decode GEMVs (M = 1) against copy bandwidth, counting weight bytes only; M = 4
// (speculative or small-batch decode), 16 (MoE experts at prefill) and 256 (prefill; int8
// weights on the dot product beside bf16 ones) on the same weights against the larger of
// that transfer and their FLOPs at the peak. GEMV weights
// rotate among enough packed copies to span bench::dram_working_set() (twice the LLC), so
// they stream from DRAM rather than from a (virtualised, here 300 MiB) last-level cache.
#include <algorithm>
#include <cstdio>
#include <omp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/torch_peer.h"
#include "ops/gemm/gemm_internal.h"
#include "testing/rng.h"

#ifdef OPTX_HAVE_OPENBLAS
#include <cblas.h>
extern "C" char* openblas_get_corename(void);
extern "C" void openblas_set_num_threads(int);
#endif
#ifdef OPTX_HAVE_ONEDNN
#include <dnnl.hpp>
#endif

namespace optx::gemm_detail {
namespace {

std::string shape_case(const char* dtype, int64_t M, int64_t N, int64_t K) {
  return std::string("dtype=") + dtype + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
         " K=" + std::to_string(K);
}

// optx gemm on packed weights, rotating over the packed copies in w.
struct OptxRun {
  GemmParams p;
  const std::vector<PackedWeights>* w;
  std::vector<uint8_t> ws;
  size_t i = 0;
  OptxRun(GemmParams params, const std::vector<PackedWeights>& weights) : p(params), w(&weights) {
    p.packed_b = &weights[0][0];
    ws.resize(gemm_workspace_size(p));
  }
  void operator()() {
    p.packed_b = &(*w)[i++ % w->size()][0];
    bench::check(gemm(p, {ws.data(), ws.size()}));
  }
};

#ifdef OPTX_HAVE_ONEDNN
// oneDNN matmul C[M, N] = A[M, K] * W^T (all f32 or all bf16), each W of `w` given [N, K]
// row-major and reordered once into oneDNN's preferred layout (its equivalent of packing),
// or, `plain`, read as it is on every call (its unpacked path). Calls rotate over w.
struct OnednnMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream s{eng};
  dnnl::matmul::primitive_desc pd;
  std::vector<dnnl::memory> ws;
  dnnl::memory a_mem, c_mem;
  dnnl::matmul mm;
  size_t i = 0;
  OnednnMatmul(bool bf16, int threads, int64_t M, int64_t N, int64_t K, void* a, const std::vector<void*>& w, void* c, bool plain) {
    omp_set_num_threads(threads);
    using namespace dnnl;
    using tag = memory::format_tag;
    const memory::data_type dt = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::desc a_md({M, K}, dt, tag::ab), c_md({M, N}, dt, tag::ab);
    const memory::desc w_user_md({K, N}, dt, tag::ba);  // [N, K] row-major == [K, N] "ba"
    pd = matmul::primitive_desc(matmul::desc(a_md, plain ? w_user_md : memory::desc({K, N}, dt, tag::any), c_md), eng);
    for (void* src : w) {
      memory w_user(w_user_md, eng, src);
      if (plain) {
        ws.push_back(w_user);
        continue;
      }
      ws.emplace_back(pd.weights_desc(), eng);
      reorder(w_user, ws.back()).execute(s, w_user, ws.back());
    }
    a_mem = memory(a_md, eng, a);
    c_mem = memory(c_md, eng, c);
    mm = matmul(pd);
  }
  void operator()() {
    mm.execute(s, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, ws[i++ % ws.size()]}, {DNNL_ARG_DST, c_mem}});
    s.wait();
  }
};

// The peer, or nullptr (and a line saying so) where oneDNN has no implementation of the
// case on this CPU: its bf16 matmul needs AVX512_BF16 or AMX, so an AVX2 machine has none.
std::unique_ptr<OnednnMatmul> make_onednn(bool bf16, int threads, int64_t M, int64_t N, int64_t K, void* a,
                                          const std::vector<void*>& w, void* c, bool plain = false) {
  try {
    return std::make_unique<OnednnMatmul>(bf16, threads, M, N, K, a, w, c, plain);
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "optx bench: gemm: no oneDNN %s matmul M=%lld N=%lld K=%lld on this CPU (%s); its row is left out\n",
                 bf16 ? "bf16" : "f32", static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), e.what());
    return nullptr;
  }
}
#endif

// Times optx and the peers of one case and adds a record for each. Peers on optx's
// OpenMP pool (oneDNN) run interleaved with optx, call by call, so machine noise hits
// both alike. OpenBLAS has its own pthread pool whose workers spin for ~0.1 s after each
// call (2^28 cycles, OpenBLAS's THREAD_TIMEOUT; 0.13 s measured here): interleaved call by call, each library
// would run against the other's spinning threads on our 2 cores, so with OpenBLAS in the
// case everything runs in alternating blocks that first wait that spin out.
void run_case(bench::Context& ctx, const bench::Record& optx_rec, const std::vector<std::function<void()>>& fns,
              const std::vector<bench::Record>& peer_recs, double flops, double bytes) {
  const bool own_pool = std::any_of(peer_recs.begin(), peer_recs.end(), [](const bench::Record& p) { return p.impl == "openblas"; });
  const auto t = own_pool ? ctx.time_blocks(fns, 0.25) : ctx.time_interleaved(fns);
  ctx.add(optx_rec, t[0], flops, bytes);
  for (size_t k = 0; k < peer_recs.size(); ++k) ctx.add(peer_recs[k], t[k + 1], flops, bytes);
}

void bench_square(bench::Context& ctx, bool bf16) {
  const int64_t M = 2048, N = 2048, K = 2048;
  const char* dt = bf16 ? "bf16" : "f32";
  const DType t = bf16 ? DType::kBF16 : DType::kF32;
  const size_t es = dtype_size(t);
  testing::Rng rng(11);
  bench::Buffer a(size_t(M * K) * es), b(size_t(N * K) * es), c(size_t(M * N) * es);
  if (bf16) {
    testing::fill_bf16(a.as<uint16_t>(), M * K, rng);
    testing::fill_bf16(b.as<uint16_t>(), N * K, rng);
  } else {
    testing::fill_f32(a.as<float>(), M * K, rng);
    testing::fill_f32(b.as<float>(), N * K, rng);
  }
  std::vector<PackedWeights> w(1);
  bench::check(pack_weights({.w = make_view(b.data(), t, {N, K})}, &w[0]));
  OptxRun optx({.a = make_view(a.data(), t, {M, K}), .c = make_view(c.data(), t, {M, N})}, w);
  const double flops = 2.0 * M * N * K;
  const double bytes = double(M * K + N * K + M * N) * double(es);
  const bench::Roof roof = bf16 ? bench::Roof::kBF16 : bench::Roof::kF32;
  bench::Record r{.op = "gemm", .case_ = shape_case(dt, M, N, K), .impl = "optx", .roof = roof};
  r.note = selected_impl("gemm");
  r.peak_bytes = double(optx.ws.size());  // extra memory beyond inputs and output
  std::vector<std::function<void()>> fns = {std::ref(optx)};
  std::vector<bench::Record> peers;
#ifdef OPTX_HAVE_OPENBLAS
  if (!bf16) {
    openblas_set_num_threads(ctx.threads);
    peers.push_back({.op = "gemm", .case_ = r.case_, .impl = "openblas", .roof = roof});
    peers.back().note = std::string("core=") + openblas_get_corename();
    fns.push_back([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.0f, a.as<float>(), int(K),
                  b.as<float>(), int(K), 0.0f, c.as<float>(), int(N));
    });
  }
#endif
#ifdef OPTX_HAVE_ONEDNN
  // (Debian's OpenBLAS has no sbgemm, so the bf16 case has oneDNN alone.)
  const auto dnn = make_onednn(bf16, ctx.threads, M, N, K, a.data(), {b.data()}, c.data());
  if (dnn) {
    peers.push_back({.op = "gemm", .case_ = r.case_, .impl = "onednn", .roof = roof});
    peers.back().note = dnn->pd.impl_info_str();
    fns.push_back(std::ref(*dnn));
  }
#endif
  // PyTorch's torch.mm, where the peer is loaded, checked against optx's C.
  if (const bench::TorchPeer* torch = bench::torch_peer(ctx.threads)) {
    const TensorView av = make_view(a.data(), t, {M, K}), bv = make_view(b.data(), t, {N, K}), cv = make_view(c.data(), t, {M, N});
    optx();
    const std::vector<uint8_t> optx_c(c.as<uint8_t>(), c.as<uint8_t>() + c.bytes());
    auto run = [torch, av, bv, cv](int, const TensorView&) { return torch->linear(av, bv, cv); };  // C in place: nothing to drop
    for (auto& peer : bench::torch_row(*torch, r, bf16 ? "mm_bf16" : "mm_f32", run, cv, optx_c.data(), 1, bf16 ? 1e-2 : 1e-5, true)) {
      peers.push_back(peer.record);
      fns.push_back(peer.fn);
    }
  }
  run_case(ctx, r, fns, peers, flops, bytes);
}

void bench_gemv(bench::Context& ctx, DType wt, int64_t M) {
  const int64_t N = 4096, K = 4096;
  const bool i8 = wt == DType::kI8;
  const char* dt = i8 ? "i8w" : "bf16";
  const double wbytes = double(N * K) * double(dtype_size(wt)) + (i8 ? 4.0 * N : 0.0);
  const int copies = int((int64_t(bench::dram_working_set()) + int64_t(wbytes) - 1) / int64_t(wbytes)) + 1;
  testing::Rng rng(5);
  std::vector<uint8_t> raw(size_t(N * K) * dtype_size(wt));
  std::vector<float> scales(static_cast<size_t>(N));
  if (i8) {
    testing::fill_i8(reinterpret_cast<int8_t*>(raw.data()), N * K, rng);
    testing::fill_f32(scales.data(), N, rng, 0.001f, 0.01f);
  } else {
    testing::fill_bf16(reinterpret_cast<uint16_t*>(raw.data()), N * K, rng);
  }
  std::vector<PackedWeights> w(static_cast<size_t>(copies));
  for (auto& pw : w)
    bench::check(pack_weights({.w = make_view(raw.data(), wt, {N, K}),
                        .scales = i8 ? make_view(scales.data(), DType::kF32, {N}) : TensorView{}},
                       &pw));
  std::vector<uint16_t> a(size_t(M * K)), c(size_t(M * N));
  testing::fill_bf16(a.data(), M * K, rng);
  OptxRun optx({.a = make_view(a.data(), DType::kBF16, {M, K}), .c = make_view(c.data(), DType::kBF16, {M, N})}, w);
  const double flops = 2.0 * M * N * K;
  bench::Record r{.op = "gemm", .case_ = shape_case(dt, M, N, K), .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = std::to_string(copies) + " weight copies rotated";
  r.peak_bytes = double(optx.ws.size());
  std::vector<std::function<void()>> fns = {std::ref(optx)};
  std::vector<bench::Record> peers;
#ifdef OPTX_HAVE_ONEDNN
  std::unique_ptr<OnednnMatmul> dnn;
  if (!i8) dnn = make_onednn(true, ctx.threads, M, N, K, a.data(), std::vector<void*>(size_t(copies), raw.data()), c.data());
  if (dnn) {
    peers.push_back({.op = "gemm", .case_ = r.case_, .impl = "onednn", .roof = bench::Roof::kMemory});
    peers.back().note = dnn->pd.impl_info_str();
    fns.push_back(std::ref(*dnn));
  }
#endif
  run_case(ctx, r, fns, peers, flops, wbytes);
}

// Unpacked bf16 weights (no pack_weights at load), [N, K] or [K, N] (kn): decode (M = 1;
// M = 8, the most rows the row-dot-product kernels take) and row counts that pack each
// weight panel on the fly (M = 32 within one L2 chunk of A, M = 128 past it: make_plan's
// kUnpackedOneChunk), the same bytes per call as the packed rows, rotated over copies of
// the raw weights. oneDNN beside [N, K] reads the same plain copies (its primitive on the
// user's layout, no reorder).
void bench_unpacked(bench::Context& ctx, int64_t M, bool kn) {
  const int64_t N = 4096, K = 4096;
  const double wbytes = double(N * K) * 2;
  const int copies = int((int64_t(bench::dram_working_set()) + int64_t(wbytes) - 1) / int64_t(wbytes)) + 1;
  testing::Rng rng(6);
  std::vector<std::unique_ptr<bench::Buffer>> w;
  std::vector<void*> raw;
  for (int i = 0; i < copies; ++i) {
    w.push_back(std::make_unique<bench::Buffer>(size_t(wbytes)));
    testing::fill_bf16(w.back()->as<uint16_t>(), N * K, rng);
    raw.push_back(w.back()->data());
  }
  std::vector<uint16_t> a(size_t(M * K)), c(size_t(M * N));
  testing::fill_bf16(a.data(), M * K, rng);
  GemmParams p{.a = make_view(a.data(), DType::kBF16, {M, K}),
               .b = kn ? make_view(raw[0], DType::kBF16, {K, N}) : make_view(raw[0], DType::kBF16, {N, K}),
               .c = make_view(c.data(), DType::kBF16, {M, N}), .b_kn = kn};
  std::vector<uint8_t> ws(gemm_workspace_size(p));
  size_t i = 0;
  bench::Record r{.op = "gemm", .case_ = shape_case("bf16", M, N, K) + " packed=0" + (kn ? " kn=1" : ""), .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = std::to_string(copies) + " weight copies rotated, unpacked" + (kn ? " [K, N]" : "");
  r.peak_bytes = double(ws.size());
  std::vector<std::function<void()>> fns = {[&] {
    p.b.data = raw[i++ % raw.size()];
    bench::check(gemm(p, {ws.data(), ws.size()}));
  }};
  std::vector<bench::Record> peers;
#ifdef OPTX_HAVE_ONEDNN
  std::unique_ptr<OnednnMatmul> dnn;
  if (!kn) dnn = make_onednn(true, ctx.threads, M, N, K, a.data(), raw, c.data(), true);
  if (dnn) {
    peers.push_back({.op = "gemm", .case_ = r.case_, .impl = "onednn", .roof = bench::Roof::kMemory});
    peers.back().note = dnn->pd.impl_info_str() + std::string(", plain weights");
    fns.push_back(std::ref(*dnn));
  }
#endif
  run_case(ctx, r, fns, peers, 2.0 * M * N * K, wbytes);
}

void bench_gemm(bench::Context& ctx) {
  bench_square(ctx, false);
  bench_square(ctx, true);
  bench_gemv(ctx, DType::kBF16, 1);
  bench_gemv(ctx, DType::kI8, 1);
  if (!ctx.quick) bench_gemv(ctx, DType::kBF16, 4);
  if (!ctx.quick) bench_gemv(ctx, DType::kBF16, 16);
  if (!ctx.quick) bench_gemv(ctx, DType::kBF16, 64);  // mid M: beside the unpacked M = 32 / 128 rows
  if (!ctx.quick) bench_gemv(ctx, DType::kBF16, 256);
  if (!ctx.quick) bench_gemv(ctx, DType::kI8, 256);
  if (!ctx.quick) bench_unpacked(ctx, 1, false);
  if (!ctx.quick) bench_unpacked(ctx, 1, true);
  if (!ctx.quick) bench_unpacked(ctx, 8, false);
  if (!ctx.quick) bench_unpacked(ctx, 32, false);
  if (!ctx.quick) bench_unpacked(ctx, 128, false);
}

OPTX_REGISTER_BENCH("gemm", bench_gemm);

}  // namespace
}  // namespace optx::gemm_detail
