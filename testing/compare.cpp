#include "testing/compare.h"

#include <cmath>
#include <sstream>

namespace optx::testing {

CompareResult compare(const double* out, const double* ref, int64_t n, Tolerance tol,
                      const double* extra) {
  CompareResult r;
  // Stage 1: non-finite positions.
  for (int64_t i = 0; i < n; ++i) {
    const bool on = std::isnan(out[i]), rn = std::isnan(ref[i]);
    const bool oi = std::isinf(out[i]), ri = std::isinf(ref[i]);
    if (on != rn || oi != ri || (oi && ri && std::signbit(out[i]) != std::signbit(ref[i]))) {
      std::ostringstream os;
      os << "non-finite mismatch at index " << i << ": out=" << out[i] << " ref=" << ref[i];
      r.pass = false;
      r.worst_index = i;
      r.message = os.str();
      r.max_abs_err = INFINITY;
      r.max_rel_err = INFINITY;
      r.nmse = INFINITY;
      return r;
    }
  }
  // Stages 2 and 3.
  double err2 = 0, ref2 = 0, out2 = 0, dot = 0, worst_ratio = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(ref[i])) continue;
    const double d = out[i] - ref[i];
    err2 += d * d;
    ref2 += ref[i] * ref[i];
    out2 += out[i] * out[i];
    dot += out[i] * ref[i];
    const double ad = std::fabs(d);
    const double rel = ad / std::max(std::fabs(ref[i]), 1e-30);
    if (ad > r.max_abs_err) r.max_abs_err = ad;
    if (rel > r.max_rel_err) r.max_rel_err = rel;
    const double bound = tol.atol + tol.rtol * std::fabs(ref[i]) + (extra ? extra[i] : 0.0);
    const double ratio = bound > 0 ? ad / bound : (ad > 0 ? INFINITY : 0.0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      r.worst_index = i;
    }
  }
  r.nmse = ref2 > 0 ? err2 / ref2 : err2;
  r.cosine = (ref2 > 0 && out2 > 0) ? dot / std::sqrt(ref2 * out2) : (err2 == 0 ? 1.0 : 0.0);
  if (worst_ratio > 1.0) {
    const int64_t i = r.worst_index;
    std::ostringstream os;
    os << "index " << i << ": out=" << out[i] << " ref=" << ref[i] << " |diff|=" << std::fabs(out[i] - ref[i])
       << " exceeds bound " << (tol.atol + tol.rtol * std::fabs(ref[i]) + (extra ? extra[i] : 0.0))
       << " (nmse=" << r.nmse << ")";
    r.pass = false;
    r.message = os.str();
  }
  return r;
}

}  // namespace optx::testing
