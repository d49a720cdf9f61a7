// RMSNorm row kernels written once over a vector type V (src/simd) and included by each
// ISA unit inside its own namespace (OPTX_ISA_NS).
//
// Both ops share one reduction order (chunk c of W lanes goes to accumulator c % 4; the
// tail chunk continues the cycle) and one scale, which is what makes add_rms_norm bitwise
// equal to "residual += x; rms_norm(residual)".
// A row of 7168 bf16 is 14 KiB: the scale re-reads it from L1, so each element crosses
// the memory bus once per read and once per write.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including norm_kernels_inl.h"
#endif
#include <cmath>

#include "ops/norm/norm_internal.h"

namespace optx::norm_detail::OPTX_ISA_NS {
namespace {

// Chunk c of W lanes accumulates into acc[c % 4]. The main loop is unrolled by four with
// constant indices: a rotating index made GCC keep the accumulators on the stack, a
// store-to-load round trip per vector (measured: rms_norm of 512-wide bf16 rows 121 ns per
// row before, L2-resident).
template <class V>
struct SumSq {
  typename V::F a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();

  OPTX_ALWAYS_INLINE void add4(typename V::F v0, typename V::F v1, typename V::F v2, typename V::F v3) {
    a0 = V::fmadd(v0, v0, a0);
    a1 = V::fmadd(v1, v1, a1);
    a2 = V::fmadd(v2, v2, a2);
    a3 = V::fmadd(v3, v3, a3);
  }
  // From element i (a multiple of 4W) to H: up to three more whole chunks (to a0, a1, a2),
  // then the partial chunk to the next one. get(i) / get(i, n) give the row's values.
  template <class Get>
  OPTX_ALWAYS_INLINE float finish(int64_t i, int64_t H, Get get) {
    int c = 0;
    for (; i + V::W <= H; i += V::W, ++c) add_to(c, get(i));
    if (i < H) add_to(c, get(i, int(H - i)));
    return V::reduce(V::add(V::add(a0, a1), V::add(a2, a3)));
  }
  // By branches, not through an array of pointers: taking the accumulators' addresses made
  // GCC store all four to the stack on every step of the main loop.
  OPTX_ALWAYS_INLINE void add_to(int c, typename V::F v) {
    if (c == 0) a0 = V::fmadd(v, v, a0);
    else if (c == 1) a1 = V::fmadd(v, v, a1);
    else if (c == 2) a2 = V::fmadd(v, v, a2);
    else a3 = V::fmadd(v, v, a3);
  }
};

// Software prefetch distance along the next row's streams (it may run past that row's
// end into the row after, which the following pass reads). The hardware streamer alone
// left rms_norm below the two-pass version; 2 KiB ahead measured best of 1, 2 and 4 KiB.
inline constexpr int64_t kPrefetchBytes = 2048;

template <class T, int64_t kBytes>
OPTX_ALWAYS_INLINE void prefetch_span(const T* p) {
  for (int64_t b = 0; b < kBytes; b += 64) __builtin_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes + b);
}

template <class V, class T>
struct LoadRow {
  const T* x;
  OPTX_ALWAYS_INLINE void prefetch(int64_t i) const { prefetch_span<T, 4 * V::W * sizeof(T)>(x + i); }
  OPTX_ALWAYS_INLINE typename V::F operator()(int64_t i) const { return V::load(x + i); }
  OPTX_ALWAYS_INLINE typename V::F operator()(int64_t i, int n) const { return V::load(x + i, n); }
};

template <class V, class Get>
OPTX_ALWAYS_INLINE float sumsq_of(int64_t H, Get get) {
  SumSq<V> acc;
  int64_t i = 0;
  for (; i + 4 * V::W <= H; i += 4 * V::W) acc.add4(get(i), get(i + V::W), get(i + 2 * V::W), get(i + 3 * V::W));
  return acc.finish(i, H, get);
}

template <class V, class T>
OPTX_ALWAYS_INLINE float row_sumsq(const T* x, int64_t H) {
  return sumsq_of<V>(H, LoadRow<V, T>{x});
}

// residual += x for one row, rounded to T as stored; yields the stored values (read back
// through store forwarding) so the statistics see what the residual holds.
template <class V, class T>
struct AddInto {
  T* res;
  const T* x;
  OPTX_ALWAYS_INLINE void prefetch(int64_t i) const {
    prefetch_span<T, 4 * V::W * sizeof(T)>(x + i);
    prefetch_span<T, 4 * V::W * sizeof(T)>(res + i);
  }
  OPTX_ALWAYS_INLINE typename V::F operator()(int64_t i) const {
    V::store(res + i, V::add(V::load(res + i), V::load(x + i)));
    return V::load(res + i);
  }
  OPTX_ALWAYS_INLINE typename V::F operator()(int64_t i, int n) const {
    V::store(res + i, V::add(V::load(res + i, n), V::load(x + i, n)), n);
    return V::load(res + i, n);
  }
};

OPTX_ALWAYS_INLINE float inv_rms(float sumsq, int64_t H, float eps) {
  return 1.0f / std::sqrt(sumsq / float(H) + eps);
}

// A row's scale on its own (a thread's last row, the tail of a pipelined one, kv_cache's
// last latent row).
//
// stream: write out with non-temporal stores (where out is aligned) — for outputs too big
// to stay in cache, whose lines would otherwise be read from DRAM before being written.
template <class V, class T>
OPTX_ALWAYS_INLINE void scale_row(const T* x, const T* w, float inv, int64_t H, T* out, bool stream = false) {
  const auto s = V::set1(inv);
  const auto y = [&](int64_t j) { return V::mul(V::mul(V::load(x + j), s), V::load(w + j)); };
  int64_t i = 0;
  if (stream && simd::stream_aligned<V>(out))
    for (; i + 2 * V::W <= H; i += 2 * V::W) V::store_stream2(out + i, y(i), y(i + V::W));
  for (; i + V::W <= H; i += V::W) V::store(out + i, y(i));
  if (i < H) {
    const int n = int(H - i);
    V::store(out + i, V::mul(V::mul(V::load(x + i, n), s), V::load(w + i, n)), n);
  }
}

// One pass that writes row t and reads row t + 1: the scale runs from L1 while the next
// row streams in, so every step moves one line in and one line out, the pattern of a
// copy loop. Two passes per row (statistics, then scale with the next row prefetched)
// left memory idle during the first and bursted the prefetches in the second (measured,
// bf16 4096 x 7168, 2 threads: see README). next(i) yields the next row's values (and
// does its residual update for add_rms_norm); returns their sum of squares in
// row_sumsq's order.
// Where a range [t0, t1) splits into the two halves run in lockstep: [t0, mid) and
// [mid, t1), the first taking the extra item of an odd count.
inline int64_t lockstep_mid(int64_t t0, int64_t t1) { return t0 + (t1 - t0 + 1) / 2; }

// out[i, i + 4W) = x * s * w, the main step of the pipelined passes below (stream: out
// aligned for non-temporal stores).
template <class V, class T>
OPTX_ALWAYS_INLINE void scale_chunk4(const T* x, const T* w, typename V::F s, T* out, bool stream, int64_t i) {
  const auto y = [&](int64_t j) { return V::mul(V::mul(V::load(x + j), s), V::load(w + j)); };
  const auto y0 = y(i), y1 = y(i + V::W), y2 = y(i + 2 * V::W), y3 = y(i + 3 * V::W);
  if (stream) {
    V::store_stream2(out + i, y0, y1);
    V::store_stream2(out + i + 2 * V::W, y2, y3);
  } else {
    V::store(out + i, y0);
    V::store(out + i + V::W, y1);
    V::store(out + i + 2 * V::W, y2);
    V::store(out + i + 3 * V::W, y3);
  }
}

template <class V, class T, class Next>
OPTX_ALWAYS_INLINE float scale_row_sumsq_next(const T* x, const T* w, float inv, int64_t H, T* out, bool stream,
                                              Next next) {
  const auto s = V::set1(inv);
  stream = stream && simd::stream_aligned<V>(out);
  SumSq<V> acc;
  int64_t i = 0;
  for (; i + 4 * V::W <= H; i += 4 * V::W) {
    scale_chunk4<V>(x, w, s, out, stream, i);
    next.prefetch(i);
    acc.add4(next(i), next(i + V::W), next(i + 2 * V::W), next(i + 3 * V::W));
  }
  scale_row<V>(x + i, w + i, inv, H - i, out + i, stream);
  return acc.finish(i, H, next);
}

// scale_row_sumsq_next on two rows at once, a and b, a chunk of four vectors of each in
// turn: the core then has two read and two write streams in flight instead of one of
// each. Each row's sum keeps row_sumsq's order.
template <class V, class T, class NextA, class NextB>
OPTX_ALWAYS_INLINE void scale_rows2_sumsq_next(const T* xa, const T* xb, const T* w, float inva, float invb, int64_t H,
                                               T* outa, T* outb, bool stream, NextA na, NextB nb, float& ssa, float& ssb) {
  const auto sa = V::set1(inva), sb = V::set1(invb);
  const bool st_a = stream && simd::stream_aligned<V>(outa), st_b = stream && simd::stream_aligned<V>(outb);
  SumSq<V> acc_a, acc_b;
  int64_t i = 0;
  for (; i + 4 * V::W <= H; i += 4 * V::W) {
    scale_chunk4<V>(xa, w, sa, outa, st_a, i);
    na.prefetch(i);
    acc_a.add4(na(i), na(i + V::W), na(i + 2 * V::W), na(i + 3 * V::W));
    scale_chunk4<V>(xb, w, sb, outb, st_b, i);
    nb.prefetch(i);
    acc_b.add4(nb(i), nb(i + V::W), nb(i + 2 * V::W), nb(i + 3 * V::W));
  }
  scale_row<V>(xa + i, w + i, inva, H - i, outa + i, st_a);
  scale_row<V>(xb + i, w + i, invb, H - i, outb + i, st_b);
  ssa = acc_a.finish(i, H, na);
  ssb = acc_b.finish(i, H, nb);
}

// Rows [t0, t1) of one thread, each row's statistics gathered while the previous row is
// written (scale_row_sumsq_next); streaming stores ordered once at the end. The two halves
// of the range go in lockstep (scale_rows2_sumsq_next): one read and one write stream per
// core left rms_norm at ~30 GB/s where a plain non-temporal copy with two of each per
// core, interleaved a KiB at a time, runs 10-15% above one (bf16 4096 x 7168, 2 threads,
// alternating in one process: 3.94-3.95 -> 3.50-3.55 ms; add_rms_norm, already two of
// each, 5.74 -> 5.47 ms). Only where kLockstep: the two rows' eight sum-of-squares
// accumulators besides the scale's registers fit AVX-512's 32 registers; with AVX2's 16
// GCC keeps one on the stack, and on the Zen 3 machine of stop 18 one row at a time ran
// faster (see the norm README). The kv_cache family's token loops follow the same rule.
template <class V>
inline constexpr bool kLockstep = V::W >= 16;

template <class V, class T, class NextOf>
OPTX_ALWAYS_INLINE void norm_rows(const Rows& r, int64_t t0, int64_t t1, const T* (*row_of)(const Rows&, int64_t),
                                  float first_sumsq, NextOf next_of) {
  const T* w = static_cast<const T*>(r.weight);
  const auto out = [&](int64_t t) { return static_cast<T*>(r.out) + t * r.ldo; };
  const auto inv = [&](float ss) { return inv_rms(ss, r.H, r.eps); };
  if constexpr (!kLockstep<V>) {
    float ss = first_sumsq;
    for (int64_t t = t0; t < t1; ++t) {
      if (t + 1 < t1) ss = scale_row_sumsq_next<V>(row_of(r, t), w, inv(ss), r.H, out(t), r.stream_out, next_of(t + 1));
      else scale_row<V>(row_of(r, t), w, inv(ss), r.H, out(t), r.stream_out);
    }
    V::stream_fence();
    return;
  }
  const int64_t tm = lockstep_mid(t0, t1), nb = t1 - tm;
  float ssa = first_sumsq, ssb = nb > 0 ? sumsq_of<V>(r.H, next_of(tm)) : 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t a = t0 + i, b = tm + i;
    const float ia = inv(ssa), ib = inv(ssb);
    if (b + 1 < t1) {
      scale_rows2_sumsq_next<V>(row_of(r, a), row_of(r, b), w, ia, ib, r.H, out(a), out(b), r.stream_out, next_of(a + 1),
                                next_of(b + 1), ssa, ssb);
      continue;
    }
    if (a + 1 < tm) ssa = scale_row_sumsq_next<V>(row_of(r, a), w, ia, r.H, out(a), r.stream_out, next_of(a + 1));
    else scale_row<V>(row_of(r, a), w, ia, r.H, out(a), r.stream_out);
    scale_row<V>(row_of(r, b), w, ib, r.H, out(b), r.stream_out);
  }
  if (tm - t0 > nb) scale_row<V>(row_of(r, t0 + nb), w, inv(ssa), r.H, out(t0 + nb), r.stream_out);
  V::stream_fence();
}

template <class T>
const T* x_row(const Rows& r, int64_t t) {
  return static_cast<const T*>(r.x) + t * r.ldx;
}
template <class T>
const T* res_row(const Rows& r, int64_t t) {
  return static_cast<const T*>(r.residual) + t * r.ldr;
}

template <class V, class T>
void rms_norm_rows_t(const Rows& r, int64_t t0, int64_t t1) {
  if (t0 >= t1) return;
  norm_rows<V, T>(r, t0, t1, x_row<T>, row_sumsq<V>(x_row<T>(r, t0), r.H),
                  [&](int64_t t) { return LoadRow<V, T>{x_row<T>(r, t)}; });
}

// residual += x, rounded to T as stored; then the norm of the stored values.
template <class V, class T>
void add_rms_norm_rows_t(const Rows& r, int64_t t0, int64_t t1) {
  if (t0 >= t1) return;
  const auto add_of = [&](int64_t t) {
    return AddInto<V, T>{static_cast<T*>(r.residual) + t * r.ldr, x_row<T>(r, t)};
  };
  norm_rows<V, T>(r, t0, t1, res_row<T>, sumsq_of<V>(r.H, add_of(t0)), add_of);
}

template <class V>
void rms_norm_rows(const Rows& r, int64_t t0, int64_t t1) {
  if (r.bf16) rms_norm_rows_t<V, uint16_t>(r, t0, t1);
  else rms_norm_rows_t<V, float>(r, t0, t1);
}
template <class V>
void add_rms_norm_rows(const Rows& r, int64_t t0, int64_t t1) {
  if (r.bf16) add_rms_norm_rows_t<V, uint16_t>(r, t0, t1);
  else add_rms_norm_rows_t<V, float>(r, t0, t1);
}

}  // namespace
}  // namespace optx::norm_detail::OPTX_ISA_NS
