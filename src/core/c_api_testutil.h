// The C API tests' harness: an op called through optx.h and through C++ on twin sets of
// buffers must leave them bitwise equal (same implementation), allocate nothing more, and
// refuse what every C entry refuses (null params, enums out of range, a small workspace).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/c_api_internal.h"
#include "testing/aligned.h"
#include "testing/alloc_count.h"
#include "testing/rng.h"

namespace optx::capi_test {

// Test buffers. Two sets filled by the same calls in the same order hold the same bytes.
class Buffers {
 public:
  // Uniform in [lo, hi) for f32 | bf16 | f16, any value for i8 / i32 / i64.
  TensorView random(DType dt, std::initializer_list<int64_t> sizes, float lo = -1.0f, float hi = 1.0f) {
    const TensorView t = make(dt, sizes);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = rng_.uniform(lo, hi);
      const uint64_t bits = rng_.next();
      switch (dt) {
        case DType::kF32: t.ptr<float>()[i] = v; break;
        case DType::kBF16: t.ptr<uint16_t>()[i] = f32_to_bf16(v); break;
        case DType::kF16: t.ptr<uint16_t>()[i] = f32_to_f16(v); break;
        default: std::memcpy(t.ptr<uint8_t>() + i * int64_t(dtype_size(dt)), &bits, dtype_size(dt)); break;
      }
    }
    return t;
  }
  // These values, converted to dt (row-major).
  TensorView values(DType dt, std::initializer_list<int64_t> sizes, std::initializer_list<double> v) {
    const TensorView t = make(dt, sizes);
    EXPECT_EQ(int64_t(v.size()), t.numel());
    int64_t i = 0;
    for (double x : v) {
      switch (dt) {
        case DType::kF32: t.ptr<float>()[i] = float(x); break;
        case DType::kI8: t.ptr<int8_t>()[i] = int8_t(x); break;
        case DType::kI32: t.ptr<int32_t>()[i] = int32_t(x); break;
        case DType::kI64: t.ptr<int64_t>()[i] = int64_t(x); break;
        default: t.ptr<uint16_t>()[i] = dt == DType::kBF16 ? f32_to_bf16(float(x)) : f32_to_f16(float(x)); break;
      }
      ++i;
    }
    return t;
  }
  bool same_bytes(const Buffers& o) const { return bufs_ == o.bufs_; }

 private:
  TensorView make(DType dt, std::initializer_list<int64_t> sizes) {
    TensorView t = optx::make_view(nullptr, dt, sizes);
    bufs_.emplace_back(size_t(t.numel()) * dtype_size(dt));
    t.data = bufs_.back().data();
    return t;
  }
  testing::Rng rng_{2024};
  std::vector<testing::AlignedVector<uint8_t>> bufs_;  // moving the vectors keeps their data
};

// Weights packed through optx.h: C++ params naming them (weights, gate_up, ...) then
// convert to the C struct (a PackedWeights* must be a handle's, see capi::ToC).
class Packed {
 public:
  explicit Packed(const PackWeightsParams& p) {
    const capi::CParams<optx_pack_weights_params> c(p);
    EXPECT_EQ(optx_pack_weights(&c.c, &h_), OPTX_OK) << optx_last_error();
  }
  ~Packed() { optx_packed_weights_free(h_); }
  Packed(const Packed&) = delete;
  Packed& operator=(const Packed&) = delete;
  const PackedWeights* get() const { return &h_->w; }
  const optx_packed_weights* handle() const { return h_; }

 private:
  optx_packed_weights* h_ = nullptr;
};

// An op under test: its C entry points (c_size null where C++ has no size query) and C++ twins.
template <class C>
struct Op {
  using Cpp = typename capi::Mirror<C>::Cpp;
  const char* name;
  optx_status (*c_run)(const C*, void*, size_t);
  size_t (*c_size)(const C*);
  Status (*cpp_run)(const Cpp&, Workspace);
  size_t (*cpp_size)(const Cpp&);
};
#define OPTX_TEST_OP(op)                                                                  \
  ::optx::capi_test::Op<optx_##op##_params> {                                             \
    #op, optx_##op, nullptr, [](const auto& p, ::optx::Workspace ws) { return ::optx::op(p, ws); }, nullptr \
  }
