// Linked into every test binary: after each test, put back the process-wide state a test
// may change, so a failed ASSERT that returns early cannot leak a thread count or a
// forced implementation into the tests after it (or into the OPTX_MAX_ISA-capped runs).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "optx/runtime.h"

namespace {

class RestoreGlobals : public ::testing::EmptyTestEventListener {
 public:
  RestoreGlobals() {
    if (const char* v = std::getenv("OPTX_IMPL")) impl_ = v;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    optx::set_num_threads(0);
    if (impl_) setenv("OPTX_IMPL", impl_->c_str(), 1);
    else unsetenv("OPTX_IMPL");
  }

 private:
  std::optional<std::string> impl_;
};

const bool registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new RestoreGlobals);
  return true;
}();

}  // namespace
