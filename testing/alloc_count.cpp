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

// Every replaceable non-aligned form, so that each allocation and its release go through
// one pair (malloc / free): under AddressSanitizer a form left to the runtime (nothrow new,
// used by std::stable_sort's buffer) would be freed by the free() below and reported as a
// mismatch. The align_val_t forms stay the runtime's, new and delete alike.
// Not inlined: GCC would pair its built-in new with the free() below and warn.
namespace {
void* counted_malloc(std::size_t n) noexcept {
  optx::testing::note_new();
  return std::malloc(n ? n : 1);
}
void* counted_new(std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
}  // namespace

__attribute__((noinline)) void* operator new(std::size_t n) { return counted_new(n); }
__attribute__((noinline)) void* operator new[](std::size_t n) { return counted_new(n); }
__attribute__((noinline)) void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
__attribute__((noinline)) void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete[](void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
