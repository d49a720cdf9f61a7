// optx/attention.h — fused attention: flash (prefill / full forward), paged decode, MLA
// decode, and the merge of partial results.
//
// Scores s = scale * q . k (then softcap, bias, masks); out = softmax(s) . v computed with
// an online softmax over KV blocks (nothing of size Sq x Skv is materialised);
// lse = log(sum exp(s)) per query row (natural log). A row with no visible key gets
// out = 0 and lse = -inf, never NaN. f32 accumulation for f32 and bf16 inputs.
#pragma once

#include <cstdint>

#include "optx/runtime.h"
#include "optx/status.h"
#include "optx/tensor.h"

namespace optx {

enum class AttnLayout : uint8_t {
  kBSND,  // [B, S, N, D]
  kBNSD,  // [B, N, S, D]
  kTND,   // [T, N, D], sequences given by cu_seqlens (variable length)
};

struct FlashAttentionParams {
  TensorView q;    // [B, Sq, Nq, D] / [B, Nq, Sq, D] / [Tq, Nq, D]; f32 | bf16; unit stride in D
  TensorView k;    // same layout with Skv, Nkv, D (Nq a multiple of Nkv: MHA, GQA, MQA)
  TensorView v;    // same layout with Skv, Nkv, Dv (Dv may differ from D)
  TensorView out;  // layout of q with Dv, dtype of q
  TensorView lse;  // [B, Nq, Sq] f32 ([Nq, Tq] for TND); may be empty
  AttnLayout layout = AttnLayout::kBSND;
  TensorView cu_seqlens_q;   // TND: [B + 1] i32, cumulative, starting at 0
  TensorView cu_seqlens_kv;  // TND: [B + 1] i32
  float scale = 0.0f;        // 0: 1 / sqrt(D)
  // Masks. Query i of a sequence sits at key position i + (Skv - Sq) (bottom-right
  // alignment); key j is visible if every enabled rule allows it:
  bool causal = false;          // j <= i + (Skv - Sq)
  int64_t window_left = -1;     // >= 0: j >= i + (Skv - Sq) - window_left
  int64_t window_right = -1;    // >= 0: j <= i + (Skv - Sq) + window_right
  TensorView mask;   // [B | 1, N | 1, Sq, Skv] i8, nonzero = visible; may be empty. TND: per sequence,
                     // [B | 1, N | 1, >= max Sq, >= max Skv] padded, by position within the sequence
  TensorView bias;   // [B | 1, N | 1, Sq, Skv] f32 added to the scores (TND: as mask); may be empty
  TensorView sinks;  // [Nq] f32: a per-head logit with no value, added to the softmax denominator
  float softcap = 0.0f;  // > 0: s = softcap * tanh(s / softcap), before bias and masks
};
// Workspace sizes here and below grow with the thread count (per-thread job scratch):
// query at the num_threads() the call will run with (gemm.h); a workspace sized for more
// threads serves fewer, one sized for fewer is refused (kWorkspaceTooSmall). A flash call
// of few query rows against long keys also holds the partials of its split KV axis, so
// its size depends on the lengths too: size for the shapes you call (a decode step may
// need more than the longest prefill).
size_t flash_attention_workspace_size(const FlashAttentionParams& p);
Status flash_attention(const FlashAttentionParams& p, Workspace ws);

// Decode against the paged KV cache (see optx/kv_cache.h): q [B, Sq, Nq, D] with Sq new
// tokens per sequence (1..8, speculative decoding), the last Sq of seq_lens[b] positions;
// causal among the new tokens.
// The caches are q's dtype, or both i8 with per-token scales as kv_cache_write writes them
// (the result then within 2x the error of attention over the dequantised values rounded to
// q's dtype, plus the usual bound).
struct PagedDecodeParams {
  TensorView q;             // [B, Sq, Nq, D] f32 | bf16
  TensorView k_cache;       // [num_slots, Nkv * D], dtype of q, or i8
  TensorView v_cache;       // [num_slots, Nkv * Dv], dtype of q, or i8
  TensorView k_scales;      // [num_slots] f32 with i8 caches, else empty
  TensorView v_scales;      // [num_slots] f32 with i8 caches, else empty
  TensorView block_tables;  // [B, max_blocks] i32
  TensorView seq_lens;      // [B] i32: tokens in the cache per sequence, including the new ones
  int64_t block_size = 16;
  int64_t kv_heads = 0;
  TensorView out;           // [B, Sq, Nq, Dv], dtype of q
  TensorView lse;           // [B, Nq, Sq] f32; may be empty
  float scale = 0.0f;       // 0: 1 / sqrt(D)
};
// Sized for what block_tables can hold (max_blocks * block_size tokens), not the current
// seq_lens: one query serves every later decode step with the same B, heads and tables
// shape (and thread count). The same holds for mla_decode_attention_workspace_size.
size_t paged_decode_attention_workspace_size(const PagedDecodeParams& p);
Status paged_decode_attention(const PagedDecodeParams& p, Workspace ws);

// DeepSeek MLA decode in absorbed (MQA) form: one shared latent KV head per token, K = the
// whole cache row (kv_lora_rank + rope_dim), V = its first kv_lora_rank values.
// The cache is either q's dtype, or the i8 layout kv_rms_norm_rope_cache writes: the
// latent quantised per token (cache_scales) and the rope part in rope_cache. An i8 latent
// stands for value * scale; the result is within 2x the error of attention over those
// values rounded to q's dtype (plus the usual bound), and each key reads
// kv_lora_rank + 4 + rope_dim * sizeof(q) bytes instead of (kv_lora_rank + rope_dim) * sizeof(q).
struct MlaDecodeParams {
  TensorView q;             // [B, Sq, Nq, kv_lora_rank + rope_dim] f32 | bf16
  TensorView cache;         // [num_slots, kv_lora_rank + rope_dim], dtype of q; or i8 [num_slots, kv_lora_rank]
  TensorView cache_scales;  // [num_slots] f32 with an i8 cache, else empty
  TensorView rope_cache;    // [num_slots, rope_dim], dtype of q, with an i8 cache, else empty
  TensorView block_tables;  // [B, max_blocks] i32
  TensorView seq_lens;      // [B] i32
  int64_t block_size = 64;
  int64_t kv_lora_rank = 512;
  TensorView out;           // [B, Sq, Nq, kv_lora_rank], dtype of q
  TensorView lse;           // [B, Nq, Sq] f32; may be empty
  float scale = 0.0f;       // required in practice: DeepSeek's (qk_nope + qk_rope)^-1/2 * m^2
};
size_t mla_decode_attention_workspace_size(const MlaDecodeParams& p);
Status mla_decode_attention(const MlaDecodeParams& p, Workspace ws);

// Merges P partial results of the same queries over disjoint key sets:
//   lse = log(sum_i exp(lse_i)), out = sum_i exp(lse_i - lse) * out_i.
// Partials with lse_i = -inf contribute nothing; all -inf gives out = 0, lse = -inf.
struct AttentionUpdateParams {
  TensorView outs;  // [P, R, Dv] f32 partial outputs (R rows: any flattening of B, S, N)
  TensorView lses;  // [P, R] f32
  TensorView out;   // [R, Dv] f32 | bf16
  TensorView lse;   // [R] f32; may be empty
};
Status attention_update(const AttentionUpdateParams& p, Workspace ws = {});

}  // namespace optx
