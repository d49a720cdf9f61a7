// `optx verify` interface for op families: each registers a function that runs its cases
// for every implementation the host can run and adds one Record per case x impl.
#pragma once

#include <string>
#include <vector>

namespace optx::verify {

struct Record {
  std::string op, case_, impl;
  double max_abs_err = 0, max_rel_err = 0, nmse = 0;
  long long worst_index = -1;
  bool pass = false;
  std::string message;
};

using VerifyFn = void (*)(std::vector<Record>&);
bool register_verify(const char* op, VerifyFn fn);
struct Registered {
  const char* op;
  VerifyFn fn;
};
const std::vector<Registered>& verifies();

}  // namespace optx::verify

#define OPTX_REGISTER_VERIFY(op, fn) \
  static const bool optx_verify_registered_##fn = ::optx::verify::register_verify(op, fn)
