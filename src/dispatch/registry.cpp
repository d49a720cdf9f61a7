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
}  // namespace

// OPTX_IMPL's entries that select nothing, warned about once per process: an entry that
// is not op=impl (both non-empty), and an op given twice (the first entry applies). An op
// name no registry has is reported by `optx info`, which knows every op.
void warn_malformed_impl(std::string_view s) {
  std::vector<std::string_view> seen;
  for (size_t pos = 0; pos <= s.size();) {
    size_t end = s.find(',', pos);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view item = s.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;  // "a=b," or ",,": nothing asked
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      log_warning("OPTX_IMPL entry '" + std::string(item) + "' is not op=impl; ignored");
      continue;
    }
    const std::string_view op = item.substr(0, eq);
    for (const auto& o : seen)
      if (o == op) log_warning("OPTX_IMPL names " + std::string(op) + " more than once; its first entry applies");
    seen.push_back(op);
  }
}

// A view into the environment (no copy: selection runs on every op call, and an op name
// past the small-string buffer made each call allocate); valid until OPTX_IMPL changes.
std::string_view forced_impl(std::string_view op) {
  const char* env = std::getenv("OPTX_IMPL");
  if (!env) return {};
  static std::once_flag checked;
  std::call_once(checked, warn_malformed_impl, std::string_view(env));
  // Format: op=impl[,op=impl...]
  const std::string_view s(env);
  for (size_t pos = 0; pos <= s.size();) {
    size_t end = s.find(',', pos);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view item = s.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq != std::string_view::npos && item.substr(0, eq) == op) return item.substr(eq + 1);
    pos = end + 1;
  }
  return {};
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
