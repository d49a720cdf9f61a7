// `optx verify` interface for op families: each registers a function that runs its cases
// for every implementation the host can run and adds one Record per case x impl.
#pragma once

#include <string>
#include <vector>

#include "optx/status.h"
#include "testing/compare.h"

namespace optx::verify {

struct Record {
  std::string op, case_, impl;
  double max_abs_err = 0, max_rel_err = 0, nmse = 0;
  long long worst_index = -1;
  bool pass = false;
  std::string message;
};

// One row from a run's status and its comparison with the reference.
inline Record make_record(std::string op, std::string impl, std::string case_, const Status& st,
                          const testing::CompareResult& cmp) {
  Record r;
  r.op = std::move(op);
  r.impl = std::move(impl);
  r.case_ = std::move(case_);
  r.max_abs_err = cmp.max_abs_err;
  r.max_rel_err = cmp.max_rel_err;
  r.nmse = cmp.nmse;
  r.worst_index = cmp.worst_index;
  r.pass = st.ok() && cmp.pass;
  r.message = st.ok() ? cmp.message : st.message();
  return r;
}

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
