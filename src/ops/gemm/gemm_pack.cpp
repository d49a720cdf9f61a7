// Weight packing: [N, K] (or [K, N]) matrices into 64-column panels, f32 optionally as
// 16-column strips per K block (see optx/gemm.h).
#include <algorithm>
#include <cstring>
#include <new>

#include "core/validate.h"
#include "ops/gemm/gemm_internal.h"
#include "ops/gemm/gemm_kernels.h"

namespace optx {
namespace gemm_detail {

namespace {
template <class T>
void pack_typed(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, T* dst) {
  const PanelSource<T> in(b, kn, j);
  const bool pairs = sizeof(T) == 2;  // bf16: [k/2][64][2]
  const int64_t krows = pairs ? (kc + 1) / 2 * 2 : kc;
  for (int64_t kk = 0; kk < krows; ++kk)
    for (int64_t n = 0; n < kNR; ++n) {
      const int64_t idx = pairs ? (kk / 2) * 2 * kNR + 2 * n + (kk & 1) : kk * kNR + n;
      dst[idx] = in.value(n, k0 + kk);
    }
}
}  // namespace

// Element (k, n) of the panel goes to K block kb = k - k % kc at strip_index(kcur, k - kb, n).
void pack_strip_panel(const TensorView& b, bool kn, int64_t j, int64_t kc, float* dst, PackStripsFn fast) {
  const PanelSource<float> in(b, kn, j);
  for (int64_t kb = 0; kb < in.K; kb += kc) {
    const int64_t kcur = std::min(kc, in.K - kb);
    float* block = dst + kb * kNR;
    if (fast && fast(b, kn, j, kb, kcur, block)) continue;
    for (int64_t kk = 0; kk < kcur; ++kk)
      for (int64_t n = 0; n < kNR; ++n) block[strip_index(kcur, kk, n)] = in.value(n, kb + kk);
  }
}

void strips_to_panel(const float* src, int64_t kc, float* dst) {
  for (int s = 0; s < kNR / 16; ++s)
    for (int64_t k = 0; k < kc; ++k) std::memcpy(dst + k * kNR + 16 * s, src + strip_index(kc, k, 16 * s), 16 * sizeof(float));
}

void pack_panel(const TensorView& b, bool kn, int64_t j, int64_t k0, int64_t kc, void* dst, PackPanelFn fast) {
  if (fast && fast(b, kn, j, k0, kc, dst)) return;
  switch (b.dtype) {
    case DType::kF32: return pack_typed(b, kn, j, k0, kc, static_cast<float*>(dst));
    case DType::kBF16: return pack_typed(b, kn, j, k0, kc, static_cast<uint16_t*>(dst));
    case DType::kI8: return pack_typed(b, kn, j, k0, kc, static_cast<int8_t*>(dst));
    default: return;
  }
}

PackedMatrix packed_layout(DType dtype, int64_t n, int64_t k, int64_t strip_kc) {
  PackedMatrix m;
  m.dtype = dtype;
  m.n = n;
  m.k = k;
  m.strip_kc = strip_kc;
  m.k_padded = dtype == DType::kBF16 ? (k + kAmxK - 1) / kAmxK * kAmxK : k;
  m.panel_bytes = m.k_padded * kNR * int64_t(dtype_size(dtype));
  return m;
}

Status check_packed_layout(const char* op, const char* name, const PackedMatrix& m) {
  // Bounded first: packed_layout rounds k up and multiplies, which would wrap past 2^62.
  if (m.n < 0 || m.k < 0 || m.n > kMaxViewElements || m.k > kMaxViewElements)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " has n=", m.n, " and k=", m.k, "; each must be in [0, 2^",
                 kMaxViewLog2, "]");
  const PackedMatrix want = packed_layout(m.dtype, m.n, m.k, m.strip_kc);
  if (m.k_padded != want.k_padded || m.panel_bytes != want.panel_bytes)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, " has k_padded=", m.k_padded, " and panel_bytes=", m.panel_bytes,
                 " but a ", dtype_name(m.dtype), " matrix with k=", m.k, " packs as k_padded=", want.k_padded,
                 " and panel_bytes=", want.panel_bytes, " (pack_weights' layout)");
  if (reinterpret_cast<uintptr_t>(m.data) % kAlign != 0)
    return Error(StatusCode::kInvalidArgument, op, ": ", name, "->data=", m.data, " is not ", kAlign, "-byte aligned");
  return Status::Ok();
}

