// Bench driver pieces: timing, machine ceilings, registration.
#include "bench/bench.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "bench/torch_peer.h"
#include "optx/runtime.h"

#ifdef OPTX_HAVE_OPENBLAS
extern "C" char* openblas_get_corename(void);
#endif

namespace optx::bench {

namespace {
std::vector<Registered>& bench_list() {
  static std::vector<Registered> v;
  return v;
}
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void prepare_peers(char** argv) {
#ifdef OPTX_HAVE_OPENBLAS
  // OpenBLAS picks its kernel when the library loads. Debian's 0.3.21 does not know some
  // newer or virtualised CPUs and falls back to the generic Prescott kernel, which would
  // make it a straw man; with no explicit OPENBLAS_CORETYPE, restart once with its best
  // AVX-512 kernel (SkylakeX measured fastest here, ahead of Cooperlake).
  const std::string core = openblas_get_corename();
  const bool weak = core != "SkylakeX" && core != "Cooperlake" && core != "SapphireRapids";
  if (weak && detected_isa() >= Isa::kAvx512 && !std::getenv("OPENBLAS_CORETYPE") &&
      !std::getenv("OPTX_BENCH_REEXEC")) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    unsetenv("OPENBLAS_L2_SIZE");
    setenv("OPTX_BENCH_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: keep going with Prescott
  }
#else
  (void)argv;
#endif
}

bool register_bench(const char* op, BenchFn fn) {
  bench_list().push_back({op, fn});
  return true;
}
const std::vector<Registered>& benches() { return bench_list(); }

namespace {
// Median and 90th percentile of each implementation's samples (ms).
std::vector<Timing> timings_of(std::vector<std::vector<double>>& ms) {
  std::vector<Timing> out;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    out.push_back({v[v.size() / 2], v[std::min(v.size() - 1, size_t(double(v.size()) * 0.9))]});
  }
  return out;
}
}  // namespace

// A copy of 64 MiB from DRAM (the ceiling's loop and buffers) and a read of as much, GB/s,
// medians of three; zeros before measure_ceilings().
struct Beside {
  double copy = 0, read = 0;
};
Beside probe_beside(int threads);

// One implementation is the interleaved loop of one (same warm-up, repetitions and time).
Timing Context::time_it(const std::function<void()>& fn) const { return time_interleaved({fn})[0]; }

// Copies bracketing a case's timing (before its warm-up, after its last call): the copy
// rate of the moment, against which its bytes / time is also reported. This VM's DRAM
// rate moves 2-3x between runs (copy ceilings 38-98 GB/s within one hour on the Zen 5
// host), so a ceiling taken minutes earlier can put a row at 184% of "copy".
// The faster of the two: a copy can stall for a moment (one probe here measured 7 GB/s
// between two of 58), and a row judged against a stalled copy would read 400%.
double best_of_copies(double before, double after) { return before > 0 && after > 0 ? std::max(before, after) : 0; }
// The read beside each row says what a read-only stream (decode weights, KV caches)
// could reach at that moment: on machines whose writes take a path of their own (Zen 4:
// two threads read at 72-74% of a copy's read + write bytes, alternating in one process)
// the copy overstates it.
void set_beside(const Context& ctx, const Beside& before, const Beside& after) {
  ctx.copy_beside_gbs = best_of_copies(before.copy, after.copy);
  ctx.read_beside_gbs = best_of_copies(before.read, after.read);
}

void Context::add_interleaved(const Record& optx, const std::function<void()>& optx_fn, const Record& basic,
                              const std::function<void()>& basic_fn, double flops, double bytes,
                              const std::vector<Peer>& peers) const {
  std::vector<std::function<void()>> fns = {optx_fn, basic_fn};
  for (const Peer& p : peers) fns.push_back(p.fn);
  const auto t = time_interleaved(fns);
  add(optx, t[0], flops, bytes);
  add(basic, t[1], flops, bytes);
  for (size_t i = 0; i < peers.size(); ++i) add(peers[i].record, t[i + 2], flops, bytes);
}

std::vector<Timing> Context::time_interleaved(const std::vector<std::function<void()>>& fns) const {
  const Beside before = probe_beside(threads);
  const double w0 = now_s();
  for (const auto& f : fns) f();  // warm-up: first touch, caches, thread pool, AMX power-up
  // Cases of a second or more per repetition get 3 repetitions (a median of 3 still).
  const int min_reps = (quick || now_s() - w0 > 1.0) ? 3 : 7;
  const double min_s = quick ? 0.15 : 0.6;
  std::vector<std::vector<double>> ms(fns.size());
  const double start = now_s();
  while (int(ms[0].size()) < min_reps || (now_s() - start < min_s * double(fns.size()) && ms[0].size() < 1000)) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const double t0 = now_s();
      fns[i]();
      ms[i].push_back((now_s() - t0) * 1e3);
    }
  }
  set_beside(*this, before, probe_beside(threads));
  return timings_of(ms);
}

