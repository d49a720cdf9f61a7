// Heap allocations made while a scope is open, for tests of DESIGN.md's "no heap
// allocation inside a kernel call". Every test binary links testing/alloc_count.cpp, which
// replaces the global operator new with a counting one (malloc underneath).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "optx/runtime.h"
#include "optx/status.h"

namespace optx::testing {

// Counts operator new calls on every thread (an op's OpenMP workers too) from construction
// to count(). Call the op once before opening the scope: first calls build registries and
// the thread pool.
class AllocCount {
 public:
  AllocCount();
  ~AllocCount();
  AllocCount(const AllocCount&) = delete;
  AllocCount& operator=(const AllocCount&) = delete;
  long count() const;

 private:
  long start_;
};

// `calls` (returning the first failing Status, or Ok) at one and two threads: once to warm
// up, then again with allocations counted; each run must succeed and the second allocate
// nothing.
template <class F>
void expect_no_heap_allocation(F&& calls, const std::string& what) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const Status first = calls();
    ASSERT_TRUE(first.ok()) << first.message();
    const AllocCount news;
    const Status st = calls();
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(news.count(), 0) << "operator new calls inside " << what << " at " << threads << " threads";
  }
  set_num_threads(0);
}

}  // namespace optx::testing
