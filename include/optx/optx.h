/* optx/optx.h — the C API: the whole C++ API (optx/gemm.h, norm.h, rope.h, kv_cache.h,
 * attention.h, moe.h, runtime.h) for C callers and foreign-function interfaces. C99 / C11;
 * C++ callers include the per-family headers instead.
 *
 * Ops. Op `xxx` takes an optx_xxx_params struct with the C++ params' fields under the same
 * names, in the same order (TensorView -> optx_tensor, bool -> int, enums -> optx_* enums
 * with the C++ values, owning classes -> the handles below); what each field means is in
 * the C++ header. Each op has (declared by OPTX_OP / OPTX_SIZED_OP below the struct):
 *   optx_xxx_params optx_xxx_params_default(void);   the C++ defaults: start from these, a
 *       zeroed struct means other things (gemm's alpha 0 drops A B^T, flash_attention's
 *       window_left 0 hides every earlier key, ...)
 *   size_t optx_xxx_workspace_size(const optx_xxx_params* p);   where C++ has a size query:
 *       the bytes; or 0, with optx_last_error() the reason when the params are refused
 *       and "" when they are valid and need no workspace
 *   optx_status optx_xxx(const optx_xxx_params* p, void* workspace, size_t workspace_bytes);
 * Other structs have their optx_yyy optx_yyy_default(void) (OPTX_DEFAULT) too.
 *
 * Errors. Functions return an optx_status; on failure optx_last_error() returns the message
 * (thread-local, valid until the next failing call on the same thread), which names the op
 * and the argument: "gemm: b has K=96 (b.sizes[1]) but a.sizes[1]=128: K must match". An
 * enum outside its values, a NULL params or handle are OPTX_INVALID_ARGUMENT too; no C++
 * exception crosses this API (out of memory: OPTX_OUT_OF_MEMORY, anything else
 * OPTX_INTERNAL).
 *
 * Handles. The C++ classes that own memory (PackedWeights, KvBlockPool, RopeTable,
 * ScheduleStats, ThreadScope) are opaque handles made by a function taking `**out` (NULL
 * there on failure) and released by optx_xxx_free (NULL is fine). A getter that returns a
 * number gives -1 (0 for a byte count) and sets optx_last_error() when its handle is NULL. */
#ifndef OPTX_OPTX_H_
#define OPTX_OPTX_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum optx_status {
  OPTX_OK = 0,
  OPTX_INVALID_ARGUMENT = 1,
  OPTX_WORKSPACE_TOO_SMALL = 2,
  OPTX_UNSUPPORTED = 3,
  OPTX_OUT_OF_MEMORY = 4,
  OPTX_INTERNAL = 5
} optx_status;

typedef enum optx_dtype { OPTX_F32 = 0, OPTX_BF16 = 1, OPTX_F16 = 2, OPTX_I8 = 3, OPTX_I32 = 4, OPTX_I64 = 5 } optx_dtype;

/* Non-owning strided view; strides in elements. data == NULL && rank == 0: not given. */
typedef struct optx_tensor {
  void* data;
  optx_dtype dtype;
  int rank;
  int64_t sizes[6];
  int64_t strides[6];
} optx_tensor;

