// C API of the rope family (optx.h): rope and its cos / sin tables.
#include "core/c_api_internal.h"

struct optx_rope_table {
  optx::RopeTable table;
};

using optx::capi::get;

extern "C" {

OPTX_C_DEFAULT(rope_params)
OPTX_C_DEFAULT(yarn_scaling)
OPTX_C_DEFAULT(rope_table_params)
OPTX_C_SIZED_OP(rope, optx::capi::never_refused<optx::RopeParams>)

double optx_yarn_mscale(double factor, double mscale) { return optx::yarn_mscale(factor, mscale); }

optx_status optx_rope_table_build(const optx_rope_table_params* p, optx_rope_table** out) {
  return optx::capi::create_from("rope_table", p, out,
                                 [](const optx::RopeTableParams& q, optx_rope_table& h) { return optx::RopeTable::build(q, &h.table); });
}
void optx_rope_table_free(optx_rope_table* t) { delete t; }

optx_status optx_rope_table_cos(const optx_rope_table* t, optx_tensor* out) {
  return optx::capi::view_of("optx_rope_table_cos", t, out, [](const optx_rope_table& h) { return h.table.cos(); });
}
optx_status optx_rope_table_sin(const optx_rope_table* t, optx_tensor* out) {
  return optx::capi::view_of("optx_rope_table_sin", t, out, [](const optx_rope_table& h) { return h.table.sin(); });
}
int64_t optx_rope_table_positions(const optx_rope_table* t) {
  return get("optx_rope_table_positions", t, int64_t(-1), [](const optx_rope_table& h) { return h.table.positions(); });
}
int64_t optx_rope_table_half(const optx_rope_table* t) {
  return get("optx_rope_table_half", t, int64_t(-1), [](const optx_rope_table& h) { return h.table.half(); });
}
const double* optx_rope_table_inv_freq(const optx_rope_table* t) {
  return get("optx_rope_table_inv_freq", t, static_cast<const double*>(nullptr),
             [](const optx_rope_table& h) { return h.table.inv_freq().data(); });
}

}  // extern "C"
