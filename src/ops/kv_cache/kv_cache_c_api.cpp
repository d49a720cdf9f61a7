// C API of the kv_cache family (optx.h): the block pool and the cache ops. KvSequence has no
// C twin: a C caller keeps the block table allocate() fills as its own int32_t array.
#include "core/c_api_internal.h"

struct optx_kv_block_pool {
  optx::KvBlockPool pool;
};

namespace {
using Pool = optx_kv_block_pool;

// Plane p of the pool, as fn's view (plane or scales); C++ gives an empty view for a p
// out of range, C an error, since an empty plane passed on would fail far from here.
template <class Get>
optx_status plane_view(const char* fn, const Pool* pool, int p, optx_tensor* out, Get g) {
  if (pool && (p < 0 || p >= pool->pool.config().planes))
    return optx::capi::guarded(fn, [&] {
      return optx::Error(optx::StatusCode::kInvalidArgument, fn, ": p=", p, " but the pool has ", pool->pool.config().planes, " planes");
    });
  return optx::capi::view_of(fn, pool, out, [&](const Pool& h) { return g(h.pool, p); });
}
}  // namespace

using optx::capi::get;

extern "C" {

OPTX_C_DEFAULT(kv_pool_config)
OPTX_C_DEFAULT(kv_cache_write_params)
OPTX_C_DEFAULT(gather_pa_kv_cache_params)
OPTX_C_DEFAULT(kv_rms_norm_rope_cache_params)
OPTX_C_DEFAULT(qkv_rope_cache_params)
OPTX_C_OP(kv_cache_write)
OPTX_C_OP(gather_pa_kv_cache)
OPTX_C_OP(kv_rms_norm_rope_cache)
OPTX_C_OP(qkv_rope_cache)

optx_status optx_kv_block_pool_create(const optx_kv_pool_config* cfg, Pool** out) {
  return optx::capi::create_from("kv_pool", cfg, out,
                                 [](const optx::KvPoolConfig& c, Pool& h) { return optx::KvBlockPool::create(c, &h.pool); });
}
void optx_kv_block_pool_free(Pool* pool) { delete pool; }

optx_status optx_kv_block_pool_config(const Pool* pool, optx_kv_pool_config* out) {
  constexpr const char* fn = "optx_kv_block_pool_config";
  if (!pool || !out) return optx::capi::fail(OPTX_INVALID_ARGUMENT, fn, "the handle and out must be non-null");
  *out = optx::capi::CParams<optx_kv_pool_config>(pool->pool.config()).c;
  return OPTX_OK;
}
int64_t optx_kv_block_pool_num_slots(const Pool* pool) {
  return get("optx_kv_block_pool_num_slots", pool, int64_t(-1), [](const Pool& h) { return h.pool.num_slots(); });
}
int64_t optx_kv_block_pool_free_blocks(const Pool* pool) {
  return get("optx_kv_block_pool_free_blocks", pool, int64_t(-1), [](const Pool& h) { return h.pool.free_blocks(); });
}
optx_status optx_kv_block_pool_plane(const Pool* pool, int p, optx_tensor* out) {
  return plane_view("optx_kv_block_pool_plane", pool, p, out, [](const optx::KvBlockPool& kv, int i) { return kv.plane(i); });
}
optx_status optx_kv_block_pool_scales(const Pool* pool, int p, optx_tensor* out) {
  return plane_view("optx_kv_block_pool_scales", pool, p, out, [](const optx::KvBlockPool& kv, int i) { return kv.scales(i); });
}

optx_status optx_kv_block_pool_allocate(Pool* pool, int64_t n, int32_t* blocks) {
  constexpr const char* fn = "optx_kv_block_pool_allocate";
  if (!pool) return optx::capi::fail(OPTX_INVALID_ARGUMENT, fn, "the handle is null");
  return optx::capi::guarded(fn, [&] { return pool->pool.allocate(n, blocks); });
}
optx_status optx_kv_block_pool_release(Pool* pool, const int32_t* blocks, int64_t n) {
  constexpr const char* fn = "optx_kv_block_pool_release";
  if (!pool) return optx::capi::fail(OPTX_INVALID_ARGUMENT, fn, "the handle is null");
  return optx::capi::guarded(fn, [&] { return pool->pool.release(blocks, n); });
}

}  // extern "C"
