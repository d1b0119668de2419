// The CPU dense backend: the MLPs on oneDNN's sgemm (dense/linear.h), the
// interactions of dense/interaction.h, BCE (dense/loss.h) and
// DenseOptimizer, all in host memory. Every buffer the step hands out is
// the one the kernels use: no staging copies.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "dense/backend.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// The CPU backend for `config` (normalised; its device is not looked at).
// InvalidArgument as DenseOptimizer::Create.
absl::StatusOr<std::unique_ptr<DenseBackend>> CreateCpuDenseBackend(
    const ModelConfig& config);

}  // namespace dlrm::dense
