// The PyTorch peer of `optx bench` (impl `torch`): optional, and a plugin, not a link.
//
// Built only with -DOPTX_TORCH_PEER=ON against an installed PyTorch (bench/torch_peer.cpp
// becomes liboptx_torch_peer.so beside the optx binary); without it, or where the plugin
// does not load (no PyTorch, or a CUDA build of it without its CUDA libraries), the bench
// has no torch rows and says why on stderr. It is loaded with dlopen only when a bench
// case asks for it, after the CLI's own OpenMP runtime is in the process, so PyTorch's
// ATen kernels (and the MKL inside it, with GNU threading) run on the same libgomp pool as
// optx: no second pool whose spinning workers would steal the two cores in interleaved
// timing.
//
// The two sides share only this table of plain function pointers and optx::TensorView
// (a plain struct), so the plugin links PyTorch and nothing of optx.
#pragma once

#include <string>

#include "optx/tensor.h"

namespace optx::bench {

struct TorchPeer {
  static constexpr int kAbi = 4;
  int abi = kAbi;
  const char* version = "";  // PyTorch's version string
  // A name for each kernel path the peer's calls take (`optx bench` puts it in the
  // row's note), e.g. "torch 2.15.0 mm (MKL)".
  const char* (*describe)(const char* what) = nullptr;
  void (*set_threads)(int threads) = nullptr;
  // The most bytes PyTorch held in tensors at once since the last call with reset (its
  // CPU allocations all go through the plugin's allocator): a call's peak extra memory,
  // its output included.
  size_t (*peak_bytes)(bool reset) = nullptr;
  // Each call returns nullptr on success, else the error's text (valid until the next call).
  //
  // out = scaled_dot_product_attention(q, k, v) over [B, H, S, D] views (any strides; the
  // bench passes BSND buffers as permuted views, as a model's q / k / v are), f32 or bf16,
  // k / v with Hq / Hkv heads (GQA); causal = PyTorch's is_causal, the mask aligned to the
  // top left (so the bench asks it only where Sq == Skv, or Sq == 1 without the flag).
  // out may be empty: the result is computed and dropped (timing without the copy into
  // out, which PyTorch's op does not need).
  const char* (*sdpa)(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, bool causal,
                      float scale) = nullptr;
  // Decode over a paged cache as a PyTorch model without a fused kernel runs it: for each
  // sequence b, its first seq_lens[b] slots' K / V rows gathered with index_select (slot
  // = block_tables[b, i / block_size] * block_size + i % block_size), then attention of
  // its one new token's heads over them (torch_peer.cpp says how). q [B, 1, Hq, D];
  // k_cache [slots, Hkv, D], v_cache [slots, Hkv, Dv] views (MLA: both the latent rows, V
  // as their first Dv columns); block_tables [B, max_blocks] and seq_lens [B] i32; out
  // [B, 1, Hq, Dv] or empty, as sdpa's.
  const char* (*paged_sdpa)(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                            const TensorView& block_tables, const TensorView& seq_lens, int64_t block_size,
                            const TensorView& out, float scale) = nullptr;
  // A DeepSeek MoE layer as DeepSeek's PyTorch reference (its model.py) writes it, on x
  // [T, H] bf16: scores = softmax(x . router^T) in f32 (router [E, H] f32); top_k experts
  // by score + bias (bias [E] f32, may be empty), weights = their scores; then for each
  // expert with tokens, its rows gathered, y = down(silu(gate) * up) (gate_up [E, 2I, H]
  // with gate in the first I rows, down [E, H, I], bf16), added into the output by
  // index_add weighted; plus the shared experts' MLP (shared_gate_up [2 I_s, H],
  // shared_down [H, I_s]) over every token. out [T, H] bf16, or empty, as sdpa's.
  const char* (*moe)(const TensorView& x, const TensorView& router, const TensorView& bias, int64_t top_k,
                     const TensorView& gate_up, const TensorView& down, const TensorView& shared_gate_up,
                     const TensorView& shared_down, const TensorView& out) = nullptr;
  // c [M, N] = a [M, K] . b^T, b [N, K] (nn.Linear's weights), all f32 or all bf16:
  // torch.mm(a, b.t(), out=c), PyTorch's own choice of kernel (MKL sgemm for f32; oneDNN
  // for bf16 where the CPU has it).
  const char* (*linear)(const TensorView& a, const TensorView& b, const TensorView& c) = nullptr;
};

// The plugin's one export (C linkage, so dlsym finds it by this name).
extern "C" const TorchPeer* optx_torch_peer();
using TorchPeerEntry = const TorchPeer* (*)();

// The loaded peer at `threads` threads, or nullptr (a failure to load is reported on
// stderr, once; a bench built without the plugin is silent). Looks for the plugin at
// $OPTX_TORCH_PEER, else beside the running executable.
const TorchPeer* torch_peer(int threads);
// The plugin at `path`, or nullptr with the reason on stderr (what torch_peer() uses).
const TorchPeer* load_torch_peer(const std::string& path);

}  // namespace optx::bench