// Views past int64 or 2^48 bytes (a hand-built matrix's sizes) are clamped: overlap tests
// then see the first 2^48 bytes, which no real buffer exceeds.
TensorView packed_bytes(const PackedMatrix& m) {
  int64_t bytes;
  if (!m.data || __builtin_mul_overflow(m.n_panels(), m.panel_bytes, &bytes) || bytes > kMaxViewBytes) bytes = m.data ? kMaxViewBytes : 0;
  return bytes > 0 ? make_view(const_cast<void*>(m.data), DType::kI8, {bytes}) : TensorView{};
}
TensorView packed_scales(const PackedMatrix& m) {
  const int64_t n = std::min(m.n_panels() * kNR, kMaxViewElements / 4);
  return m.dtype == DType::kI8 && m.scales && n > 0 ? make_view(const_cast<float*>(m.scales), DType::kF32, {n}) : TensorView{};
}

void pack_scales(const TensorView& scales, int64_t j, float* dst) {
  const int64_t N = scales.sizes[0];
  const float* s = static_cast<const float*>(scales.data);
  for (int64_t n = 0; n < kNR; ++n) {
    const int64_t col = j * kNR + n;
    dst[n] = col < N ? s[col * scales.strides[0]] : 0.0f;
  }
}

}  // namespace gemm_detail

float PackedMatrix::at(int64_t n_idx, int64_t k_idx) const {
  const int64_t j = n_idx / kPanel, n = n_idx % kPanel;
  const uint8_t* p = panel(j);
  switch (dtype) {
    case DType::kF32:
      if (strip_kc > 0) {
        const int64_t kb = k_idx - k_idx % strip_kc, kcur = std::min(strip_kc, k - kb);
        return reinterpret_cast<const float*>(p)[kb * kPanel + gemm_detail::strip_index(kcur, k_idx - kb, n)];
      }
      return reinterpret_cast<const float*>(p)[k_idx * kPanel + n];
    case DType::kBF16:
      return bf16_to_f32(
          reinterpret_cast<const uint16_t*>(p)[(k_idx / 2) * 2 * kPanel + 2 * n + (k_idx & 1)]);
    case DType::kI8: return float(reinterpret_cast<const int8_t*>(p)[k_idx * kPanel + n]);
    default: return 0.0f;
  }
}

