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

#include <algorithm>
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
// freed blocks are kept by size class (a quarter-power of two: at most 25% more than
// asked) and handed out again; exact sizes left MoE's per-expert tensors, whose row
// counts differ call to call, allocating fresh pages on most calls (T = 1024: p90 2-3x
// the median). It also counts the bytes held, for TorchPeer::peak_bytes.
class CachingAllocator final : public c10::Allocator {
 public:
  static size_t peak(bool reset) {
    std::lock_guard<std::mutex> lock(mu());
    const size_t p = peak_;
    if (reset) peak_ = held_;
    return p;
  }
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
  static size_t size_class(size_t bytes) {
    size_t top = 64;
    while (top < bytes) top <<= 1;
    const size_t quarter = std::max<size_t>(top / 8, 64);  // classes top/2 + k * top/8
    return (bytes + quarter - 1) / quarter * quarter;
  }
  static void* take(size_t asked) {
    if (asked == 0) return nullptr;
    const size_t bytes = size_class(asked);
    std::lock_guard<std::mutex> lock(mu());
    held_ += bytes;
    peak_ = std::max(peak_, held_);
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
    const size_t bytes = sizes().at(p);
    held_ -= bytes;
    free_blocks().emplace(bytes, p);
  }
  static inline size_t held_ = 0, peak_ = 0;
};

std::string& last_error() {
  static std::string e;
  return e;
}
std::string& last_paged_path() {
  static std::string p = "not run yet";
  return p;
}
std::string& last_sdpa_backend() {
  static std::string b = "not run yet";
  return b;
}

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::kBF16: return at::kBFloat16;
    case DType::kI32: return at::kInt;
    default: return at::kFloat;  // the bench passes f32, bf16 and i32 only
  }
}

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
    at::Tensor tq = wrap(q);
    const at::Tensor tk = wrap(k), tv = wrap(v);
    const int64_t hkv = k.sizes[1];
    // One query row per head sharing a KV head: the group's heads fold into that head's
    // query rows (as paged_sdpa's), where enable_gqa ran MQA decode (16 heads, S = 16384)
    // at 3.1 ms.
    const bool fold = q.sizes[2] == 1 && !causal && q.sizes[1] != hkv;
    if (fold) tq = tq.reshape({q.sizes[0], hkv, q.sizes[1] / hkv, q.sizes[3]});
    const bool gqa = tq.size(1) != hkv;
    // Which of PyTorch's SDPA kernels this call takes (its own dispatch rule): for the note.
    switch (static_cast<at::SDPBackend>(at::_fused_sdp_choice(tq, tk, tv, {}, 0.0, causal, double(scale), gqa))) {
      case at::SDPBackend::math: last_sdpa_backend() = "math"; break;
      case at::SDPBackend::flash_attention: last_sdpa_backend() = "flash"; break;
      default: last_sdpa_backend() = "other";
    }
    at::Tensor o = at::scaled_dot_product_attention(tq, tk, tv, {}, 0.0, causal, double(scale), gqa);
    if (fold) o = o.reshape({q.sizes[0], q.sizes[1], 1, v.sizes[3]});
    if (out.data) wrap(out).copy_(o);
  });
}

// One new token per sequence. The sequence's blocks are gathered whole (index_select of
// [block_size, Hkv, D] blocks), and each query head group shares its KV head, so the
// group's heads fold into the query rows of that head (q [1, Hkv, G, D], no GQA
// broadcast; PyTorch's own enable_gqa path ran 1.3x slower here). D == Dv takes SDPA (its
// flash kernel). MLA's 576 / 512 is outside that kernel, and SDPA's math path upcasts to
// f32 (ctx 8k: 13 ms), so it runs as DeepSeek's reference code writes absorbed MLA,
// scores = q . latent^T in bf16, softmax in f32 back to bf16, out = P . latent[:, :Dv],
// on 2-D mm per KV head: per-row gathers and batched 3-D matmul (whose path for these
// shapes ran the scores ~20x slower at ctx 32k) had MLA ctx 8k at 6.4 ms, this 3.1.
const char* paged_sdpa(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache, const TensorView& block_tables,
                       const TensorView& seq_lens, int64_t block_size, const TensorView& out, float scale) {
  return guarded([&] {
    const at::Tensor tq = wrap(q), tables = wrap(block_tables), lens = wrap(seq_lens);
    const int64_t hkv = k_cache.sizes[1], group = q.sizes[2] / hkv, dv = v_cache.sizes[2];
    const at::Tensor kb = wrap(k_cache).view({-1, block_size, hkv, k_cache.sizes[2]});
    const at::Tensor vb = wrap(v_cache).view({-1, block_size, hkv, dv});
    const bool same_dims = k_cache.sizes[2] == dv;
    last_paged_path() = same_dims ? "scaled_dot_product_attention" : "bf16 mm, f32 softmax, mm (DeepSeek's absorbed MLA)";
    for (int64_t b = 0; b < q.sizes[0]; ++b) {
      const int64_t n = lens[b].item<int64_t>(), blocks = (n + block_size - 1) / block_size;
      const at::Tensor ids = tables[b].slice(0, 0, blocks).to(at::kLong);
      const at::Tensor k = kb.index_select(0, ids).flatten(0, 1).slice(0, 0, n).transpose(0, 1);  // [Hkv, n, D]
      const at::Tensor v = vb.index_select(0, ids).flatten(0, 1).slice(0, 0, n).transpose(0, 1);
      const at::Tensor qb = tq[b][0].view({hkv, group, q.sizes[3]});  // [Hkv, G, D]
      at::Tensor o;
      if (same_dims) {
        o = at::scaled_dot_product_attention(qb.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), {}, 0.0, false, double(scale))[0];
      } else {
        std::vector<at::Tensor> heads;
        for (int64_t h = 0; h < hkv; ++h) {
          const at::Tensor p = (at::mm(qb[h], k[h].t()) * scale).softmax(-1, at::kFloat).to(qb.scalar_type());
          heads.push_back(at::mm(p, v[h]));
        }
        o = at::stack(heads);
      }
      if (out.data) wrap(out)[b][0].copy_(o.reshape({q.sizes[2], dv}));
    }
  });
}

