// The one comparison toolkit: used by the unit tests, `optx verify` and the bench's checks.
//
// An output is compared with its double-precision reference in stages:
//   1. NaN / Inf positions (and Inf signs) must match exactly;
//   2. NMSE and cosine similarity over the finite elements (reported only, with the result
//      and in `optx verify` rows; no threshold — stage 3 decides);
//   3. elementwise |out - ref| <= atol + rtol * |ref| + extra[i] (extra: an optional
//      per-element allowance, e.g. the K * eps * sum|a||b| bound of a long reduction),
//      reporting the worst coordinate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace optx::testing {

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-5;
};

struct CompareResult {
  bool pass = true;
  double max_abs_err = 0.0;
  double max_rel_err = 0.0;  // |out - ref| / max(|ref|, tiny)
  double nmse = 0.0;         // sum (out - ref)^2 / sum ref^2
  double cosine = 1.0;
  int64_t worst_index = -1;  // element with the largest bound violation ratio
  std::string message;       // why it failed, naming the worst coordinate
};

// out: n values (already converted to double); ref: n reference values; extra: optional.
CompareResult compare(const double* out, const double* ref, int64_t n, Tolerance tol,
                      const double* extra = nullptr);
inline CompareResult compare(const std::vector<double>& out, const std::vector<double>& ref,
                             Tolerance tol, const std::vector<double>* extra = nullptr) {
  return compare(out.data(), ref.data(), int64_t(out.size()), tol, extra ? extra->data() : nullptr);
}

// Unit round-off of the formats (half an ulp at 1.0).
inline constexpr double kEpsF32 = 1.0 / (1 << 24);
inline constexpr double kEpsBF16 = 1.0 / (1 << 8);

}  // namespace optx::testing
