/* optx.h from C (built as ISO C11, -pedantic): a few calls as a C program makes them. The
 * C++ tests compare every op against C++; this unit proves the header is C and the
 * entry points link and run from C. */
#include <math.h>
#include <string.h>

#include "optx/optx.h"

int optx_c_smoke(void);

static optx_tensor view2(void* data, optx_dtype dt, int64_t rows, int64_t cols) {
  optx_tensor t = {0};
  t.data = data;
  t.dtype = dt;
  t.rank = 2;
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = cols;
  t.strides[1] = 1;
  return t;
}

static optx_tensor view1(void* data, optx_dtype dt, int64_t n) {
  optx_tensor t = {0};
  t.data = data;
  t.dtype = dt;
  t.rank = 1;
  t.sizes[0] = n;
  t.strides[0] = 1;
  return t;
}

/* 0, or the line of the first check that failed. */
#define CHECK(cond) \
  do {              \
    if (!(cond)) return __LINE__; \
  } while (0)

static int norm_and_errors(void) {
  float x[2][4] = {{1, 2, 3, 4}, {-1, 0, 1, 2}}, w[4] = {1, 1, 2, 2}, out[2][4];
  optx_rms_norm_params p = optx_rms_norm_params_default();
  int row, i;
  CHECK(p.eps == 1e-6f);
  p.x = view2(x, OPTX_F32, 2, 4);
  p.weight = view1(w, OPTX_F32, 4);
  p.out = view2(out, OPTX_F32, 2, 4);
  p.eps = 0.5f;
  CHECK(optx_rms_norm_workspace_size(&p) == 0);
  CHECK(optx_rms_norm(&p, NULL, 0) == OPTX_OK);
  for (row = 0; row < 2; ++row) {
    float ms = 0;
    for (i = 0; i < 4; ++i) ms += x[row][i] * x[row][i];
    ms = ms / 4 + 0.5f;
    for (i = 0; i < 4; ++i) CHECK(fabsf(out[row][i] - x[row][i] / sqrtf(ms) * w[i]) < 1e-5f);
  }
  CHECK(optx_rms_norm(NULL, NULL, 0) == OPTX_INVALID_ARGUMENT);
  CHECK(strcmp(optx_last_error(), "rms_norm: params is null") == 0);
  p.weight.dtype = (optx_dtype)9;
  CHECK(optx_rms_norm(&p, NULL, 0) == OPTX_INVALID_ARGUMENT);
  CHECK(strcmp(optx_last_error(), "rms_norm: weight.dtype=9 is not an optx_dtype") == 0);
  return 0;
}

/* y = x W^T through packed weights, with a bias. */
static int packed_gemm(void) {
  float wdata[2][3] = {{1, 0, 2}, {0, 1, -1}}, x[3] = {1, 2, 3}, bias[2] = {10, 20}, y[2] = {0};
  optx_pack_weights_params pp = optx_pack_weights_params_default();
  optx_packed_weights* w = NULL;
  optx_packed_matrix m;
  optx_gemm_params g = optx_gemm_params_default();
  unsigned char ws[1 << 16];
  size_t need;
  optx_status st;
  pp.w = view2(wdata, OPTX_F32, 2, 3);
  CHECK(optx_pack_weights(&pp, &w) == OPTX_OK);
  CHECK(optx_packed_weights_count(w) == 1 && optx_packed_weights_bytes(w) > 0);
  CHECK(optx_packed_weights_matrix(w, 0, &m) == OPTX_OK && m.n == 2 && m.k == 3 && m.dtype == OPTX_F32);
  g.a = view2(x, OPTX_F32, 1, 3);
  g.packed_b = &m;
  g.bias = view1(bias, OPTX_F32, 2);
  g.c = view2(y, OPTX_F32, 1, 2);
  need = optx_gemm_workspace_size(&g);
  st = need <= sizeof ws ? optx_gemm(&g, ws, sizeof ws) : OPTX_WORKSPACE_TOO_SMALL;
  optx_packed_weights_free(w);
  CHECK(st == OPTX_OK);
  CHECK(y[0] == 17.0f && y[1] == 19.0f);
  return 0;
}

/* Handles and the runtime. */
static int handles(void) {
  optx_kv_pool_config cfg = optx_kv_pool_config_default();
  optx_kv_block_pool* pool = NULL;
  optx_rope_table_params tp = optx_rope_table_params_default();
  optx_rope_table* table = NULL;
  optx_tensor cos;
  int32_t blocks[3];
  char name[64];
  cfg.num_blocks = 4;
  cfg.row = 8;
  CHECK(optx_kv_block_pool_create(&cfg, &pool) == OPTX_OK);
  CHECK(optx_kv_block_pool_allocate(pool, 3, blocks) == OPTX_OK && optx_kv_block_pool_free_blocks(pool) == 1);
  CHECK(optx_kv_block_pool_release(pool, blocks, 3) == OPTX_OK && optx_kv_block_pool_free_blocks(pool) == 4);
  optx_kv_block_pool_free(pool);
  cfg.num_blocks = 0;
  CHECK(optx_kv_block_pool_create(&cfg, &pool) == OPTX_INVALID_ARGUMENT && pool == NULL);
  tp.rotary_dim = 4;
  tp.max_positions = 3;
  CHECK(optx_rope_table_build(&tp, &table) == OPTX_OK);
  CHECK(optx_rope_table_cos(table, &cos) == OPTX_OK && cos.sizes[0] == 3 && cos.sizes[1] == 2);
  CHECK(((const float*)cos.data)[0] == 1.0f); /* position 0: cos 0 */
  optx_rope_table_free(table);
  CHECK(optx_registered_op_count() > 0 && optx_registered_op(0, name, sizeof name) == OPTX_OK);
  CHECK(strcmp(optx_isa_name(optx_active_isa()), "?") != 0);
  CHECK(optx_version()[0] != '\0');
  return 0;
}

int optx_c_smoke(void) {
  int line = norm_and_errors();
  if (!line) line = packed_gemm();
  if (!line) line = handles();
  return line;
}
