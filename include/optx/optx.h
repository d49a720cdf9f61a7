/* optx/optx.h — the C API. Mirrors the C++ API (optx/gemm.h, ...): functions return an
 * optx_status code; on failure optx_last_error() returns the message (thread-local, valid
 * until the next failing call on the same thread). C++ users include the per-family
 * headers instead. */
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

typedef enum optx_dtype { OPTX_F32, OPTX_BF16, OPTX_F16, OPTX_I8, OPTX_I32, OPTX_I64 } optx_dtype;

/* Non-owning strided view; strides in elements. data == NULL && rank == 0: not given. */
typedef struct optx_tensor {
  void* data;
  optx_dtype dtype;
  int rank;
  int64_t sizes[6];
  int64_t strides[6];
} optx_tensor;

const char* optx_version(void);
const char* optx_last_error(void);
void optx_set_num_threads(int n);
int optx_num_threads(void);
/* Writes the selected implementation's name of `op` into buf (NUL-terminated, truncated). */
optx_status optx_selected_impl(const char* op, char* buf, size_t buf_size);

/* C = alpha * A * B^T + beta * C (+ bias); see optx/gemm.h. Unpacked B only. */
typedef struct optx_gemm_params {
  optx_tensor a, b, b_scales, bias, c;
  float alpha, beta;
  int b_kn;
} optx_gemm_params;
/* 0 with optx_last_error() set when the params are refused (a valid call may also need 0). */
size_t optx_gemm_workspace_size(const optx_gemm_params* p);
optx_status optx_gemm(const optx_gemm_params* p, void* workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif
#endif /* OPTX_OPTX_H_ */
