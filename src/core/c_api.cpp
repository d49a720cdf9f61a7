// C API: converts C structs to the C++ params and Status to codes + thread-local message.
#include "optx/optx.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "ops/gemm/gemm_internal.h"
#include "optx/gemm.h"

namespace {
thread_local std::string g_last_error;

optx_status to_c(const optx::Status& s) {
  if (!s.ok()) g_last_error = s.message();
  return static_cast<optx_status>(s.code());
}

// The rank goes through as given (check_view names a bad one with its value); sizes and
// strides past the C struct's six are never read.
optx::TensorView to_view(const optx_tensor& t) {
  optx::TensorView v;
  v.data = t.data;
  v.dtype = static_cast<optx::DType>(t.dtype);
  v.rank = t.rank;
  for (int i = 0; i < std::min(t.rank, optx::kMaxRank); ++i) {
    v.sizes[i] = t.sizes[i];
    v.strides[i] = t.strides[i];
  }
  return v;
}

// A C caller's enum is any int: a value past DType's uint8_t range would wrap onto a valid
// dtype (256 onto f32) in the cast above, so it is rejected here with the value as passed.
// Read as the int it is (loading an out-of-range value as the enum type is undefined in C++).
optx::Status check_dtypes(const optx_gemm_params& p) {
  static_assert(sizeof(optx_dtype) == sizeof(int));
  const std::pair<const char*, const optx_tensor*> ts[] = {{"a", &p.a}, {"b", &p.b}, {"b_scales", &p.b_scales}, {"bias", &p.bias}, {"c", &p.c}};
  for (const auto& [name, t] : ts) {
    int d = 0;
    std::memcpy(&d, &t->dtype, sizeof d);
    if (d < OPTX_F32 || d > OPTX_I64)
      return optx::Error(optx::StatusCode::kInvalidArgument, "gemm: ", name, ".dtype=", d, " is not an optx_dtype");
  }
  return optx::Status::Ok();
}

// What both gemm entry points check before the C struct may be converted.
optx::Status check_c_params(const optx_gemm_params* p) {
  if (!p) return optx::Error(optx::StatusCode::kInvalidArgument, "gemm: params is null");
  return check_dtypes(*p);
}

optx::GemmParams to_params(const optx_gemm_params& p) {
  optx::GemmParams g;
  g.a = to_view(p.a);
  g.b = to_view(p.b);
  g.b_scales = to_view(p.b_scales);
  g.bias = to_view(p.bias);
  g.c = to_view(p.c);
  g.alpha = p.alpha;
  g.beta = p.beta;
  g.b_kn = p.b_kn != 0;
  return g;
}
}  // namespace

extern "C" {

const char* optx_version(void) { return optx::version(); }
const char* optx_last_error(void) { return g_last_error.c_str(); }
void optx_set_num_threads(int n) { optx::set_num_threads(n); }
int optx_num_threads(void) { return optx::num_threads(); }

optx_status optx_selected_impl(const char* op, char* buf, size_t buf_size) {
  if (!op || !buf || buf_size == 0)
    return to_c(optx::Error(optx::StatusCode::kInvalidArgument, "optx_selected_impl: op and buf must be non-null, buf_size > 0"));
  const std::string name = optx::selected_impl(op);
  if (name.empty())
    return to_c(optx::Error(optx::StatusCode::kInvalidArgument, "optx_selected_impl: unknown op '", op, "'"));
  std::strncpy(buf, name.c_str(), buf_size - 1);
  buf[buf_size - 1] = '\0';
  return OPTX_OK;
}

// A valid call may need no workspace, so 0 alone cannot say the params were refused: a
// refusal also sets optx_last_error() (the message gemm() would return).
size_t optx_gemm_workspace_size(const optx_gemm_params* p) {
  if (optx::Status st = check_c_params(p); !st.ok()) return to_c(st), 0;
  const optx::GemmParams g = to_params(*p);
  const size_t bytes = optx::gemm_workspace_size(g);
  if (bytes == 0) to_c(optx::gemm_detail::validate(g, /*need_data=*/false));  // only a 0 needs the reason
  return bytes;
}

optx_status optx_gemm(const optx_gemm_params* p, void* workspace, size_t workspace_bytes) {
  if (optx::Status st = check_c_params(p); !st.ok()) return to_c(st);
  return to_c(optx::gemm(to_params(*p), optx::Workspace{workspace, workspace_bytes}));
}

}  // extern "C"
