// Hand-written AMX bf16 GEMMs for the MLP layers: the accumulators hold 32
// x 32 outputs in fp32 while the reduction runs in blocks of 32, and the
// bias, ReLU and the output's rounding are applied as each block of
// outputs leaves the tiles, so no pass over C follows. B is laid out for
// the tiles first (AmxPackedB). Where AMX cannot run (AmxGemmUsable()
// false) the callers use oneDNN's matmul (dense/bf16.h).
#pragma once

#include <cstdint>

#include "core/aligned.h"
#include "dense/bf16_round.h"

namespace dlrm::dense {

// Whether AmxGemm runs here: AMX usable as the kernel and the hypervisor
// grant it (dense/cpu_isa.h AmxUsable), oneDNN not held below AMX (an
// ONEDNN_MAX_CPU_ISA cap holds these kernels back too), and the
// environment variable DLRM_AMX_GEMM not "0" (which keeps the bf16 layers
// on oneDNN, for comparisons). Decided once per process.
bool AmxGemmUsable();

// A bf16 matrix B [k x n] laid out for the tile products: blocks of 32
// rows (the reduction) by 16 columns, each 16 row pairs x 16 columns x 2
// (a pair of consecutive rows interleaved, the layout TDPBF16PS reads),
// zero past k and n. The blocks of one column block are contiguous over
// the reduction.
class AmxPackedB {
 public:
  // From B stored row-major [k x n] with leading dimension ldb >= n.
  void Pack(const Bf16* b, int64_t k, int64_t n, int64_t ldb);
  // From B = W^T with W stored row-major [n x k], leading dimension ldw >=
  // k (a layer's weights [out x in] for its forward, k = in, n = out).
  void PackTransposed(const Bf16* w, int64_t k, int64_t n, int64_t ldw);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t k_blocks() const { return k_blocks_; }
  int64_t n_blocks() const { return n_blocks_; }
  // The 512 values of block (kb, nb).
  const Bf16* block(int64_t kb, int64_t nb) const {
    return data_.data() + (nb * k_blocks_ + kb) * 512;
  }

 private:
  void Resize(int64_t k, int64_t n);
  // Resizes for B [k x n], then calls fill(k0, n0, block) for each block
  // (its first row and column in B), threaded when there are many.
  template <typename Fill>
  void FillBlocks(int64_t k, int64_t n, Fill fill);
  Bf16* mutable_block(int64_t kb, int64_t nb) {
    return data_.data() + (nb * k_blocks_ + kb) * 512;
  }

  int64_t k_ = 0, n_ = 0, k_blocks_ = 0, n_blocks_ = 0;
  AlignedVector<Bf16> data_;
};

// What AmxGemm does with each output (i, j): u = act(sum + bias[j]), act
// ReLU when `relu`, identity otherwise; u written to pre_f32 unless null;
// v = u * mul[i, j] + add[i, j] (a null mul or add leaves its step out: the
// cross network's x_{l+1} = x_0 * q + x_l, or a residual); v written as
// fp32 to c_f32 (or added to what c_f32 holds, when `accumulate`) and/or
// rounded to bf16 (ToBf16, dense/bf16_round.h) into c_bf16. Every matrix
// has leading dimension ldc; at least one output non-null.
struct AmxEpilogue {
  const float* bias = nullptr;  // [n]; null adds nothing
  bool relu = false;
  float* c_f32 = nullptr;
  Bf16* c_bf16 = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;     // c_f32 += v (c_bf16 gets the sum's rounding)
  float* pre_f32 = nullptr;    // u, before mul and add
  const float* mul = nullptr;  // [m x n] factor
  const float* add = nullptr;  // [m x n] addend
  // The backward's mask pass of the layer below, fused into the product
  // of its output gradient (Linear's MaskedGrad): v = 0 where mask[i, j]
  // (bf16, leading dimension ldc: that layer's ReLU output) is not > 0,
  // before the outputs; c_bf16 also written transposed to c_bf16_t [n x m]
  // (leading dimension ldt); v summed over each block of 32 rows in order
  // into col_sums [ceil(m / 32) x ldc]. Each null leaves its step out.
  const Bf16* mask = nullptr;
  Bf16* c_bf16_t = nullptr;
  int64_t ldt = 0;
  float* col_sums = nullptr;
};

// C [m x n] = act(A [m x k] B + bias) with A bf16 row-major (leading
// dimension lda >= k), B packed (its k and n), the sums in fp32 over the
// reduction's blocks of 32 in order. Each output is summed by one thread
// in the same order whatever m and the thread count, so its bits depend on
// its row of A and on B alone. Threads with OpenMP. Only where
// AmxGemmUsable(); m of 0 does nothing, k of 0 gives act(bias).
void AmxGemm(int64_t m, const Bf16* a, int64_t lda, const AmxPackedB& b,
             const AmxEpilogue& out);

// dst [cols x rows] = src [rows x cols] transposed, bf16, row-major with
// leading dimensions ld_src >= cols and ld_dst >= rows: the A operand of a
// reduction over src's rows (a weight gradient dY^T X). Blocks of 32 rows
// by 16 columns go through AVX-512 registers where the CPU has them
// (interleaved row pairs, then a 16 x 16 transpose of the pairs); the rest
// element by element.
void TransposeBf16(const Bf16* src, int64_t rows, int64_t cols, int64_t ld_src,
                   Bf16* dst, int64_t ld_dst);

// The bf16 backward's mask pass over rows [begin, end) of a ReLU layer
// whose forward kept only its bf16 output y [rows x out]: for each
// element, v = dy if y > 0 (its bits, as the fp32 pass reads them) else
// 0; dyb = ToBf16(v) and sum[c] = the sum of v over the rows in order
// (the bits of the plain loop). AVX-512; only where AmxGemmUsable().
void AmxMaskRows(const float* dy, const Bf16* y, int64_t begin, int64_t end,
                 int out, float* sum, Bf16* dyb);

// The leading dimension for a transposed copy of `rows` rows (the batch of
// a weight gradient's dY^T): rows rounded up to 32 values (64-byte lines)
// plus 32, so the copy's rows are not a multiple of 4 KiB apart. At a
// batch of 2048 they were, and the 16 rows a tile load or the
// transposition touches shared one set of the L1 cache.
inline int64_t AmxTransposedLd(int64_t rows) {
  return (rows + 31) / 32 * 32 + 32;
}

}  // namespace dlrm::dense
