// The bench driver's interface for op families (`optx bench`).
//
// A family registers one function with OPTX_REGISTER_BENCH; it times its cases with
// time_it() and adds one Record per (case, impl), so ratios are read off one run. Every
// record names the roofline it is judged against (FLOPs and/or bytes); the driver fills in
// the share of the floor from the ceilings it measured in the same run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "optx/status.h"
#include "optx/tensor.h"
#include "testing/rng.h"

namespace optx::bench {

struct Ceilings {
  double fma_f32_gflops = 0;   // peak f32 FMA rate at the run's thread count
  double dot_bf16_gflops = 0;  // peak bf16 dot-product rate (vdpbf16ps, else f32 FMA)
  double amx_bf16_gflops = 0;  // peak AMX tdpbf16ps rate (0 without AMX)
  double copy_gbytes_per_s = 0;  // DRAM copy, bytes read + written, over dram_working_set()
  double read_gbytes_per_s = 0;  // DRAM read-only, eight streams per thread, same buffers
};

enum class Roof { kNone, kF32, kBF16, kMemory };

struct Record {
  std::string op, case_, impl;
  double median_ms = 0, p90_ms = 0;
  double gflops = 0, gbytes_per_s = 0;
  double peak_bytes = 0;
  int threads = 1;
  // For the table: what the floor is measured against, and free-form notes.
  Roof roof = Roof::kNone;
  double share_of_floor = 0;  // floor time / median time, 0 if unknown
  std::string note;
};

struct Timing {
  double median_ms = 0, p90_ms = 0;
};

struct Context {
  int threads = 1;
  bool quick = false;
  Ceilings ceil;
  std::vector<Record>* records = nullptr;
  // Cases whose op returned an error (see check()): reported on stderr, no row, and
  // `optx bench` exits 1, so a failing call is never timed and shown as a result.
  std::vector<std::string>* failures = nullptr;
  // Whether --filter selects this op: families that bench several ops skip the others.
  std::function<bool(const char* op)> wants = [](const char*) { return true; };

  // Runs fn once to warm up, then repeatedly for at least min_reps calls and min_seconds.
  Timing time_it(const std::function<void()>& fn) const;
  // Times several implementations of one case with their repetitions interleaved
  // (A B C A B C ...), so a slow phase of a noisy machine hits all of them alike and the
  // ratios between them hold even when absolute times drift. One warm-up call each.
  std::vector<Timing> time_interleaved(const std::vector<std::function<void()>>& fns) const;
  // Times implementations with their own thread pools (OpenBLAS's pthread workers spin
  // ~0.1 s after each call; OpenMP's spin too) in alternating blocks: each block first
  // runs untimed calls for `settle_s`, so the other pool's spinning threads are gone
  // before a timed call starts, and the rounds alternate so a slow phase of the machine
  // still falls on all of them.
  std::vector<Timing> time_blocks(const std::vector<std::function<void()>>& fns, double settle_s) const;
  // Fills throughput from flops / bytes and the timing, and the share of the floor; a
  // memory-bound row's note also gets its shares of the copy and the read timed beside it.
  void add(Record r, const Timing& t, double flops, double bytes) const;
  // The copy and read rates measured around the last time_interleaved / time_blocks (0:
  // none).
  mutable double copy_beside_gbs = 0, read_beside_gbs = 0;
  // A peer's row and the call that times it.
  struct Peer {
    Record record;
    std::function<void()> fn;
  };
  // The usual side-by-side case: optx, basic and any peers timed interleaved, every row
  // added with the same flops and bytes.
  void add_interleaved(const Record& optx, const std::function<void()>& optx_fn, const Record& basic,
                       const std::function<void()>& basic_fn, double flops, double bytes,
                       const std::vector<Peer>& peers = {}) const;
};

// A 64-byte aligned operand buffer, zeroed at construction so that no timed call pays
// the first touch of its pages (~12 us per 4 KiB page here). Throws std::bad_alloc.
class Buffer {
 public:
  explicit Buffer(size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_;
  size_t bytes_;
};

// optx's output `got` against basic's `ref` (n values of dt, f32 or bf16): they must agree
// within rel_tol of ref's largest magnitude, or the case fails like an error (through
// check(), so call it before the case's rows are added). A baseline that computed
// something else would make the ratio meaningless.
void expect_agree(const std::string& key, const void* got, const void* ref, int64_t n, DType dt, double rel_tol);

// Every op call in a bench goes through check(). A failed call's case loses its rows and
// is reported failed instead: the next row added, or with `key` = "op case" that case's
// (for calls timed beside other cases, as the decode benches' i8 caches).
void check(const Status& st, const std::string& key = {});

using BenchFn = void (*)(Context&);
bool register_bench(const char* op, BenchFn fn);
struct Registered {
  const char* op;
  BenchFn fn;
};
const std::vector<Registered>& benches();

Ceilings measure_ceilings(int threads, bool quick);

// Bytes a rotation of operands must span so that each call streams them from DRAM: twice
// the last-level cache (this VM reports a 300 MiB L3), and at least 512 MiB.
size_t dram_working_set();

// Block tables of `sets` sets of `per_set` blocks each, no block in two sets, the ids
// shuffled over [0, sets * per_set): rotating the sets reads a paged pool from DRAM.
std::vector<std::vector<int32_t>> disjoint_tables(int sets, int64_t per_set, testing::Rng& rng);

// A case's PyTorch row (bench/torch_peer.h), timed beside optx's. run(set, out) runs
// PyTorch on operand copy `set` of `sets`: run(0, out) writes its result into out, which
// must match optx's `expect` (out's dtype and size, as expect_agree) before the row
// exists; the timed calls rotate over the copies from a quarter of them on (optx's start
// at 0, basic's half the copies away, so none reads what another just brought into cache)
// with an empty out, their result dropped. peak_bytes: what PyTorch held at once beyond
// its result (optx's rows count their workspace, beyond inputs and output), the result
// being a tensor it returned unless `in_place` (it wrote out). Empty where PyTorch fails
// (said on stderr).
struct TorchPeer;
std::vector<Context::Peer> torch_row(const TorchPeer& torch, const Record& optx_rec, const char* what,
                                     std::function<const char*(int set, const TensorView& out)> run, const TensorView& out,
                                     const void* expect, int sets = 1, double rel_tol = 3e-2, bool in_place = false);

// Puts peer libraries in their best configuration before anything is timed; may re-exec
// the process (argv: the original command line).
void prepare_peers(char** argv);

}  // namespace optx::bench

#define OPTX_REGISTER_BENCH(op, fn) \
  static const bool optx_bench_registered_##fn = ::optx::bench::register_bench(op, fn)
