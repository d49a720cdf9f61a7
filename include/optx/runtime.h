// optx/runtime.h — version, CPU features, ISA dispatch control, threads, workspaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace optx {

const char* version();

// ---- CPU features (cpuid + XCR0: a feature counts only if the OS saves its registers) ---
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_vnni = false, avx_vnni = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool amx_permitted = false;  // the OS granted this process the AMX tile state
  // vdpbf16ps retires at the rate of an f32 FMA, so it does twice the FLOPs (AMD Zen 4 / 5:
  // both run on the FMA pipes). Intel's AVX512_BF16 cores (Cooper Lake, Sapphire Rapids)
  // issue it on one port against two for FMA: there widening bf16 to f32 and using FMAs is
  // the faster compute-bound bf16 GEMM.
  bool fast_bf16_dot = false;
  std::string vendor;  // cpuid leaf 0, e.g. "GenuineIntel", "AuthenticAMD"
  std::string brand;
};
const CpuFeatures& cpu_features();

// ISA levels, ordered: an implementation built for level L runs on any CPU at level >= L.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };
const char* isa_name(Isa isa);
// Best level the CPU supports.
Isa detected_isa();
// detected_isa() capped by OPTX_MAX_ISA (read once, at first use).
Isa active_isa();

// Name of the implementation the op will run with the current settings (honours
// OPTX_MAX_ISA and OPTX_IMPL), or "" for an unknown op.
std::string selected_impl(const std::string& op);
// All registered ops, in registration order.
std::vector<std::string> registered_ops();

// ---- threads ------------------------------------------------------------------------------
// Defaults to OMP_NUM_THREADS if set, else the number of cores.
void set_num_threads(int n);
// The threads an op called from this thread plans for: the ThreadScope override, else
// set_num_threads' count, either at most OMP_THREAD_LIMIT and kMaxThreads (an OpenMP team
// of INT_MAX threads made libgomp exit the process) — except 1 inside an OpenMP parallel
// region that cannot fork another team (nesting off or at its OMP_MAX_ACTIVE_LEVELS): an
// op called there runs on the calling thread. Ops may be called concurrently from several
// threads (each with its own outputs and workspace), from user threads or from the
// threads of a parallel region.
int num_threads();
inline constexpr int kMaxThreads = 1024;

// Overrides num_threads() for the calling thread only, while in scope (scopes nest). An op
// that already spreads independent work items over the threads (e.g. MoE experts) runs
// the ops inside each item with ThreadScope serial(1), so they neither fork a nested team
// nor plan their tiles for threads they will not get.
class ThreadScope {
 public:
  explicit ThreadScope(int n);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int prev_;
};

// ---- memory -------------------------------------------------------------------------------
inline constexpr size_t kAlign = 64;
// Rounds a byte count (or an address) up to kAlign: workspace carving in every op.
inline constexpr size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
void* aligned_alloc_bytes(size_t bytes, size_t align = kAlign);  // nullptr on failure
void aligned_free(void* p);

// Caller-owned scratch memory for one op call. Size it with the op's *_workspace_size().
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

}  // namespace optx
