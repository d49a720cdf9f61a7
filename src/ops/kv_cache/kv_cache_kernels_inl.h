// Fused cache-write kernels, written once over a vector type V and included per ISA unit
// in its own namespace (OPTX_ISA_NS). They call the very row functions of the norm and
// rope families (same source, same flags), which is what makes each fused op bitwise
// equal to its unfused composition.
#ifndef OPTX_ISA_NS
#error "define OPTX_ISA_NS before including kv_cache_kernels_inl.h"
#endif
#include <cstring>

#include "ops/kv_cache/kv_cache_internal.h"
#include "ops/norm/norm_kernels_inl.h"
#include "ops/rope/rope_kernels_inl.h"

namespace optx::kv_detail::OPTX_ISA_NS {
namespace {

namespace nk = ::optx::norm_detail::OPTX_ISA_NS;
namespace rk = ::optx::rope_detail::OPTX_ISA_NS;

// Token t's rope part (rope_dim values from `from`) rotated into `to`.
template <class V, class T>
OPTX_ALWAYS_INLINE void mla_rope_to(const MlaArgs& a, int64_t t, const T* from, T* to, bool stream) {
  rk::rope_head_to<V>(from, to, a.rope.cos_at(t), a.rope.sin_at(t), a.rope_dim, a.rope.style, stream);
}

// MLA: cache[slot] = [rms_norm(c_kv) * w | rope(k_pe)], tokens [t0, t1) of one thread.
// The latent of token t is scaled straight into its slot with non-temporal stores (slots
// are scattered, so ordinary stores would first read each destination line from DRAM)
// while token t + 1's row streams in and is summed (norm's scale_row_sumsq_next): one
// pass per row, memory busy throughout. The rope part is streamed straight from the
// rotation too. One fence per thread at the end: a fence per token was slower.
// Measured (bf16, T = 4096, 2 threads): ordinary stores 0.83 ms; row staged in L1 then
// streamed, two passes per row 0.47-0.60 ms; this — see PERF_LOG.md.
template <class V, class T>
void mla_tokens_t(const MlaArgs& a, int64_t t0, int64_t t1) {
  if (t0 >= t1) return;
  const T* w = static_cast<const T*>(a.weight);
  const auto row = [&](int64_t t) { return static_cast<const T*>(a.kv) + t * a.ldkv; };
  alignas(64) T stage[kMaxMlaRow];  // i8: the rounded latent to quantise
  float ss = nk::row_sumsq<V>(row(t0), a.rank);
  for (int64_t t = t0; t < t1; ++t) {
    const T* src = row(t);
    const bool more = t + 1 < t1;
    const int64_t slot = a.slot(t);
    if (slot < 0) {
      if (more) ss = nk::row_sumsq<V>(row(t + 1), a.rank);
      continue;
    }
    T* dst = a.i8 ? stage : static_cast<T*>(a.cache) + slot * a.ldc;
    const float inv = nk::inv_rms(ss, a.rank, a.eps);
    if (more)
      ss = nk::scale_row_sumsq_next<V>(src, w, inv, a.rank, dst, !a.i8, nk::LoadRow<V, T>{row(t + 1)});
    else
      nk::scale_row<V>(src, w, inv, a.rank, dst, !a.i8);
    if (a.i8) {  // latent quantised from the rounded row (as kv_cache_write would), rope part apart
      quantize_row_i8(static_cast<const T*>(stage), a.rank, static_cast<int8_t*>(a.cache) + slot * a.ldc,
                      a.scales + slot);
      mla_rope_to<V>(a, t, src + a.rank, static_cast<T*>(a.rope_cache) + slot * a.ldr, false);
      continue;
    }
    mla_rope_to<V>(a, t, src + a.rank, dst + a.rank, /*stream=*/true);
  }
  V::stream_fence();
}

// Float caches: the two halves of [t0, t1) in lockstep (norm's scale_rows2_sumsq_next),
// so the core keeps two read and two write streams in flight, as norm_rows does (bf16
// T = 4096, 2 threads, alternating in one process, six runs: 0.286-0.382 -> 0.258-0.374
// ms, 2-11% faster). A token with slot -1 (and each half's last token) ends the lockstep
// run; the rest go on through mla_tokens_t.
template <class V, class T>
void mla_tokens2_t(const MlaArgs& a, int64_t t0, int64_t t1) {
  const T* w = static_cast<const T*>(a.weight);
  const auto row = [&](int64_t t) { return static_cast<const T*>(a.kv) + t * a.ldkv; };
  const int64_t tm = nk::lockstep_mid(t0, t1), nb = t1 - tm;
  int64_t i = 0;
  if (nb >= 2 && a.slot(t0) >= 0 && a.slot(tm) >= 0) {
    float ssa = nk::row_sumsq<V>(row(t0), a.rank), ssb = nk::row_sumsq<V>(row(tm), a.rank);
    const auto rope = [&](int64_t t, T* dst) { mla_rope_to<V>(a, t, row(t) + a.rank, dst + a.rank, /*stream=*/true); };
    for (; i + 1 < nb; ++i) {  // tokens t0 + i and tm + i, while t0 + i + 1 and tm + i + 1 are summed
      const int64_t ta = t0 + i, tb = tm + i;
      if (a.slot(ta + 1) < 0 || a.slot(tb + 1) < 0) break;
      T* da = static_cast<T*>(a.cache) + a.slot(ta) * a.ldc;
      T* db = static_cast<T*>(a.cache) + a.slot(tb) * a.ldc;
      nk::scale_rows2_sumsq_next<V>(row(ta), row(tb), w, nk::inv_rms(ssa, a.rank, a.eps), nk::inv_rms(ssb, a.rank, a.eps), a.rank, da,
                                    db, true, nk::LoadRow<V, T>{row(ta + 1)}, nk::LoadRow<V, T>{row(tb + 1)}, ssa, ssb);
      rope(ta, da);
      rope(tb, db);
    }
  }
  mla_tokens_t<V, T>(a, t0 + i, tm);
  mla_tokens_t<V, T>(a, tm + i, t1);
}

// Each head asks for the lines 4 KiB further along the qkv rows (a third of a token ahead
// at 48 heads x 128): the hardware streamer, seeing 256-byte runs per head, fell behind
// (bf16 T = 4096: 4.8-5.0 ms without, 3.1-3.5 ms with; 2, 3, 6 and 8 KiB measured too).
inline constexpr size_t kQkvAhead = 4096;
// MHA / GQA: q_out = rope(q); k_cache[slot] = rope(k); v_cache[slot] = v. Cache rows and
// a large q_out are written with non-temporal stores straight from the rotation: ordinary
// stores read every destination line from DRAM first (a third more traffic). One token's
// steps — each q head, each k head, the v rows — so that two tokens can take turns.
template <class V, class T>
struct QkvToken {
  const QkvArgs& a;
  int64_t t;
  const T* src;
  const float* c;
  const float* s;
  int64_t slot;
  QkvToken(const QkvArgs& args, int64_t tok)
      : a(args), t(tok), src(static_cast<const T*>(a.qkv) + t * a.ldqkv), c(a.rope.cos_at(t)), s(a.rope.sin_at(t)),
        slot(a.slot(t)) {}
  static void ahead(const T* p, int64_t n) {
    for (size_t b = 0; b < sizeof(T) * size_t(n); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(p) + kQkvAhead + b);
  }
  // Rotated channels go straight from the source row to their destination; only the
  // channels past rotary_dim (if any) need a copy.
  void head(const T* from, T* to, bool stream) const {
    ahead(from, a.d);
    rk::rope_head_to<V>(from, to, c, s, a.rope.rotary_dim, a.rope.style, stream);
    if (a.d > a.rope.rotary_dim)
      std::memcpy(to + a.rope.rotary_dim, from + a.rope.rotary_dim, sizeof(T) * size_t(a.d - a.rope.rotary_dim));
  }
  const T* kv() const { return src + a.hq * a.d; }
  void q(int64_t h) const { head(src + h * a.d, static_cast<T*>(a.q_out) + t * a.ldq_t + h * a.ldq_h, a.stream_q); }
  void k(int64_t h) const {
    if (slot >= 0) head(kv() + h * a.d, static_cast<T*>(a.k_cache) + slot * a.ldk + h * a.d, true);
  }
  void v() const {
    if (slot < 0) {
      ahead(kv(), 2 * a.hkv * a.d);  // keeps the prefetch stream unbroken for the rows after
      return;
    }
    ahead(kv() + a.hkv * a.d, a.hkv * a.d);
    V::stream_copy(static_cast<T*>(a.v_cache) + slot * a.ldv, kv() + a.hkv * a.d, sizeof(T) * size_t(a.d * a.hkv));
  }
};

template <class V, class T>
void qkv_token_t(const QkvArgs& a, int64_t t) {
  const QkvToken<V, T> x(a, t);
  for (int64_t h = 0; h < a.hq; ++h) x.q(h);
  for (int64_t h = 0; h < a.hkv; ++h) x.k(h);
  x.v();
}

// A thread's two token halves in lockstep, a head of one token and then of the other:
// two read and six write streams per core instead of one and three (see mla_tokens2_t).
// bf16 T = 4096, 32 / 8 heads of 128, 2 threads, alternating in one process, six runs:
// 3.59-3.99 -> 3.20-3.95 ms (1-13%, median 9%).
template <class V, class T>
void qkv_tokens2_t(const QkvArgs& a, int64_t t0, int64_t t1) {
  const int64_t tm = nk::lockstep_mid(t0, t1), nb = t1 - tm;
  for (int64_t i = 0; i < nb; ++i) {
    const QkvToken<V, T> x(a, t0 + i), y(a, tm + i);
    for (int64_t h = 0; h < a.hq; ++h) x.q(h), y.q(h);
    for (int64_t h = 0; h < a.hkv; ++h) x.k(h), y.k(h);
    x.v();
    y.v();
  }
  if (tm - t0 > nb) qkv_token_t<V, T>(a, t0 + nb);
}

// Two tokens in lockstep (mla_tokens2_t, qkv_tokens2_t) only where norm's rows go in
// lockstep (nk::kLockstep: AVX-512 units, where they were measured faster, MLA 2-11% and
// QKV 1-13%). On the AVX2 machine of stop 18 one token at a time ran MLA 3-6% and QKV 1-3%
// faster (alternating in one process, one and two threads, rows hot and from DRAM).
template <class V>
void mla_tokens(const MlaArgs& a, int64_t t0, int64_t t1) {
  if (a.i8 || !nk::kLockstep<V>) {  // i8: the latent goes through a staging row to its quantiser
    if (a.bf16) mla_tokens_t<V, uint16_t>(a, t0, t1);
    else mla_tokens_t<V, float>(a, t0, t1);
  } else if (a.bf16) {
    mla_tokens2_t<V, uint16_t>(a, t0, t1);
  } else {
    mla_tokens2_t<V, float>(a, t0, t1);
  }
}
template <class V>
void qkv_tokens(const QkvArgs& a, int64_t t0, int64_t t1) {
  if (!nk::kLockstep<V>) {
    for (int64_t t = t0; t < t1; ++t) {
      if (a.bf16) qkv_token_t<V, uint16_t>(a, t);
      else qkv_token_t<V, float>(a, t);
    }
  } else if (a.bf16) {
    qkv_tokens2_t<V, uint16_t>(a, t0, t1);
  } else {
    qkv_tokens2_t<V, float>(a, t0, t1);
  }
  V::stream_fence();
}

inline constexpr int64_t kMaxStagedI8Row = 16384;

// One row of a plain cache write or gather: the same dtype is copied (non-temporal where
// the op writes enough to stream past the caches: scattered cache slots would otherwise
// read each destination line first), an i8 destination gets the row quantised per token
// (numerics/quant_i8.h compiled with this unit's flags, so its absmax, scale and rounding
// loops vectorise; the same values in every unit).
template <class V>
OPTX_ALWAYS_INLINE void put_row(const Plane& src, const Plane& dst, int64_t s_row, int64_t d_row, int64_t row, bool stream) {
  const uint8_t* s = static_cast<const uint8_t*>(src.base) + size_t(s_row * src.ld) * dtype_size(src.dtype);
  uint8_t* d = static_cast<uint8_t*>(dst.base) + size_t(d_row * dst.ld) * dtype_size(dst.dtype);
  if (dst.dtype == src.dtype) {
    const size_t bytes = size_t(row) * dtype_size(src.dtype);
    if (stream) V::stream_copy(d, s, bytes);
    else std::memcpy(d, s, bytes);
    return;
  }
  // i8: quantised into an L1 row first where the op streams, then copied out whole lines.
  alignas(64) int8_t stage[kMaxStagedI8Row];
  int8_t* q = stream && row <= kMaxStagedI8Row ? stage : reinterpret_cast<int8_t*>(d);
  if (src.dtype == DType::kF32) quantize_row_i8(reinterpret_cast<const float*>(s), row, q, dst.scales + d_row);
  else quantize_row_i8(reinterpret_cast<const uint16_t*>(s), row, q, dst.scales + d_row);
  if (q == stage) V::stream_copy(d, stage, size_t(row));
}

// kv_cache_write: k / v rows of tokens [t0, t1) into their slots (slot -1 skipped).
template <class V>
void write_tokens(const WriteArgs& a, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t slot = a.slot(t);
    if (slot < 0) continue;
    if (a.k.base) put_row<V>(a.k, a.k_cache, t, slot, a.row, a.stream);
    if (a.v.base) put_row<V>(a.v, a.v_cache, t, slot, a.row, a.stream);
  }
  V::stream_fence();
}

// gather_pa_kv_cache: output rows [r0, r1) (sequences back to back); the first sequence
// is found by a scan of seq_lens (O(B), no allocation), then rows and sequences go in order.
template <class V>
void gather_rows(const GatherArgs& a, int64_t r0, int64_t r1) {
  int64_t b = 0, start = 0;
  while (b < a.B && start + a.seq_lens[b] <= r0) start += a.seq_lens[b++];
  for (int64_t r = r0; r < r1; ++r) {
    while (r - start >= a.seq_lens[b]) start += a.seq_lens[b++];
    const int64_t p = r - start;
    const int64_t slot = int64_t(a.block_tables[b * a.max_blocks + p / a.block_size]) * a.block_size + p % a.block_size;
    for (const Plane* pl : {&a.k_cache, &a.v_cache}) {
      if (!pl->base) continue;
      const Plane& out = pl == &a.k_cache ? a.k_out : a.v_out;
      put_row<V>(*pl, out, slot, r, a.row, a.stream);
      if (pl->scales) out.scales[r] = pl->scales[slot];
    }
  }
  V::stream_fence();
}

}  // namespace
}  // namespace optx::kv_detail::OPTX_ISA_NS