std::vector<Timing> Context::time_blocks(const std::vector<std::function<void()>>& fns, double settle_s) const {
  const int min_rounds = quick ? 2 : 6;  // noise phases last seconds: more, shorter rounds balance them better
  const double block_s = quick ? 0.05 : 0.15;  // timed seconds per block
  std::vector<std::vector<double>> ms(fns.size());
  const Beside before = probe_beside(threads);
  for (int round = 0; round < min_rounds || int(ms[0].size()) < (quick ? 3 : 7); ++round)
    for (size_t i = 0; i < fns.size(); ++i) {
      const double b0 = now_s();
      do fns[i]();  // settle: at least one untimed call (also the first call's warm-up)
      while (now_s() - b0 < settle_s);
      const double t_start = now_s();
      do {
        const double t0 = now_s();
        fns[i]();
        ms[i].push_back((now_s() - t0) * 1e3);
      } while (now_s() - t_start < block_s);
    }
  set_beside(*this, before, probe_beside(threads));
  return timings_of(ms);
}

namespace {
// First failure of each case since its last row ("" key: whichever row comes next).
std::vector<std::pair<std::string, std::string>> g_pending;
std::vector<std::string> g_failed_cases;  // "op case" whose rows are dropped
}  // namespace

void check(const Status& st, const std::string& key) {
  if (st.ok()) return;
  for (const auto& [k, msg] : g_pending)
    if (k == key) return;
  g_pending.emplace_back(key, st.message());
}

void expect_agree(const std::string& key, const void* got, const void* ref, int64_t n, DType dt, double rel_tol) {
  auto at = [dt](const void* p, int64_t i) {
    return dt == DType::kBF16 ? double(bf16_to_f32(static_cast<const uint16_t*>(p)[i])) : double(static_cast<const float*>(p)[i]);
  };
  double diff = 0, mag = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = at(got, i), r = at(ref, i), d = std::fabs(g - r);
    mag = std::max(mag, std::fabs(r));
    if (!(d <= diff)) diff = d, worst = i;  // NaN counts as the worst
  }
  if (diff <= rel_tol * mag) return;
  char msg[160];
  std::snprintf(msg, sizeof msg, "optx and basic disagree: |diff| %.3g at %lld (optx %.4g, basic %.4g) over max |basic| %.3g", diff,
                static_cast<long long>(worst), at(got, worst), at(ref, worst), mag);
  check(Error(StatusCode::kInternal, msg), key);
}

