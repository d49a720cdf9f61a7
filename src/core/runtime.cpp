// Runtime state: ISA level (detected, capped by OPTX_MAX_ISA), thread count, allocation.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/log.h"
#include "optx/runtime.h"

#ifndef OPTX_VERSION_STRING
#define OPTX_VERSION_STRING "0.0.0"
#endif

namespace optx {

const char* version() { return OPTX_VERSION_STRING; }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512_bf16";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

Isa detected_isa() {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma;
  // The avx512_bf16 unit is built with AVX512_VNNI too (int8 dot products): every CPU with
  // AVX512_BF16 has it (Cooper Lake, Sapphire Rapids and later, Zen 4 / 5).
  const bool bf16 = avx512 && f.avx512_bf16 && f.avx512_vnni;
  if (bf16 && f.amx_tile && f.amx_bf16 && f.amx_permitted) return Isa::kAmx;
  if (bf16) return Isa::kAvx512Bf16;
  if (avx512) return Isa::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return Isa::kAvx2;
  return Isa::kScalar;
}

namespace {
Isa compute_active_isa() {
  Isa isa = detected_isa();
  const char* cap = std::getenv("OPTX_MAX_ISA");
  if (cap && *cap) {
    bool known = false;
    for (int i = 0; i <= int(Isa::kAmx); ++i) {
      if (std::strcmp(cap, isa_name(Isa(i))) == 0) {
        known = true;
        if (Isa(i) < isa) isa = Isa(i);
      }
    }
    if (!known)
      log_warning(std::string("OPTX_MAX_ISA='") + cap +
                  "' is not one of scalar|avx2|avx512|avx512_bf16|amx; ignored");
  }
  return isa;
}

std::atomic<int> g_threads{0};
thread_local int t_threads = 0;  // ThreadScope override; 0 = use g_threads

int default_threads() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env && std::atoi(env) > 0) return std::atoi(env);
  return omp_get_num_procs();
}
}  // namespace

Isa active_isa() {
  static const Isa isa = compute_active_isa();
  return isa;
}

void set_num_threads(int n) { g_threads.store(n > 0 ? n : default_threads()); }

ThreadScope::ThreadScope(int n) : prev_(t_threads) { t_threads = std::max(n, 0); }
ThreadScope::~ThreadScope() { t_threads = prev_; }

int num_threads() {
  // OMP_THREAD_LIMIT: no team gets more, so neither count plans for more (a ThreadScope
  // past it planned splits for threads that never came, and sized workspaces for them).
  if (t_threads > 0) return std::min({t_threads, omp_get_thread_limit(), kMaxThreads});
  // A parallel region opened here would get a team of one: planning for more would split
  // the work for threads that never come (or, in kernels with per-thread shares, leave
  // their shares undone).
  if (omp_get_active_level() >= omp_get_max_active_levels()) return 1;
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = default_threads();
    g_threads.store(n);
  }
  return std::min({n, omp_get_thread_limit(), kMaxThreads});
}

void* aligned_alloc_bytes(size_t bytes, size_t align) {
  if (bytes == 0) bytes = align;
  // Large buffers (packed weights, pools) go on 2 MiB boundaries and ask for transparent
  // huge pages: a first touch of a 4 KiB page costs ~12 us here, and streaming weights
  // through 4 KiB pages costs a TLB walk every 4 KiB. Without THP this is a plain allocation.
  constexpr size_t kHuge = size_t(2) << 20;
  const bool huge = bytes >= 2 * kHuge;
  if (huge && align < kHuge) align = kHuge;
  if (bytes > SIZE_MAX - align) return nullptr;  // the round-up below would wrap to a tiny block
  void* p = nullptr;
  if (posix_memalign(&p, align, (bytes + align - 1) / align * align) != 0) return nullptr;
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void aligned_free(void* p) { std::free(p); }

bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("OPTX_VERBOSE");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return v;
}

void log_warning(const std::string& msg) { std::fprintf(stderr, "optx: warning: %s\n", msg.c_str()); }
void log_verbose(const std::string& msg) {
  if (verbose()) std::fprintf(stderr, "optx: %s\n", msg.c_str());
}

}  // namespace optx
