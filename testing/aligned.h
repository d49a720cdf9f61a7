// std::vector storage aligned to optx::kAlign (64 bytes) for test buffers: kernels take
// their non-temporal-store paths only on aligned rows, so tests must not depend on
// where malloc happens to place a buffer to cover them.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "optx/runtime.h"

namespace optx::testing {

template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = aligned_alloc_bytes(n * sizeof(T) + (n == 0), kAlign);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { aligned_free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace optx::testing
