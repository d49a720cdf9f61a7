// GEMM: every implementation the host can run (capped by OPTX_MAX_ISA) against the
// double-precision definition, on edge shapes; bad inputs -> Status naming the argument.
#include <gtest/gtest.h>
#include <xmmintrin.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <array>
#include <tuple>
#include <limits>

#include "ops/gemm/gemm_kernels.h"
#include "ops/gemm/gemm_testutil.h"
#include "testing/alloc_count.h"

namespace optx::gemm_detail {
namespace {

using testutil::Bias;
using testutil::Case;

std::vector<Case> edge_cases() {
  std::vector<Case> cs;
  const DType combos[][3] = {
      {DType::kF32, DType::kF32, DType::kF32},   {DType::kF32, DType::kF32, DType::kBF16},
      {DType::kBF16, DType::kBF16, DType::kF32}, {DType::kBF16, DType::kBF16, DType::kBF16},
      {DType::kF32, DType::kBF16, DType::kF32},  {DType::kF32, DType::kI8, DType::kF32},
      {DType::kBF16, DType::kI8, DType::kBF16},  {DType::kF32, DType::kI8, DType::kBF16},
      {DType::kBF16, DType::kI8, DType::kF32},   {DType::kF32, DType::kBF16, DType::kBF16},
  };
  const int64_t dims[] = {1, 7, 17, 113};
  for (const auto& t : combos)
    for (int64_t M : dims)
      for (int64_t N : dims)
        for (int64_t K : dims) {
          if (M * N * K > 113 * 113 * 17) continue;  // keep the double reference fast
          Case c;
          c.M = M, c.N = N, c.K = K;
          c.a = t[0], c.b = t[1], c.c = t[2];
          // Vary the remaining knobs deterministically so every combination meets each.
          const int64_t h = M * 31 + N * 7 + K;
          c.packed = h % 2 == 0;
          c.b_kn = h % 3 == 0;
          c.lda_pad = h % 5 == 0 ? 3 : 0;
          c.ldc_pad = h % 7 == 0 ? 5 : 0;
          c.beta = h % 4 == 1 ? 0.5f : 0.0f;
          c.alpha = h % 6 == 1 ? -1.5f : 1.0f;
          c.bias = h % 3 == 1 ? Bias::kF32 : (h % 5 == 2 ? Bias::kBF16 : Bias::kNone);
          // f32 weights in both packed layouts (and whichever kAuto picks) on every kernel.
          if (c.b == DType::kF32) c.layout = PackLayout(h % 3);
          cs.push_back(c);
        }
  // Sizes at and around tile edges, the 1023 cases from the spec, a K of two AMX K blocks
  // (2048 + a tail: the second block accumulates onto the first), and packed rows in one
  // chunk over enough panels to split N (72 x 520: 32- and 16-row AMX blocks per thread).
  for (auto [M, N, K] : {std::tuple{1023, 7, 17}, {7, 1023, 17}, {17, 7, 1023}, {2, 65, 300}, {6, 64, 256},
                         {12, 128, 257}, {200, 130, 129}, {16, 200, 513}, {17, 64, 1}, {130, 3, 40}, {1, 520, 33},
                         {36, 70, int(kAmxKc) + 52}, {10, 70, 300}, {8, 130, 513}, {72, 520, 300}}) {
    for (const auto& t : combos) {
      Case c;
      c.M = M, c.N = N, c.K = K;
      c.a = t[0], c.b = t[1], c.c = t[2];
      c.beta = M % 2 ? 0.0f : -1.0f;
      c.bias = Bias::kF32;
      c.lda_pad = 1;
      c.packed = (M + K) % 2 == 0;
      if (c.b == DType::kF32) c.layout = PackLayout((M + N) % 3);
      cs.push_back(c);
    }
  }
  // f32 weights packed as strips (K blocks of kStripKc, the last one short): decode rows
  // (no gemv4 on strips), one slice, a slice plus a remainder, several row chunks; K
  // below, at and past a block; N tails; beta and bias (the epilogue), identity C, and
  // panels for comparison.
  for (auto [M, N, K] : {std::tuple{1, 200, 600}, {3, 64, 256}, {6, 70, 257}, {7, 130, 40}, {13, 65, 513},
                         {200, 100, 300}})
    for (PackLayout layout : {PackLayout::kStrips, PackLayout::kPanels})
      for (bool identity : {false, true}) {
        Case c;
        c.M = M, c.N = N, c.K = K;
        c.layout = layout;
        c.c = identity || M % 2 ? DType::kF32 : DType::kBF16;
        if (!identity) {
          c.beta = 0.5f;
          c.bias = Bias::kF32;
          c.ldc_pad = 2;
        }
        cs.push_back(c);
      }
  // Decode rows on packed bf16 / int8 weights (two to six rows: the paths that stream a
  // panel in 4 KiB / 2 KiB pieces, each piece's passes reading it from L1): K within one
  // piece, across many with an odd tail, and N with a tail panel; bf16 and f32 A, beta.
  for (int64_t M = 2; M <= 6; ++M)
    for (int64_t K : {int64_t(20), int64_t(301)})
      for (DType bt : {DType::kBF16, DType::kI8}) {
        Case c;
        c.M = M, c.N = M % 2 ? 130 : 192, c.K = K;
        c.a = M % 2 ? DType::kBF16 : DType::kF32, c.b = bt, c.c = DType::kF32;
        c.beta = K > 100 ? 0.5f : 0.0f;
        c.lda_pad = M % 3;
        cs.push_back(c);
      }
  // Row slices of the strip path, as even as kMR allows (8 = 4 + 4, 13 = 5 + 4 + 4, 20 =
  // 5 x 4, ...): packed bf16, int8 and f32 strips, K over two blocks, identity C or beta
  // and bias, so every slice height writes its own rows of the tile and of C.
  for (int64_t M : {8, 9, 13, 14, 19, 20, 23})
    for (DType bt : {DType::kBF16, DType::kI8, DType::kF32}) {
      Case c;
      c.M = M, c.N = 130, c.K = int64_t(kStripKc) + 44;
      c.a = M % 2 && bt != DType::kF32 ? DType::kBF16 : DType::kF32, c.b = bt, c.c = DType::kF32;
      if (bt == DType::kF32) c.layout = PackLayout::kStrips;
      if (M % 3) {
        c.beta = 0.5f;
        c.bias = Bias::kF32;
        c.ldc_pad = 3;
      }
      c.lda_pad = M % 2;
      cs.push_back(c);
    }
  // bf16 x bf16 on packed weights past the dot-product kernel's K block (kDpKc = 2048):
  // the second block accumulates onto the first; identity C (the last block stores into
  // C, an edge panel through the epilogue), strided C, and beta for comparison.
  for (auto [M, N, K] : {std::tuple{13, 130, 2048 + 40}, {6, 64, 2 * 2048 + 1}})
    for (bool identity : {true, false}) {
      Case c;
      c.M = M, c.N = N, c.K = K;
      c.a = DType::kBF16, c.b = DType::kBF16, c.c = DType::kF32;
      c.ldc_pad = identity ? 3 : 0;
      if (!identity) c.beta = 0.5f;
      cs.push_back(c);
    }
  // Unpacked B in row slices that share K blocks (strips): packed straight into f32 strips
  // from [N, K] (8 x 8 transposes, K and N tails) and [K, N] (row copies) f32 and bf16.
  for (auto [M, N, K] : {std::tuple{24, 128, 40}, {13, 100, 300}, {30, 64, 9}})
    for (bool kn : {false, true})
      for (DType bt : {DType::kF32, DType::kBF16}) {
        Case c;
        c.M = M, c.N = N, c.K = K;
        c.a = DType::kF32, c.b = bt, c.c = DType::kF32;
        c.packed = false;
        c.b_kn = kn;
        c.beta = 0.5f;
        cs.push_back(c);
      }
  // Unpacked B packed a chunk of K blocks at a time (256 KiB of a panel: 2048 bf16 K rows,
  // 1024 f32 ones at kc = 128), K past two chunks with an odd tail; rows that fit one
  // chunk split N over the threads (40 rows over 9 panels), and so do rows past the L2
  // budget's chunk (200 > 192 rows: kUnpackedOneChunk), with beta and bias.
  for (auto [M, N, K] : {std::tuple{17, 130, 2 * 2048 + 37}, {40, 520, 1024 + 129}, {200, 520, 129}})
    for (bool kn : {false, true})
      for (DType bt : {DType::kF32, DType::kBF16}) {
        Case c;
        c.M = M, c.N = N, c.K = K;
        c.a = bt, c.b = bt, c.c = DType::kF32;
        c.packed = false;
        c.b_kn = kn;
        c.lda_pad = 1;
        if (kn) {
          c.beta = 0.5f;
          c.bias = Bias::kF32;
        }
        cs.push_back(c);
      }
  // Decode against unpacked weights (up to 8 rows; 9 leave the streaming paths, and bf16 A
  // with bf16 [N, K] B from 7 rows on AMX hosts where K is not a multiple of 32:
  // kGemvRowsAmx; K a multiple of 32 below), strided A,
  // beta, bias, f32 / bf16 (bf16 A with bf16 B), bf16 C:
  //   [N, K] (KernelTable::gemv_rows): every row count and its B-row grouping, K below and
  //          past a vector with a tail, N past a panel with a tail;
  //   [K, N] (KernelTable::gemv_kn): every row count and its tile width, N within one
  //          8-column vector, past a panel with a vector and a scalar tail, and past one
  //          thread's column group (2048) into a third group; K within one 16-row block,
  //          several with a tail; B rows padded (decode's V slices).
  for (bool kn : {false, true})
    for (int64_t M = 1; M <= 9; ++M)
      for (DType at : {DType::kF32, DType::kBF16})
        for (DType bt : {DType::kF32, DType::kBF16}) {
          if (at == DType::kBF16 && bt == DType::kF32) continue;  // not a supported pairing
          Case c;
          c.M = M;
          if (kn) c.N = M == 3 ? 4200 : M % 3 == 0 ? 5 : M % 2 ? 70 : 131, c.K = M % 4 == 0 ? 16 : 8 * M + 5;
          else c.N = M % 2 ? 70 : 131, c.K = M % 3 == 0 ? 5 : 8 * M + 3;
          c.a = at, c.b = bt, c.c = at;
          c.packed = false;
          c.b_kn = kn;
          c.lda_pad = M % 2;
          c.ldb_pad = kn && M % 2 == 0 ? 7 * M : 0;
          c.ldc_pad = M % 3;
          c.alpha = M % 4 ? 1.0f : 0.5f;
          c.beta = M % 2 ? 0.0f : 0.75f;
          c.bias = M % 3 == 1 ? Bias::kF32 : M % 3 == 2 ? Bias::kBF16 : Bias::kNone;
          cs.push_back(c);
        }
  // bf16 [N, K] decode with K a multiple of 32, which the AMX unit runs on the tiles
  // against A^T pairs (gemv_rows_tiles) up to kGemvTileRowsM = 128 rows (129: the blocked
  // path): row counts within and across the 16-row C^T tiles (one to four of them, the
  // last cut short) and across the 64-row passes, 16-row groups of B whole and cut short
  // (N = 70: a 6-row last group; 131: 3), A in place and strided; the other units' row
  // kernels take up to 8.
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 32, 33, 48, 63, 64, 65, 80, 97, 127, 128, 129}) {
    Case c;
    c.M = M, c.N = M % 2 ? 70 : 131, c.K = 32 * (M % 5 + 1);
    c.a = c.b = c.c = DType::kBF16;
    c.packed = false;
    c.lda_pad = M % 2 ? 3 : 0;
    c.ldc_pad = M % 3;
    c.alpha = M % 4 ? 1.0f : 0.5f;
    c.beta = M % 2 ? 0.0f : 0.75f;
    c.bias = M % 3 == 1 ? Bias::kF32 : M % 3 == 2 ? Bias::kBF16 : Bias::kNone;
    cs.push_back(c);
  }
  // [N, K] decode from 4 rows with A's rows a multiple of 1 KiB apart, which the row
  // kernels read from a copy at a skewed stride (gemv_a_stride): K a multiple of 1 KiB of
  // elements, or short of it with a tail, A's row padding past K not copied.
  for (int64_t M : {4, 5, 7, 8})
    for (DType at : {DType::kF32, DType::kBF16})
      for (DType bt : {DType::kF32, DType::kBF16}) {
        if (at == DType::kBF16 && bt == DType::kF32) continue;
        const int64_t row = 1024 / int64_t(dtype_size(at));  // elements per KiB
        Case c;
        c.M = M, c.N = 131;
        c.K = M % 2 ? row - 6 : 2 * row;
        c.lda_pad = M % 2 ? 6 : 0;
        c.a = at, c.b = bt, c.c = DType::kF32;
        c.packed = false;
        c.beta = M == 5 ? 0.5f : 0.0f;
        cs.push_back(c);
      }
  // The identity epilogue (alpha 1, beta 0, no bias) over several K blocks: the last
  // block's tile goes straight into C, onto the blocks accumulated before it; f32, and
  // bf16 x bf16 into a bf16 C (the dot-product kernel rounds its tile itself; packed
  // K = 2100 is two of its K blocks).
  for (auto [M, N, K] : {std::tuple{17, 128, 300}, {200, 130, 129}, {36, 70, int(kAmxKc) + 52}})
    for (bool packed : {false, true})
      for (DType t : {DType::kF32, DType::kBF16}) {
        Case c;
        c.M = M, c.N = N, c.K = K;
        c.a = c.b = c.c = t;
        c.packed = packed;
        c.ldc_pad = packed ? 3 : 0;
        cs.push_back(c);
      }
  // Fused SwiGLU: decode pairs (gemv4 takes two outputs per call, I = 192 leaves one
  // over), vector and AMX row blocks (M > 16, M > 32), K tails, padded C rows.
  for (auto [M, I, K] : {std::tuple{1, 64, 17}, {1, 192, 100}, {2, 192, 301}, {3, 128, 64}, {6, 128, 301}, {7, 64, 1}, {17, 128, 33},
                         {40, 192, 64}, {70, 64, 129}}) {
    for (const auto& t : combos) {
      Case c;
      c.M = M, c.N = 2 * I, c.K = K;
      c.a = t[0], c.b = t[1], c.c = t[2];
      c.swiglu = true;
      c.lda_pad = M % 2;
      c.ldc_pad = M % 3 ? 5 : 0;
      cs.push_back(c);
      if (c.b == DType::kF32) {
        c.layout = PackLayout::kStrips;
        c.K = K + int64_t(kStripKc);  // two K blocks
        cs.push_back(c);
      }
    }
  }
  return cs;
}