void Context::add(Record r, const Timing& t, double flops, double bytes) const {
  const std::string key = r.op + " " + r.case_;
  const bool failed = std::find(g_failed_cases.begin(), g_failed_cases.end(), key) != g_failed_cases.end();
  for (size_t i = 0; i < g_pending.size(); ++i)
    if (g_pending[i].first == key || g_pending[i].first.empty()) {
      if (!failed) {  // a case is reported once, whatever else went wrong in it
        std::fprintf(stderr, "optx bench: %s failed: %s\n", key.c_str(), g_pending[i].second.c_str());
        if (failures) failures->push_back(key);
        g_failed_cases.push_back(key);
      }
      g_pending.erase(g_pending.begin() + std::ptrdiff_t(i));
      return;
    }
  if (failed) return;
  r.median_ms = t.median_ms;
  r.p90_ms = t.p90_ms;
  r.threads = threads;
  const double s = t.median_ms * 1e-3;
  r.gflops = flops > 0 ? flops / s * 1e-9 : 0;
  r.gbytes_per_s = bytes > 0 ? bytes / s * 1e-9 : 0;
  // Floor: the larger of compute time at peak and transfer time at copy bandwidth, for
  // every row that counts both (decode attention and GEMV rows too: MLA decode does ~30
  // FLOPs per cache byte, and its compute time, not its bytes, is the floor). f32 rows
  // use the FMA peak; bf16 products can also run widened at the FMA rate or on AMX tiles,
  // so the others use the fastest peak the machine has.
  const double peak = r.roof == Roof::kF32 ? ceil.fma_f32_gflops
                                           : std::max({ceil.dot_bf16_gflops, ceil.fma_f32_gflops, ceil.amx_bf16_gflops});
  const double compute_s = flops > 0 && peak > 0 ? flops / (peak * 1e9) : 0;
  const double memory_s = bytes > 0 && ceil.copy_gbytes_per_s > 0 ? bytes / (ceil.copy_gbytes_per_s * 1e9) : 0;
  const double floor_s = std::max(compute_s, memory_s);
  // The table names the bound that sets the floor: a bf16 case with few rows (MoE decode)
  // is bound by its weight bytes, not by the dot peak.
  if (memory_s > compute_s) r.roof = Roof::kMemory;
  else if (compute_s > 0 && r.roof == Roof::kMemory) r.roof = Roof::kBF16;
  r.share_of_floor = floor_s > 0 ? floor_s / s : 0;
  if (r.roof == Roof::kMemory && copy_beside_gbs > 0) {
    char beside[128];
    std::snprintf(beside, sizeof beside, "%s%.0f%% of a copy beside (%.1f GB/s), %.0f%% of a read beside (%.1f)",
                  r.note.empty() ? "" : "; ", 100.0 * bytes / (copy_beside_gbs * 1e9) / s, copy_beside_gbs,
                  100.0 * bytes / (read_beside_gbs * 1e9) / s, read_beside_gbs);
    r.note += beside;
  }
  records->push_back(std::move(r));
}

// ---- ceilings -------------------------------------------------------------------------------
namespace {

// 16 independent accumulator chains: enough to cover FMA latency (4 cycles) x 2 ports.
__attribute__((target("avx512f,fma"))) float fma_loop_avx512(int64_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}
__attribute__((target("avx512f,avx512bf16"))) float dot_loop_bf16(int64_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x33003300);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}

// AMX: four independent 16 x 16 f32 accumulator tiles, inputs from registers. Needs the
// process's tile permission (requested during cpu_features()).
struct alignas(64) AmxConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
__attribute__((target("amx-tile,amx-bf16"))) float amx_loop(int64_t iters_in) {
  const int64_t iters = iters_in / 50;
  AmxConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) uint16_t in[16 * 32];
  for (auto& v : in) v = 0x3c00;  // small values: no overflow over many iterations
  _tile_loadd(4, in, 64);
  _tile_loadd(5, in, 64);
  _tile_loadd(6, in, 64);
  _tile_loadd(7, in, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

volatile float g_sink;

// Runs loop(iters) on every thread at once; returns the aggregate GFLOP/s.
double peak_rate(int threads, float (*loop)(int64_t), double flops_per_iter, bool quick) {
  const int64_t iters = quick ? 10'000'000 : 20'000'000;  // ~30-70 ms: long enough to see through VM jitter
  double best = 0;
  for (int rep = 0; rep < (quick ? 3 : 5); ++rep) {
    double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
#pragma omp master
      t0 = now_s();
      g_sink = loop(iters);
#pragma omp barrier
#pragma omp master
      t1 = now_s();
    }
    best = std::max(best, flops_per_iter * double(iters) * threads / (t1 - t0) * 1e-9);
  }
  return best;
}