// DeepSeek's Expert / MLP: w2(silu(w1(x)) * w3(x)), w1 and w3 stacked as gate_up.
at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down) {
  const at::Tensor gu = at::linear(x, gate_up);
  const int64_t inter = gate_up.size(0) / 2;
  return at::linear(at::silu(gu.slice(1, 0, inter)) * gu.slice(1, inter), down);
}

const char* moe(const TensorView& x, const TensorView& router, const TensorView& bias, int64_t top_k, const TensorView& gate_up,
                const TensorView& down, const TensorView& shared_gate_up, const TensorView& shared_down, const TensorView& out) {
  return guarded([&] {
    const at::Tensor tx = wrap(x), wgu = wrap(gate_up), wdn = wrap(down);
    const at::Tensor scores = at::linear(tx.to(at::kFloat), wrap(router)).softmax(-1);
    const at::Tensor ids = std::get<1>((bias.data ? scores + wrap(bias) : scores).topk(top_k, -1));
    const at::Tensor weights = scores.gather(1, ids);
    const int64_t experts = gate_up.sizes[0];
    const at::Tensor counts = at::bincount(ids.flatten(), {}, experts);
    const int64_t* count = counts.data_ptr<int64_t>();
    // The routed experts' sum in f32 (DeepSeek's reference adds in the activations' bf16;
    // f32 keeps the comparison with optx's f32 finalize tight and costs nothing visible).
    at::Tensor y = at::zeros({x.sizes[0], x.sizes[1]}, at::kFloat);
    for (int64_t e = 0; e < experts; ++e) {
      if (count[e] == 0) continue;
      const std::vector<at::Tensor> where = at::where(ids == e);  // token, slot
      const at::Tensor ye = swiglu_mlp(tx.index_select(0, where[0]), wgu[e], wdn[e]);
      y.index_add_(0, where[0], ye.to(at::kFloat) * weights.index({where[0], where[1]}).unsqueeze(1));
    }
    if (shared_gate_up.data) y += swiglu_mlp(tx, wrap(shared_gate_up), wrap(shared_down)).to(at::kFloat);
    const at::Tensor o = y.to(tx.scalar_type());
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
  if (std::string(what) == "paged_sdpa") s += " per sequence: index_select gather, " + last_paged_path();
  if (std::string(what) == "moe") s += " DeepSeek's reference MoE: f32 router, topk, loop over experts (linear, silu, index_add), shared MLP";
  if (std::string(what) == "mm_f32") s += at::hasMKL() ? " mm (MKL)" : " mm";
  if (std::string(what) == "mm_bf16") s += at::hasMKLDNN() ? " mm (oneDNN)" : " mm";
  return s.c_str();
}

void set_threads(int threads) { at::set_num_threads(threads); }
size_t peak_bytes(bool reset) { return CachingAllocator::peak(reset); }

}  // namespace

extern "C" const TorchPeer* optx_torch_peer() {
  static const TorchPeer* peer = [] {
    static CachingAllocator alloc;
    c10::SetCPUAllocator(&alloc, /*priority=*/1);  // above the default allocator's 0
    static const TorchPeer p{.version = TORCH_VERSION, .describe = describe, .set_threads = set_threads, .peak_bytes = peak_bytes, .sdpa = sdpa, .paged_sdpa = paged_sdpa, .moe = moe, .linear = linear};
    return &p;
  }();
  return peer;
}

}  // namespace optx::bench