#define OPTX_TEST_SIZED_OP(op)                                                                                \
  ::optx::capi_test::Op<optx_##op##_params> {                                                                 \
    #op, optx_##op, optx_##op##_workspace_size, [](const auto& p, ::optx::Workspace ws) { return ::optx::op(p, ws); }, \
        [](const auto& p) { return ::optx::op##_workspace_size(p); }                                          \
  }

inline Status status_of(optx_status code) {
  return code == OPTX_OK ? Status::Ok() : Status(StatusCode(code), optx_last_error());
}

// The C call and its size query (where there is one) refuse p with exactly `message`.
template <class C>
void expect_refused(const Op<C>& op, const C* p, const std::string& message) {
  std::vector<uint8_t> ws(1 << 12);
  EXPECT_EQ(op.c_run(p, ws.data(), ws.size()), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(optx_last_error(), message);
  if (!op.c_size) return;
  EXPECT_EQ(op.c_size(p), 0u);
  EXPECT_EQ(optx_last_error(), message);
}

// Sets each optx_tensor dtype and each enum of p out of range in turn (and points each
// packed-matrix pointer at a matrix whose dtype is), calling expect(&p, the exact message).
template <class C, class Expect>
class BadEnums {
 public:
  BadEnums(const char* op, C* p, Expect& expect) : op_(op), p_(p), expect_(expect) {}
  void operator()(const char* name, optx_tensor& t, TensorView&) {
    each_bad(t.dtype, {-1, OPTX_I64 + 1, 256}, std::string(name) + ".dtype");  // 256: DType's uint8_t would wrap it to f32
  }
  template <capi::CEnumType E>
  void operator()(const char* name, E& e, typename capi::CEnum<E>::type&) {
    each_bad(e, {-1, capi::CEnum<E>::max + 1}, name);
  }
  void operator()(const char* name, const optx_packed_matrix*& m, const PackedMatrix*&) {
    if (!m) return;
    const optx_packed_matrix* keep = m;
    optx_packed_matrix bad = *m;
    m = &bad;
    each_bad(bad.dtype, {OPTX_I64 + 1}, std::string(name) + ".dtype");
    m = keep;
  }
  template <class T, class U>
    requires(!capi::CEnumType<T>)
  void operator()(const char*, T&, U&) {}

 private:
  template <class E>
  void each_bad(E& e, std::initializer_list<int> values, const std::string& name) {
    const E keep = e;
    for (int bad : values) {
      std::memcpy(&e, &bad, sizeof bad);
      expect_(static_cast<const C*>(p_), std::string(op_) + ": " + name + "=" + std::to_string(bad) + " is not an " + capi::CEnum<E>::name);
    }
    e = keep;
  }
  const char* op_;
  C* p_;
  Expect& expect_;
};
template <class C, class Expect>
void for_each_bad_enum(const char* op, C p, Expect expect) {
  typename capi::Mirror<C>::Cpp unused{};
  BadEnums<C, Expect> bad(op, &p, expect);
  capi::Mirror<C>::each(bad, p, unused);
}

// A handle's maker (optx_pack_weights, ...) refuses a null params or out, and enums out of
// range, with *out null.
template <class C, class H>
void expect_create_errors(const char* op, optx_status (*create)(const C*, H**), const C& valid) {
  auto refused = [&](const C* p, const std::string& message) {
    H* h = reinterpret_cast<H*>(&h);  // anything but null
    EXPECT_EQ(create(p, &h), OPTX_INVALID_ARGUMENT);
    EXPECT_EQ(h, nullptr);
    EXPECT_EQ(optx_last_error(), message);
  };
  refused(nullptr, std::string(op) + ": params is null");
  EXPECT_EQ(create(&valid, nullptr), OPTX_INVALID_ARGUMENT);
  EXPECT_EQ(optx_last_error(), std::string(op) + ": out is null");
  for_each_bad_enum(op, valid, refused);
}

// The first optx_tensor field of a C struct: what the refused size query test breaks.
struct FirstTensor {
  const char* name = nullptr;
  optx_tensor* t = nullptr;
  void operator()(const char* n, optx_tensor& v, TensorView&) {
    if (!t) name = n, t = &v;
  }
  template <class T, class U>
  void operator()(const char*, T&, U&) {}
};

// make(Buffers&) -> the op's C++ params over those buffers (any handles they name made
// beforehand: they are read only). Checks the C entry points against C++ and their errors.
template <class C, class Make>
void expect_c_matches_cpp(const Op<C>& op, Make make) {
  SCOPED_TRACE(op.name);
  Buffers cpp_bufs, c_bufs, untouched;
  const auto cpp_p = make(cpp_bufs);
  capi::CParams<C> c(make(c_bufs));
  make(untouched);
  const size_t cpp_bytes = op.cpp_size ? op.cpp_size(cpp_p) : 0;
  const size_t c_bytes = op.c_size ? op.c_size(&c.c) : 0;
  EXPECT_EQ(c_bytes, cpp_bytes);
  std::vector<uint8_t> cpp_ws(cpp_bytes), c_ws(c_bytes);
  const Status st = op.cpp_run(cpp_p, {cpp_ws.data(), cpp_ws.size()});
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(op.c_run(&c.c, c_ws.data(), c_ws.size()), OPTX_OK) << optx_last_error();
  EXPECT_TRUE(c_bufs.same_bytes(cpp_bufs)) << "the C call left other bytes than the C++ one";
  EXPECT_FALSE(untouched.same_bytes(cpp_bufs)) << "the call wrote nothing";

  // The C layer allocates nothing the op does not (and the op nothing).
  std::vector<uint8_t> ws;
  {
    const ThreadScope two(2);  // a workspace sized for two threads serves one
    ws.resize(op.c_size ? op.c_size(&c.c) : 0);
  }
  testing::expect_no_heap_allocation([&] { return status_of(op.c_run(&c.c, ws.data(), ws.size())); }, op.name);

  // Errors every C entry gives.
  expect_refused<C>(op, nullptr, std::string(op.name) + ": params is null");
  for_each_bad_enum(op.name, c.c, [&](const C* p, const std::string& message) { expect_refused(op, p, message); });
  if (op.c_size && c_bytes == 0) {  // a valid 0 clears the message the refusals above left
    ASSERT_STRNE(optx_last_error(), "");
    EXPECT_EQ(op.c_size(&c.c), 0u);
    EXPECT_STREQ(optx_last_error(), "");
  }
  if (c_bytes > 0) {
    EXPECT_EQ(op.c_run(&c.c, c_ws.data(), c_bytes - 1), OPTX_WORKSPACE_TOO_SMALL);
    EXPECT_NE(std::string(optx_last_error()).find(std::string(op.name) + ": workspace"), std::string::npos) << optx_last_error();
    // A refused size query says why, as the call would.
    C bad = c.c;
    typename capi::Mirror<C>::Cpp unused{};
    FirstTensor first;
    capi::Mirror<C>::each(first, bad, unused);
    first.t->rank = 7;
    EXPECT_EQ(op.c_size(&bad), 0u);
    const std::string why = optx_last_error();
    EXPECT_EQ(why.rfind(std::string(op.name) + ": " + first.name + ".rank=7", 0), 0u) << why;
    EXPECT_EQ(op.c_run(&bad, c_ws.data(), c_ws.size()), OPTX_INVALID_ARGUMENT);
    EXPECT_EQ(why, optx_last_error());
  }
}

}  // namespace optx::capi_test
