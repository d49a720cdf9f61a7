// optx/status.h — errors are values.
//
// Every op returns a Status. A failing Status carries a code and a message that names the
// op, the argument and the offending values, e.g.
//   "gemm: b.sizes[1]=96 but a.sizes[1]=128: K must match".
// Ops never abort and never print-and-continue.
#pragma once

#include <string>
#include <utility>

namespace optx {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // shapes, dtypes, strides, null pointers
  kWorkspaceTooSmall = 2,
  kUnsupported = 3,      // valid request this build or CPU cannot serve (e.g. forced impl)
  kOutOfMemory = 4,
  kInternal = 5,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Builds an error whose message is the concatenation of the arguments (strings, numbers).
template <class... Args>
Status Error(StatusCode code, const Args&... parts);

}  // namespace optx

#define OPTX_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::optx::Status optx_status_ = (expr);       \
    if (!optx_status_.ok()) return optx_status_; \
  } while (0)

// ---- implementation of Error() (header-only so callers can format freely) -------------
#include <sstream>

namespace optx {
template <class... Args>
Status Error(StatusCode code, const Args&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return Status(code, os.str());
}
}  // namespace optx
