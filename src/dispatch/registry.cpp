#include "dispatch/registry.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"

namespace optx {
namespace dispatch {
namespace {
struct OpEntry {
  std::string op;
  std::string (*selected)();
};
std::vector<OpEntry>& ops() {
  static std::vector<OpEntry> v;
  return v;
}
std::mutex& ops_mutex() {
  static std::mutex m;
  return m;
}

// OPTX_IMPL's entries that select nothing, warned about once per process: an entry that
// is not op=impl (both non-empty), and an op given twice (the first entry applies). An op
// name no registry has is reported by `optx info`, which knows every op.
void warn_malformed_impl(std::string_view s) {
  std::vector<std::string_view> seen;
  each_impl_item(s, [&](std::string_view item, ImplEntry e) {
    if (item.empty()) return false;  // "a=b," or ",,": nothing asked
    if (e.op.empty()) {
      log_warning("OPTX_IMPL entry '" + std::string(item) + "' is not op=impl; ignored");
      return false;
    }
    for (const auto& o : seen)
      if (o == e.op) log_warning("OPTX_IMPL names " + std::string(e.op) + " more than once; its first entry applies");
    seen.push_back(e.op);
    return false;
  });
}
}  // namespace

// A view into the environment (no copy: selection runs on every op call, and an op name
// past the small-string buffer made each call allocate); valid until OPTX_IMPL changes.
std::string_view forced_impl(std::string_view op) {
  const char* env = std::getenv("OPTX_IMPL");
  if (!env) return {};
  static std::once_flag checked;
  std::call_once(checked, warn_malformed_impl, std::string_view(env));
  std::string_view forced;
  each_impl_item(env, [&](std::string_view, ImplEntry e) {
    if (e.op != op) return false;
    forced = e.impl;
    return true;
  });
  return forced;
}

void register_op(const std::string& op, std::string (*selected)()) {
  std::lock_guard<std::mutex> lock(ops_mutex());
  for (auto& e : ops())
    if (e.op == op) return;
  ops().push_back({op, selected});
}
}  // namespace dispatch

std::string selected_impl(const std::string& op) {
  std::lock_guard<std::mutex> lock(dispatch::ops_mutex());
  for (auto& e : dispatch::ops())
    if (e.op == op) return e.selected();
  return "";
}

std::vector<std::string> registered_ops() {
  std::lock_guard<std::mutex> lock(dispatch::ops_mutex());
  std::vector<std::string> r;
  for (auto& e : dispatch::ops()) r.push_back(e.op);
  return r;
}

}  // namespace optx
