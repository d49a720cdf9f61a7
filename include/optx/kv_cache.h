// optx/kv_cache.h — the paged KV cache and the ops that write and read it.
//
// A KvBlockPool holds num_blocks blocks of block_size token slots, allocated once (64-byte
// aligned, on 2 MiB transparent huge pages where the OS grants them). Token slot s of a
// plane is row s of a [num_blocks * block_size, row] tensor; a sequence's position p lives
// in slot block_table[p / block_size] * block_size + p % block_size. Slot -1 means "do
// not write" in every op that takes slots; a slot named by two tokens of one call holds
// the later token's row, as if the tokens were written one by one in order.
#pragma once

#include <cstdint>
#include <vector>

#include "optx/rope.h"
#include "optx/runtime.h"
#include "optx/status.h"
#include "optx/tensor.h"

namespace optx {

struct KvPoolConfig {
  int64_t num_blocks = 0;
  int64_t block_size = 16;     // tokens per block
  int64_t row = 0;             // elements per token and plane (Hkv * D, or 576 for MLA)
  int planes = 2;              // 2: K and V; 1: MLA latent
  DType dtype = DType::kBF16;  // f32 | bf16 | i8 (i8: one f32 scale per token and plane)
};

class KvBlockPool {
 public:
  static Status create(const KvPoolConfig& cfg, KvBlockPool* out);
  KvBlockPool() = default;
  KvBlockPool(KvBlockPool&&) noexcept;
  KvBlockPool& operator=(KvBlockPool&&) noexcept;
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;
  ~KvBlockPool();

  const KvPoolConfig& config() const { return cfg_; }
  int64_t num_slots() const { return cfg_.num_blocks * cfg_.block_size; }
  TensorView plane(int p) const;   // [num_slots, row]
  TensorView scales(int p) const;  // [num_slots] f32 for i8 pools, else empty
  int64_t free_blocks() const { return int64_t(free_.size()); }

  // Takes n free blocks (all or nothing); a full pool is an error naming both counts.
  Status allocate(int64_t n, int32_t* blocks);
  // Returns blocks; an id out of range or not allocated is an error (nothing is freed).
  Status release(const int32_t* blocks, int64_t n);

 private:
  KvPoolConfig cfg_;
  void* storage_ = nullptr;
  size_t plane_bytes_ = 0, scale_bytes_ = 0;
  std::vector<int32_t> free_;     // stack of free block ids, capacity num_blocks
  std::vector<uint8_t> in_use_;
};

// One sequence's block table. Its capacity is fixed at construction, so growing a
// sequence never allocates on the heap.
class KvSequence {
 public:
  // The block table is allocated here, once, not as the sequence grows. A table that
  // cannot be allocated (max_blocks beyond memory) does not throw: reserve() reports it.
  explicit KvSequence(int64_t max_blocks) noexcept : max_blocks_(max_blocks > 0 ? max_blocks : 0) {
    try {
      blocks_.resize(size_t(max_blocks_));
    } catch (...) {
    }
  }
  // Makes room for `tokens` tokens in total, taking blocks from the pool as needed.
  Status reserve(KvBlockPool& pool, int64_t tokens);
  // Returns all blocks to the pool; the sequence becomes empty.
  Status release(KvBlockPool& pool);
  int64_t num_blocks() const { return num_blocks_; }
  const int32_t* block_table() const { return blocks_.data(); }
  int64_t capacity_tokens(int64_t block_size) const { return num_blocks_ * block_size; }
  // Cache slot of token `pos`; -1 (which kv_cache_write skips) for a position outside the
  // reserved blocks, rather than a slot in a block the pool may have given to another sequence.
  int64_t slot(int64_t pos, int64_t block_size) const {
    if (block_size < 1 || pos < 0 || pos / block_size >= num_blocks_) return -1;
    return int64_t(blocks_[size_t(pos / block_size)]) * block_size + pos % block_size;
  }

