// optx/rope.h — rotary position embedding, in place on q and k, and its cos/sin tables.
//
// For a rotated slice x[0..d) of a head (d = rotary_dim, starting at rotary_offset) at
// position p, with c_i = cos[p][i], s_i = sin[p][i], i < d/2:
//   kHalf (GPT-NeoX):          y[i] = x[i] c_i - x[i+d/2] s_i,   y[i+d/2] = x[i+d/2] c_i + x[i] s_i
//   kInterleaved (GPT-J, the   y[2i] = x[2i] c_i - x[2i+1] s_i, y[2i+1] = x[2i+1] c_i + x[2i] s_i
//     DeepSeek reference code)
//   kInterleavedToHalf (HF     y[i] = x[2i] c_i - x[2i+1] s_i,  y[i+d/2] = x[2i+1] c_i + x[2i] s_i
//     DeepSeek, ops-transformer's interleave_rope: pairs rotated, written de-interleaved)
// Channels outside the slice pass through. Math in f32; results rounded to the dtype.
#pragma once

#include <vector>

#include "optx/runtime.h"
#include "optx/status.h"
#include "optx/tensor.h"

namespace optx {

enum class RopeStyle : uint8_t { kHalf, kInterleaved, kInterleavedToHalf };

struct RopeParams {
  TensorView q;          // [T, Hq, D] f32 | bf16, rotated in place; unit stride in D; may be empty
  TensorView k;          // [T, Hk, D'], dtype of q, rotated in place; may be empty (Hk, D' may differ)
  TensorView positions;  // [T] i32 | i64, each in [0, P)
  TensorView cos;        // [P, rotary_dim / 2] f32, contiguous rows
  TensorView sin;        // [P, rotary_dim / 2] f32, contiguous rows
  int64_t rotary_dim = 0;     // even, 2..1024; 0 means the whole head (D)
  int64_t rotary_offset = 0;  // first rotated channel: 0 = leading, D - rotary_dim = trailing
  RopeStyle style = RopeStyle::kHalf;
};
size_t rope_workspace_size(const RopeParams& p);  // 0
Status rope(const RopeParams& p, Workspace ws = {});

// YaRN scaling as DeepSeek configures it (rope_scaling in config.json). factor <= 1 means
// plain RoPE.
struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
};
// m(factor, mscale) = 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1. DeepSeek scales
// its softmax by yarn_mscale(factor, mscale_all_dim)^2.
double yarn_mscale(double factor, double mscale);

struct RopeTableParams {
  int64_t rotary_dim = 64;
  int64_t max_positions = 4096;
  double theta = 10000.0;
  YarnScaling yarn;  // default: factor 1, plain RoPE
};

// Owning cos/sin tables [max_positions, rotary_dim / 2] f32, computed in double.
class RopeTable {
 public:
  static Status build(const RopeTableParams& p, RopeTable* out);
  TensorView cos() const;
  TensorView sin() const;
  int64_t positions() const { return positions_; }
  int64_t half() const { return half_; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  std::vector<float> cos_, sin_;
  std::vector<double> inv_freq_;
  int64_t positions_ = 0, half_ = 0;
};

}  // namespace optx
