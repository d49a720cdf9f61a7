// liboptx_torch_peer.so: PyTorch as a peer of `optx bench` (see torch_peer.h). Built only
// with -DOPTX_TORCH_PEER=ON; links PyTorch's libtorch_cpu / libc10 and nothing of optx.
#include "bench/torch_peer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/SDPBackend.h>
#include <c10/core/CPUAllocator.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/csrc/api/include/torch/version.h>)
#include <torch/csrc/api/include/torch/version.h>
#else
#define TORCH_VERSION "(version unknown)"
#endif

#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace optx::bench {
namespace {

// PyTorch's default CPU allocator hands every tensor fresh memory from malloc, and a
// block past glibc's mmap threshold is new pages on every call: at ~12 us per 4 KiB page
// on these VMs an SDPA output of 16 MiB costs ~5% of the call (S = 4096, 2 threads: 70-75
// against 68-69 ms). Deployments run PyTorch on a caching malloc (jemalloc, tcmalloc) for
// that reason, and optx's own calls reuse their buffers, so the peer gets a cache too:
// freed blocks are kept by size and handed out again.
class CachingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* p = take(bytes);
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<void*, size_t>& sizes() {
    static std::unordered_map<void*, size_t> s;
    return s;
  }
  static std::multimap<size_t, void*>& free_blocks() {
    static std::multimap<size_t, void*> f;
    return f;
  }
  static void* take(size_t bytes) {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mu());
    if (auto it = free_blocks().find(bytes); it != free_blocks().end()) {
      void* p = it->second;
      free_blocks().erase(it);
      return p;
    }
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0) throw std::bad_alloc();
    sizes()[p] = bytes;
    return p;
  }
  static void release(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu());
    free_blocks().emplace(sizes().at(p), p);
  }
};

std::string& last_error() {
  static std::string e;
  return e;
}
std::string& last_sdpa_backend() {
  static std::string b = "not run yet";
  return b;
}

at::ScalarType scalar_type(DType t) { return t == DType::kBF16 ? at::kBFloat16 : at::kFloat; }

at::Tensor wrap(const TensorView& v) {
  return at::from_blob(v.data, at::IntArrayRef(v.sizes, size_t(v.rank)), at::IntArrayRef(v.strides, size_t(v.rank)),
                       at::TensorOptions().dtype(scalar_type(v.dtype)));
}

template <class F>
const char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    last_error() = e.what();
    return last_error().c_str();
  }
}

const char* sdpa(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, bool causal, float scale) {
  return guarded([&] {
    const at::Tensor tq = wrap(q), tk = wrap(k), tv = wrap(v);
    const bool gqa = q.sizes[1] != k.sizes[1];
    // Which of PyTorch's SDPA kernels this call takes (its own dispatch rule): for the note.
    switch (static_cast<at::SDPBackend>(at::_fused_sdp_choice(tq, tk, tv, {}, 0.0, causal, double(scale), gqa))) {
      case at::SDPBackend::math: last_sdpa_backend() = "math"; break;
      case at::SDPBackend::flash_attention: last_sdpa_backend() = "flash"; break;
      default: last_sdpa_backend() = "other";
    }
    const at::Tensor o = at::scaled_dot_product_attention(tq, tk, tv, {}, 0.0, causal, double(scale), gqa);
    if (out.data) wrap(out).copy_(o);
  });
}

const char* linear(const TensorView& a, const TensorView& b, const TensorView& c) {
  return guarded([&] {
    at::Tensor tc = wrap(c);
    at::mm_out(tc, wrap(a), wrap(b).t());
  });
}

const char* describe(const char* what) {
  static std::string s;
  s = std::string("torch ") + TORCH_VERSION;
  if (std::string(what) == "sdpa") s += " scaled_dot_product_attention (" + last_sdpa_backend() + " kernel)";
  if (std::string(what) == "mm_f32") s += at::hasMKL() ? " mm (MKL)" : " mm";
  if (std::string(what) == "mm_bf16") s += at::hasMKLDNN() ? " mm (oneDNN)" : " mm";
  return s.c_str();
}

void set_threads(int threads) { at::set_num_threads(threads); }

}  // namespace

extern "C" const TorchPeer* optx_torch_peer() {
  static const TorchPeer* peer = [] {
    static CachingAllocator alloc;
    c10::SetCPUAllocator(&alloc, /*priority=*/1);  // above the default allocator's 0
    static const TorchPeer p{.version = TORCH_VERSION, .describe = describe, .set_threads = set_threads, .sdpa = sdpa, .linear = linear};
    return &p;
  }();
  return peer;
}

}  // namespace optx::bench