void* alloc_big(size_t bytes) {
  // 2 MiB alignment + transparent huge pages where granted: first touch of 4 KiB pages
  // costs ~12 us each here, 512 MiB of them would cost seconds.
  void* p = aligned_alloc_bytes(bytes, size_t(2) << 20);
  if (p) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

volatile float read_sink;

// Sums 64-byte lines of eight equal parts of the range at once: eight sequential streams
// per core, which the hardware prefetchers follow side by side. One stream per core (even
// with software prefetches 4 KiB ahead, as this loop had) reads ~75% of this rate here:
// 2 threads over 512 MiB, alternating in one process, 1 stream 27.6-31.6 GB/s, 4 streams
// 40.0, 8 streams 40.3-41.6 (software prefetches on top: 37.6-38.7).
__attribute__((target("avx512f"))) float read_avx512(const char* p, size_t bytes) {
  constexpr int kStreams = 8;
  const size_t part = bytes / kStreams / 128 * 128;
  __m512 a[kStreams];
  for (int s = 0; s < kStreams; ++s) a[s] = _mm512_setzero_ps();
  for (size_t i = 0; i < part; i += 128)
    for (int s = 0; s < kStreams; ++s) {
      const float* q = reinterpret_cast<const float*>(p + size_t(s) * part + i);
      a[s] = _mm512_add_ps(a[s], _mm512_add_ps(_mm512_load_ps(q), _mm512_load_ps(q + 16)));
    }
  for (int s = 1; s < kStreams; ++s) a[0] = _mm512_add_ps(a[0], a[s]);
  float o[16];
  _mm512_storeu_ps(o, a[0]);
  return o[0];
}
// The same with AVX2 loads (hosts without AVX-512 read one byte per line before: 27.4 GB/s
// where this loop reads 32.0, 2 threads over 512 MiB).
__attribute__((target("avx2"))) float read_avx2(const char* p, size_t bytes) {
  constexpr int kStreams = 8;
  const size_t part = bytes / kStreams / 64 * 64;
  __m256 a[kStreams];
  for (int s = 0; s < kStreams; ++s) a[s] = _mm256_setzero_ps();
  for (size_t i = 0; i < part; i += 64)
    for (int s = 0; s < kStreams; ++s) {
      const float* q = reinterpret_cast<const float*>(p + size_t(s) * part + i);
      a[s] = _mm256_add_ps(a[s], _mm256_add_ps(_mm256_load_ps(q), _mm256_load_ps(q + 8)));
    }
  for (int s = 1; s < kStreams; ++s) a[0] = _mm256_add_ps(a[0], a[s]);
  float o[8];
  _mm256_storeu_ps(o, a[0]);
  return o[0];
}

// Copies with non-temporal stores, so the copy moves 2 bytes of DRAM traffic per byte
// copied. memcpy chose per call: glibc 2.36 streams only past its non-temporal threshold
// (192 MiB here), so the 128 MiB each of 2 threads copied went through ordinary stores,
// each destination line read before it was written (3 bytes of traffic per 2 counted),
// while 1 thread's 256 MiB streamed: 2 threads measured 24.6-25.2 GB/s, 1 thread 30.9, and
// this loop 36.9-38.9 on 2 threads (alternating in one process, 256 / 512 MiB buffers).
__attribute__((target("avx512f"))) void copy_nt_avx512(char* dst, const char* src, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_load_si512(src + i));
  _mm_sfence();
}
__attribute__((target("avx2"))) void copy_nt_avx2(char* dst, const char* src, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) {
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i y = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), x);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), y);
  }
  _mm_sfence();
}

