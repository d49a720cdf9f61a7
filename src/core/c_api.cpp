// C API: the last error, the runtime functions; the ops are bound in each family's
// <family>_c_api.cpp through core/c_api_internal.h.
#include <cstring>
#include <string>
#include <vector>

#include "core/c_api_internal.h"

struct optx_thread_scope {
  explicit optx_thread_scope(int n) : scope(n) {}
  optx::ThreadScope scope;
};

namespace optx::capi {
namespace {
thread_local std::string t_error;
// Stands in for t_error when even the message could not be allocated.
thread_local const char* t_fixed_error = nullptr;
constexpr const char* kNoRoomForMessage = "optx: out of memory (while recording an error message)";

void set_error(const std::string& message) noexcept {
  try {
    t_error = message;
    t_fixed_error = nullptr;
  } catch (...) {
    t_fixed_error = kNoRoomForMessage;
  }
}

// Copies name into buf as optx_selected_impl documents: NUL-terminated, truncated.
void copy_name(const std::string& name, char* buf, size_t buf_size) {
  std::strncpy(buf, name.c_str(), buf_size - 1);
  buf[buf_size - 1] = '\0';
}
}  // namespace

optx_status to_c(const Status& s) noexcept {
  if (!s.ok()) set_error(s.message());
  return static_cast<optx_status>(s.code());
}

void clear_error() noexcept {
  t_error.clear();  // keeps its capacity: no allocation, no throw
  t_fixed_error = nullptr;
}

optx_status fail(optx_status code, const char* where, const char* what) noexcept {
  try {
    set_error(std::string(where) + ": " + what);
  } catch (...) {
    t_fixed_error = kNoRoomForMessage;
  }
  return code;
}

}  // namespace optx::capi

using optx::capi::fail;
using optx::capi::guarded;

extern "C" {

const char* optx_version(void) { return optx::version(); }
const char* optx_last_error(void) { return optx::capi::t_fixed_error ? optx::capi::t_fixed_error : optx::capi::t_error.c_str(); }
void optx_set_num_threads(int n) { optx::set_num_threads(n); }
int optx_num_threads(void) { return optx::num_threads(); }

optx_status optx_thread_scope_create(int n, optx_thread_scope** out) {
  if (!out) return fail(OPTX_INVALID_ARGUMENT, "optx_thread_scope_create", "out is null");
  *out = nullptr;
  return guarded("optx_thread_scope_create", [&] {
    *out = new optx_thread_scope(n);
    return optx::Status::Ok();
  });
}
void optx_thread_scope_free(optx_thread_scope* s) { delete s; }

optx_isa optx_detected_isa(void) { return optx_isa(optx::detected_isa()); }
optx_isa optx_active_isa(void) { return optx_isa(optx::active_isa()); }
const char* optx_isa_name(optx_isa isa) {
  const int v = optx::capi::enum_value(isa);
  if (optx::capi::enum_ok<optx_isa>(v)) return optx::isa_name(optx::Isa(v));
  guarded("optx_isa_name", [&] {
    return optx::Error(optx::StatusCode::kInvalidArgument, "optx_isa_name: isa=", v, " is not an optx_isa");
  });
  return "?";
}

optx_status optx_selected_impl(const char* op, char* buf, size_t buf_size) {
  constexpr const char* fn = "optx_selected_impl";
  if (!op || !buf || buf_size == 0) return fail(OPTX_INVALID_ARGUMENT, fn, "op and buf must be non-null, buf_size > 0");
  return guarded(fn, [&] {
    const std::string name = optx::selected_impl(op);
    if (name.empty()) return optx::Error(optx::StatusCode::kInvalidArgument, fn, ": unknown op '", op, "'");
    optx::capi::copy_name(name, buf, buf_size);
    return optx::Status::Ok();
  });
}

size_t optx_registered_op_count(void) {
  size_t n = 0;
  guarded("optx_registered_op_count", [&] {
    n = optx::registered_ops().size();
    return optx::Status::Ok();
  });
  return n;
}

optx_status optx_registered_op(size_t i, char* buf, size_t buf_size) {
  constexpr const char* fn = "optx_registered_op";
  if (!buf || buf_size == 0) return fail(OPTX_INVALID_ARGUMENT, fn, "buf must be non-null, buf_size > 0");
  return guarded(fn, [&] {
    const std::vector<std::string> ops = optx::registered_ops();
    if (i >= ops.size()) return optx::Error(optx::StatusCode::kInvalidArgument, fn, ": i=", i, " but ", ops.size(), " ops are registered");
    optx::capi::copy_name(ops[i], buf, buf_size);
    return optx::Status::Ok();
  });
}

}  // extern "C"
