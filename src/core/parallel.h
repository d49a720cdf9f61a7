// Static contiguous split of a range over the caller's threads (optx::num_threads()).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "optx/runtime.h"

namespace optx {

// Calls fn(begin, end) once per thread on min(num_threads(), n) threads, the ranges
// contiguous, in order and within one item of each other in size: for kernels that carry
// state from one item to the next (pipelined rows) or read neighbouring items together.
template <class Fn>
void parallel_ranges(int64_t n, Fn fn) {
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(num_threads(), n)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    fn(n * t / T, n * (t + 1) / T);
  }
}

}  // namespace optx
