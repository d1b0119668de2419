// The CPU dense backend: the MLPs on oneDNN's sgemm (dense/linear.h), the
// interactions of dense/interaction.h, BCE (dense/loss.h) and
// DenseOptimizer, all in host memory. Every buffer the step hands out is
// the one the kernels use: no staging copies. Under dense_precision
// PRECISION_BF16 (where the CPU has bf16 instructions) the MLPs' and the
// cross network's GEMMs run in bf16 on bf16 copies of the fp32 master
// weights, rewritten after each Update and before the first step or
// prediction after the host view was handed out (a restore may write it).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "dense/backend.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// The CPU backend for `config` (normalised; its device is not looked at),
// at dense::ResolveCpuPrecision(config.dense_precision()).
// InvalidArgument as DenseOptimizer::Create.
absl::StatusOr<std::unique_ptr<DenseBackend>> CreateCpuDenseBackend(
    const ModelConfig& config);

}  // namespace dlrm::dense
