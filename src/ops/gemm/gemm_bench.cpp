// `optx bench` rows for gemm, side by side with OpenBLAS and oneDNN in the same run.
//
// Compute-bound cases (M = N = K = 2048) are judged against the FMA / bf16-dot peaks;
// decode GEMVs (M = 1) against copy bandwidth, counting weight bytes only. GEMV weights
// rotate among enough packed copies that the working set is >= 256 MiB, so they stream
// from DRAM rather than from a (virtualised, possibly huge) last-level cache.
#include <omp.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
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

constexpr int64_t kRotateBytes = int64_t(256) << 20;

struct Aligned {
  void* p = nullptr;
  explicit Aligned(size_t bytes) : p(aligned_alloc_bytes(bytes)) {}
  ~Aligned() { aligned_free(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

std::string shape_case(const char* dtype, int64_t M, int64_t N, int64_t K) {
  return std::string("dtype=") + dtype + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
         " K=" + std::to_string(K);
}

// Times optx gemm on packed weights, rotating over `copies` packed matrices.
bench::Timing time_optx(bench::Context& ctx, GemmParams p, const std::vector<PackedWeights>& w) {
  p.packed_b = &w[0][0];
  std::vector<uint8_t> ws(gemm_workspace_size(p));
  size_t i = 0;
  return ctx.time_it([&] {
    p.packed_b = &w[i++ % w.size()][0];
    (void)gemm(p, {ws.data(), ws.size()});
  });
}

#ifdef OPTX_HAVE_ONEDNN
// oneDNN bf16 matmul C[M, N] = A[M, K] * W^T, W given [N, K] row-major and reordered once
// into oneDNN's preferred layout (its equivalent of packing), `copies` times for rotation.
// Adds one record with impl "onednn" and the kernel oneDNN chose in the note.
void bench_onednn_bf16(bench::Context& ctx, const bench::Record& like, int64_t M, int64_t N, int64_t K,
                       void* a, void* w, void* c, int copies, double flops, double bytes) {
  omp_set_num_threads(ctx.threads);
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  using dt = memory::data_type;
  using tag = memory::format_tag;
  memory::desc a_md({M, K}, dt::bf16, tag::ab), w_any({K, N}, dt::bf16, tag::any), c_md({M, N}, dt::bf16, tag::ab);
  matmul::primitive_desc pd(matmul::desc(a_md, w_any, c_md), eng);
  memory w_user({{K, N}, dt::bf16, tag::ba}, eng, w);  // [N, K] row-major == [K, N] "ba"
  std::vector<memory> ws;
  for (int i = 0; i < copies; ++i) {
    ws.emplace_back(pd.weights_desc(), eng);
    reorder(w_user, ws.back()).execute(s, w_user, ws.back());
  }
  memory a_mem(a_md, eng, a), c_mem(c_md, eng, c);
  matmul mm(pd);
  bench::Record o = like;
  o.impl = "onednn";
  o.note = pd.impl_info_str();
  o.peak_bytes = 0;
  size_t i = 0;
  const auto tm = ctx.time_it([&] {
    mm.execute(s, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, ws[i++ % ws.size()]}, {DNNL_ARG_DST, c_mem}});
    s.wait();
  });
  ctx.add(o, tm, flops, bytes);
}
#endif

void bench_square(bench::Context& ctx, bool bf16) {
  const int64_t M = 2048, N = 2048, K = 2048;
  const char* dt = bf16 ? "bf16" : "f32";
  const DType t = bf16 ? DType::kBF16 : DType::kF32;
  const size_t es = dtype_size(t);
  testing::Rng rng(11);
  Aligned a(size_t(M * K) * es), b(size_t(N * K) * es), c(size_t(M * N) * es);
  if (bf16) {
    testing::fill_bf16(a.as<uint16_t>(), M * K, rng);
    testing::fill_bf16(b.as<uint16_t>(), N * K, rng);
  } else {
    testing::fill_f32(a.as<float>(), M * K, rng);
    testing::fill_f32(b.as<float>(), N * K, rng);
  }
  std::vector<PackedWeights> w(1);
  (void)pack_weights({.w = make_view(b.p, t, {N, K})}, &w[0]);
  GemmParams p{.a = make_view(a.p, t, {M, K}), .c = make_view(c.p, t, {M, N})};
  const double flops = 2.0 * M * N * K;
  const double bytes = double(M * K + N * K + M * N) * double(es);
  const bench::Roof roof = bf16 ? bench::Roof::kBF16 : bench::Roof::kF32;
  bench::Record r{.op = "gemm", .case_ = shape_case(dt, M, N, K), .impl = "optx", .roof = roof};
  r.note = selected_impl("gemm");
  r.peak_bytes = double(gemm_workspace_size(p));  // extra memory beyond inputs and output
  ctx.add(r, time_optx(ctx, p, w), flops, bytes);

#ifdef OPTX_HAVE_OPENBLAS
  if (!bf16) {
    openblas_set_num_threads(ctx.threads);
    bench::Record o{.op = "gemm", .case_ = r.case_, .impl = "openblas", .roof = roof};
    o.note = std::string("core=") + openblas_get_corename();
    const auto tm = ctx.time_it([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.0f, a.as<float>(), int(K),
                  b.as<float>(), int(K), 0.0f, c.as<float>(), int(N));
    });
    ctx.add(o, tm, flops, bytes);
  }
#endif
#ifdef OPTX_HAVE_ONEDNN
  if (bf16) bench_onednn_bf16(ctx, r, M, N, K, a.p, b.p, c.p, 1, flops, bytes);
#endif
}

