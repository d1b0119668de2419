// The CUDA dense backend: the MLPs through cuBLASLt / cuBLAS
// (cuda_linear.cc), the interactions, BCE and the dense optimizer as the
// kernels of dense_kernels.cu, on CUDA device 0, one stream. Built when
// CUDA is enabled (DLRM_WITH_CUDA). The float GEMMs run in TF32 unless
// the config's gpu_disable_tf32 is set (GemmOptions::allow_tf32); under
// dense_precision PRECISION_BF16 the MLPs' and the cross network's GEMMs
// take bf16 inputs and accumulate in fp32, as the CPU backend's.
//
// Memory: parameters, gradients, optimizer state and activations live on
// the device. Tables in host memory stay there, so each step copies their
// columns of the interaction input, the dense features and the labels in
// (host to device) from pinned staging, double-buffered so that the host
// fills step k + 1's while step k's copies may still be queued, and their
// interaction gradient out; the loss (read by ReadLoss, which waits for it
// alone) and Predict's logits come back too. The gradients' all-reduce
// buckets are packed into host buffers on a second stream, ordered after
// the backward that made them. With ModelConfig.gpu_cuda_graphs the
// training calls' launch sequences run as CUDA graphs (docs/cuda.md "CUDA
// graphs").
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "dense/backend.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense::cuda {

// The CUDA backend for `config` (normalised; every dense optimizer type).
// FailedPrecondition naming why when no CUDA device is usable (no driver,
// no device); InvalidArgument as DenseOptimizer::Create; Internal (or
// ResourceExhausted for device memory) on CUDA / cuBLAS errors while
// setting up.
absl::StatusOr<std::unique_ptr<DenseBackend>> CreateCudaDenseBackend(
    const ModelConfig& config);

}  // namespace dlrm::dense::cuda