 private:
  std::vector<int32_t> blocks_;
  int64_t max_blocks_ = 0;
  int64_t num_blocks_ = 0;
};

// k / v rows -> cache slots. f32 | bf16 rows into a cache of the same dtype, or into an
// i8 cache with per-token symmetric scales: scale = max|row| / 127, q = rne(row * 127 / max|row|).
struct KvCacheWriteParams {
  TensorView k;         // [T, row] f32 | bf16, unit column stride; may be empty
  TensorView v;         // [T, row], dtype of k; may be empty
  TensorView slots;     // [T] i32 | i64: slot, or -1 to skip; a repeated slot keeps the later token's row
  TensorView k_cache;   // [num_slots, row] dtype of k, or i8
  TensorView v_cache;   // [num_slots, row]
  TensorView k_scales;  // [num_slots] f32 for an i8 k_cache, else empty
  TensorView v_scales;  // [num_slots] f32 for an i8 v_cache, else empty
};
Status kv_cache_write(const KvCacheWriteParams& p, Workspace ws = {});

// Paged cache -> contiguous rows: sequence b's tokens 0..seq_lens[b]) land at rows
// cu[b] .. cu[b] + seq_lens[b] of out, cu being the running sum of seq_lens.
struct GatherKvParams {
  TensorView k_cache, v_cache;    // [num_slots, row]; either may be empty
  TensorView k_scales, v_scales;  // [num_slots] f32 with i8 caches, else empty
  TensorView block_tables;        // [B, max_blocks] i32
  TensorView seq_lens;            // [B] i32
  int64_t block_size = 16;
  TensorView k_out, v_out;        // [sum(seq_lens), row], dtype of the cache
  TensorView k_scales_out, v_scales_out;  // [sum(seq_lens)] f32 with i8 caches
};
Status gather_pa_kv_cache(const GatherKvParams& p, Workspace ws = {});

// DeepSeek MLA: kv = [c_kv | k_pe] rows from kv_a_proj ([T, kv_lora_rank + rope_dim]).
// cache[slot] = [ RMSNorm(c_kv) * weight | RoPE(k_pe, position) ], one row per slot.
// With an i8 cache the latent is stored quantised per token (as kv_cache_write does, from
// the normalised values rounded to kv's dtype) with its scale in cache_scales, and the
// rotated k_pe goes to rope_cache in kv's dtype (the rope part keeps full precision, as in
// FlashMLA's quantised layouts). Bitwise equal to rms_norm + rope + kv_cache_write with
// the same implementation.
struct KvRmsNormRopeCacheParams {
  TensorView kv;          // [T, kv_lora_rank + rope_dim] f32 | bf16, unit column stride
  TensorView weight;      // [kv_lora_rank], dtype of kv
  TensorView positions;   // [T] i32 | i64
  TensorView cos, sin;    // [P, rope_dim / 2] f32
  TensorView slots;       // [T] i32 | i64, -1 skips the token
  TensorView cache;       // [num_slots, kv_lora_rank + rope_dim], dtype of kv; or i8 [num_slots, kv_lora_rank]
  TensorView cache_scales;  // [num_slots] f32 with an i8 cache, else empty
  TensorView rope_cache;    // [num_slots, rope_dim], dtype of kv, with an i8 cache, else empty
  int64_t kv_lora_rank = 512;
  float eps = 1e-6f;
  RopeStyle style = RopeStyle::kInterleaved;
};
Status kv_rms_norm_rope_cache(const KvRmsNormRopeCacheParams& p, Workspace ws = {});

// MHA / GQA: qkv = [q heads | k heads | v heads] rows from the fused projection.
// q_out = RoPE(q); k_cache[slot] = RoPE(k); v_cache[slot] = v. Bitwise equal to rope on
// q and k followed by kv_cache_write with the same implementation.
struct QkvRopeCacheParams {
  TensorView qkv;          // [T, (q_heads + 2 * kv_heads) * head_dim] f32 | bf16
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  TensorView positions;    // [T] i32 | i64
  TensorView cos, sin;     // [P, rotary_dim / 2] f32
  int64_t rotary_dim = 0;  // 0: head_dim; rotates the leading rotary_dim channels
  RopeStyle style = RopeStyle::kHalf;
  TensorView slots;        // [T] i32 | i64, -1: q only
  TensorView k_cache, v_cache;  // [num_slots, kv_heads * head_dim], dtype of qkv
  TensorView q_out;        // [T, q_heads, head_dim], dtype of qkv
};
Status qkv_rope_cache(const QkvRopeCacheParams& p, Workspace ws = {});

}  // namespace optx
