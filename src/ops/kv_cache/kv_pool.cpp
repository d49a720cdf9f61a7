// Block pool and sequences: one allocation at creation, a free-list stack of block ids,
// no heap allocation when sequences grow or shrink.
#include <cstring>
#include <new>

#include "core/validate.h"
#include "optx/kv_cache.h"

namespace optx {

namespace {
size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

Status KvBlockPool::create(const KvPoolConfig& cfg, KvBlockPool* out) {
  constexpr const char* op = "kv_pool";
  if (!out) return Error(StatusCode::kInvalidArgument, op, ": out is null");
  if (cfg.num_blocks < 1 || cfg.num_blocks > INT32_MAX)
    return Error(StatusCode::kInvalidArgument, op, ": num_blocks=", cfg.num_blocks, " must be in [1, 2^31)");
  if (cfg.block_size < 1) return Error(StatusCode::kInvalidArgument, op, ": block_size=", cfg.block_size, " must be >= 1");
  if (cfg.row < 1) return Error(StatusCode::kInvalidArgument, op, ": row=", cfg.row, " must be >= 1");
  if (cfg.planes != 1 && cfg.planes != 2)
    return Error(StatusCode::kInvalidArgument, op, ": planes=", cfg.planes, " must be 1 (latent) or 2 (K and V)");
  if (cfg.dtype != DType::kF32 && cfg.dtype != DType::kBF16 && cfg.dtype != DType::kI8)
    return Error(StatusCode::kInvalidArgument, op, ": dtype=", dtype_name(cfg.dtype), " must be f32, bf16 or i8");
  // Slots and bytes in checked arithmetic: a wrapped product would give a small pool that
  // views and ops then index as the large one.
  int64_t slots = 0, plane = 0;
  if (__builtin_mul_overflow(cfg.num_blocks, cfg.block_size, &slots) || slots > kMaxViewElements ||
      __builtin_mul_overflow(slots, cfg.row, &plane) || plane > kMaxViewElements)
    return Error(StatusCode::kInvalidArgument, op, ": num_blocks=", cfg.num_blocks, " x block_size=", cfg.block_size,
                 " x row=", cfg.row, " exceeds 2^", kMaxViewLog2, " elements per plane");
  KvBlockPool p;
  p.cfg_ = cfg;
  p.plane_bytes_ = round_up(size_t(plane) * dtype_size(cfg.dtype), kAlign);
  p.scale_bytes_ = cfg.dtype == DType::kI8 ? round_up(size_t(slots) * sizeof(float), kAlign) : 0;
  const size_t total = size_t(cfg.planes) * (p.plane_bytes_ + p.scale_bytes_);
  p.storage_ = aligned_alloc_bytes(total);
  if (!p.storage_) return Error(StatusCode::kOutOfMemory, op, ": cannot allocate ", total, " bytes");
  // Touch once now (zeros): first-touch page faults belong to load time, not to decode.
  std::memset(p.storage_, 0, total);
  try {
    p.free_.resize(size_t(cfg.num_blocks));
    p.in_use_.assign(size_t(cfg.num_blocks), 0);
  } catch (const std::bad_alloc&) {
    return Error(StatusCode::kOutOfMemory, op, ": cannot allocate the free list of ", cfg.num_blocks, " blocks");
  }
  for (int64_t b = 0; b < cfg.num_blocks; ++b) p.free_[size_t(b)] = int32_t(cfg.num_blocks - 1 - b);  // pop 0 first
  *out = std::move(p);
  return Status::Ok();
}

KvBlockPool::KvBlockPool(KvBlockPool&& o) noexcept { *this = std::move(o); }
KvBlockPool& KvBlockPool::operator=(KvBlockPool&& o) noexcept {
  if (this != &o) {
    aligned_free(storage_);
    cfg_ = o.cfg_;
    storage_ = o.storage_;
    plane_bytes_ = o.plane_bytes_;
    scale_bytes_ = o.scale_bytes_;
    free_ = std::move(o.free_);
    in_use_ = std::move(o.in_use_);
    // The moved-from pool becomes an empty one: its config must not still promise blocks
    // that release() would look up in the (now empty) in-use table.
    o.storage_ = nullptr;
    o.cfg_.num_blocks = 0;
    o.plane_bytes_ = o.scale_bytes_ = 0;
    o.free_.clear();
    o.in_use_.clear();
  }
  return *this;
}
KvBlockPool::~KvBlockPool() { aligned_free(storage_); }

TensorView KvBlockPool::plane(int p) const {
  if (!storage_ || p < 0 || p >= cfg_.planes) return {};
  uint8_t* base = static_cast<uint8_t*>(storage_) + size_t(p) * (plane_bytes_ + scale_bytes_);
  return make_view(base, cfg_.dtype, {num_slots(), cfg_.row});
}

TensorView KvBlockPool::scales(int p) const {
  if (!storage_ || p < 0 || p >= cfg_.planes || cfg_.dtype != DType::kI8) return {};
  uint8_t* base = static_cast<uint8_t*>(storage_) + size_t(p) * (plane_bytes_ + scale_bytes_) + plane_bytes_;
  return make_view(base, DType::kF32, {num_slots()});
}

Status KvBlockPool::allocate(int64_t n, int32_t* blocks) {
  if (n < 0) return Error(StatusCode::kInvalidArgument, "kv_pool.allocate: n=", n, " is negative");
  if (n > 0 && !blocks) return Error(StatusCode::kInvalidArgument, "kv_pool.allocate: blocks is null (n=", n, ")");
  if (n > int64_t(free_.size()))
    return Error(StatusCode::kOutOfMemory, "kv_pool.allocate: requested ", n, " blocks but only ", free_.size(), " of ",
                 cfg_.num_blocks, " are free");
  for (int64_t i = 0; i < n; ++i) {
    blocks[i] = free_.back();
    free_.pop_back();
    in_use_[size_t(blocks[i])] = 1;
  }
  return Status::Ok();
}

Status KvBlockPool::release(const int32_t* blocks, int64_t n) {
  if (n < 0) return Error(StatusCode::kInvalidArgument, "kv_pool.release: n=", n, " is negative");
  if (n > 0 && !blocks) return Error(StatusCode::kInvalidArgument, "kv_pool.release: blocks is null (n=", n, ")");
  // First pass marks (1 -> 2) so an id repeated in the call is caught before anything is freed.
  for (int64_t i = 0; i < n; ++i) {
    const bool ok = blocks[i] >= 0 && size_t(blocks[i]) < in_use_.size() && in_use_[size_t(blocks[i])] == 1;
    if (!ok) {
      for (int64_t j = 0; j < i; ++j) in_use_[size_t(blocks[j])] = 1;
      return Error(StatusCode::kInvalidArgument, "kv_pool.release: blocks[", i, "]=", blocks[i],
                   " is not an allocated block of this pool (or is listed twice)");
    }
    in_use_[size_t(blocks[i])] = 2;
  }
  for (int64_t i = 0; i < n; ++i) {
    in_use_[size_t(blocks[i])] = 0;
    free_.push_back(blocks[i]);
  }
  return Status::Ok();
}

Status KvSequence::reserve(KvBlockPool& pool, int64_t tokens) {
  const int64_t bs = pool.config().block_size;
  if (tokens < 0) return Error(StatusCode::kInvalidArgument, "kv_sequence.reserve: tokens=", tokens, " is negative");
  if (int64_t(blocks_.size()) < max_blocks_)
    return Error(StatusCode::kOutOfMemory, "kv_sequence.reserve: the sequence's block table of max_blocks=", max_blocks_,
                 " entries could not be allocated");
  const int64_t need = tokens / bs + (tokens % bs != 0);  // no tokens + bs - 1: it wraps near INT64_MAX
  if (need > int64_t(blocks_.size()))
    return Error(StatusCode::kInvalidArgument, "kv_sequence.reserve: ", tokens, " tokens need ", need,
                 " blocks but the table holds at most ", blocks_.size());
  if (need <= num_blocks_) return Status::Ok();
  OPTX_RETURN_IF_ERROR(pool.allocate(need - num_blocks_, blocks_.data() + num_blocks_));
  num_blocks_ = need;
  return Status::Ok();
}

Status KvSequence::release(KvBlockPool& pool) {
  OPTX_RETURN_IF_ERROR(pool.release(blocks_.data(), num_blocks_));
  num_blocks_ = 0;
  return Status::Ok();
}

}  // namespace optx