TEST(Gemm, EveryImplementationMatchesReference) {
  const auto cases = edge_cases();
  for (const auto* impl : registry().runnable()) {
    int failures = 0;
    for (const Case& c : cases) {
      const auto out = testutil::run_case(*impl, c);
      ASSERT_TRUE(out.status.ok()) << impl->name << " " << c.name() << ": " << out.status.message();
      EXPECT_TRUE(out.cmp.pass) << impl->name << " " << c.name() << ": " << out.cmp.message;
      if (!out.cmp.pass && ++failures > 5) FAIL() << "too many failures for " << impl->name;
    }
  }
}

// A bf16 C holds the f32 C of the same call rounded to nearest even, bit for bit (zeros of
// either sign alike): the C dtype changes only the last rounding, whether the epilogue
// does it or the dot-product kernel stores its tile straight into C. Row counts for the
// decode paths, one and several row slices and chunks; packed and unpacked B; K over one
// and two dot-product K blocks; a panel tail.
TEST(Gemm, Bf16COfACallIsItsF32CRounded) {
  for (const auto* impl : registry().runnable())
    for (auto [M, N, K] : {std::tuple{3, 130, 40}, {13, 192, 2100}, {40, 130, 300}, {300, 64, 77}})
      for (bool packed : {false, true}) {
        testing::Rng rng(uint64_t(M * 7 + K));
        std::vector<uint16_t> a(size_t(M * K)), b(size_t(N * K)), c16(size_t(M * N));
        std::vector<float> c32(size_t(M * N));
        testing::fill_bf16(a.data(), M * K, rng);
        testing::fill_bf16(b.data(), N * K, rng);
        PackedWeights pw;
        if (packed) {
          ASSERT_TRUE(pack_weights({.w = make_view(b.data(), DType::kBF16, {N, K})}, &pw).ok());
        }
        auto call = [&](void* c, DType ct) {
          GemmParams p{.a = make_view(a.data(), DType::kBF16, {M, K}), .c = make_view(c, ct, {M, N})};
          if (packed) p.packed_b = &pw[0];
          else p.b = make_view(b.data(), DType::kBF16, {N, K});
          std::vector<uint8_t> ws(gemm_workspace_size(p));
          return run_impl(*impl, p, {ws.data(), ws.size()});
        };
        ASSERT_TRUE(call(c32.data(), DType::kF32).ok());
        ASSERT_TRUE(call(c16.data(), DType::kBF16).ok());
        int bad = 0;
        for (size_t i = 0; i < c16.size() && bad < 5; ++i) {
          const uint16_t want = f32_to_bf16(c32[i]);
          if (c16[i] != want && ((c16[i] | want) & 0x7fff) != 0)
            ++bad, ADD_FAILURE() << impl->name << " M=" << M << " N=" << N << " K=" << K << " packed=" << packed << " element " << i
                                 << ": " << std::hex << c16[i] << " vs " << want;
        }
      }
}

TEST(Gemm, ZeroSizedDimensions) {
  for (const auto* impl : registry().runnable()) {
    // K = 0 must still zero the accumulator tile (the workspace starts as NaN), for every
    // weight dtype, bf16 A with bf16 B (the AMX plan, from kAmxMinRows rows; also with
    // SwiGLU), one and several row slices, packed and unpacked B in both layouts (the
    // unpacked decode paths too).
    for (auto [M, N, K] : {std::tuple{0, 5, 3}, {4, 0, 3}, {4, 5, 0}, {13, 70, 0}, {40, 128, 0}, {0, 0, 0}})
      for (DType bt : {DType::kF32, DType::kBF16, DType::kI8})
        for (DType at : {DType::kF32, DType::kBF16})
          for (bool swiglu : {false, true})
            for (int layout = 0; layout < 3; ++layout) {  // packed, unpacked [N, K], unpacked [K, N]
              if ((at == DType::kBF16 && bt == DType::kF32) || (swiglu && (at != DType::kBF16 || bt != DType::kBF16 || N % 128 || layout != 0)))
                continue;
              Case c;
              c.M = M, c.N = N, c.K = K;
              c.packed = layout == 0;
              c.b_kn = layout == 2;
              c.a = at;
              c.b = bt;
              c.swiglu = swiglu;
              c.bias = swiglu ? Bias::kNone : Bias::kF32;
              c.beta = swiglu ? 0.0f : 0.25f;
              const auto out = testutil::run_case(*impl, c);
              ASSERT_TRUE(out.status.ok()) << impl->name << " " << c.name() << ": " << out.status.message();
              EXPECT_TRUE(out.cmp.pass) << impl->name << " " << c.name() << ": " << out.cmp.message;
            }
  }
}