/* The declarations listed above, one line per struct in the header below. */
#define OPTX_DEFAULT(s) optx_##s optx_##s##_default(void);
#define OPTX_OP(op) \
  OPTX_DEFAULT(op##_params) \
  optx_status optx_##op(const optx_##op##_params* p, void* workspace, size_t workspace_bytes);
#define OPTX_SIZED_OP(op) \
  OPTX_OP(op) \
  size_t optx_##op##_workspace_size(const optx_##op##_params* p);

/* ---- runtime (optx/runtime.h) ------------------------------------------------------------ */
const char* optx_version(void);
const char* optx_last_error(void);
void optx_set_num_threads(int n);
int optx_num_threads(void);

/* optx::ThreadScope: num_threads() is n for the calling thread until the scope is freed, on
 * the same thread, innermost first (scopes nest). */
typedef struct optx_thread_scope optx_thread_scope;
optx_status optx_thread_scope_create(int n, optx_thread_scope** out);
void optx_thread_scope_free(optx_thread_scope* s);

typedef enum optx_isa {
  OPTX_ISA_SCALAR = 0,
  OPTX_ISA_AVX2 = 1,
  OPTX_ISA_AVX512 = 2,
  OPTX_ISA_AVX512_BF16 = 3,
  OPTX_ISA_AMX = 4
} optx_isa;
optx_isa optx_detected_isa(void);
optx_isa optx_active_isa(void); /* detected, capped by OPTX_MAX_ISA */
/* "scalar", "avx2", ...; "?" with optx_last_error() set for a value that is no optx_isa. */
const char* optx_isa_name(optx_isa isa);

/* Writes the selected implementation's name of `op` into buf (NUL-terminated, truncated). */
optx_status optx_selected_impl(const char* op, char* buf, size_t buf_size);
/* The registered ops, in registration order: name i into buf as optx_selected_impl does. */
size_t optx_registered_op_count(void);
optx_status optx_registered_op(size_t i, char* buf, size_t buf_size);

/* ---- gemm (optx/gemm.h) -------------------------------------------------------------------- */
typedef enum optx_pack_layout { OPTX_PACK_LAYOUT_AUTO = 0, OPTX_PACK_LAYOUT_PANELS = 1, OPTX_PACK_LAYOUT_STRIPS = 2 } optx_pack_layout;
typedef enum optx_gemm_activation { OPTX_GEMM_ACTIVATION_NONE = 0, OPTX_GEMM_ACTIVATION_SWIGLU = 1 } optx_gemm_activation;

/* optx::PackedMatrix: one packed [N, K] matrix, as optx_packed_weights_matrix() gives it or
 * built by hand over stored packed bytes (the layout rules are gemm.h's). */
typedef struct optx_packed_matrix {
  optx_dtype dtype;
  int64_t n, k;
  int64_t k_padded;
  int64_t panel_bytes;
  int64_t strip_kc;
  const void* data;
  const float* scales; /* i8 only */
} optx_packed_matrix;
OPTX_DEFAULT(packed_matrix)

typedef struct optx_pack_weights_params {
  optx_tensor w;      /* [N, K] or [E, N, K] ([K, N] / [E, K, N] with kn); f32 | bf16 | i8 */
  optx_tensor scales; /* i8 only: [N] or [E, N] f32; else empty */
  int kn;
  optx_pack_layout layout; /* OPTX_PACK_LAYOUT_STRIPS: f32 only */
} optx_pack_weights_params;
OPTX_DEFAULT(pack_weights_params)

/* optx::PackedWeights: one or E packed matrices (per-expert weights). */
typedef struct optx_packed_weights optx_packed_weights;
optx_status optx_pack_weights(const optx_pack_weights_params* p, optx_packed_weights** out);
void optx_packed_weights_free(optx_packed_weights* w);
int64_t optx_packed_weights_count(const optx_packed_weights* w);
size_t optx_packed_weights_bytes(const optx_packed_weights* w);
/* Matrix e of w; its data stays w's. */
optx_status optx_packed_weights_matrix(const optx_packed_weights* w, int64_t e, optx_packed_matrix* out);

/* C = alpha * A * B^T + beta * C (+ bias). */
typedef struct optx_gemm_params {
  optx_tensor a;                      /* [M, K] f32 | bf16 */
  optx_tensor b;                      /* [N, K] ([K, N] if b_kn) f32 | bf16 | i8; empty if packed_b */
  const optx_packed_matrix* packed_b; /* NULL to use b */
  optx_tensor b_scales;               /* [N] f32, for an unpacked i8 b only */
  optx_tensor bias;                   /* [N] f32 | bf16; may be empty */
  optx_tensor c;                      /* [M, N] f32 | bf16 */
  float alpha;
  float beta;
  int b_kn;
  optx_gemm_activation activation;
} optx_gemm_params;
OPTX_SIZED_OP(gemm)

/* ---- norm (optx/norm.h) -------------------------------------------------------------------- */
typedef struct optx_rms_norm_params {
  optx_tensor x;      /* [T, H] f32 | bf16 */
  optx_tensor weight; /* [H], dtype of x */
  optx_tensor out;    /* [T, H], dtype of x; may alias x */
  float eps;
} optx_rms_norm_params;
OPTX_SIZED_OP(rms_norm)

typedef struct optx_add_rms_norm_params {
  optx_tensor x;        /* [T, H] f32 | bf16 */
  optx_tensor residual; /* [T, H], dtype of x; overwritten with residual + x */
  optx_tensor weight;   /* [H], dtype of x */
  optx_tensor out;      /* [T, H], dtype of x */
  float eps;
} optx_add_rms_norm_params;
OPTX_SIZED_OP(add_rms_norm)

/* ---- rope (optx/rope.h) -------------------------------------------------------------------- */
typedef enum optx_rope_style {
  OPTX_ROPE_STYLE_HALF = 0,
  OPTX_ROPE_STYLE_INTERLEAVED = 1,
  OPTX_ROPE_STYLE_INTERLEAVED_TO_HALF = 2
} optx_rope_style;

typedef struct optx_rope_params {
  optx_tensor q;         /* [T, Hq, D] f32 | bf16, in place; may be empty */
  optx_tensor k;         /* [T, Hk, D'], dtype of q, in place; may be empty */
  optx_tensor positions; /* [T] i32 | i64 */
  optx_tensor cos;       /* [P, rotary_dim / 2] f32 */
  optx_tensor sin;       /* [P, rotary_dim / 2] f32 */
  int64_t rotary_dim;
  int64_t rotary_offset;
  optx_rope_style style;
} optx_rope_params;
OPTX_SIZED_OP(rope)

typedef struct optx_yarn_scaling {
  double factor;
  int64_t original_max_position_embeddings;
  double beta_fast, beta_slow;
  double mscale, mscale_all_dim;
} optx_yarn_scaling;
OPTX_DEFAULT(yarn_scaling)
double optx_yarn_mscale(double factor, double mscale);

typedef struct optx_rope_table_params {
  int64_t rotary_dim;
  int64_t max_positions;
  double theta;
  optx_yarn_scaling yarn; /* default: factor 1, plain RoPE */
} optx_rope_table_params;
OPTX_DEFAULT(rope_table_params)

/* optx::RopeTable: cos / sin [max_positions, rotary_dim / 2] f32, owned by the table. */
typedef struct optx_rope_table optx_rope_table;
optx_status optx_rope_table_build(const optx_rope_table_params* p, optx_rope_table** out);
void optx_rope_table_free(optx_rope_table* t);
optx_status optx_rope_table_cos(const optx_rope_table* t, optx_tensor* out);
optx_status optx_rope_table_sin(const optx_rope_table* t, optx_tensor* out);
int64_t optx_rope_table_positions(const optx_rope_table* t);
int64_t optx_rope_table_half(const optx_rope_table* t);
const double* optx_rope_table_inv_freq(const optx_rope_table* t); /* [half]; NULL for a NULL table */

/* ---- kv_cache (optx/kv_cache.h) ------------------------------------------------------------ */
typedef struct optx_kv_pool_config {
  int64_t num_blocks;
  int64_t block_size; /* tokens per block */
  int64_t row;        /* elements per token and plane */
  int planes;         /* 2: K and V; 1: MLA latent */
  optx_dtype dtype;   /* f32 | bf16 | i8 (i8: one f32 scale per token and plane) */
} optx_kv_pool_config;
OPTX_DEFAULT(kv_pool_config)

/* optx::KvBlockPool. C++'s KvSequence is left out: it only keeps a block table filled by
 * allocate / release, which a C caller keeps as its own int32_t array. */
typedef struct optx_kv_block_pool optx_kv_block_pool;
optx_status optx_kv_block_pool_create(const optx_kv_pool_config* cfg, optx_kv_block_pool** out);
void optx_kv_block_pool_free(optx_kv_block_pool* pool);
/* Plane p in [0, planes): [num_slots, row]; its scales [num_slots] f32 (i8 pools, else empty). */
optx_status optx_kv_block_pool_plane(const optx_kv_block_pool* pool, int p, optx_tensor* out);
optx_status optx_kv_block_pool_scales(const optx_kv_block_pool* pool, int p, optx_tensor* out);
optx_status optx_kv_block_pool_config(const optx_kv_block_pool* pool, optx_kv_pool_config* out);
int64_t optx_kv_block_pool_num_slots(const optx_kv_block_pool* pool);
int64_t optx_kv_block_pool_free_blocks(const optx_kv_block_pool* pool);
optx_status optx_kv_block_pool_allocate(optx_kv_block_pool* pool, int64_t n, int32_t* blocks);
optx_status optx_kv_block_pool_release(optx_kv_block_pool* pool, const int32_t* blocks, int64_t n);

typedef struct optx_kv_cache_write_params {
  optx_tensor k;        /* [T, row] f32 | bf16; may be empty */
  optx_tensor v;        /* [T, row], dtype of k; may be empty */
  optx_tensor slots;    /* [T] i32 | i64, -1 skips */
  optx_tensor k_cache;  /* [num_slots, row] dtype of k, or i8 */
  optx_tensor v_cache;  /* [num_slots, row] */
  optx_tensor k_scales; /* [num_slots] f32 for an i8 k_cache */
  optx_tensor v_scales; /* [num_slots] f32 for an i8 v_cache */
} optx_kv_cache_write_params;
OPTX_OP(kv_cache_write)

typedef struct optx_gather_pa_kv_cache_params {
  optx_tensor k_cache, v_cache;           /* [num_slots, row]; either may be empty */
  optx_tensor k_scales, v_scales;         /* [num_slots] f32 with i8 caches */
  optx_tensor block_tables;               /* [B, max_blocks] i32 */
  optx_tensor seq_lens;                   /* [B] i32 */
  int64_t block_size;
  optx_tensor k_out, v_out;               /* [sum(seq_lens), row], dtype of the cache */
  optx_tensor k_scales_out, v_scales_out; /* [sum(seq_lens)] f32 with i8 caches */
} optx_gather_pa_kv_cache_params;
OPTX_OP(gather_pa_kv_cache)

typedef struct optx_kv_rms_norm_rope_cache_params {
  optx_tensor kv;           /* [T, kv_lora_rank + rope_dim] f32 | bf16 */
  optx_tensor weight;       /* [kv_lora_rank], dtype of kv */
  optx_tensor positions;    /* [T] i32 | i64 */
  optx_tensor cos, sin;     /* [P, rope_dim / 2] f32 */
  optx_tensor slots;        /* [T] i32 | i64, -1 skips */
  optx_tensor cache;        /* [num_slots, kv_lora_rank + rope_dim] dtype of kv, or i8 [num_slots, kv_lora_rank] */
  optx_tensor cache_scales; /* [num_slots] f32 with an i8 cache */
  optx_tensor rope_cache;   /* [num_slots, rope_dim], dtype of kv, with an i8 cache */
  int64_t kv_lora_rank;
  float eps;
  optx_rope_style style;
} optx_kv_rms_norm_rope_cache_params;
OPTX_OP(kv_rms_norm_rope_cache)

typedef struct optx_qkv_rope_cache_params {
  optx_tensor qkv; /* [T, (q_heads + 2 * kv_heads) * head_dim] f32 | bf16 */
  int64_t q_heads, kv_heads, head_dim;
  optx_tensor positions; /* [T] i32 | i64 */
  optx_tensor cos, sin;  /* [P, rotary_dim / 2] f32 */
  int64_t rotary_dim;
  optx_rope_style style;
  optx_tensor slots;            /* [T] i32 | i64, -1: q only */
  optx_tensor k_cache, v_cache; /* [num_slots, kv_heads * head_dim], dtype of qkv */
  optx_tensor q_out;            /* [T, q_heads, head_dim], dtype of qkv */
} optx_qkv_rope_cache_params;
OPTX_OP(qkv_rope_cache)

/* ---- attention (optx/attention.h) ---------------------------------------------------------- */
typedef enum optx_attn_layout { OPTX_ATTN_LAYOUT_BSND = 0, OPTX_ATTN_LAYOUT_BNSD = 1, OPTX_ATTN_LAYOUT_TND = 2 } optx_attn_layout;

typedef struct optx_flash_attention_params {
  optx_tensor q;   /* [B, Sq, Nq, D] / [B, Nq, Sq, D] / [Tq, Nq, D]; f32 | bf16 */
  optx_tensor k;   /* layout of q with Skv, Nkv, D */
  optx_tensor v;   /* layout of q with Skv, Nkv, Dv */
  optx_tensor out; /* layout of q with Dv, dtype of q */
  optx_tensor lse; /* [B, Nq, Sq] f32 ([Nq, Tq] for TND); may be empty */
  optx_attn_layout layout;
  optx_tensor cu_seqlens_q;  /* TND: [B + 1] i32 */
  optx_tensor cu_seqlens_kv; /* TND: [B + 1] i32 */
  float scale;
  int causal;
  int64_t window_left;
  int64_t window_right;
  optx_tensor mask;  /* [B | 1, N | 1, Sq, Skv] i8; may be empty */
  optx_tensor bias;  /* [B | 1, N | 1, Sq, Skv] f32; may be empty */
  optx_tensor sinks; /* [Nq] f32; may be empty */
  float softcap;
} optx_flash_attention_params;
OPTX_SIZED_OP(flash_attention)

typedef struct optx_paged_decode_attention_params {
  optx_tensor q;            /* [B, Sq, Nq, D] f32 | bf16 */
  optx_tensor k_cache;      /* [num_slots, Nkv * D], dtype of q, or i8 */
  optx_tensor v_cache;      /* [num_slots, Nkv * Dv], dtype of q, or i8 */
  optx_tensor k_scales;     /* [num_slots] f32 with i8 caches */
  optx_tensor v_scales;     /* [num_slots] f32 with i8 caches */
  optx_tensor block_tables; /* [B, max_blocks] i32 */
  optx_tensor seq_lens;     /* [B] i32 */
  int64_t block_size;
  int64_t kv_heads;
  optx_tensor out; /* [B, Sq, Nq, Dv], dtype of q */
  optx_tensor lse; /* [B, Nq, Sq] f32; may be empty */
  float scale;     /* 0: 1 / sqrt(D) */
} optx_paged_decode_attention_params;
OPTX_SIZED_OP(paged_decode_attention)

typedef struct optx_mla_decode_attention_params {
  optx_tensor q;            /* [B, Sq, Nq, kv_lora_rank + rope_dim] f32 | bf16 */
  optx_tensor cache;        /* [num_slots, kv_lora_rank + rope_dim] dtype of q, or i8 [num_slots, kv_lora_rank] */
  optx_tensor cache_scales; /* [num_slots] f32 with an i8 cache */
  optx_tensor rope_cache;   /* [num_slots, rope_dim], dtype of q, with an i8 cache */
  optx_tensor block_tables; /* [B, max_blocks] i32 */
  optx_tensor seq_lens;     /* [B] i32 */
  int64_t block_size, kv_lora_rank;
  optx_tensor out; /* [B, Sq, Nq, kv_lora_rank], dtype of q */
  optx_tensor lse; /* [B, Nq, Sq] f32; may be empty */
  float scale;     /* required in practice: DeepSeek's (qk_nope + qk_rope)^-1/2 * m^2 */
} optx_mla_decode_attention_params;
OPTX_SIZED_OP(mla_decode_attention)

typedef struct optx_attention_update_params {
  optx_tensor outs; /* [P, R, Dv] f32 */
  optx_tensor lses; /* [P, R] f32 */
  optx_tensor out;  /* [R, Dv] f32 | bf16 */
  optx_tensor lse;  /* [R] f32; may be empty */
} optx_attention_update_params;
OPTX_OP(attention_update)

/* ---- moe (optx/moe.h) ---------------------------------------------------------------------- */
typedef enum optx_moe_score { OPTX_MOE_SCORE_SOFTMAX = 0, OPTX_MOE_SCORE_SIGMOID = 1, OPTX_MOE_SCORE_SQRT_SOFTPLUS = 2 } optx_moe_score;
typedef enum optx_moe_group_score { OPTX_MOE_GROUP_SCORE_MAX = 0, OPTX_MOE_GROUP_SCORE_TOP2_SUM = 1 } optx_moe_group_score;

/* optx::ScheduleStats of the grouped GEMMs, accumulated over the calls given it. */
typedef struct optx_schedule_stats optx_schedule_stats;
optx_status optx_schedule_stats_create(optx_schedule_stats** out);
void optx_schedule_stats_free(optx_schedule_stats* s);
optx_status optx_schedule_stats_reset(optx_schedule_stats* s);
double optx_schedule_stats_wall_s(const optx_schedule_stats* s);
int optx_schedule_stats_threads(const optx_schedule_stats* s);
/* Thread i's busy time, i in [0, threads); -1 with optx_last_error() set otherwise. */
double optx_schedule_stats_busy_s(const optx_schedule_stats* s, int i);

typedef struct optx_moe_gating_topk_params {
  optx_tensor logits;       /* [T, E] f32 | bf16 */
  optx_tensor bias;         /* [E] f32; may be empty */
  optx_tensor topk_ids;     /* [T, k] i32 (output) */
  optx_tensor topk_weights; /* [T, k] f32 (output) */
  optx_moe_score score;
  int64_t n_group, topk_group;
  optx_moe_group_score group_score;
  int renormalize;
  int topk_then_softmax;
  float routed_scaling_factor;
} optx_moe_gating_topk_params;
OPTX_OP(moe_gating_topk)

typedef struct optx_moe_gating_topk_softmax_params {
  optx_tensor logits;       /* [T, E] f32 | bf16 */
  optx_tensor topk_ids;     /* [T, k] i32 (output) */
  optx_tensor topk_weights; /* [T, k] f32 (output) */
  int renormalize;
  int topk_then_softmax;
} optx_moe_gating_topk_softmax_params;
OPTX_OP(moe_gating_topk_softmax)

typedef struct optx_moe_init_routing_params {
  optx_tensor x;        /* [T, H] f32 | bf16 */
  optx_tensor topk_ids; /* [T, k] i32 */
  int64_t num_experts;
  int64_t expert_begin, expert_end;
  optx_tensor sorted_rows; /* [T*k, H], dtype of x or i8 */
  optx_tensor row_scales;  /* [T*k] f32 when sorted_rows is i8 */
  optx_tensor row_map;     /* [T*k] i32 */
  optx_tensor inverse;     /* [T*k] i32 */
  optx_tensor counts;      /* [E] i64 */
  optx_tensor offsets;     /* [E] i64 */
} optx_moe_init_routing_params;
OPTX_OP(moe_init_routing)

/* C++ takes these two views as arguments (and no workspace, which this call ignores). */
typedef struct optx_moe_compute_expert_tokens_params {
  optx_tensor sorted_ids; /* [N] i32 */
  optx_tensor offsets;    /* [E] i64 */
} optx_moe_compute_expert_tokens_params;
OPTX_OP(moe_compute_expert_tokens)

typedef struct optx_grouped_matmul_params {
  optx_tensor x;                      /* [M, K] f32 | bf16 */
  const optx_packed_weights* weights; /* E matrices [N, K] */
  optx_tensor group_offsets;          /* [E] i64 */
  int offsets_are_counts;
  optx_tensor out;            /* [M, N] f32 | bf16 */
  optx_schedule_stats* stats; /* may be NULL */
} optx_grouped_matmul_params;
OPTX_SIZED_OP(grouped_matmul)

typedef struct optx_grouped_matmul_swiglu_params {
  optx_tensor x;                      /* [M, K] f32 | bf16 */
  const optx_packed_weights* weights; /* E matrices [2I, K] */
  optx_tensor group_offsets;          /* [E] i64 */
  optx_tensor out;                    /* [M, I] f32 | bf16 | i8 */
  optx_tensor out_scales;             /* [M] f32 when out is i8 */
  optx_schedule_stats* stats;         /* may be NULL */
} optx_grouped_matmul_swiglu_params;
OPTX_SIZED_OP(grouped_matmul_swiglu)

typedef struct optx_moe_finalize_routing_params {
  optx_tensor y;        /* [rows, H] f32 | bf16 */
  optx_tensor inverse;  /* [T*k] i32 */
  optx_tensor weights;  /* [T, k] f32 */
  optx_tensor shared;   /* [T, H] f32 | bf16; may be empty */
  optx_tensor residual; /* [T, H] f32 | bf16; may be empty */
  optx_tensor out;      /* [T, H] f32 | bf16 */
} optx_moe_finalize_routing_params;
OPTX_OP(moe_finalize_routing)

typedef struct optx_moe_forward_params {
  optx_tensor x;                           /* [T, H] bf16 | f32 */
  optx_tensor router;                      /* [E, H] f32; empty with packed_router */
  const optx_packed_matrix* packed_router; /* NULL to use router */
  optx_tensor bias;                        /* [E] f32; may be empty */
  int64_t top_k;
  optx_moe_score score;
  int64_t n_group, topk_group;
  optx_moe_group_score group_score;
  int renormalize;
  float routed_scaling_factor;
  const optx_packed_weights* gate_up;        /* E matrices [2I, H] */
  const optx_packed_weights* down;           /* E matrices [H, I] */
  const optx_packed_weights* shared_gate_up; /* 1 matrix [2 I_s, H]; may be NULL */
  const optx_packed_weights* shared_down;    /* 1 matrix [H, I_s] */
  optx_tensor out;                           /* [T, H], dtype of x */
  optx_schedule_stats* stats;                /* may be NULL */
} optx_moe_forward_params;
OPTX_SIZED_OP(moe_forward)

#undef OPTX_DEFAULT
#undef OPTX_OP
#undef OPTX_SIZED_OP

#ifdef __cplusplus
}
#endif
#endif /* OPTX_OPTX_H_ */