float read_scalar(const char* p, size_t bytes) {
  float s = 0;
  for (size_t i = 0; i < bytes; i += 64) s += float(p[i]);
  return s;
}
float read_stream(const char* p, size_t bytes, int threads) {
  float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const size_t lo = bytes * size_t(t) / size_t(T) / 256 * 256, hi = bytes * size_t(t + 1) / size_t(T) / 256 * 256;
    total += detected_isa() >= Isa::kAvx512 ? read_avx512(p + lo, hi - lo)
             : detected_isa() >= Isa::kAvx2 ? read_avx2(p + lo, hi - lo)
                                            : read_scalar(p + lo, hi - lo);
  }
  return total;
}

// The copy ceiling's two buffers, kept for the copies timed beside each case.
struct CopyBuffers {
  char* src = nullptr;
  char* dst = nullptr;
  size_t bytes = 0;  // per buffer
  size_t next = 0;   // offset of the next probe chunk
};
CopyBuffers g_copy;

void copy_nt(char* dst, const char* src, size_t bytes, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const size_t lo = bytes * size_t(t) / size_t(T) / 64 * 64, hi = bytes * size_t(t + 1) / size_t(T) / 64 * 64;
    if (detected_isa() >= Isa::kAvx512) copy_nt_avx512(dst + lo, src + lo, hi - lo);
    else if (detected_isa() >= Isa::kAvx2) copy_nt_avx2(dst + lo, src + lo, hi - lo);
    else std::memcpy(dst + lo, src + lo, hi - lo);
  }
}

double copy_bandwidth(int threads, bool quick, double& read_gbs) {
  const size_t bytes = dram_working_set() / 2;  // per buffer
  char* src = static_cast<char*>(alloc_big(bytes));
  char* dst = static_cast<char*>(alloc_big(bytes));
  if (!src || !dst) {
    aligned_free(src);
    aligned_free(dst);
    return 0;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < int64_t(bytes); i += 4096) {
    src[i] = char(i);
    dst[i] = 0;
  }
  std::vector<double> gbs;
  for (int rep = 0; rep < (quick ? 3 : 7); ++rep) {
    const double t0 = now_s();
    copy_nt(dst, src, bytes, threads);
    gbs.push_back(2.0 * double(bytes) / (now_s() - t0) * 1e-9);
  }
  std::sort(gbs.begin(), gbs.end());
  const double copy = gbs[gbs.size() / 2];

  // Read-only stream over both buffers in turn (the floor of weight-streaming decode).
  std::vector<double> rd;
  for (int rep = 0; rep < (quick ? 3 : 7); ++rep) {
    char* p = rep % 2 ? dst : src;
    const double t0 = now_s();
    read_sink = read_stream(p, bytes, threads);
    rd.push_back(double(bytes) / (now_s() - t0) * 1e-9);
  }
  std::sort(rd.begin(), rd.end());
  read_gbs = rd[rd.size() / 2];
  aligned_free(g_copy.src);
  aligned_free(g_copy.dst);
  g_copy = {src, dst, bytes, 0};
  return copy;
}

}  // namespace

Buffer::Buffer(size_t bytes) : p_(aligned_alloc_bytes(bytes)), bytes_(bytes) {
  if (!p_ && bytes) throw std::bad_alloc();
  if (p_) std::memset(p_, 0, bytes);
}
Buffer::~Buffer() { aligned_free(p_); }

