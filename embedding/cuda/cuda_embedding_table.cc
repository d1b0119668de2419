// CudaEmbeddingTable: host <-> device copies and the step counter; the
// kernels take the optimizer's rule from optim/rules.h.
#include "embedding/cuda/cuda_embedding_table.h"

#include <span>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "optim/optimizer.h"

namespace dlrm::embedding::cuda {

absl::Status DeviceSparseFeature::Upload(const data::SparseFeature& feature) {
  num_bags_ = feature.num_bags();
  num_ids_ = static_cast<int64_t>(feature.ids.size());
  RETURN_IF_ERROR(offsets_.Resize(feature.offsets.size()));
  RETURN_IF_ERROR(ids_.Resize(feature.ids.size()));
  RETURN_IF_ERROR(
      offsets_.CopyFromHost(std::span<const int64_t>(feature.offsets)));
  RETURN_IF_ERROR(ids_.CopyFromHost(std::span<const int64_t>(feature.ids)));
  return absl::OkStatus();
}

DeviceBags DeviceSparseFeature::bags() const {
  return DeviceBags{offsets_.data(), ids_.data(), num_bags_, num_ids_};
}

absl::StatusOr<std::unique_ptr<CudaEmbeddingTable>>
CudaEmbeddingTable::FromHost(const EmbeddingTable& table) {
  if (table.dim() > MaxDim(table.dim())) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table.table_index(), ": dim ", table.dim(),
                     " is over the CUDA kernels' limit ", MaxDim(table.dim())));
  }
  std::unique_ptr<CudaEmbeddingTable> t(new CudaEmbeddingTable());
  if (!optim::VisitElementWise(table.optimizer().type(), [](auto) {})) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.type: ", static_cast<int>(table.optimizer().type()),
        " has no CUDA embedding kernel"));
  }
  t->rows_ = table.rows();
  t->dim_ = table.dim();
  t->mean_ = table.pooling() == POOLING_MEAN;
  t->optimizer_ = table.optimizer();
  t->step_ = table.step();
  const size_t elements = static_cast<size_t>(table.rows()) * table.dim();
  ASSIGN_OR_RETURN(t->weights_,
                   dlrm::cuda::DeviceBuffer<float>::Allocate(elements));
  RETURN_IF_ERROR(t->weights_.CopyFromHost(
      std::span<const float>(table.weights(), elements)));
  ASSIGN_OR_RETURN(t->state1_, dlrm::cuda::DeviceBuffer<float>::Allocate(
                                   table.state1().size()));
  RETURN_IF_ERROR(t->state1_.CopyFromHost(
      std::span<const float>(table.state1().data(), table.state1().size())));
  ASSIGN_OR_RETURN(t->state2_, dlrm::cuda::DeviceBuffer<float>::Allocate(
                                   table.state2().size()));
  RETURN_IF_ERROR(t->state2_.CopyFromHost(
      std::span<const float>(table.state2().data(), table.state2().size())));
  return t;
}

absl::Status CudaEmbeddingTable::CopyToHost(EmbeddingTable* table) const {
  if (table->rows() != rows_ || table->dim() != dim_ ||
      table->state1().size() != state1_.size() ||
      table->state2().size() != state2_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyToHost: host table ", table->rows(), " x ",
                     table->dim(), " does not match the device table ", rows_,
                     " x ", dim_, " with its optimizer state"));
  }
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  RETURN_IF_ERROR(weights_.CopyToHost(
      std::span<float>(table->weights(), static_cast<size_t>(rows_) * dim_)));
  RETURN_IF_ERROR(state1_.CopyToHost(
      std::span<float>(table->state1().data(), table->state1().size())));
  RETURN_IF_ERROR(state2_.CopyToHost(
      std::span<float>(table->state2().data(), table->state2().size())));
  table->set_step(step_);
  return absl::OkStatus();
}

absl::Status CudaEmbeddingTable::Forward(const DeviceBags& bags, float* out,
                                         int64_t out_stride,
                                         cudaStream_t stream) const {
  return PoolForward(weights_.data(), rows_, dim_, mean_, bags, out, out_stride,
                     stream);
}

absl::Status CudaEmbeddingTable::BackwardUpdate(const DeviceBags& bags,
                                                const float* grad,
                                                int64_t grad_stride,
                                                cudaStream_t stream) {
  ++step_;
  ASSIGN_OR_RETURN(const optim::AnyStep step,
                   optim::MakeStep(optimizer_, step_));
  return SparseBackwardUpdate(weights_.data(), state1_.data(), state2_.data(),
                              rows_, dim_, mean_, step, bags, grad, grad_stride,
                              &workspace_, stream);
}

}  // namespace dlrm::embedding::cuda