void bench_gemv(bench::Context& ctx, DType wt, int64_t M) {
  const int64_t N = 4096, K = 4096;
  const bool i8 = wt == DType::kI8;
  const char* dt = i8 ? "i8w" : "bf16";
  const double wbytes = double(N * K) * double(dtype_size(wt)) + (i8 ? 4.0 * N : 0.0);
  const int copies = int((kRotateBytes + int64_t(wbytes) - 1) / int64_t(wbytes)) + 1;
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
    (void)pack_weights({.w = make_view(raw.data(), wt, {N, K}),
                        .scales = i8 ? make_view(scales.data(), DType::kF32, {N}) : TensorView{}},
                       &pw);
  std::vector<uint16_t> a(size_t(M * K)), c(size_t(M * N));
  testing::fill_bf16(a.data(), M * K, rng);
  GemmParams p{.a = make_view(a.data(), DType::kBF16, {M, K}), .c = make_view(c.data(), DType::kBF16, {M, N})};
  p.packed_b = &w[0][0];  // for the workspace size; time_optx rotates it
  const double flops = 2.0 * M * N * K;
  bench::Record r{.op = "gemm", .case_ = shape_case(dt, M, N, K), .impl = "optx", .roof = bench::Roof::kMemory};
  r.note = std::to_string(copies) + " weight copies rotated";
  r.peak_bytes = double(gemm_workspace_size(p));
  ctx.add(r, time_optx(ctx, p, w), flops, wbytes);

#ifdef OPTX_HAVE_ONEDNN
  if (!i8) bench_onednn_bf16(ctx, r, M, N, K, a.data(), raw.data(), c.data(), copies, flops, wbytes);
#endif
}

void bench_gemm(bench::Context& ctx) {
  bench_square(ctx, false);
  bench_square(ctx, true);
  bench_gemv(ctx, DType::kBF16, 1);
  bench_gemv(ctx, DType::kI8, 1);
  if (!ctx.quick) bench_gemv(ctx, DType::kBF16, 16);
}

OPTX_REGISTER_BENCH("gemm", bench_gemm);

}  // namespace
}  // namespace optx::gemm_detail
