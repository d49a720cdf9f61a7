#include "testing/alloc_count.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace optx::testing {
namespace {
std::atomic<int> g_open{0};
std::atomic<long> g_news{0};
}  // namespace

AllocCount::AllocCount() : start_(g_news.load()) { ++g_open; }
AllocCount::~AllocCount() { --g_open; }
long AllocCount::count() const { return g_news.load() - start_; }

namespace {
void note_new() {
  if (g_open.load(std::memory_order_relaxed) > 0) g_news.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

}  // namespace optx::testing

// The replaceable global forms that the others (nothrow, array) call in libstdc++.
// Not inlined: GCC would pair its built-in new with the free() below and warn.
__attribute__((noinline)) void* operator new(std::size_t n) {
  optx::testing::note_new();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }
