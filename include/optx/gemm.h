// optx/gemm.h — dense GEMM: C = alpha * A * B^T + beta * C (+ bias).
//
// B is a weight matrix in the nn.Linear layout [N, K] (or [K, N] with b_kn = true), given
// either as a plain view or pre-packed once at load time with pack_weights(). Every
// implementation reads every packed layout (the grouped GEMM takes an array of
// PackedMatrix too), so a model packs once; pack_weights picks, for f32, the layout the
// implementation selected on this CPU reads fastest (PackLayout).
// A plain (unpacked) f32 / bf16 B with unit inner stride: up to 8 rows of A (decode, or
// attention's P V against a V slice as [K, N]) stream B in place in either layout; more
// rows pack B first on every call, so weights that serve many calls belong packed.
//
// dtypes:  A f32  x B f32           -> C f32 | bf16
//          A bf16 x B bf16          -> C f32 | bf16     (f32 accumulation)
//          A f32  x B bf16          -> C f32 | bf16
//          A f32 | bf16 x B i8 (per-output-channel f32 scales) -> C f32 | bf16
#pragma once

#include <cstddef>
#include <cstdint>

#include "optx/runtime.h"
#include "optx/status.h"
#include "optx/tensor.h"

namespace optx {

// One packed weight matrix [N, K]. Layout: ceil(N / 64) column panels; each panel holds
// all of K for 64 output channels, zero-padded past N (and past K to k_padded):
//   f32: [K][64]         bf16: [K/2][64][2] (k-pairs interleaved, as vdpbf16ps reads them)
//   i8:  [K][64]         plus scales[n_panels * 64] (f32, zero-padded)
// f32 with strip_kc > 0 (PackLayout::kStrips): each panel is K blocks of strip_kc rows
// (the last one shorter), each block four 16-column strips [kc][16] one after another —
// what the AVX2 strip kernel reads (32 KiB L1D: a 16 KiB strip stays in L1 for all the
// row slices), same bytes per panel.
// Panels are contiguous, so a thread streaming a range of panels reads one sequential run.
// One built by hand (bytes packed once, stored, mapped back) must keep pack_weights'
// k_padded and panel_bytes for its dtype and k, with data 64-byte aligned: the ops check
// both, since the kernels read whole panels with aligned vector loads. n_panels() panels
// must lie behind data (and n_panels() * 64 scales behind scales, i8): the struct holds no
// byte count, so that part is the caller's.
struct PackedMatrix {
  DType dtype = DType::kF32;
  int64_t n = 0, k = 0;
  int64_t k_padded = 0;      // K, rounded up to 32 for bf16 (whole AMX k-steps)
  int64_t panel_bytes = 0;   // bytes of one panel (k_padded * 64 * elem)
  int64_t strip_kc = 0;      // f32 only: > 0 for the strip layout, 0 for [K][64]
  const void* data = nullptr;
  const float* scales = nullptr;  // i8 only

  static constexpr int64_t kPanel = 64;
  int64_t n_panels() const { return (n + kPanel - 1) / kPanel; }
  const uint8_t* panel(int64_t j) const {
    return static_cast<const uint8_t*>(data) + j * panel_bytes;
  }
  // Element (n, k) as float (unscaled for i8). For references and debugging, not hot loops.
  float at(int64_t n_idx, int64_t k_idx) const;
};

// Owns the packed bytes of one matrix or of E matrices (per-expert weights).
class PackedWeights {
 public:
  PackedWeights() = default;
  PackedWeights(PackedWeights&&) noexcept;
  PackedWeights& operator=(PackedWeights&&) noexcept;
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;
  ~PackedWeights();

  int64_t count() const { return count_; }
  const PackedMatrix& operator[](int64_t e) const { return mats_[e]; }
  const PackedMatrix* matrices() const { return mats_; }
  size_t bytes() const { return bytes_; }

 private:
  friend Status pack_weights(const struct PackWeightsParams& p, PackedWeights* out);
  void* storage_ = nullptr;
  PackedMatrix* mats_ = nullptr;
  int64_t count_ = 0;
  size_t bytes_ = 0;
};

// kAuto: kStrips for f32 weights when the gemm implementation selected on this CPU runs
// 16-column strip kernels (AVX2), kPanels otherwise. Any implementation reads either
// (one that does not run strips rebuilds each K block as a panel first, a copy per block).
enum class PackLayout : uint8_t { kAuto, kPanels, kStrips };

struct PackWeightsParams {
  TensorView w;        // [N, K] or [E, N, K] (or [K, N] / [E, K, N] with kn); f32 | bf16 | i8
  TensorView scales;   // i8 only: [N] or [E, N] f32 per-output-channel scales; else empty
  bool kn = false;     // w is laid out [K, N]
  PackLayout layout = PackLayout::kAuto;  // kStrips: f32 only
};
// Allocates (64-byte aligned, once) and packs. Runs multi-threaded.
Status pack_weights(const PackWeightsParams& p, PackedWeights* out);

// Activation fused into the epilogue. kSwiglu: B holds [gate; up] (N = 2I rows, gate
// first) and C is [M, I] = silu(A gate^T) * (A up^T), computed from the two f32 tiles in
// registers before the one store. Needs packed_b with I a multiple of 64 (output panel j
// pairs gate panel j with up panel j + I/64), alpha = 1, beta = 0 and no bias.
enum class GemmActivation : uint8_t { kNone, kSwiglu };

struct GemmParams {
  TensorView a;                 // [M, K] f32 | bf16; unit column stride, row stride >= K
  TensorView b;                 // [N, K] (or [K, N] if b_kn) f32 | bf16 | i8; empty if packed_b
  const PackedMatrix* packed_b = nullptr;  // pre-packed B; nullptr to use b
  TensorView b_scales;          // [N] f32, for an unpacked i8 b only; else empty
  TensorView bias;              // [N] f32 | bf16; may be empty
  TensorView c;                 // [M, N] f32 | bf16; unit column stride, row stride >= N;
                                // must not overlap a, b, bias or the workspace (C is
                                // written while A and B are still being read)
  float alpha = 1.0f;
  float beta = 0.0f;            // beta == 0: C is not read (NaN/garbage in C is ignored)
  bool b_kn = false;            // b is laid out [K, N]
  GemmActivation activation = GemmActivation::kNone;
};

// Bytes of workspace gemm() needs for these params at the current thread count
// (num_threads(): query it where the call will run — inside a parallel region that cannot
// fork, that is one thread). Only shapes, dtypes, strides and flags decide it: data
// pointers may still be null (size the workspace before the activations exist). 0 when
// the params are invalid.
size_t gemm_workspace_size(const GemmParams& p);
Status gemm(const GemmParams& p, Workspace ws);

}  // namespace optx
