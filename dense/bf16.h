// bf16 arithmetic for the dense part's PRECISION_BF16
// (proto/dlrm/config.proto) on the CPU: array conversions from fp32 (the
// scalar rounding, ToBf16, is dense/bf16_round.h's, shared with the CUDA
// kernels), GEMMs with bf16 inputs and fp32 accumulation on oneDNN's
// matmul, and whether this CPU runs them natively.
#pragma once

#include <cstdint>
#include <string>

#include "dense/bf16_round.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// out[i] = ToBf16(in[i]) for i in [0, n), threaded with OpenMP for large n.
void ToBf16(const float* in, int64_t n, Bf16* out);

// Row-major C [m x n] = op(A) [m x k] op(B) [k x n] + beta * C with bf16 A
// and B, accumulated in fp32, as Sgemm (dense/linear.h): op 'N' or 'T',
// nothing for m or n of 0, k of 0 gives beta * C. On oneDNN's matmul
// (avx512_core_bf16 or AMX kernels where the CPU has them), primitives
// cached per shape and thread. A oneDNN error is a programming error: it
// aborts naming the call.
void Bgemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
           const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb, float beta,
           float* c, int64_t ldc);
// The same with C written as bf16 (C = op(A) op(B), the fp32 sum rounded
// once).
void BgemmToBf16(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
                 const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb,
                 Bf16* c, int64_t ldc);

// A bf16 layer's forward in one oneDNN call: C [m x n] = act(A B^T + bias)
// with A [m x k] and B [n x k] bf16, row-major (B as stored is op 'T'), the
// fp32 bias [n] added to every row and act ReLU when `relu` (identity
// otherwise), as GEMM post-ops on the fp32 sums; C written as fp32 to c_f32
// or rounded once to bf16 (round to nearest even) into c_bf16: exactly one
// of the two is non-null. Nothing for m or n of 0; k of 0 gives act(bias).
void BgemmBiasAct(int64_t m, int64_t n, int64_t k, const Bf16* a, int64_t lda,
                  const Bf16* b, int64_t ldb, const float* bias, bool relu,
                  float* c_f32, Bf16* c_bf16, int64_t ldc);

// The oneDNN implementation Bgemm runs for this shape (dense operands),
// e.g. "brg:avx512_core_bf16"; "ref:any" would be the slow reference path.
std::string BgemmImplementation(char trans_a, char trans_b, int64_t m,
                                int64_t n, int64_t k);

// Whether this CPU has bf16 dot-product instructions (avx512_bf16; AMX
// CPUs have them too) and oneDNN may use them (ONEDNN_MAX_CPU_ISA below
// AVX512_CORE_BF16 forbids it).
bool CpuHasBf16();

}  // namespace dlrm::dense
