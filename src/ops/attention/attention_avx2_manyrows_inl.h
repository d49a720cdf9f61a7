// Decode jobs with many rows over one KV head's rows (MLA: all heads over the latent row,
// bf16 or i8; GQA groups of 16 or more rows) on AVX2 units, D and Dv multiples of 16.
//
// Such a job is compute-bound here (MLA does 16 x (576 + 512) x 2 = 34.8 kFLOP per
// 1152-byte key). The tiles (attention_avx2_bf16_inl.h) widen each K / V chunk again for
// every 4 rows and end every 8 scores in a horizontal-add tree; an i8 latent costs them
// two loads, widenings and conversions per chunk. Here a block's rows are widened to f32
// once for all rows (an i8 latent with its scale applied), and both products run as
// broadcast-FMA tiles with no reduction, as in a GEMM microkernel:
//   S^T [key][row] = K_f Q^T  keys 6 at a time x rows 16 at a time (12 accumulators), a K
//                             value broadcast against 2 vectors of Q^T [d][16];
//   O [row][col]  += P V_f    up to 6 rows at a time x 16 columns, a P^T value broadcast
//                             against 2 vectors of the widened V row.
// S^T is transposed (8 x 8 in registers) into the rows' score layout for the shared
// softmax code, and P back into P^T [key][row]; both are 1K floats a block. Each tile
// alone (one core, operands in L1 / L2) ran 90-94 GFLOP/s in a fast phase of the machine,
// against ~97 for a bare 12-chain FMA loop (65-77 in slow phases); in the op, widening
// takes ~7% of the time, the softmax and transposes ~3%.
//
// Widening bf16 by unpacks gives each 16-value chunk as [0-3, 8-11, 4-7, 12-15]; q is kept
// in that order (so the scores do not care) and O too (put back once per job), as with the
// tiles. An i8 latent widens in plain order, with q's latent part and O left plain.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including attention_avx2_manyrows_inl.h"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "ops/attention/attention_internal.h"