TEST(Gemm, NonFiniteInputsPropagate) {
  // NaN in A must reach exactly the rows that use it, Inf must keep its sign.
  for (const auto* impl : registry().runnable()) {
    const int64_t M = 3, N = 70, K = 9;
    std::vector<float> a(M * K, 1.0f), b(N * K, 0.5f), c(M * N, 0.0f);
    a[1 * K + 4] = std::numeric_limits<float>::quiet_NaN();
    a[2 * K + 2] = std::numeric_limits<float>::infinity();
    GemmParams p{.a = make_view(a.data(), DType::kF32, {M, K}),
                 .b = make_view(b.data(), DType::kF32, {N, K}),
                 .c = make_view(c.data(), DType::kF32, {M, N})};
    std::vector<uint8_t> ws(gemm_workspace_size(p));
    ASSERT_TRUE(run_impl(*impl, p, {ws.data(), ws.size()}).ok());
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_FLOAT_EQ(c[n], 4.5f) << impl->name;
      EXPECT_TRUE(std::isnan(c[N + n])) << impl->name;
      EXPECT_TRUE(std::isinf(c[2 * N + n]) && c[2 * N + n] > 0) << impl->name;
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
// bf16 weights count denormals as zero in every optimised implementation: vdpbf16ps and
// AMX do so by definition, and the widened-FMA kernels run with MXCSR DAZ / FTZ to agree
// with them (and to avoid a microcode assist per denormal input). A weight of 2^-130 times
// an activation of 2^100 would be 2^-30 per term if kept, so C must be exactly 0 there; one
// normal weight row shows the rest of the call computed. The caller's MXCSR modes (rounding,
// DAZ / FTZ, exception masks) must be back after the call, on one and two threads, through
// the streaming GEMV (unpacked, few rows), the pack-once path and the blocked kernels.
TEST(Gemm, Bf16DenormalWeightsCountAsZeroAndTheCallersMxcsr) {
  const int64_t N = 130, K = 70, live = 5;  // B row `live` holds 1.0
  const unsigned modes = 0xffc0u;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto* impl : registry().runnable()) {
      if (std::string(impl->name) == "reference") continue;  // the definition: IEEE arithmetic
      for (int64_t M : {1, 2, 3, 7, 16})
        for (int layout = 0; layout < 3; ++layout)  // packed, unpacked [N, K], unpacked [K, N]
          for (DType at : {DType::kF32, DType::kBF16}) {
            std::vector<uint16_t> b(size_t(N * K), 0x0008);  // 8 * 2^-133 = 2^-130, a bf16 denormal
            for (int64_t k = 0; k < K; ++k) b[size_t(layout == 2 ? k * N + live : live * K + k)] = 0x3f80;
            std::vector<float> af(size_t(M * K), 0x1p100f);
            std::vector<uint16_t> ab(size_t(M * K), 0x7180);  // 2^100
            std::vector<float> c(size_t(M * N), std::numeric_limits<float>::quiet_NaN());
            PackedWeights pw;
            GemmParams p{.a = at == DType::kF32 ? make_view(af.data(), at, {M, K}) : make_view(ab.data(), at, {M, K}),
                         .c = make_view(c.data(), DType::kF32, {M, N})};
            if (layout == 0) {
              ASSERT_TRUE(pack_weights({.w = make_view(b.data(), DType::kBF16, {N, K})}, &pw).ok());
              p.packed_b = &pw[0];
            } else {
              p.b = layout == 1 ? make_view(b.data(), DType::kBF16, {N, K}) : make_view(b.data(), DType::kBF16, {K, N});
              p.b_kn = layout == 2;
            }
            std::vector<uint8_t> ws(gemm_workspace_size(p) + 64);
            const unsigned before = _mm_getcsr() & modes;
            ASSERT_TRUE(run_impl(*impl, p, {ws.data(), ws.size()}).ok()) << impl->name;
            EXPECT_EQ(_mm_getcsr() & modes, before) << impl->name << " M=" << M << " layout " << layout;
            int wrong = 0;
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n)
                wrong += c[size_t(m * N + n)] != (n == live ? float(K) * 0x1p100f : 0.0f);
            EXPECT_EQ(wrong, 0) << impl->name << " threads=" << threads << " M=" << M << " layout " << layout << " a "
                                << dtype_name(at) << ": C[0][0]=" << c[0];
          }
    }
  }
  set_num_threads(0);
}
#endif

// Decode shapes (M <= 6) claim panels from a shared cursor, so which thread computes a
// panel changes from call to call; the results must not. Row chunks follow the thread
// count, so a larger M's last chunk (M = 17: 12 + 5 rows at two threads) and its slices
// of 1-3 rows must sum K in the order the other chunks do (an API fuzzer found both
// apart by an ulp on the AVX2 unit, bf16; the gemm_max_isa_avx2 test runs this there).
class GemmThreads : public ::testing::TestWithParam<std::array<int64_t, 3>> {
 protected:
  const int64_t M = GetParam()[0], N = GetParam()[1], K = GetParam()[2];
};
INSTANTIATE_TEST_SUITE_P(Shapes, GemmThreads,  // decode-sized M over many panels; then row chunks
                         ::testing::Values(std::array<int64_t, 3>{150, 300, 333}, std::array<int64_t, 3>{1, 1100, 333},
                                           std::array<int64_t, 3>{2, 1100, 333}, std::array<int64_t, 3>{3, 1100, 333},
                                           std::array<int64_t, 3>{5, 1100, 333}, std::array<int64_t, 3>{12, 1100, 333},
                                           std::array<int64_t, 3>{17, 200, 16}, std::array<int64_t, 3>{37, 64, 72}));

TEST_P(GemmThreads, DeterministicAndThreadCountIndependentOnSelectedIsa) {
  testing::Rng rng(7);
  std::vector<uint16_t> a(M * K), b(N * K);
  testing::fill_bf16(a.data(), M * K, rng);
  testing::fill_bf16(b.data(), N * K, rng);
  std::vector<float> af(M * K), bf(N * K);
  for (int64_t i = 0; i < M * K; ++i) af[i] = bf16_to_f32(a[i]);
  for (int64_t i = 0; i < N * K; ++i) bf[i] = bf16_to_f32(b[i]);
  std::vector<int8_t> q(N * K);
  std::vector<float> scales(N);
  testing::fill_i8(q.data(), N * K, rng);
  testing::fill_f32(scales.data(), N, rng, 0.001f, 0.01f);
  // bf16 weights, f32 weights in the strip layout (two K blocks), and int8 weights with
  // bf16 A (the dot-product path from kI8DpMinRows rows, whose chunks also change with T).
  for (DType dt : {DType::kBF16, DType::kF32, DType::kI8}) {
    PackedWeights pw;
    const void* w = dt == DType::kBF16 ? static_cast<const void*>(b.data()) : dt == DType::kI8 ? static_cast<const void*>(q.data()) : bf.data();
    const PackLayout layout = dt == DType::kF32 ? PackLayout::kStrips : PackLayout::kAuto;
    ASSERT_TRUE(pack_weights({.w = make_view(const_cast<void*>(w), dt, {N, K}),
                              .scales = dt == DType::kI8 ? make_view(scales.data(), DType::kF32, {N}) : TensorView{}, .layout = layout},
                             &pw)
                    .ok());
    auto run = [&](int threads) {
      set_num_threads(threads);
      std::vector<float> c(M * N);
      GemmParams p{.a = dt == DType::kF32 ? make_view(af.data(), dt, {M, K}) : make_view(a.data(), DType::kBF16, {M, K}),
                   .packed_b = &pw[0],
                   .c = make_view(c.data(), DType::kF32, {M, N})};
      std::vector<uint8_t> ws(gemm_workspace_size(p));
      EXPECT_TRUE(gemm(p, {ws.data(), ws.size()}).ok());
      return c;
    };
    const auto c1 = run(1), c2 = run(2), c2b = run(2), c3 = run(3), c3b = run(3);
    set_num_threads(0);
    EXPECT_EQ(c3, c3b) << dtype_name(dt);
    EXPECT_EQ(c2, c2b) << dtype_name(dt);
    EXPECT_EQ(c1, c2) << dtype_name(dt);
    EXPECT_EQ(c1, c3) << dtype_name(dt);
  }
}