std::vector<Context::Peer> torch_row(const TorchPeer& torch, const Record& optx_rec, const char* what,
                                     std::function<const char*(int set, const TensorView& out)> run, const TensorView& out,
                                     const void* expect, int sets, double rel_tol, bool in_place) {
  const std::string key = optx_rec.op + " " + optx_rec.case_;
  torch.peak_bytes(true);
  if (const char* err = run(0, out)) {
    std::fprintf(stderr, "optx bench: %s: torch: %s; no torch row\n", key.c_str(), err);
    return {};
  }
  expect_agree(key, expect, out.data, out.numel(), out.dtype, rel_tol);
  Record r = optx_rec;
  r.impl = "torch";
  const double result = in_place ? 0.0 : double(out.numel()) * double(dtype_size(out.dtype));
  r.peak_bytes = std::max(0.0, double(torch.peak_bytes(false)) - result);
  r.note = torch.describe(what);
  auto set = std::make_shared<int>(sets / 4);
  auto fn = [run, set, sets, key] {
    if (const char* err = run((*set)++ % sets, TensorView{})) check(Status(StatusCode::kInternal, err), key);
  };
  return {{r, fn}};
}

std::vector<std::vector<int32_t>> disjoint_tables(int sets, int64_t per_set, testing::Rng& rng) {
  const int64_t num_blocks = per_set * sets;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) ids[size_t(i)] = int32_t(i);
  for (int64_t i = num_blocks - 1; i > 0; --i) std::swap(ids[size_t(i)], ids[size_t(rng.below(i + 1))]);
  std::vector<std::vector<int32_t>> tables;
  for (int s = 0; s < sets; ++s) tables.emplace_back(ids.begin() + s * per_set, ids.begin() + (s + 1) * per_set);
  return tables;
}

size_t dram_working_set() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max(size_t(512) << 20, llc > 0 ? 2 * size_t(llc) : 0);
}

Beside probe_beside(int threads) {
  if (!g_copy.src) return {};
  // 64 MiB chunks walking the 2 x 256+ MiB buffers: each chunk's source was last touched
  // hundreds of MiB ago, so it comes from DRAM as the ceiling's did; the read then takes
  // the chunk just written with streaming stores, which went to DRAM as well.
  const size_t chunk = std::min(g_copy.bytes, size_t(64) << 20);
  double copy[3], read[3];
  for (int i = 0; i < 3; ++i) {
    if (g_copy.next + chunk > g_copy.bytes) g_copy.next = 0;
    double t0 = now_s();
    copy_nt(g_copy.dst + g_copy.next, g_copy.src + g_copy.next, chunk, threads);
    copy[i] = 2.0 * double(chunk) / (now_s() - t0) * 1e-9;
    t0 = now_s();
    read_sink = read_stream(g_copy.dst + g_copy.next, chunk, threads);
    read[i] = double(chunk) / (now_s() - t0) * 1e-9;
    g_copy.next += chunk;
  }
  std::sort(copy, copy + 3);
  std::sort(read, read + 3);
  return {copy[1], read[1]};
}

Ceilings measure_ceilings(int threads, bool quick) {
  Ceilings c;
  const CpuFeatures& f = cpu_features();
  const Isa isa = detected_isa();
  if (isa >= Isa::kAvx512) c.fma_f32_gflops = peak_rate(threads, fma_loop_avx512, 16 * 16 * 2, quick);
  else if (isa >= Isa::kAvx2) c.fma_f32_gflops = peak_rate(threads, fma_loop_avx2, 12 * 8 * 2, quick);
  if (f.avx512_bf16) c.dot_bf16_gflops = peak_rate(threads, dot_loop_bf16, 16 * 16 * 4, quick);
  else c.dot_bf16_gflops = c.fma_f32_gflops;
  // A tdpbf16ps is 16 x 16 x 32 multiply-adds; the loop is 50x denser than the others.
  if (detected_isa() >= Isa::kAmx) c.amx_bf16_gflops = peak_rate(threads, amx_loop, 4.0 * 16 * 16 * 32 * 2 / 50, quick);
  c.copy_gbytes_per_s = copy_bandwidth(threads, quick, c.read_gbytes_per_s);
  return c;
}

}  // namespace optx::bench
