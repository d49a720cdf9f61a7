// optx/norm.h — RMSNorm and the fused residual-add + RMSNorm.
//
//   rms_norm:      out[t, :] = x[t, :] * rsqrt(mean(x[t, :]^2) + eps) * weight
//   add_rms_norm:  residual[t, :] = residual[t, :] + x[t, :]   (in place, rounded to dtype)
//                  out[t, :] = rms_norm(residual[t, :])        (of the stored, rounded sum)
// Statistics and products in f32; one dtype (f32 or bf16) for all tensors of a call.
// add_rms_norm(x, r) equals computing r' = r + x then rms_norm(r') bit for bit.
#pragma once

#include "optx/runtime.h"
#include "optx/status.h"
#include "optx/tensor.h"

namespace optx {

struct RmsNormParams {
  TensorView x;       // [T, H] f32 | bf16; unit column stride, row stride >= H
  TensorView weight;  // [H], dtype of x, contiguous
  TensorView out;     // [T, H], dtype of x; may alias x
  float eps = 1e-6f;
};
size_t rms_norm_workspace_size(const RmsNormParams& p);  // 0: needs none
Status rms_norm(const RmsNormParams& p, Workspace ws = {});

struct AddRmsNormParams {
  TensorView x;         // [T, H] f32 | bf16: the sublayer output to add
  TensorView residual;  // [T, H], dtype of x: read, then overwritten with residual + x; may be x itself
  TensorView weight;    // [H], dtype of x, contiguous
  TensorView out;       // [T, H], dtype of x; may alias x, must not alias residual
  float eps = 1e-6f;
};
size_t add_rms_norm_workspace_size(const AddRmsNormParams& p);  // 0: needs none
Status add_rms_norm(const AddRmsNormParams& p, Workspace ws = {});

}  // namespace optx