// An engine may call ops from several threads at once: from the threads of its own
// parallel region (one request per thread), or from threads of its own. Such a region
// cannot fork another team (nesting is off by default), so a GEMM that planned fixed
// per-thread shares of C for two threads left one share unwritten (M = 12 split N that
// way). The op must run whole on the calling thread: num_threads() is 1 there, and a team
// smaller than planned (ThreadScope(3) below) takes every share in turn.
TEST_P(GemmThreads, ConcurrentCallersAndCallsFromAParallelRegion) {
  testing::Rng rng(11);
  std::vector<float> a(M * K), b(N * K);
  testing::fill_f32(a.data(), M * K, rng);
  testing::fill_f32(b.data(), N * K, rng);
  auto call = [&](std::vector<float>& c) {
    c.assign(M * N, std::numeric_limits<float>::quiet_NaN());
    GemmParams p{.a = make_view(a.data(), DType::kF32, {M, K}), .b = make_view(b.data(), DType::kF32, {N, K}),
                 .c = make_view(c.data(), DType::kF32, {M, N})};
    std::vector<uint8_t> ws(gemm_workspace_size(p));
    return gemm(p, {ws.data(), ws.size()}).ok();
  };
  set_num_threads(2);
  std::vector<float> want;
  ASSERT_TRUE(call(want));
  for (int scope : {0, 3}) {
    std::vector<float> got[2];
    bool ok[2] = {false, false};
#pragma omp parallel num_threads(2)
    {
      const int t = omp_get_thread_num();
      ThreadScope threads(scope);
      ok[t] = call(got[t]);
    }
    for (int t = 0; t < 2; ++t) {
      EXPECT_TRUE(ok[t]) << "scope " << scope;
      EXPECT_EQ(got[t], want) << "thread " << t << ", ThreadScope(" << scope << ")";
    }
  }
  // And from plain user threads, each call forking its own team of two.
  std::vector<float> got[3];
  bool ok[3] = {false, false, false};
  {
    std::vector<std::thread> users;
    for (int t = 0; t < 3; ++t) users.emplace_back([&, t] { ok[t] = call(got[t]); });
    for (auto& u : users) u.join();
  }
  for (int t = 0; t < 3; ++t) {
    EXPECT_TRUE(ok[t]);
    EXPECT_EQ(got[t], want) << "user thread " << t;
  }
}

// No heap allocation inside a call (DESIGN.md) on the decode, strip, pack-once and
// unpacked paths, one and two threads, after a first call (pack_weights, at load time,
// may allocate).
TEST(Gemm, NoHeapAllocationInsideACall) {
  const int64_t N = 192, K = 320;
  std::vector<uint16_t> wb(N * K, 0x3c00), ab(300 * K, 0x3c00);
  std::vector<float> wf(N * K, 0.5f), af(300 * K, 0.25f), c(300 * N);
  PackedWeights pb;
  ASSERT_TRUE(pack_weights({.w = make_view(wb.data(), DType::kBF16, {N, K})}, &pb).ok());
  std::vector<uint8_t> ws(64 << 20);
  auto calls = [&] {
    Status st = Status::Ok();
    for (int64_t M : {1, 4, 12, 300}) {
      if (st.ok())
        st = gemm({.a = make_view(ab.data(), DType::kBF16, {M, K}), .packed_b = &pb[0], .c = make_view(c.data(), DType::kF32, {M, N})},
                  {ws.data(), ws.size()});
      if (st.ok())
        st = gemm({.a = make_view(af.data(), DType::kF32, {M, K}), .b = make_view(wf.data(), DType::kF32, {N, K}),
                   .c = make_view(c.data(), DType::kF32, {M, N})},
                  {ws.data(), ws.size()});
    }
    return st;
  };
  testing::expect_no_heap_allocation(calls, "gemm");
}

// Grouped GEMM sizes one workspace for all its groups from the largest M, which is only
// valid if the workspace never shrinks as M grows (at any thread count, any dtype).
TEST(Gemm, WorkspaceGrowsMonotonicallyWithM) {
  for (int threads : {1, 2, 3})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{128, 37}, {128, 2048}, {520, 37}, {520, 2048}}) {
        // 520 columns (9 panels): unpacked B splits them over the threads up to three L2
        // chunks of rows (kUnpackedOneChunk), then packs once.
        set_num_threads(threads);
        std::vector<uint8_t> b(size_t(N * K) * dtype_size(dt));
        PackedWeights pw;
        ASSERT_TRUE(pack_weights({.w = make_view(b.data(), dt, {N, K})}, &pw).ok());
        // Packed, and unpacked (which switches to packing B once as the row chunks grow).
        for (bool packed : {true, false}) {
          size_t prev = 0;
          for (int64_t M = 1; M <= 1100; ++M) {
            GemmParams p{.a = make_view(b.data(), dt, {M, K}), .c = make_view(b.data(), DType::kF32, {M, N})};
            if (packed) p.packed_b = &pw[0];
            else p.b = make_view(b.data(), dt, {N, K});
            const size_t ws = gemm_workspace_size(p);
            ASSERT_GE(ws, prev) << dtype_name(dt) << " N=" << N << " K=" << K << " threads=" << threads << " M=" << M << " packed=" << packed;
            // The size is a function of the shapes alone: the same without any data.
            GemmParams shapes = p;
            shapes.a.data = shapes.c.data = shapes.b.data = nullptr;
            ASSERT_EQ(gemm_workspace_size(shapes), ws) << "M=" << M;
            prev = ws;
          }
        }
      }
  set_num_threads(0);
}