namespace optx::attn_detail::OPTX_ISA_NS {
namespace {

// S^T[i][0, 8 HV) (+)= sum_d k_i[d] * qt[d][0, 8 HV) for KT keys (rows of k, stride ldk)
// over nd values of d; qt's rows are 8 HV floats.
template <int KT, int HV>
OPTX_ALWAYS_INLINE void st_tile(const float* k, int64_t ldk, const float* qt, int64_t nd, float* st, int64_t ldst, bool add) {
  __m256 acc[KT][HV];
#pragma GCC unroll 8
  for (int i = 0; i < KT; ++i)
#pragma GCC unroll 2
    for (int h = 0; h < HV; ++h) acc[i][h] = add ? _mm256_loadu_ps(st + i * ldst + 8 * h) : _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t d = 0; d < nd; ++d) {
    __m256 b[HV];
#pragma GCC unroll 2
    for (int h = 0; h < HV; ++h) b[h] = _mm256_loadu_ps(qt + d * 8 * HV + 8 * h);
#pragma GCC unroll 8
    for (int i = 0; i < KT; ++i) {
      const __m256 a = _mm256_broadcast_ss(k + i * ldk + d);
#pragma GCC unroll 2
      for (int h = 0; h < HV; ++h) acc[i][h] = _mm256_fmadd_ps(a, b[h], acc[i][h]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < KT; ++i)
#pragma GCC unroll 2
    for (int h = 0; h < HV; ++h) _mm256_storeu_ps(st + i * ldst + 8 * h, acc[i][h]);
}

// o_h[0, 16) += sum_jj pt[jj][h] * v_jj[0, 16) for NH rows (stride ldo) over n keys
// (pt rows of ldp floats, v rows of ldv).
template <int NH>
OPTX_ALWAYS_INLINE void pv_tile(const float* pt, int64_t ldp, const float* v, int64_t ldv, int64_t n, float* o, int64_t ldo) {
  __m256 acc[NH][2];
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h) {
    acc[h][0] = _mm256_loadu_ps(o + h * ldo);
    acc[h][1] = _mm256_loadu_ps(o + h * ldo + 8);
  }
#pragma GCC unroll 4
  for (int64_t jj = 0; jj < n; ++jj) {
    const __m256 v0 = _mm256_loadu_ps(v + jj * ldv), v1 = _mm256_loadu_ps(v + jj * ldv + 8);
#pragma GCC unroll 8
    for (int h = 0; h < NH; ++h) {
      const __m256 p = _mm256_broadcast_ss(pt + jj * ldp + h);
      acc[h][0] = _mm256_fmadd_ps(p, v0, acc[h][0]);
      acc[h][1] = _mm256_fmadd_ps(p, v1, acc[h][1]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < NH; ++h) {
    _mm256_storeu_ps(o + h * ldo, acc[h][0]);
    _mm256_storeu_ps(o + h * ldo + 8, acc[h][1]);
  }
}

struct ManyRows {
  // Keys per S^T tile, rows per P·V tile at most.
  static constexpr int kKeyTile = 6, kRowTile = 6;
  int R = 0, Rp = 0;  // rows, and rows rounded up to 8 (Q^T, S^T and P^T columns)
  int64_t D = 0, Dv = 0, dc = 0;  // dc: the d chunk of the scores
  bool v_shared = false;          // V is the first Dv values of K's row: read from kf
  float* kf = nullptr;            // kKvBlock x D
  float* vf = nullptr;            // kKvBlock x Dv (not v_shared)
  float* qt = nullptr;            // D x Rp in column groups of 16 (the last of 8): group at h0 is [D][w]
  float* st = nullptr;            // kKvBlock x Rp: S^T, then P^T

  ManyRows(int rows, int64_t d, int64_t dv, bool shared, float* scratch) : R(rows), Rp((rows + 7) / 8 * 8), D(d), Dv(dv), v_shared(shared) {
    const ManyRowsLayout l(d, dv);
    kf = scratch + l.kf, vf = scratch + l.vf, qt = scratch + l.qt, st = scratch + l.st;
    // The scores walk d in chunks of <= 160 values, so a row group's Q^T piece (<= 10 KiB)
    // stays in L1 while every key tile of the block passes over it whatever D is. (At
    // MLA's 576 a whole-D Q^T, 36 KiB streamed from L2, measured the same: 68-73 against
    // 68-70 GFLOP/s for the tiles alone.)
    const int64_t chunks = (D + 159) / 160;
    dc = ((D + chunks - 1) / chunks + 15) / 16 * 16;
  }

  // Tile calls of one block's scores and P·V, over which the next block's rows are
  // prefetched (PrefetchCursor).
  int64_t steps(int64_t n) const {
    return (D + dc - 1) / dc * ((n + kKeyTile - 1) / kKeyTile) * ((Rp + 15) / 16) + Dv / 16 * row_tiles();
  }
  int row_tiles() const { return (R + kRowTile - 1) / kRowTile; }

  // qf: R rows of q (scaled, swap_quads16 order), stride Dp; rows R .. Rp zero.
  void pack_q(const float* qf, int64_t Dp) {
    for (int h0 = 0; h0 < Rp; h0 += 16) {
      const int w = std::min(16, Rp - h0);
      float* g = qt + h0 * D;
      for (int64_t d = 0; d < D; ++d)
        for (int h = 0; h < w; ++h) g[d * w + h] = h0 + h < R ? qf[(h0 + h) * Dp + d] : 0.0f;
    }
  }

  // This block's rows (n keys) widened to f32.
  void widen(const void* const* kp, const void* const* vp, int64_t n) {
    widen_cols(kp, 0, n, 0, D, kf, D);
    if (!v_shared) widen_cols(vp, 0, n, 0, Dv, vf, Dv);
  }

  // The same from an i8 latent (MLA): each row's Dv int8 values times its scale, in plain
  // order, then the rope part from its own rows (bf16, swap_quads16 order, as q's).
  void widen_i8(const void* const* kp, const float* ks, const void* const* rp, int64_t n) {
    for (int64_t jj = 0; jj < n; ++jj) {
      const int8_t* x = static_cast<const int8_t*>(kp[jj]);
      const __m256 s = _mm256_set1_ps(ks[jj]);
      float* dst = kf + jj * D;
      for (int64_t d = 0; d < Dv; d += 16) {
        __m256 lo, hi;
        widen16(x + d, lo, hi);
        _mm256_storeu_ps(dst + d, _mm256_mul_ps(lo, s));
        _mm256_storeu_ps(dst + d + 8, _mm256_mul_ps(hi, s));
      }
    }
    widen_cols(rp, 0, n, 0, D - Dv, kf + Dv, D);
  }

  // Both cursors step once per tile call (the next block's K rows, and its V rows unless
  // they are K's).
  void scores(int64_t n, float* S, PrefetchCursor& pf_k, PrefetchCursor& pf_v) {
    for (int64_t d0 = 0; d0 < D; d0 += dc) {
      const int64_t nd = std::min(dc, D - d0);
      for (int h0 = 0; h0 < Rp; h0 += 16) {
        const float* q = qt + h0 * D + d0 * std::min(16, Rp - h0);
        if (Rp - h0 >= 16) key_tiles<2>(n, q, d0, nd, st + h0, pf_k, pf_v);
        else key_tiles<1>(n, q, d0, nd, st + h0, pf_k, pf_v);
      }
    }
    // S^T -> S (keys past n carry whatever the buffer held; never read).
    for (int h0 = 0; h0 < Rp; h0 += 8)
      for (int64_t j0 = 0; j0 < n; j0 += 8) transpose_block(st + j0 * Rp + h0, Rp, 8, S + h0 * kKvBlock + j0, kKvBlock, R - h0);
  }

  // acc_r[0, Dv) (stride Dvp) += sum_jj P[r][jj] v_jj over the block's n keys.
  void pv(const float* P, int64_t n, float* acc, int64_t Dvp, PrefetchCursor& pf_k, PrefetchCursor& pf_v) {
    for (int h0 = 0; h0 < Rp; h0 += 8)  // P -> P^T, rows R .. Rp zero
      for (int64_t j0 = 0; j0 < n; j0 += 8) transpose_block(P + h0 * kKvBlock + j0, kKvBlock, R - h0, st + j0 * Rp + h0, Rp, 8);
    const float* v = v_shared ? kf : vf;
    const int64_t ldv = v_shared ? D : Dv;
    // A 16-column piece of V (64 keys: 4 KiB) serves all the row tiles from L1. The rows
    // are split evenly (16: 5 + 5 + 6, not 6 + 6 + 4 with 8 accumulators in the last).
    const int tiles = row_tiles();
    for (int64_t c0 = 0; c0 < Dv; c0 += 16)
      for (int t = 0; t < tiles; ++t) {
        pf_k.step();
        pf_v.step();
        const int h0 = R * t / tiles, h1 = R * (t + 1) / tiles;
        const float* pt = st + h0;
        float* o = acc + h0 * Dvp + c0;
        switch (h1 - h0) {
          case 6: pv_tile<6>(pt, Rp, v + c0, ldv, n, o, Dvp); break;
          case 5: pv_tile<5>(pt, Rp, v + c0, ldv, n, o, Dvp); break;
          case 4: pv_tile<4>(pt, Rp, v + c0, ldv, n, o, Dvp); break;
          case 3: pv_tile<3>(pt, Rp, v + c0, ldv, n, o, Dvp); break;
          case 2: pv_tile<2>(pt, Rp, v + c0, ldv, n, o, Dvp); break;
          default: pv_tile<1>(pt, Rp, v + c0, ldv, n, o, Dvp); break;
        }
      }
  }

 private:
  // An 8 x 8 block src (row stride lds; rows from `have` on read as zero) transposed into
  // dst (row stride ldd; only its first `keep` rows written).
  static void transpose_block(const float* src, int64_t lds, int have, float* dst, int64_t ldd, int keep) {
    __m256 x[8];
    for (int i = 0; i < 8; ++i) x[i] = i < have ? _mm256_loadu_ps(src + i * lds) : _mm256_setzero_ps();
    simd::Avx2::transpose8(x);
    for (int i = 0; i < 8 && i < keep; ++i) _mm256_storeu_ps(dst + i * ldd, x[i]);
  }
  // Columns [c0, c1) of rows [j0, j1) widened into dst (row stride ld).
  static void widen_cols(const void* const* rows, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst, int64_t ld) {
    for (int64_t jj = j0; jj < j1; ++jj) {
      const uint16_t* src = static_cast<const uint16_t*>(rows[jj]);
      for (int64_t d = c0; d < c1; d += 16) {
        __m256 lo, hi;
        widen16(src + d, lo, hi);
        _mm256_storeu_ps(dst + jj * ld + d, lo);
        _mm256_storeu_ps(dst + jj * ld + d + 8, hi);
      }
    }
  }
  // S^T of one row group (8 HV rows at column st0 of S^T) over d [d0, d0 + nd) for the
  // block's n keys, kKeyTile at a time. (12 keys for a group of 8 rows, 12 accumulators
  // instead of 6, ran at half the speed: 12 broadcasts from 12 rows per 12 FMAs.)
  template <int HV>
  void key_tiles(int64_t n, const float* q, int64_t d0, int64_t nd, float* st0, PrefetchCursor& pf_k, PrefetchCursor& pf_v) const {
    for (int64_t j0 = 0; j0 < n; j0 += kKeyTile) {
      pf_k.step();
      pf_v.step();
      const float* k = kf + j0 * D + d0;
      float* s = st0 + j0 * Rp;
      switch (std::min<int64_t>(kKeyTile, n - j0)) {
        case 6: st_tile<6, HV>(k, D, q, nd, s, Rp, d0 > 0); break;
        case 5: st_tile<5, HV>(k, D, q, nd, s, Rp, d0 > 0); break;
        case 4: st_tile<4, HV>(k, D, q, nd, s, Rp, d0 > 0); break;
        case 3: st_tile<3, HV>(k, D, q, nd, s, Rp, d0 > 0); break;
        case 2: st_tile<2, HV>(k, D, q, nd, s, Rp, d0 > 0); break;
        default: st_tile<1, HV>(k, D, q, nd, s, Rp, d0 > 0); break;
      }
    }
  }
};

}  // namespace
}  // namespace optx::attn_detail::OPTX_ISA_NS
