// AMX detection (CPUID and the kernel's tile permission), the oneDNN ISA cap
// that keeps oneDNN off tiles it may not use, and PRECISION_AUTO's choice.
#include "dense/cpu_isa.h"

#include <oneapi/dnnl/dnnl.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "dense/bf16.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace dlrm::dense {
namespace {

#if defined(__x86_64__)
// arch_prctl codes and the tile data feature (Linux's uapi/asm/prctl.h; the
// Debian 12 headers predate them).
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr unsigned long kXfeatureXtileData = 18;

AmxSupport Probe() {
  AmxSupport amx;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return amx;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  amx.cpuid_bf16 = (edx >> 22) & 1;
  amx.cpuid_tile = (edx >> 24) & 1;
  if (!amx.cpuid_tile || __get_cpuid_max(0, nullptr) < 0x1d) return amx;
  __cpuid_count(0x1d, 0, eax, ebx, ecx, edx);
  amx.palettes = static_cast<int>(eax);
  if (amx.palettes >= 1) {
    __cpuid_count(0x1d, 1, eax, ebx, ecx, edx);
    amx.tile_bytes = static_cast<int>(eax >> 16);
    amx.tiles = static_cast<int>(ebx >> 16);
  }
  // Asking twice is harmless (the grant is per process and sticky).
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0) {
    unsigned long granted = 0;
    amx.permission =
        syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) == 0 &&
        ((granted >> kXfeatureXtileData) & 1);
  }
  return amx;
}
#else
AmxSupport Probe() { return {}; }
#endif

std::string Trim(std::string s) {
  const size_t begin = s.find_first_not_of(' ');
  if (begin == std::string::npos) return "";
  const size_t end = s.find_last_not_of(' ');
  return s.substr(begin, end - begin + 1);
}

std::string ProbeMatmul(bool bf16) {
  using dt = dnnl::memory::data_type;
  const dt type = bf16 ? dt::bf16 : dt::f32;
  const dnnl::memory::dims square{512, 512};
  try {
    const dnnl::memory::desc a(square, type, dnnl::memory::format_tag::ab);
    const dnnl::memory::desc c(square, dt::f32, dnnl::memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c),
                                          CpuEngine());
    return pd.impl_info_str();
  } catch (const dnnl::error&) {
    return "none";
  }
}

}  // namespace

const AmxSupport& DetectAmx() {
  static const AmxSupport amx = Probe();
  return amx;
}

bool AmxUsable(const AmxSupport& amx) {
  return AmxUnusableReason(amx).empty() && amx.cpuid_tile && amx.cpuid_bf16;
}

std::string AmxUnusableReason(const AmxSupport& amx) {
  if (!amx.cpuid_tile && !amx.cpuid_bf16) return "";
  if (!amx.cpuid_tile || !amx.cpuid_bf16) {
    return "CPUID advertises only one of AMX-TILE and AMX-BF16";
  }
  if (amx.palettes < 1) return "CPUID leaf 0x1D reports no tile palette";
  if (amx.tiles < 8 || amx.tile_bytes < 1024) {
    return "CPUID leaf 0x1D's palette 1 has fewer than 8 tiles of 1 KiB";
  }
  if (!amx.permission) {
    return "the kernel refused the tile data permission "
           "(arch_prctl ARCH_REQ_XCOMP_PERM)";
  }
  return "";
}

std::string CpuModel() {
#if defined(__x86_64__)
  unsigned regs[12] = {};
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1],
                  &regs[4 * i + 2], &regs[4 * i + 3]);
    }
    std::string brand(reinterpret_cast<const char*>(regs), sizeof(regs));
    brand.resize(brand.find('\0') == std::string::npos ? brand.size()
                                                       : brand.find('\0'));
    brand = Trim(brand);
    if (!brand.empty()) return brand;
  }
#endif
  return "unknown";
}

void EnsureCpuIsa() {
  static std::once_flag once;
  std::call_once(once, [] {
    const AmxSupport& amx = DetectAmx();
    const std::string why = AmxUnusableReason(amx);
    if (why.empty()) return;
    // Must precede every other oneDNN call: the cap is fixed once oneDNN
    // has dispatched anything.
    const dnnl_status_t st =
        dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_bf16);
    std::fprintf(stderr,
                 "dlrm: the CPU advertises AMX but %s; oneDNN is held below "
                 "AMX%s\n",
                 why.c_str(),
                 st == dnnl_success ? "" : " (the cap came too late: FAILED)");
  });
}

dnnl::engine& CpuEngine() {
  static dnnl::engine* engine = [] {
    EnsureCpuIsa();
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return *engine;
}

std::string MatmulIsa(bool bf16) {
  static const std::string fp32_isa = ProbeMatmul(false);
  static const std::string bf16_isa = ProbeMatmul(true);
  return bf16 ? bf16_isa : fp32_isa;
}

bool MatmulUsesAmx() {
  return MatmulIsa(true).find("amx") != std::string::npos;
}

DensePrecision ChooseCpuPrecision(DensePrecision requested, bool bf16_kernels,
                                  bool amx_kernels) {
  switch (requested) {
    case PRECISION_AUTO:
      return amx_kernels ? PRECISION_BF16 : PRECISION_FP32;
    case PRECISION_BF16:
      return bf16_kernels ? PRECISION_BF16 : PRECISION_FP32;
    default:
      return PRECISION_FP32;
  }
}

DensePrecision ResolveCpuPrecision(DensePrecision requested) {
  const bool bf16 = CpuHasBf16();
  const DensePrecision got =
      ChooseCpuPrecision(requested, bf16, bf16 && MatmulUsesAmx());
  if (requested == PRECISION_BF16 && got != PRECISION_BF16) {
    static std::once_flag logged;
    std::call_once(logged, [] {
      std::fprintf(stderr,
                   "dlrm: dense_precision PRECISION_BF16 asked for, but this "
                   "CPU has no bf16 instructions oneDNN may use (avx512_bf16 "
                   "/ AMX); the dense part runs PRECISION_FP32\n");
    });
  }
  return got;
}

DensePrecision ResolvePrecision(ComputeDevice device,
                                DensePrecision requested) {
  if (device == DEVICE_CUDA) {
    return requested == PRECISION_BF16 ? PRECISION_BF16 : PRECISION_FP32;
  }
  return ResolveCpuPrecision(requested);
}

std::string DescribePrecision(ComputeDevice device, DensePrecision requested) {
  const DensePrecision runs = ResolvePrecision(device, requested);
  std::string out = runs == PRECISION_BF16 ? "bf16" : "fp32";
  const char* why = requested == PRECISION_AUTO ? "auto" : "asked for";
  if (device == DEVICE_CUDA) return out + " (" + why + ", on the GPU)";
  return out + " (" + why + "; oneDNN " + MatmulIsa(runs == PRECISION_BF16) +
         " on " + CpuModel() + ")";
}

}  // namespace dlrm::dense
