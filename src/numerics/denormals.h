// MXCSR denormals-are-zero / flush-to-zero for the span of a kernel, on the calling thread.
//
// Why: on Intel cores an FMA with a denormal input takes a microcode assist. A paged
// decode V cache holding one bf16 denormal in 2000 values ran its widened P . V at 25
// instead of 7.4 cycles per key and pass; bf16 weights with the same density slowed a
// 16-row GEMM 2x. The instructions the widened FMAs stand in for (vdpbf16ps, AMX's
// tdpbf16ps) treat bf16 denormals as zero by definition, so the FMA paths running with
// DAZ / FTZ also agree with them on such inputs. The caller's modes come back on exit:
// each OpenMP thread has its own MXCSR, so every thread that runs a kernel sets its own.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace optx::numerics {
// Unnamed namespace: ISA units and generic code each compile this with their own flags;
// an inline member with external linkage would be one weak symbol the linker picks from
// any of them (the isa_symbols test rejects that).
namespace {

class DenormalsAsZero {
 public:
  explicit DenormalsAsZero(bool on = true) {
#if defined(__x86_64__) || defined(__i386__)
    if (on) {
      saved_ = _mm_getcsr();
      set_ = true;
      _mm_setcsr(saved_ | kDazFtz);
    }
#else
    (void)on;
#endif
  }
  ~DenormalsAsZero() {
#if defined(__x86_64__) || defined(__i386__)
    if (set_) _mm_setcsr(saved_);
#endif
  }
  DenormalsAsZero(const DenormalsAsZero&) = delete;
  DenormalsAsZero& operator=(const DenormalsAsZero&) = delete;

 private:
  static constexpr unsigned kDazFtz = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  unsigned saved_ = 0;
  bool set_ = false;
};

}  // namespace
}  // namespace optx::numerics
