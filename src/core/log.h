// Internal logging. Warnings go to stderr; verbose messages only with OPTX_VERBOSE=1.
#pragma once
#include <string>

namespace optx {
bool verbose();
void log_warning(const std::string& msg);
void log_verbose(const std::string& msg);
}  // namespace optx