// The strip layout holds the same matrix: element (n, k) read back through at() in both
// layouts, and the raw bytes where the layout puts them (K block, strip, row, column).
TEST(Gemm, StripLayoutPacksTheSameMatrix) {
  const int64_t N = 70, K = int64_t(kStripKc) + 45;
  testing::Rng rng(5);
  std::vector<float> w(N * K);
  testing::fill_f32(w.data(), N * K, rng);
  PackedWeights strips, panels, automatic;
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kF32, {N, K}), .layout = PackLayout::kStrips}, &strips).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kF32, {N, K}), .layout = PackLayout::kPanels}, &panels).ok());
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kF32, {N, K})}, &automatic).ok());
  EXPECT_EQ(strips[0].strip_kc, kStripKc);
  EXPECT_EQ(panels[0].strip_kc, 0);
  EXPECT_EQ(strips[0].panel_bytes, panels[0].panel_bytes);
  // kAuto: strips exactly when the selected implementation runs strip kernels (AVX2).
  EXPECT_EQ(automatic[0].strip_kc, selected_impl("gemm") == "avx2" ? kStripKc : 0) << selected_impl("gemm");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      ASSERT_EQ(strips[0].at(n, k), w[n * K + k]) << n << " " << k;
      ASSERT_EQ(panels[0].at(n, k), w[n * K + k]) << n << " " << k;
    }
  // Panel 1, second (short) K block, strip 0, row 3, column 5: weight row 64 + 5.
  const int64_t kcur = K - kStripKc;
  const float* p1 = reinterpret_cast<const float*>(strips[0].panel(1));
  EXPECT_EQ(p1[kStripKc * 64 + 0 * kcur * 16 + 3 * 16 + 5], w[69 * K + kStripKc + 3]);
  EXPECT_EQ(p1[kStripKc * 64 + 0 * kcur * 16 + 3 * 16 + 6], 0.0f);  // past N
  // Other dtypes have no strip layout.
  std::vector<uint16_t> b(N * K);
  const Status st = pack_weights({.w = make_view(b.data(), DType::kBF16, {N, K}), .layout = PackLayout::kStrips}, &panels);
  EXPECT_EQ(st.message(), "pack_weights: layout=strips needs f32 weights, got w.dtype=bf16");
}

// The selected kernels' vector packer for unpacked bf16 and f32 B
// (KernelTable::pack_panel_fast) writes the bytes of pack_panel's element loop: both
// layouts, padded rows, N and K tails, odd K, whole K padded past B (pack_weights) and a K
// block from the middle (the blocked driver); every panel byte is compared, over buffers
// poisoned differently. Other dtypes are declined.
TEST(Gemm, VectorPanelPackerMatchesTheElementLoop) {
  const KernelTable* kt = selected_table();
  if (!kt || !kt->pack_panel_fast) GTEST_SKIP() << "no vector panel packer in " << selected_impl("gemm");
  testing::Rng rng(9);
  for (DType dt : {DType::kBF16, DType::kF32})
    for (bool kn : {false, true})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{70, 37}, {64, 16}, {13, 1}, {131, 100}, {200, 64}})
        for (int64_t pad : {0, 3}) {
          const int64_t rows = kn ? K : N, cols = kn ? N : K, ld = cols + pad;
          const size_t es = dtype_size(dt);
          std::vector<uint8_t> w(size_t(rows * ld) * es);
          if (dt == DType::kBF16) testing::fill_bf16(reinterpret_cast<uint16_t*>(w.data()), rows * ld, rng);
          else testing::fill_f32(reinterpret_cast<float*>(w.data()), rows * ld, rng);
          const TensorView b = make_view(w.data(), dt, {rows, cols}, {ld, 1});
          std::vector<std::pair<int64_t, int64_t>> blocks = {{0, (K + 31) / 32 * 32}};
          if (K > 32) blocks.push_back({16, 16});
          for (auto [k0, kc] : blocks)
            for (int64_t j = 0; j < (N + kNR - 1) / kNR; ++j) {
              const size_t n = size_t((dt == DType::kBF16 ? (kc + 1) / 2 * 2 : kc) * kNR) * es;
              std::vector<uint8_t> fast(n, 0x12), slow(n, 0x43);
              ASSERT_TRUE(kt->pack_panel_fast(b, kn, j, k0, kc, fast.data()));
              pack_panel(b, kn, j, k0, kc, slow.data());
              ASSERT_EQ(fast, slow) << dtype_name(dt) << " kn=" << kn << " N=" << N << " K=" << K << " pad=" << pad << " k0=" << k0
                                    << " j=" << j;
            }
        }
  std::vector<int8_t> q(64 * 16);
  std::vector<uint8_t> dst(64 * 16);
  EXPECT_FALSE(kt->pack_panel_fast(make_view(q.data(), DType::kI8, {64, 16}), false, 0, 0, 16, dst.data()));
  std::vector<float> f(64 * 32);
  EXPECT_FALSE(kt->pack_panel_fast(make_view(f.data(), DType::kF32, {64, 16}, {32, 2}), false, 0, 0, 16, dst.data()));
}

TEST(Gemm, PackedGroupOfMatrices) {
  // [E, N, K] packs into E independent matrices, each equal to packing its slice alone.
  const int64_t E = 3, N = 70, K = 11;
  testing::Rng rng(3);
  std::vector<uint16_t> w(E * N * K);
  testing::fill_bf16(w.data(), E * N * K, rng);
  PackedWeights all;
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kBF16, {E, N, K})}, &all).ok());
  ASSERT_EQ(all.count(), E);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(all[e].at(n, k), bf16_to_f32(w[(e * N + n) * K + k])) << e << " " << n << " " << k;
}

