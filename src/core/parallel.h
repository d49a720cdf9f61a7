// Static contiguous split of a range over the caller's threads (optx::num_threads()).
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
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

// Calls fn(begin, end) on contiguous chunks of at least min_chunk items (about
// chunks_per_thread per thread), claimed from a shared cursor as threads finish: a core
// whose hyperthread sibling is busy (another guest's) streams slower, and with fixed
// halves the call waits on it. Chunks start anywhere, so fn must not depend on which
// thread runs a chunk or where the previous one ended.
template <class Fn>
void parallel_chunks(int64_t n, int64_t min_chunk, int chunks_per_thread, Fn fn) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(num_threads(), n / std::max<int64_t>(1, min_chunk)));
  const int64_t chunk = std::max(min_chunk, (n + threads * chunks_per_thread - 1) / (threads * chunks_per_thread));
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(int(threads)) if (threads > 1)
  for (int64_t b; (b = next.fetch_add(chunk, std::memory_order_relaxed)) < n;) fn(b, std::min(n, b + chunk));
}

}  // namespace optx
