/* Downstream smoke test in C: an RMSNorm through the installed optx.h and library. */
#include <math.h>
#include <stdio.h>

#include "optx/optx.h"

int main(void) {
  float x[2][4] = {{1, 2, 3, 4}, {0, -2, 0, 2}}, w[4] = {1, 1, 2, 2}, out[2][4];
  optx_rms_norm_params p = optx_rms_norm_params_default();
  char impl[32];
  int row, i;
  p.x = (optx_tensor){x, OPTX_F32, 2, {2, 4}, {4, 1}};
  p.weight = (optx_tensor){w, OPTX_F32, 1, {4}, {1}};
  p.out = (optx_tensor){out, OPTX_F32, 2, {2, 4}, {4, 1}};
  if (optx_rms_norm(&p, NULL, 0) != OPTX_OK) {
    printf("consumer_c: FAILED %s\n", optx_last_error());
    return 1;
  }
  for (row = 0; row < 2; ++row) {
    float ms = 0;
    for (i = 0; i < 4; ++i) ms += x[row][i] * x[row][i] / 4;
    for (i = 0; i < 4; ++i)
      if (fabsf(out[row][i] - x[row][i] / sqrtf(ms + p.eps) * w[i]) > 1e-5f) {
        printf("consumer_c: FAILED out[%d][%d]=%g\n", row, i, out[row][i]);
        return 1;
      }
  }
  optx_selected_impl("rms_norm", impl, sizeof impl);
  printf("consumer_c: optx %s ok (rms_norm impl %s)\n", optx_version(), impl);
  return 0;
}
