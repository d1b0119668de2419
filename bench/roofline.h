// The roofline of the in-process training step (dlrm_bench_train
// --roofline): the host's own ceilings measured in the same run, the GEMM
// rate at every GEMM shape of the step at its precision and the copy
// bandwidth, and each stage's fraction of its ceiling.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/batch.h"
#include "dense/amx_gemm.h"
#include "dlrm/config.pb.h"
#include "model/stage_times.h"

namespace dlrm::bench {

// One GEMM of a training step: row-major C [m x n] = op(A) [m x k] op(B)
// [k x n] (dense::Sgemm's arguments), in `stage`.
struct GemmShape {
  model::StageTimes::Stage stage;
  std::string what;  // e.g. "top_mlp.0 dW"
  char trans_a = 'N', trans_b = 'N';
  int64_t m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * m * n * k; }
};

// The GEMMs of one step of `config` at `batch` samples: the MLPs' layers
// forward (Y = X W^T) and backward (dW = dY^T X, dX = dY W, no dX of the
// bottom MLP's first layer) and, for INTERACTION_DCN, the cross network's
// two maps per layer forward and their four backward GEMMs. The dot
// interaction's per-sample GEMMs are not in it (no single GEMM's ceiling
// applies to them).
std::vector<GemmShape> StepGemms(const ModelConfig& config, int64_t batch);

// Best seconds of one call of `shape` (fp32 Sgemm, or in bf16 the faster
// of Bgemm with fp32 C and, where AmxGemmUsable, the AMX kernel with its
// B packed in the call: dense/amx_gemm.h) over `repeats` calls of each
// after two untimed ones, on the calling thread's OpenMP team.
double TimeGemm(const GemmShape& shape, bool bf16, int repeats);

// The AMX kernel on `shape` as the layers call it (dense/amx_gemm.h): B
// (op(B) as stored, ldb as for Bgemm) packed into `packed`, then C [m x n]
// (fp32, ldc n) from A row-major [m x k] (for 'T', the transposed copy a
// layer writes). Only where dense::AmxGemmUsable().
void AmxGemmAsLayers(const GemmShape& shape, const dense::Bf16* a,
                     const dense::Bf16* b, dense::AmxPackedB* packed, float* c);

// The host's copy bandwidth: bytes read plus bytes written per second (a
// memcpy of `bytes` split over the OpenMP threads), best of `repeats`.
double CopyBandwidth(int64_t bytes, int repeats);

// The bytes the embedding stages move at least, from the ids of `batch`:
// the lookup reads every id's row and writes every pooled vector; the
// update reads and writes each distinct row and its optimizer state once
// and reads each pooled gradient.
struct EmbeddingBytes {
  double lookup = 0;
  double update = 0;
};
EmbeddingBytes StepEmbeddingBytes(const ModelConfig& config,
                                  const data::Batch& batch);

// What a stage reached of its ceiling.
struct StageRoof {
  const char* stage;
  double measured_ms = 0;  // per step
  double ceiling_ms = 0;   // at the host's ceiling (0: none applies)
  double fraction = 0;     // ceiling_ms / measured_ms (0: none applies)
  std::string bound;       // "gemm", "copy" or "" (no ceiling)
};

// Each stage's measured time against the ceiling of its GEMMs (the sum of
// TimeGemm over its shapes) or of its bytes at `copy_bytes_per_s`.
std::vector<StageRoof> Roofline(
    const std::array<double, model::StageTimes::kNumStages>& stage_seconds,
    const std::vector<GemmShape>& gemms,
    const std::vector<double>& gemm_seconds, const EmbeddingBytes& bytes,
    double copy_bytes_per_s);

}  // namespace dlrm::bench
