// optx — the command-line tool: `optx info`, `optx verify`, `optx bench`.
// Output contracts (checks outside the project read them) are specified in DESIGN.md.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench.h"
#include "dispatch/registry.h"
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

// A byte count: an exact integer (json_num's %.6g rounded 2293312 to 2.29331e+06).
std::string json_bytes(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", std::isfinite(v) && v > 0 ? v : 0.0);
  return buf;
}

// --filter selects ops by name: a family registered for several ops ("rms_norm|add_rms_norm")
// runs when the expression finds any one of them, and its rows are kept per op.
bool matches_any(const char* names, const std::regex& re) {
  const std::string all(names);
  for (size_t pos = 0; pos <= all.size();) {
    size_t end = all.find('|', pos);
    if (end == std::string::npos) end = all.size();
    if (std::regex_search(all.substr(pos, end - pos), re)) return true;
    pos = end + 1;
  }
  return false;
}

// The --json file, opened before the run so an unwritable path fails at once, and
// closed with its write errors checked (a full disk showed only at the flush).
struct JsonFile {
  std::ofstream out;
  bool open(const std::string& path, const char* cmd) {
    if (path.empty()) return true;
    out.open(path);
    if (!out) std::fprintf(stderr, "optx %s: cannot open %s for writing\n", cmd, path.c_str());
    return bool(out);
  }
  bool close(const std::string& path, const char* cmd) {
    if (!out.is_open()) return true;
    out.close();
    if (out.fail()) std::fprintf(stderr, "optx %s: cannot write %s\n", cmd, path.c_str());
    return !out.fail();
  }
};

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
      {"amx_bf16", f.amx_bf16}, {"amx_int8", f.amx_int8}, {"amx_permitted", f.amx_permitted}, {"fast_bf16_dot", f.fast_bf16_dot}};
  for (auto& [n, on] : feats)
    if (on) std::printf(" %s", n);
  std::printf("\n");
  std::printf("detected isa: %s\n", isa_name(detected_isa()));
  const char* cap = std::getenv("OPTX_MAX_ISA");
  std::printf("active isa: %s", isa_name(active_isa()));
  if (cap) std::printf("  (OPTX_MAX_ISA=%s)", cap);
  std::printf("\n");
  std::printf("threads: %d\n", num_threads());
  std::printf("selected implementations:\n");
  const auto ops = registered_ops();
  for (const auto& op : ops) std::printf("  %-24s %s\n", op.c_str(), selected_impl(op).c_str());
  // An OPTX_IMPL entry for an op no registry has (a typo) would otherwise select nothing
  // without a word.
  if (const char* env = std::getenv("OPTX_IMPL"))
    dispatch::each_impl_item(env, [&](std::string_view, dispatch::ImplEntry e) {
      if (!e.op.empty() && std::find(ops.begin(), ops.end(), e.op) == ops.end())
        std::fprintf(stderr, "optx: warning: OPTX_IMPL names '%.*s', which is not an op; ignored\n", int(e.op.size()), e.op.data());
      return false;
    });
  return 0;
}

struct Args {
  std::string filter = ".*", json;
  int threads = 0;
  bool quick = false;
};

constexpr size_t kMaxFilterChars = 1024;

// Each bad argument is named on stderr (then the usage, exit 2).
bool parse(int argc, char** argv, int start, const std::string& cmd, Args& a) {
  auto bad = [&](const std::string& why) {
    std::fprintf(stderr, "optx %s: %s\n", cmd.c_str(), why.c_str());
    return false;
  };
  for (int i = start; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (s == "--filter") {
      const char* v = next();
      if (!v) return bad("--filter needs a regular expression");
      // libstdc++ compiles a regex recursively, a frame per nesting level: 20000 nested
      // groups overflowed the stack (SIGSEGV, which no catch sees). Op names are short.
      if (std::strlen(v) > kMaxFilterChars)
        return bad("--filter is " + std::to_string(std::strlen(v)) + " characters; at most " + std::to_string(kMaxFilterChars));
      a.filter = v;
    } else if (s == "--json") {
      const char* v = next();
      if (!v || std::strncmp(v, "--", 2) == 0) return bad("--json needs a file name" + (v ? std::string(", got '") + v + "'" : ""));
      a.json = v;
    } else if (s == "--threads" && cmd == "bench") {
      const char* v = next();
      char* end = nullptr;
      const long n = v ? std::strtol(v, &end, 10) : 0;
      if (!v || *end || n < 1 || n > kMaxThreads)
        return bad("--threads needs an integer in [1, " + std::to_string(kMaxThreads) + "], got '" + (v ? v : "") + "'");
      a.threads = int(n);
    } else if (s == "--quick" && cmd == "bench") {
      a.quick = true;
    } else {
      return bad("unknown argument '" + s + "'");
    }
  }
  return true;
}

