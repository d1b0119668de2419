// The CUDA dense backend's per-step pieces (cuda_backend.cc): the
// double-buffered pinned staging of a step's inputs, and the keys and
// stream actions of the training calls' CUDA graphs (docs/cuda.md "CUDA
// graphs").
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/cuda_raii.h"
#include "optim/optimizer.h"

namespace dlrm::dense::cuda {

// GraphReplay's actions on one stream.
struct StreamGraphOps {
  using Graph = dlrm::cuda::CudaGraphExec;
  const dlrm::cuda::CudaStream* stream;  // borrowed

  absl::Status BeginCapture() {
    return dlrm::cuda::BeginCapture(stream->get());
  }
  absl::StatusOr<Graph> EndCapture() {
    return Graph::EndCapture(stream->get());
  }
  absl::Status Launch(Graph& graph) { return graph.Launch(stream->get()); }
};

// The training calls whose launch sequences may run as graphs
// (GraphKey::call): keyed by batch size in graphs_, except kUpdate, whose
// one graph (batch 0) is in update_graphs_.
enum class GraphCall {
  kBottomForward,
  kInteractionForward,
  kTopForward,
  kTopBackward,
  kInteractionBackward,
  kBottomBackward,
  kUpdate,
};

// The pinned host staging of one training step's inputs: the interaction
// input the caller fills (the columns of host_columns_ are copied up), the
// dense features, the labels, the loss copied back, and the optimizer's
// constants for Update. Two sets, used by alternate steps, so that the
// host fills step k + 1's while step k's copies may still be queued.
struct StagingSet {
  dlrm::cuda::PinnedBuffer<float> t, x, labels;
  dlrm::cuda::PinnedBuffer<double> loss;
  // optim::PackedStep's bytes (kConstantDoubles).
  dlrm::cuda::PinnedBuffer<double> constants;
  // Recorded on the compute stream after each copy from or into the set
  // is queued (BottomForward's uploads, QueueLoss's labels and loss): once
  // it has completed nothing queued uses the set, so the host may write it
  // (and ReadLoss read its loss). Never recorded: complete.
  dlrm::cuda::CudaEvent done;
  // The same for `constants` (Update's upload). Apart from `done`, so that
  // ReadLoss does not wait for the backward and the update.
  dlrm::cuda::CudaEvent constants_done;
};

// Doubles that hold an optim::PackedStep's bytes.
constexpr size_t kConstantDoubles =
    optim::PackedStep::kMaxBytes / sizeof(double);
static_assert(optim::PackedStep::kMaxBytes % sizeof(double) == 0);

}  // namespace dlrm::dense::cuda
