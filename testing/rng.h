// Deterministic test data: a small fast generator (splitmix64) so tests, verify and bench
// make the same inputs on every machine without a library dependency.
#pragma once

#include <cstdint>
#include <vector>

#include "optx/tensor.h"

namespace optx::testing {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    return lo + (hi - lo) * float(next() >> 40) * (1.0f / float(1 << 24));
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }

 private:
  uint64_t s_;
};

inline void fill_f32(float* p, int64_t n, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  for (int64_t i = 0; i < n; ++i) p[i] = rng.uniform(lo, hi);
}
inline void fill_bf16(uint16_t* p, int64_t n, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(rng.uniform(lo, hi));
}
inline void fill_i8(int8_t* p, int64_t n, Rng& rng) {
  for (int64_t i = 0; i < n; ++i) p[i] = int8_t(int(rng.below(255)) - 127);
}

}  // namespace optx::testing
