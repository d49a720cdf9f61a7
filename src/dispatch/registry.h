// Ordered implementation registry per op.
//
// Each op keeps a list of implementations, best first, the reference last. The one that
// runs is the first whose ISA level the CPU (capped by OPTX_MAX_ISA) reaches, unless
// OPTX_IMPL=<op>=<impl>[,<op>=<impl>...] names one (read at every selection, so a test can
// change it). The choice is reported by optx::selected_impl(op) and, with OPTX_VERBOSE=1,
// on stderr.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/log.h"
#include "optx/runtime.h"
#include "optx/status.h"

namespace optx::dispatch {

// Value of OPTX_IMPL for this op, or "" if none is forced.
std::string_view forced_impl(std::string_view op);

// An OPTX_IMPL item of the form op=impl (both non-empty); empty views otherwise.
struct ImplEntry {
  std::string_view op, impl;
};
// OPTX_IMPL's comma-separated items in order, as views into s (forced_impl reads them on
// every op call, so nothing is copied), each with its entry; f(item, entry) returns true
// to stop.
template <class F>
void each_impl_item(std::string_view s, F&& f) {
  for (size_t pos = 0; pos <= s.size();) {
    size_t end = s.find(',', pos);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view item = s.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = item.find('=');
    const bool entry = eq != std::string_view::npos && eq > 0 && eq + 1 < item.size();
    if (f(item, entry ? ImplEntry{item.substr(0, eq), item.substr(eq + 1)} : ImplEntry{})) return;
  }
}

// Registers an op's selection query so optx::selected_impl() and `optx info` can see it.
void register_op(const std::string& op, std::string (*selected)());

template <class Fn>
struct Impl {
  const char* name;
  Isa isa;  // lowest ISA level the implementation needs
  Fn fn;
};

template <class Fn>
class Registry {
 public:
  Registry(const char* op, std::vector<Impl<Fn>> impls) : op_(op), impls_(std::move(impls)) {}

  const char* op() const { return op_; }
  const std::vector<Impl<Fn>>& all() const { return impls_; }

  // Implementations this CPU can run under the current OPTX_MAX_ISA cap.
  std::vector<const Impl<Fn>*> runnable() const {
    std::vector<const Impl<Fn>*> r;
    for (const auto& i : impls_)
      if (i.isa <= active_isa()) r.push_back(&i);
    return r;
  }

  const Impl<Fn>* find(std::string_view name) const {
    for (const auto& i : impls_)
      if (name == i.name) return &i;
    return nullptr;
  }

  // The implementation to run, or an error if OPTX_IMPL forces one that cannot run here.
  Status select(const Impl<Fn>** out) const {
    const std::string_view forced = forced_impl(op_);
    if (!forced.empty()) {
      const Impl<Fn>* i = find(forced);
      if (!i) return Error(StatusCode::kUnsupported, op_, ": OPTX_IMPL names '", forced,
                           "', which is not an implementation of this op");
      if (i->isa > active_isa())
        return Error(StatusCode::kUnsupported, op_, ": OPTX_IMPL forces '", forced,
                     "', which needs ISA ", isa_name(i->isa), " but the active ISA is ",
                     isa_name(active_isa()));
      *out = i;
      return Status::Ok();
    }
    for (const auto& i : impls_)
      if (i.isa <= active_isa()) {
        *out = &i;
        return Status::Ok();
      }
    return Error(StatusCode::kInternal, op_, ": no runnable implementation");
  }

  // select(), and with OPTX_VERBOSE=1 the line naming what runs: what an op calls before
  // it runs its implementation.
  Status select_to_run(const Impl<Fn>** out) const {
    if (Status st = select(out); !st.ok()) return st;
    if (verbose()) log_verbose(std::string(op_) + ": running implementation '" + (*out)->name + "'");
    return Status::Ok();
  }

  std::string selected_name() const {
    const Impl<Fn>* i = nullptr;
    if (!select(&i).ok()) return "unavailable(" + std::string(forced_impl(op_)) + ")";
    return i->name;
  }

 private:
  const char* op_;
  std::vector<Impl<Fn>> impls_;
};

}  // namespace optx::dispatch
