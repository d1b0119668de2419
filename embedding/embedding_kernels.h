// The CPU pooled lookup's inner loop, in one version per instruction set,
// chosen at run time. Each version gives the bits of
// reference::PoolForward (embedding_table.h): the same additions in the
// same order per column; tests/embedding_kernels_test.cc runs every version
// this CPU has against it.
#pragma once

#include <cstdint>

#include "dlrm/config.pb.h"

namespace dlrm::embedding::kernels {

// An instruction set a kernel version is written for.
enum class Isa {
  kPortable,  // GCC vector extensions at the build's baseline (x86-64-v3).
  kAvx512,    // AVX-512F intrinsics: 16-float registers, masked row tails.
};

// The best version this CPU and OS run (kAvx512 where CPUID reports
// AVX-512F and the OS saves its registers).
Isa BestIsa();

// Whether this CPU runs `isa`'s version.
bool Supported(Isa isa);

// Pools bags [bag_begin, bag_end) of a batch (bag s holds ids[offsets[s] ..
// offsets[s + 1]), offsets[bag_end] <= total ids in all) from a
// rows x dim weight array into out + s * out_stride: each column summed
// from 0 over the bag's rows in id order, then multiplied by 1 / bag size
// when `mean` and the bag is not empty (an empty bag gives zeros); rows of
// ids up to `total` ahead are prefetched. Ids must index rows of
// `weights`; `isa` must be Supported.
void PoolBags(Isa isa, const float* weights, int dim, bool mean,
              const int64_t* offsets, const int64_t* ids, int64_t bag_begin,
              int64_t bag_end, int64_t total, float* out, int64_t out_stride);

// Whether this CPU runs `isa`'s version of PoolBags16 (kAvx512 also needs
// AVX-512BW and VL: masked 16-bit loads).
bool Supported16(Isa isa);

// The best PoolBags16 version this CPU runs.
Isa BestIsa16();

// PoolBags over a rows x dim array of 16-bit words of `precision`
// (ROW_FP16: IEEE half, ROW_BF16: bfloat16): each word widened to its float
// (exact), then pooled as PoolBags pools floats, so the result is bitwise
// PoolBags on the widened rows. `isa` must be Supported16.
void PoolBags16(Isa isa, RowPrecision precision, const uint16_t* weights,
                int dim, bool mean, const int64_t* offsets, const int64_t* ids,
                int64_t bag_begin, int64_t bag_end, int64_t total, float* out,
                int64_t out_stride);

}  // namespace dlrm::embedding::kernels