// ---- bad inputs: a Status whose message names the argument, never a crash --------------
struct BadInput : ::testing::Test {
  std::vector<float> a = std::vector<float>(4 * 8, 1.0f), b = std::vector<float>(5 * 8, 1.0f),
                     c = std::vector<float>(4 * 5, 0.0f), bias = std::vector<float>(5, 0.0f);
  GemmParams good() {
    return {.a = make_view(a.data(), DType::kF32, {4, 8}),
            .b = make_view(b.data(), DType::kF32, {5, 8}),
            .c = make_view(c.data(), DType::kF32, {4, 5})};
  }
  void expect_error(const GemmParams& p, const std::string& needle) {
    std::vector<uint8_t> buf(1 << 20);
    const Status st = gemm(p, {buf.data(), buf.size()});
    ASSERT_FALSE(st.ok()) << "expected an error mentioning " << needle;
    EXPECT_NE(st.message().find("gemm"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  }
};

TEST_F(BadInput, NullData) {
  auto p = good();
  p.a.data = nullptr;
  expect_error(p, "a.data");
  p = good();
  p.c.data = nullptr;
  expect_error(p, "c.data");
}
// C is stored while other threads still read A, B and the workspace (which holds packed
// pieces of them): an overlap with any of them is an error naming both, not a result
// computed from half-overwritten inputs.
TEST_F(BadInput, COverlappingAnInputOrTheWorkspace) {
  std::vector<float> big(64 * 64, 1.0f);
  GemmParams p{.a = make_view(big.data(), DType::kF32, {8, 8}), .b = make_view(b.data(), DType::kF32, {5, 8}),
               .c = make_view(big.data() + 4, DType::kF32, {8, 5}, {8, 1})};
  expect_error(p, "c overlaps a");
  p.c = make_view(b.data(), DType::kF32, {8, 5});  // c over b's first rows
  p.a = make_view(big.data(), DType::kF32, {8, 8});
  expect_error(p, "c overlaps b");
  p = good();
  p.bias = make_view(c.data() + 3, DType::kF32, {5});
  expect_error(p, "c overlaps bias");
  // C inside the bytes the workspace query asks for; past them the caller's arena may hold C.
  GemmParams w{.a = make_view(big.data(), DType::kF32, {64, 64}), .b = make_view(big.data(), DType::kF32, {64, 64})};
  w.c = make_view(nullptr, DType::kF32, {64, 64});
  const size_t need = gemm_workspace_size(w);
  ASSERT_GT(need, 256u);
  std::vector<uint8_t> ws(need + 64 * 64 * sizeof(float) + 64);
  w.c = make_view(ws.data() + 256, DType::kF32, {64, 64});
  const Status st = gemm(w, {ws.data(), ws.size()});
  EXPECT_NE(st.message().find("gemm: c and workspace overlap"), std::string::npos) << st.message();
  w.c = make_view(ws.data() + need + 64 - (need % 64), DType::kF32, {64, 64});
  EXPECT_TRUE(gemm(w, {ws.data(), ws.size()}).ok());
  p = good();  // apart, and C read in place for beta != 0: fine
  p.beta = 1.0f;
  EXPECT_TRUE(gemm(p, {ws.data(), ws.size()}).ok());
}
TEST_F(BadInput, MismatchedK) {
  auto p = good();
  p.b = make_view(b.data(), DType::kF32, {4, 7});
  expect_error(p, "K must match");
}
TEST_F(BadInput, WrongDtype) {
  auto p = good();
  p.a.dtype = DType::kI32;
  expect_error(p, "a.dtype=i32");
  p = good();
  p.c.dtype = DType::kI8;
  expect_error(p, "c.dtype=i8");
  p = good();
  p.a.dtype = DType::kBF16;
  expect_error(p, "a.dtype=bf16 with b.dtype=f32");
}
TEST_F(BadInput, WrongShape) {
  auto p = good();
  p.c = make_view(c.data(), DType::kF32, {5, 4});
  expect_error(p, "c.sizes=[5, 4]");
  p = good();
  p.bias = make_view(bias.data(), DType::kF32, {4});
  expect_error(p, "bias must be [N=5]");
}
TEST_F(BadInput, NegativeOrShortStride) {
  auto p = good();
  p.a.strides[0] = -8;
  expect_error(p, "a.strides[0]=-8");
  p = good();
  p.c.strides[0] = 3;
  expect_error(p, "c.strides[0]=3");
  p = good();
  p.a.strides[1] = 2;
  expect_error(p, "a.strides[1]=2");
}
TEST_F(BadInput, I8WithoutScales) {
  std::vector<int8_t> w(5 * 8, 1);
  auto p = good();
  p.b = make_view(w.data(), DType::kI8, {5, 8});
  expect_error(p, "b_scales");
}
TEST_F(BadInput, WorkspaceTooSmall) {
  auto p = good();
  const size_t need = gemm_workspace_size(p);
  const auto* impl = registry().runnable().front();
  if (std::string(impl->name) == "reference") GTEST_SKIP() << "the reference needs no workspace";
  ASSERT_GT(need, 0u);
  std::vector<uint8_t> buf(need);
  const Status st = run_impl(*impl, p, {buf.data(), need - 1});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_NE(st.message().find("gemm: workspace.bytes=" + std::to_string(need - 1) + " but gemm_workspace_size()=" + std::to_string(need)),
            std::string::npos)
      << st.message();
  // Found by review: enough bytes at a null address were reported as too few bytes.
  const Status null_st = run_impl(*impl, p, {nullptr, need});
  EXPECT_EQ(null_st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null_st.message().find("gemm: workspace.data is null (workspace.bytes=" + std::to_string(need) + ")"), std::string::npos)
      << null_st.message();
}
TEST_F(BadInput, BothBAndPacked) {
  PackedWeights pw;
  ASSERT_TRUE(pack_weights({.w = make_view(b.data(), DType::kF32, {5, 8})}, &pw).ok());
  auto p = good();
  p.packed_b = &pw[0];
  expect_error(p, "both b and packed_b");
}
TEST_F(BadInput, StripLayoutOnlyForF32) {
  std::vector<uint16_t> w(5 * 8);
  PackedWeights pw;
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kBF16, {5, 8})}, &pw).ok());
  PackedMatrix m = pw[0];
  m.strip_kc = 256;
  auto p = good();
  p.b = {};
  p.packed_b = &m;
  expect_error(p, "packed_b->strip_kc=256 with dtype bf16");
  m.strip_kc = -1;
  expect_error(p, "packed_b->strip_kc=-1");
}
// Found by a fuzz sweep: a PackedMatrix built by hand (weights packed once, stored and
// mapped back) with k past its panels' k_padded read past the last panel, and one whose
// data was not 64-byte aligned faulted on the kernels' aligned loads. Its layout fields
// must be pack_weights'; the same bytes at another aligned address give the same C.
TEST_F(BadInput, HandBuiltPackedMatrix) {
  std::vector<uint16_t> w(5 * 8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(0.25f * float(i % 7) - 0.5f);
  PackedWeights pw;
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kBF16, {5, 8})}, &pw).ok());
  const PackedMatrix& orig = pw[0];
  const size_t bytes = size_t(orig.panel_bytes * orig.n_panels());
  std::vector<uint8_t> store(bytes + 2 * kAlign);
  uint8_t* aligned = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(store.data())));
  std::memcpy(aligned, orig.data, bytes);
  PackedMatrix m = orig;
  m.data = aligned;
  auto p = good();
  p.b = {};
  std::vector<uint8_t> ws(1 << 20);
  p.packed_b = &orig;
  ASSERT_TRUE(gemm(p, {ws.data(), ws.size()}).ok());
  const std::vector<float> want = c;
  std::fill(c.begin(), c.end(), std::nanf(""));
  p.packed_b = &m;
  ASSERT_TRUE(gemm(p, {ws.data(), ws.size()}).ok());
  EXPECT_EQ(std::memcmp(c.data(), want.data(), want.size() * sizeof(float)), 0);
  m.k_padded = 8;  // bf16 pads K to 32
  expect_error(p, "packed_b has k_padded=8 and panel_bytes=4096 but a bf16 matrix with k=8 packs as k_padded=32 and panel_bytes=4096");
  m = orig, m.data = aligned, m.panel_bytes /= 2;
  expect_error(p, "panel_bytes=2048");
  m = orig, m.data = aligned, m.k = 40;  // past the 32 rows each panel holds
  expect_error(p, "with k=40 packs as k_padded=64");
  m = orig, m.data = aligned + 16;
  expect_error(p, "is not 64-byte aligned");
  m = orig, m.data = aligned, m.k = INT64_MAX;  // rounding k up to 32 would overflow
  expect_error(p, "packed_b has n=5 and k=9223372036854775807; each must be in [0, 2^");
  m = orig, m.data = aligned, m.n = -1;
  expect_error(p, "packed_b has n=-1");
}
TEST_F(BadInput, PackWeightsArguments) {
  PackedWeights pw;
  Status st = pack_weights({.w = make_view(nullptr, DType::kF32, {5, 8})}, &pw);
  EXPECT_NE(st.message().find("w.data"), std::string::npos) << st.message();
  std::vector<int8_t> w(40);
  st = pack_weights({.w = make_view(w.data(), DType::kI8, {5, 8})}, &pw);
  EXPECT_NE(st.message().find("scales"), std::string::npos) << st.message();
  // Found by a fuzz sweep: negative scale strides read before the scales; packed sizes
  // that wrapped int64 (a broadcast view [2^32, 2^31] allocated 64 bytes and was packed
  // into them; N = INT64_MAX returned OK).
  std::vector<float> s(5);
  st = pack_weights({.w = make_view(w.data(), DType::kI8, {5, 8}), .scales = make_view(s.data() + 4, DType::kF32, {5}, {-1})}, &pw);
  EXPECT_EQ(st.message(), "pack_weights: scales.strides[0]=-1 is negative (negative strides are not supported)");
  std::vector<uint16_t> b(8);
  EXPECT_FALSE(pack_weights({.w = make_view(b.data(), DType::kBF16, {int64_t(1) << 32, int64_t(1) << 31}, {0, 0})}, &pw).ok());
  EXPECT_FALSE(pack_weights({.w = make_view(b.data(), DType::kBF16, {1, (int64_t(1) << 62) - 1}, {0, 0})}, &pw).ok());
  EXPECT_FALSE(pack_weights({.w = make_view(b.data(), DType::kBF16, {INT64_MAX, 0})}, &pw).ok());
  // A workspace query for K past 2^48 (M = 0, so no elements) wrapped to a small size.
  std::vector<float> a(4), c(4);
  EXPECT_EQ(gemm_workspace_size({.a = make_view(a.data(), DType::kF32, {0, int64_t(1) << 61}),
                                 .b = make_view(b.data(), DType::kF32, {4, int64_t(1) << 61}, {0, 0}),
                                 .c = make_view(c.data(), DType::kF32, {0, 4})}),
            0u);
}