int cmd_verify(const Args& a) {
  JsonFile json;
  if (!json.open(a.json, "verify")) return 1;
  const std::regex re(a.filter);
  std::vector<verify::Record> all;
  int stopped = 0;
  for (const auto& v : verify::verifies()) {
    if (!matches_any(v.op, re)) continue;
    // A family that throws (bad_alloc) loses its remaining rows and fails the run, not the summary.
    try {
      v.fn(all);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "optx verify: %s stopped: %s\n", v.op, e.what());
      ++stopped;
    }
  }
  std::erase_if(all, [&](const verify::Record& r) { return !std::regex_search(r.op, re); });
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
    std::ofstream& out = json.out;
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
  }
  if (!json.close(a.json, "verify")) return 1;
  if (all.empty()) {
    std::fprintf(stderr, "optx verify: no op matches --filter '%s'\n", a.filter.c_str());
    return 1;
  }
  return fails == 0 && stopped == 0 ? 0 : 1;
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
  JsonFile json;
  if (!json.open(a.json, "bench")) return 1;
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
  ctx.wants = [&re](const char* op) { return std::regex_search(op, re); };
  bool any = false;
  for (const auto& b : bench::benches()) {
    if (!matches_any(b.op, re)) continue;
    any = true;
    std::fprintf(stderr, "optx bench: %s\n", b.op);
    // A peer library that throws (or a bad_alloc) loses that family's remaining rows, not the run.
    try {
      b.fn(ctx);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "optx bench: %s stopped: %s\n", b.op, e.what());
      failures.push_back(b.op);
    }
  }

  std::erase_if(recs, [&](const bench::Record& r) { return r.op != "ceiling" && !std::regex_search(r.op, re); });
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
    std::ofstream& out = json.out;
    out << "[\n";
    for (size_t i = 0; i < recs.size(); ++i) {
      const auto& r = recs[i];
      out << "  {\"op\": \"" << json_escape(r.op) << "\", \"case\": \"" << json_escape(r.case_) << "\", \"impl\": \""
          << json_escape(r.impl) << "\", \"median_ms\": " << json_num(r.median_ms) << ", \"p90_ms\": "
          << json_num(r.p90_ms) << ", \"gflops\": " << json_num(r.gflops) << ", \"gbytes_per_s\": "
          << json_num(r.gbytes_per_s) << ", \"peak_bytes\": " << json_bytes(r.peak_bytes)
          << ", \"threads\": " << r.threads << "}" << (i + 1 < recs.size() ? ",\n" : "\n");
    }
    out << "]\n";
  }
  if (!json.close(a.json, "bench")) return 1;
  if (!any) {
    std::fprintf(stderr, "optx bench: no op matches --filter '%s'\n", a.filter.c_str());
    return 1;
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
  if (cmd == "info") {
    if (argc > 2) {
      std::fprintf(stderr, "optx info: takes no arguments, got '%s'\n", argv[2]);
      return usage();
    }
    return cmd_info();
  }
  if (cmd != "verify" && cmd != "bench") {
    std::fprintf(stderr, "optx: unknown command '%s'\n", cmd.c_str());
    return usage();
  }
  Args a;
  if (!parse(argc, argv, 2, cmd, a)) return usage();
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