PackedWeights::PackedWeights(PackedWeights&& o) noexcept { *this = std::move(o); }
PackedWeights& PackedWeights::operator=(PackedWeights&& o) noexcept {
  if (this != &o) {
    aligned_free(storage_);
    delete[] mats_;
    storage_ = o.storage_;
    mats_ = o.mats_;
    count_ = o.count_;
    bytes_ = o.bytes_;
    o.storage_ = nullptr;
    o.mats_ = nullptr;
    o.count_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}
PackedWeights::~PackedWeights() {
  aligned_free(storage_);
  delete[] mats_;
}

Status pack_weights(const PackWeightsParams& p, PackedWeights* out) {
  constexpr const char* op = "pack_weights";
  if (!out) return Error(StatusCode::kInvalidArgument, op, ": out is null");
  const TensorView& w = p.w;
  OPTX_RETURN_IF_ERROR(check_view(op, "w", w));
  OPTX_RETURN_IF_ERROR(check_view(op, "scales", p.scales));
  if (!w.data) return Error(StatusCode::kInvalidArgument, op, ": w.data is null");
  if (w.rank != 2 && w.rank != 3)
    return Error(StatusCode::kInvalidArgument, op, ": w.rank=", w.rank, " but must be 2 ([N, K]) or 3 ([E, N, K])");
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kI8)
    return Error(StatusCode::kInvalidArgument, op, ": w.dtype=", dtype_name(w.dtype),
                 " but must be f32, bf16 or i8");
  const int base = w.rank - 2;
  const int64_t E = w.rank == 3 ? w.sizes[0] : 1;
  const int64_t N = p.kn ? w.sizes[base + 1] : w.sizes[base];
  const int64_t K = p.kn ? w.sizes[base] : w.sizes[base + 1];
  const bool is_i8 = w.dtype == DType::kI8;
  if (is_i8) {
    const TensorView& s = p.scales;
    if (!s.data) return Error(StatusCode::kInvalidArgument, op, ": scales.data is null but w is i8 (per-channel scales required)");
    if (s.dtype != DType::kF32) return Error(StatusCode::kInvalidArgument, op, ": scales.dtype=", dtype_name(s.dtype), " but must be f32");
    if (s.rank != w.rank - 1 || s.sizes[s.rank - 1] != N || (w.rank == 3 && s.sizes[0] != E))
      return Error(StatusCode::kInvalidArgument, op, ": scales must be [", (w.rank == 3 ? std::to_string(E) + ", " : ""), N, "] to match w");
  } else if (!p.scales.empty()) {
    return Error(StatusCode::kInvalidArgument, op, ": scales given but w.dtype=", dtype_name(w.dtype), " (only i8 weights take scales)");
  }
  const gemm_detail::KernelTable* kt = gemm_detail::selected_table();
  int64_t strip_kc = 0;
  switch (p.layout) {
    case PackLayout::kAuto: strip_kc = w.dtype == DType::kF32 && kt && kt->f32_strip ? gemm_detail::kStripKc : 0; break;
    case PackLayout::kPanels: break;
    case PackLayout::kStrips:
      if (w.dtype != DType::kF32)
        return Error(StatusCode::kInvalidArgument, op, ": layout=strips needs f32 weights, got w.dtype=", dtype_name(w.dtype));
      strip_kc = gemm_detail::kStripKc;
      break;
    default: return Error(StatusCode::kInvalidArgument, op, ": layout=", int(p.layout), " is not a known PackLayout");
  }

  const size_t esize = dtype_size(w.dtype);
  // The packed size pads N to panels and K to AMX steps: bounded like a view, so the byte
  // counts below cannot wrap (they did for [2^32, 2^31] at strides 0, a legal broadcast).
  int64_t padded = 0;
  if (N > kMaxViewElements || K > kMaxViewElements || __builtin_mul_overflow(N + gemm_detail::kNR, K + gemm_detail::kAmxK, &padded) ||
      padded > kMaxViewElements / std::max<int64_t>(E, 1))
    return Error(StatusCode::kInvalidArgument, op, ": packed [E=", E, ", N=", N, ", K=", K, "] would exceed 2^", kMaxViewLog2,
                 " elements");
  const PackedMatrix layout = gemm_detail::packed_layout(w.dtype, N, K, strip_kc);
  const int64_t n_panels = layout.n_panels(), k_padded = layout.k_padded, panel_bytes = layout.panel_bytes;
  const size_t mat_bytes = size_t(n_panels * panel_bytes);
  const size_t scale_bytes = is_i8 ? size_t(n_panels * gemm_detail::kNR) * sizeof(float) : 0;
  const size_t per_mat = (mat_bytes + scale_bytes + kAlign - 1) / kAlign * kAlign;
  const size_t total = per_mat * size_t(E);

  PackedWeights result;
  result.storage_ = aligned_alloc_bytes(total);
  result.mats_ = new (std::nothrow) PackedMatrix[size_t(E > 0 ? E : 1)];
  if (!result.storage_ || !result.mats_)
    return Error(StatusCode::kOutOfMemory, op, ": cannot allocate ", total, " bytes");
  result.count_ = E;
  result.bytes_ = total;

  for (int64_t e = 0; e < E; ++e) {
    uint8_t* base_ptr = static_cast<uint8_t*>(result.storage_) + size_t(e) * per_mat;
    PackedMatrix& m = result.mats_[e];
    m = layout;
    m.data = base_ptr;
    m.scales = is_i8 ? reinterpret_cast<const float*>(base_ptr + mat_bytes) : nullptr;
  }

  // One matrix view per expert, then panels in parallel (packing touches every page once).
  const int64_t jobs = E * n_panels;
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (int64_t job = 0; job < jobs; ++job) {
    const int64_t e = job / n_panels, j = job % n_panels;
    TensorView m = w;
    if (w.rank == 3) {
      m.data = static_cast<uint8_t*>(w.data) + size_t(e * w.strides[0]) * esize;
      m.rank = 2;
      m.sizes[0] = w.sizes[1];
      m.sizes[1] = w.sizes[2];
      m.strides[0] = w.strides[1];
      m.strides[1] = w.strides[2];
    }
    PackedMatrix& pm = result.mats_[e];
    uint8_t* dst = const_cast<uint8_t*>(pm.panel(j));
    if (strip_kc > 0) gemm_detail::pack_strip_panel(m, p.kn, j, strip_kc, reinterpret_cast<float*>(dst), kt ? kt->pack_strips : nullptr);
    else gemm_detail::pack_panel(m, p.kn, j, 0, k_padded, dst, kt ? kt->pack_panel_fast : nullptr);
    if (is_i8) {
      TensorView s = p.scales;
      if (s.rank == 2) {
        s.data = static_cast<float*>(s.data) + e * s.strides[0];
        s.rank = 1;
        s.sizes[0] = s.sizes[1];
        s.strides[0] = s.strides[1];
      }
      gemm_detail::pack_scales(s, j, const_cast<float*>(pm.scales) + j * gemm_detail::kNR);
    }
  }
  *out = std::move(result);
  return Status::Ok();
}

}  // namespace optx