TEST_F(BadInput, SwigluArguments) {
  std::vector<float> w(256 * 8, 0.5f), out(4 * 128, 0.0f);
  auto p = good();
  p.activation = GemmActivation::kSwiglu;
  expect_error(p, "needs packed_b");
  PackedWeights odd, pw;
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kF32, {200, 8})}, &odd).ok());
  p = good();
  p.b = {};
  p.packed_b = &odd[0];
  p.activation = GemmActivation::kSwiglu;
  p.c = make_view(out.data(), DType::kF32, {4, 100});
  expect_error(p, "I a multiple of 64, got N=200");
  ASSERT_TRUE(pack_weights({.w = make_view(w.data(), DType::kF32, {256, 8})}, &pw).ok());
  p.packed_b = &pw[0];
  p.c = make_view(out.data(), DType::kF32, {4, 256});
  expect_error(p, "c.sizes=[4, 256] but must be [M=4, N/2=128]");
  p.c = make_view(out.data(), DType::kF32, {4, 128});
  p.beta = 1.0f;
  expect_error(p, "beta=1");
  p.beta = 0.0f;
  p.bias = make_view(bias.data(), DType::kF32, {256});
  expect_error(p, "no bias");
}

// ---- dispatch ----------------------------------------------------------------------------
TEST(GemmDispatch, SelectedRespectsMaxIsa) {
  const std::string sel = selected_impl("gemm");
  const auto* impl = registry().find(sel);
  ASSERT_NE(impl, nullptr) << sel;
  EXPECT_LE(int(impl->isa), int(active_isa()));
  // The selection is the best runnable entry: nothing earlier in the list can run (unless
  // OPTX_IMPL forces one, which the test then runs).
  if (dispatch::forced_impl("gemm").empty()) {
    EXPECT_EQ(registry().runnable().front()->name, sel);
  }
  if (const char* cap = std::getenv("OPTX_MAX_ISA")) {
    EXPECT_EQ(std::string(isa_name(active_isa())).substr(0, std::strlen(cap)), std::string(cap));
  }
  // And it computes correctly through the public entry point.
  Case c;
  c.M = 9, c.N = 70, c.K = 33;
  const auto out = testutil::run_case(*impl, c);
  EXPECT_TRUE(out.cmp.pass) << out.cmp.message;
}

// OPTX_IMPL (read at every selection) forces an implementation through the public entry
// point; one the CPU cannot run under the cap, or a name the op does not have, is an
// error naming it, never a silent fallback. The list ends with the reference.
// (testing/test_isolation.cpp puts OPTX_IMPL back after the test, also when it fails.)
TEST(GemmDispatch, OptxImplForcesAnImplementation) {
  EXPECT_EQ(std::string(registry().all().back().name), "reference");
  std::vector<float> a(3 * 5, 1.0f), b(2 * 5, 2.0f), c(3 * 2, NAN);
  const GemmParams p{.a = make_view(a.data(), DType::kF32, {3, 5}), .b = make_view(b.data(), DType::kF32, {2, 5}),
                     .c = make_view(c.data(), DType::kF32, {3, 2})};
  std::vector<uint8_t> ws(gemm_workspace_size(p));
  for (const auto* impl : registry().runnable()) {
    setenv("OPTX_IMPL", (std::string("rope=scalar,gemm=") + impl->name).c_str(), 1);
    EXPECT_EQ(selected_impl("gemm"), impl->name);
    std::fill(c.begin(), c.end(), NAN);
    ASSERT_TRUE(gemm(p, {ws.data(), ws.size()}).ok()) << impl->name;
    for (float v : c) EXPECT_EQ(v, 10.0f) << impl->name;
  }
  setenv("OPTX_IMPL", "gemm=no_such_kernel", 1);
  Status st = gemm(p, {ws.data(), ws.size()});
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("OPTX_IMPL names 'no_such_kernel'"), std::string::npos) << st.message();
  for (const auto& impl : registry().all())
    if (impl.isa > active_isa()) {  // only under an OPTX_MAX_ISA cap or on an older CPU
      setenv("OPTX_IMPL", (std::string("gemm=") + impl.name).c_str(), 1);
      st = gemm(p, {ws.data(), ws.size()});
      EXPECT_EQ(st.code(), StatusCode::kUnsupported) << impl.name;
      EXPECT_NE(st.message().find("needs ISA"), std::string::npos) << st.message();
    }
}

}  // namespace
}  // namespace optx::gemm_detail
