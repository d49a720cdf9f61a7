// The online-softmax state of one attention row: the vector kernels fold blocks with it,
// and every kernel finishes its rows through it (sinks, 1 / l, lse). The AMX kernels keep
// the same m and l as vectors over 16 rows (one lane per row) while they run, and
// attention_update / the split-decode merge combine finished (o, lse) pairs by the same
// rule written in lse form (weights exp(lse_i - max lse)).
//
// A row's running state over the keys seen so far: m = max score, l = sum exp(s - m), and
// the output accumulator o = sum exp(s - m) v (kept by the caller). Folding a block with
// maximum m_b rescales the old sums by exp(m - m_new). A row that has seen no visible key
// has m = -inf and l = 0 and must never compute exp(-inf - -inf).
#pragma once

#include <cmath>

namespace optx::numerics {

struct SoftmaxState {
  float m = -INFINITY;
  float l = 0.0f;

  bool empty() const { return m == -INFINITY; }
  // Prepares for a block whose largest (finite or -inf) score is block_max: returns the
  // factor to rescale the old l and o by, and updates m.
  float rescale_to(float block_max) {
    if (block_max <= m) return 1.0f;
    const float f = empty() ? 0.0f : std::exp(m - block_max);
    m = block_max;
    return f;
  }
  float lse() const { return empty() ? -INFINITY : m + std::log(l); }
  // 1 / l for the final normalisation (0 for an empty row: its output is 0).
  float inv_sum() const { return l > 0.0f ? 1.0f / l : 0.0f; }
};

}  // namespace optx::numerics
