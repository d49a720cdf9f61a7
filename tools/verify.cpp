#include "tools/verify.h"

namespace optx::verify {
namespace {
std::vector<Registered>& list() {
  static std::vector<Registered> v;
  return v;
}
}  // namespace
bool register_verify(const char* op, VerifyFn fn) {
  list().push_back({op, fn});
  return true;
}
const std::vector<Registered>& verifies() { return list(); }
}  // namespace optx::verify
