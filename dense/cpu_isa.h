// What the CPU's matrix units can do for the dense part, and the precision
// PRECISION_AUTO picks from it: AMX checked the way the kernel and the
// hypervisor actually grant it, oneDNN held below AMX where they do not.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "dlrm/config.pb.h"

namespace dlrm::dense {

// AMX as this process sees it.
struct AmxSupport {
  // CPUID leaf 7: AMX-TILE and AMX-BF16 advertised.
  bool cpuid_tile = false;
  bool cpuid_bf16 = false;
  // CPUID leaf 0x1D: the highest tile palette (0: none, so no tiles).
  int palettes = 0;
  // Palette 1's tile registers and bytes per tile (0 without palette 1).
  int tiles = 0;
  int tile_bytes = 0;
  // The kernel granted this process the tile data state
  // (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA); Linux 5.16+).
  bool permission = false;
};

// Reads CPUID and asks the kernel for tile permission (once per process;
// later calls return the first answer).
const AmxSupport& DetectAmx();

// Whether AMX tiles can run: advertised, palette 1 with at least the 8 tiles
// of 1 KiB AMX defines, and permission granted. Pure: tests pass a made-up
// `amx`.
bool AmxUsable(const AmxSupport& amx);

// Why AMX is not usable ("" when it is, or is not advertised at all).
std::string AmxUnusableReason(const AmxSupport& amx);

// The CPU's brand string (CPUID 0x80000002..4), e.g. "Intel(R) Xeon(R)
// Platinum 8480+"; "unknown" where CPUID has none.
std::string CpuModel();

// The one oneDNN CPU engine of the process. Before creating it (and before
// any other oneDNN call of the dense part: call EnsureCpuIsa() first), caps
// oneDNN's ISA below AMX where the CPU advertises AMX but AmxUsable() is
// false, logging why once to stderr, so oneDNN never executes a tile
// instruction the hypervisor or the kernel refuses.
dnnl::engine& CpuEngine();
void EnsureCpuIsa();

// The implementation oneDNN picks for a representative matmul (512 x 512 x
// 512; bf16 x bf16 -> fp32 when `bf16`, else fp32), e.g.
// "brg:avx512_core_amx" or "brg:avx512_core"; what the benchmarks and
// ModelInfo report as the ISA.
std::string MatmulIsa(bool bf16);

// Whether oneDNN's bf16 matmul runs on AMX tiles here (MatmulIsa(true)
// names amx).
bool MatmulUsesAmx();

// The precision a CPU dense part runs for `requested`, given whether the
// CPU has bf16 dot-product kernels and AMX kernels oneDNN may use:
// PRECISION_AUTO is bf16 on AMX and fp32 elsewhere; PRECISION_BF16 is bf16
// where bf16 kernels exist and fp32 otherwise; PRECISION_FP32 is fp32.
// Pure; ResolveCpuPrecision() passes this host's answers.
DensePrecision ChooseCpuPrecision(DensePrecision requested, bool bf16_kernels,
                                  bool amx_kernels);
DensePrecision ResolveCpuPrecision(DensePrecision requested);

// The precision a dense part on `device` runs for `requested`: the CPU's as
// ResolveCpuPrecision; on DEVICE_CUDA PRECISION_BF16 for PRECISION_BF16 and
// PRECISION_FP32 otherwise (AUTO stays fp32 on a GPU until bf16 has run on
// one).
DensePrecision ResolvePrecision(ComputeDevice device, DensePrecision requested);

// One line for logs: the precision that runs for `requested` on `device`,
// and on a CPU what chose it and where, e.g. "bf16 (auto; oneDNN
// brg:avx512_core_amx on Intel(R) Xeon(R) Platinum 8480+)".
std::string DescribePrecision(ComputeDevice device, DensePrecision requested);

}  // namespace dlrm::dense
