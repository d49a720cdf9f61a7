// Heap allocations made while a scope is open, for tests of DESIGN.md's "no heap
// allocation inside a kernel call". Every test binary links testing/alloc_count.cpp, which
// replaces the global operator new with a counting one (malloc underneath).
#pragma once

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

}  // namespace optx::testing
