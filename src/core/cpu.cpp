// CPU feature detection. A feature is usable only if cpuid reports it AND the OS has enabled
// saving of its register state in XCR0 (YMM for AVX2, ZMM/opmask for AVX-512, tile state
// for AMX); a hypervisor may expose the cpuid bit without the OS support.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "optx/runtime.h"

namespace optx {
namespace {

uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  const bool fma = c & (1u << 12);
  const bool f16c = c & (1u << 29);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;           // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;         // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_tile = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA

  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  {
    unsigned v[3];
    __cpuid(0, a, v[0], v[2], v[1]);  // vendor string in EBX, EDX, ECX order
    char vendor[13] = {};
    std::memcpy(vendor, v, 12);
    f.vendor = vendor;
  }
  unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b7, c7, d7);
    unsigned bb, cc, dd;
    __cpuid_count(7, 1, a71, bb, cc, dd);
  }
  f.fma = os_ymm && fma;
  f.f16c = os_ymm && f16c;
  f.avx2 = os_ymm && (b7 & (1u << 5));
  f.avx512f = os_zmm && (b7 & (1u << 16));
  f.avx512dq = os_zmm && (b7 & (1u << 17));
  f.avx512bw = os_zmm && (b7 & (1u << 30));
  f.avx512vl = os_zmm && (b7 & (1u << 31));
  f.avx512_vnni = os_zmm && (c7 & (1u << 11));
  f.avx512_bf16 = os_zmm && (a71 & (1u << 5));
  f.avx_vnni = os_ymm && (a71 & (1u << 4));
  f.amx_bf16 = os_tile && (d7 & (1u << 22));
  f.amx_tile = os_tile && (d7 & (1u << 24));
  f.amx_int8 = os_tile && (d7 & (1u << 25));
  // Linux hands out the 8 KiB tile state per process on request (arch_prctl
  // ARCH_REQ_XCOMP_PERM for XTILEDATA); without it the first tile instruction faults.
  if (f.amx_tile && f.amx_bf16) {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }

  char brand[49] = {};
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) {
      unsigned r[4];
      __get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(brand + 16 * i, r, 16);
    }
  }
  f.brand = brand;
  f.fast_bf16_dot = f.avx512_bf16 && f.vendor == "AuthenticAMD";
  while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace optx
