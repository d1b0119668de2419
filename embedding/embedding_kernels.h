// The CPU pooled lookup's inner loop and the sparse update's gradient sum,
// in one version per instruction set, chosen at run time. Each version gives
// the bits of its plain loop (reference::PoolForward in embedding_table.h,
// the loop SumRows describes): the same additions in the same order per
// column; tests/embedding_kernels_test.cc runs every version this CPU has
// against them.
#pragma once

#include <cstdint>

#include "dlrm/config.pb.h"

namespace dlrm::embedding::kernels {

// An instruction set a kernel version is written for.
enum class Isa {
  kPortable,  // GCC vector extensions at the build's baseline (x86-64-v3).
  kAvx512,    // AVX-512F/BW/VL intrinsics: 16-float registers, masked row
              // tails (16-bit ones: BW).
};

// The best version this CPU and OS run (kAvx512 where CPUID reports
// AVX-512F, BW and VL and the OS saves its registers).
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

// The fused sparse update's gradient sum of one unique row (sum pooling):
// out[0, dim) = for each column, 0 plus rows[order[e] * row_stride + c] for
// e in [begin, end), added in that order (the bits of the plain loop that
// zeroes out and adds row by row; begin == end gives zeros), with the sums
// in registers. The rows of order[e + 8] are prefetched while e + 8 <
// prefetch_end (the next unique rows' occurrences follow in `order`).
// `isa` must be Supported.
void SumRows(Isa isa, const float* rows, int64_t row_stride, int dim,
             const int64_t* order, int64_t begin, int64_t end,
             int64_t prefetch_end, float* out);

// PoolBags over a rows x dim array of 16-bit words of `precision`
// (ROW_FP16: IEEE half, ROW_BF16: bfloat16): each word widened to its float
// (exact), then pooled as PoolBags pools floats, so the result is bitwise
// PoolBags on the widened rows. `isa` must be Supported.
void PoolBags16(Isa isa, RowPrecision precision, const uint16_t* weights,
                int dim, bool mean, const int64_t* offsets, const int64_t* ids,
                int64_t bag_begin, int64_t bag_end, int64_t total, float* out,
                int64_t out_stride);

}  // namespace dlrm::embedding::kernels
