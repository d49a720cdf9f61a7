// optx — the command-line tool: `optx info`, `optx verify`, `optx bench`.
// Output contracts (checks outside the project read them) are specified in DESIGN.md.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "optx/runtime.h"
#include "tools/verify.h"

namespace {

using namespace optx;

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else o += c;
  }
  return o;
}

std::string json_num(double v) {
  if (!std::isfinite(v)) return v > 0 ? "1e308" : (v < 0 ? "-1e308" : "null");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

int usage() {
  std::fprintf(stderr,
               "usage: optx info\n"
               "       optx verify [--filter REGEX] [--json FILE]\n"
               "       optx bench  [--filter REGEX] [--threads N] [--json FILE] [--quick]\n");
  return 2;
}

int cmd_info() {
  const CpuFeatures& f = cpu_features();
  std::printf("optx %s\n", version());
  std::printf("cpu: %s\n", f.brand.c_str());
  std::printf("features:");
  const std::pair<const char*, bool> feats[] = {
      {"avx2", f.avx2}, {"fma", f.fma}, {"f16c", f.f16c}, {"avx512f", f.avx512f}, {"avx512bw", f.avx512bw},
      {"avx512vl", f.avx512vl}, {"avx512dq", f.avx512dq}, {"avx512_bf16", f.avx512_bf16},
      {"avx512_vnni", f.avx512_vnni}, {"avx_vnni", f.avx_vnni}, {"amx_tile", f.amx_tile},
      {"amx_bf16", f.amx_bf16}, {"amx_int8", f.amx_int8}, {"amx_permitted", f.amx_permitted}};
  for (auto& [n, on] : feats)
    if (on) std::printf(" %s", n);
  std::printf("\n");
  std::printf("detected isa: %s\n", isa_name(detected_isa()));
  const char* cap = std::getenv("OPTX_MAX_ISA");
  std::printf("active isa: %s%s%s\n", isa_name(active_isa()), cap ? "  (OPTX_MAX_ISA=" : "", cap ? cap : "");
  if (cap) std::printf(")\n");
  std::printf("threads: %d\n", num_threads());
  std::printf("selected implementations:\n");
  for (const auto& op : registered_ops()) std::printf("  %-24s %s\n", op.c_str(), selected_impl(op).c_str());
  return 0;
}

struct Args {
  std::string filter = ".*", json;
  int threads = 0;
  bool quick = false;
};

bool parse(int argc, char** argv, int start, Args& a) {
  for (int i = start; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (s == "--filter") {
      const char* v = next();
      if (!v) return false;
      a.filter = v;
    } else if (s == "--json") {
      const char* v = next();
      if (!v) return false;
      a.json = v;
    } else if (s == "--threads") {
      const char* v = next();
      if (!v || std::atoi(v) <= 0) return false;
      a.threads = std::atoi(v);
    } else if (s == "--quick") {
      a.quick = true;
    } else {
      std::fprintf(stderr, "optx: unknown argument '%s'\n", s.c_str());
      return false;
    }
  }
  return true;
}

int cmd_verify(const Args& a) {
  const std::regex re(a.filter);
  std::vector<verify::Record> all;
  for (const auto& v : verify::verifies()) {
    if (!std::regex_search(v.op, re)) continue;
    v.fn(all);
  }
  std::printf("%-16s %-14s %-64s %12s %12s %12s %s\n", "op", "impl", "case", "max_abs_err", "max_rel_err",
              "nmse", "result");
  int fails = 0;
  for (const auto& r : all) {
    std::printf("%-16s %-14s %-64s %12.3g %12.3g %12.3g %s%s%s\n", r.op.c_str(), r.impl.c_str(), r.case_.c_str(),
                r.max_abs_err, r.max_rel_err, r.nmse, r.pass ? "pass" : "FAIL", r.pass ? "" : "  ",
                r.pass ? "" : r.message.c_str());
    fails += !r.pass;
  }
  std::printf("verify: %zu cases, %zu passed, %d failed\n", all.size(), all.size() - size_t(fails), fails);
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << "[\n";
    for (size_t i = 0; i < all.size(); ++i) {
      const auto& r = all[i];
      out << "  {\"op\": \"" << json_escape(r.op) << "\", \"case\": \"" << json_escape(r.case_) << "\", \"impl\": \""
          << json_escape(r.impl) << "\", \"max_abs_err\": " << json_num(r.max_abs_err)
          << ", \"max_rel_err\": " << json_num(r.max_rel_err) << ", \"nmse\": " << json_num(r.nmse)
          << ", \"worst_index\": " << r.worst_index << ", \"pass\": " << (r.pass ? "true" : "false") << "}"
          << (i + 1 < all.size() ? ",\n" : "\n");
    }
    out << "]\n";
    if (!out) {
      std::fprintf(stderr, "optx verify: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  if (all.empty()) {
    std::fprintf(stderr, "optx verify: no op matches --filter '%s'\n", a.filter.c_str());
    return 1;
  }
  return fails == 0 ? 0 : 1;
}

const char* roof_name(bench::Roof r) {
  switch (r) {
    case bench::Roof::kF32: return "f32 fma";
    case bench::Roof::kBF16: return "bf16 dot";
    case bench::Roof::kMemory: return "copy bw";
    default: return "";
  }
}

int cmd_bench(const Args& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  bench::Context ctx;
  ctx.threads = num_threads();
  ctx.quick = a.quick;
  std::vector<bench::Record> recs;
  ctx.records = &recs;
  std::vector<std::string> failures;
  ctx.failures = &failures;
  std::fprintf(stderr, "optx bench: measuring ceilings at %d threads...\n", ctx.threads);
  ctx.ceil = bench::measure_ceilings(ctx.threads, a.quick);
  auto ceiling = [&](const char* kind, double gflops, double gbs) {
    bench::Record r;
    r.op = "ceiling";
    r.case_ = std::string("kind=") + kind;
    r.impl = "optx";
    r.gflops = gflops;
    r.gbytes_per_s = gbs;
    r.threads = ctx.threads;
    recs.push_back(r);
  };
  ceiling("copy", 0, ctx.ceil.copy_gbytes_per_s);
  ceiling("read", 0, ctx.ceil.read_gbytes_per_s);
  ceiling("fma_f32", ctx.ceil.fma_f32_gflops, 0);
  ceiling("dot_bf16", ctx.ceil.dot_bf16_gflops, 0);
  if (ctx.ceil.amx_bf16_gflops > 0) ceiling("amx_bf16", ctx.ceil.amx_bf16_gflops, 0);

  const std::regex re(a.filter);
  for (const auto& b : bench::benches()) {
    if (!std::regex_search(b.op, re)) continue;
    std::fprintf(stderr, "optx bench: %s\n", b.op);
    // A peer library that throws (or a bad_alloc) loses that family's remaining rows, not the run.
    try {
      b.fn(ctx);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "optx bench: %s stopped: %s\n", b.op, e.what());
      failures.push_back(b.op);
    }
  }

  std::printf("%-14s %-36s %-10s %10s %10s %10s %10s %10s %8s %-9s %s\n", "op", "case", "impl", "median_ms",
              "p90_ms", "GFLOP/s", "GB/s", "peak_MiB", "%floor", "roof", "note");
  for (const auto& r : recs) {
    char share[16] = "";
    if (r.share_of_floor > 0) std::snprintf(share, sizeof share, "%.0f%%", 100 * r.share_of_floor);
    std::printf("%-14s %-36s %-10s %10.3f %10.3f %10.1f %10.1f %10.1f %8s %-9s %s\n", r.op.c_str(),
                r.case_.c_str(), r.impl.c_str(), r.median_ms, r.p90_ms, r.gflops, r.gbytes_per_s,
                r.peak_bytes / (1 << 20), share, roof_name(r.roof), r.note.c_str());
  }
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << "[\n";
    for (size_t i = 0; i < recs.size(); ++i) {
      const auto& r = recs[i];
      out << "  {\"op\": \"" << json_escape(r.op) << "\", \"case\": \"" << json_escape(r.case_) << "\", \"impl\": \""
          << json_escape(r.impl) << "\", \"median_ms\": " << json_num(r.median_ms) << ", \"p90_ms\": "
          << json_num(r.p90_ms) << ", \"gflops\": " << json_num(r.gflops) << ", \"gbytes_per_s\": "
          << json_num(r.gbytes_per_s) << ", \"peak_bytes\": " << json_num(r.peak_bytes)
          << ", \"threads\": " << r.threads << "}" << (i + 1 < recs.size() ? ",\n" : "\n");
    }
    out << "]\n";
    if (!out) {
      std::fprintf(stderr, "optx bench: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  if (!failures.empty()) {
    std::fprintf(stderr, "optx bench: %zu case(s) failed and have no row\n", failures.size());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  if (cmd == "info") return cmd_info();
  Args a;
  if (!parse(argc, argv, 2, a)) return usage();
  try {
    std::regex check(a.filter);
  } catch (const std::regex_error&) {
    std::fprintf(stderr, "optx: --filter '%s' is not a valid regular expression\n", a.filter.c_str());
    return 2;
  }
  if (cmd == "verify") return cmd_verify(a);
  if (cmd == "bench") {
    bench::prepare_peers(argv);
    return cmd_bench(a);
  }
  return usage();
}
