// CudaEmbeddingTable: host <-> device copies and the step counter; the
// kernels take the optimizer's rule from optim/rules.h.
#include "embedding/cuda/cuda_embedding_table.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "optim/optimizer.h"

namespace dlrm::embedding::cuda {

namespace {

// Copies `count` elements between host and device on `stream` (queued
// after its earlier work); nothing for 0.
template <typename T>
absl::Status CopyAsync(T* dst, const T* src, int64_t count, cudaMemcpyKind kind,
                       cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      dst, src, static_cast<size_t>(count) * sizeof(T), kind, stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status DeviceSparseFeature::Upload(const data::SparseFeature& feature,
                                         cudaStream_t stream) {
  num_bags_ = 0;
  num_ids_ = 0;
  const int64_t offsets = static_cast<int64_t>(feature.offsets.size());
  const int64_t ids = static_cast<int64_t>(feature.ids.size());
  RETURN_IF_ERROR(offsets_.Resize(offsets));
  RETURN_IF_ERROR(ids_.Resize(ids));
  RETURN_IF_ERROR(CopyAsync(offsets_.data(), feature.offsets.data(), offsets,
                            cudaMemcpyHostToDevice, stream));
  RETURN_IF_ERROR(CopyAsync(ids_.data(), feature.ids.data(), ids,
                            cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  num_bags_ = feature.num_bags();
  num_ids_ = ids;
  return absl::OkStatus();
}

DeviceBags DeviceSparseFeature::bags() const {
  return DeviceBags{offsets_.data(), ids_.data(), num_bags_, num_ids_};
}

absl::Status StagedSparseFeature::Upload(const data::SparseFeature& feature,
                                         cudaStream_t stream) {
  const int next = current_ == 0 ? 1 : 0;
  if (current_ >= 0) {
    // Everything queued so far that reads the current slot comes before.
    Slot& old = slots_[current_];
    RETURN_IF_ERROR(old.released.Record(stream));
    old.in_use = true;
  }
  current_ = -1;
  Slot& s = slots_[next];
  if (s.in_use) {
    // The batch before last: normally finished long ago.
    RETURN_IF_ERROR(s.released.Synchronize());
    s.in_use = false;
  }
  if (s.released.get() == nullptr) {
    ASSIGN_OR_RETURN(s.released, dlrm::cuda::CudaEvent::Create());
  }
  const int64_t offsets = static_cast<int64_t>(feature.offsets.size());
  const int64_t ids = static_cast<int64_t>(feature.ids.size());
  RETURN_IF_ERROR(s.staging.Reserve(static_cast<size_t>(offsets + ids)));
  RETURN_IF_ERROR(s.offsets.Resize(offsets));
  RETURN_IF_ERROR(s.ids.Resize(ids));
  std::copy(feature.offsets.begin(), feature.offsets.end(), s.staging.data());
  std::copy(feature.ids.begin(), feature.ids.end(), s.staging.data() + offsets);
  RETURN_IF_ERROR(CopyAsync(s.offsets.data(), s.staging.data(), offsets,
                            cudaMemcpyHostToDevice, stream));
  RETURN_IF_ERROR(CopyAsync(s.ids.data(), s.staging.data() + offsets, ids,
                            cudaMemcpyHostToDevice, stream));
  s.num_bags = feature.num_bags();
  s.num_ids = ids;
  current_ = next;
  return absl::OkStatus();
}

DeviceBags StagedSparseFeature::bags() const {
  if (current_ < 0) return DeviceBags{nullptr, nullptr, 0, 0};
  const Slot& s = slots_[current_];
  return DeviceBags{s.offsets.data(), s.ids.data(), s.num_bags, s.num_ids};
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
  t->SetStateFloats();
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

absl::StatusOr<std::unique_ptr<CudaEmbeddingTable>> CudaEmbeddingTable::Create(
    int table_index, int64_t rows, int dim, Pooling pooling,
    const OptimizerConfig& optimizer) {
  if (rows <= 0 || dim <= 0 || dim > MaxDim(dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_index, ": ", rows, " x ", dim,
        " is not a table the CUDA kernels take (rows > 0, dim in [1, ",
        MaxDim(dim), "])"));
  }
  if (!optim::Visit(optimizer.type(), [](auto) {})) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_index, ": optimizer.type ",
        static_cast<int>(optimizer.type()), " has no CUDA embedding kernel"));
  }
  std::unique_ptr<CudaEmbeddingTable> t(new CudaEmbeddingTable());
  t->rows_ = rows;
  t->dim_ = dim;
  t->mean_ = pooling == POOLING_MEAN;
  t->optimizer_ = optimizer;
  t->SetStateFloats();
  const size_t n = static_cast<size_t>(rows);
  ASSIGN_OR_RETURN(t->weights_, dlrm::cuda::DeviceBuffer<float>::Allocate(
                                    n * static_cast<size_t>(dim)));
  ASSIGN_OR_RETURN(t->state1_, dlrm::cuda::DeviceBuffer<float>::Allocate(
                                   n * t->state_floats_[0]));
  ASSIGN_OR_RETURN(t->state2_, dlrm::cuda::DeviceBuffer<float>::Allocate(
                                   n * t->state_floats_[1]));
  return t;
}

void CudaEmbeddingTable::SetStateFloats() {
  const std::span<const optim::StateArray> arrays =
      optim::SparseState(optimizer_);
  for (size_t k = 0; k < arrays.size() && k < 2; ++k) {
    state_floats_[k] = optim::FloatsPerRow(arrays[k], dim_);
  }
}

absl::Status CudaEmbeddingTable::CheckRows(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin > rows_ - count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows [", begin, ", ", begin + count, ") outside [0, ", rows_, ")"));
  }
  return absl::OkStatus();
}

absl::Status CudaEmbeddingTable::ReadRowRange(int64_t begin, int64_t count,
                                              float* weights, float* state1,
                                              float* state2,
                                              cudaStream_t stream) const {
  RETURN_IF_ERROR(CheckRows(begin, count));
  RETURN_IF_ERROR(CopyAsync(weights, weights_.data() + begin * dim_,
                            count * dim_, cudaMemcpyDeviceToHost, stream));
  float* host[2] = {state1, state2};
  const float* device[2] = {state1_.data(), state2_.data()};
  for (int k = 0; k < 2; ++k) {
    const int64_t n = state_floats_[k];
    RETURN_IF_ERROR(CopyAsync(host[k], device[k] + begin * n, count * n,
                              cudaMemcpyDeviceToHost, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaEmbeddingTable::WriteRowRange(int64_t begin, int64_t count,
                                               const float* weights,
                                               const float* state1,
                                               const float* state2,
                                               cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRows(begin, count));
  RETURN_IF_ERROR(CopyAsync(weights_.data() + begin * dim_, weights,
                            count * dim_, cudaMemcpyHostToDevice, stream));
  const float* host[2] = {state1, state2};
  float* device[2] = {state1_.data(), state2_.data()};
  for (int k = 0; k < 2; ++k) {
    const int64_t n = state_floats_[k];
    RETURN_IF_ERROR(CopyAsync(device[k] + begin * n, host[k], count * n,
                              cudaMemcpyHostToDevice, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaEmbeddingTable::GatherRows(const int64_t* index, int64_t n,
                                            float* weights, float* state1,
                                            float* state2,
                                            cudaStream_t stream) const {
  RETURN_IF_ERROR(cuda::GatherRows(weights_.data(), rows_, dim_, index, n,
                                   weights, stream));
  float* packed[2] = {state1, state2};
  const float* table[2] = {state1_.data(), state2_.data()};
  for (int k = 0; k < 2; ++k) {
    if (state_floats_[k] == 0) continue;
    RETURN_IF_ERROR(cuda::GatherRows(table[k], rows_, state_floats_[k], index,
                                     n, packed[k], stream));
  }
  return absl::OkStatus();
}

absl::Status CudaEmbeddingTable::ScatterRows(const int64_t* index, int64_t n,
                                             const float* weights,
                                             const float* state1,
                                             const float* state2,
                                             cudaStream_t stream) {
  RETURN_IF_ERROR(cuda::ScatterRows(weights, index, n, dim_, weights_.data(),
                                    rows_, stream));
  const float* packed[2] = {state1, state2};
  float* table[2] = {state1_.data(), state2_.data()};
  for (int k = 0; k < 2; ++k) {
    if (state_floats_[k] == 0) continue;
    RETURN_IF_ERROR(cuda::ScatterRows(packed[k], index, n, state_floats_[k],
                                      table[k], rows_, stream));
  }
  return absl::OkStatus();
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
  ASSIGN_OR_RETURN(const optim::AnyStep step,
                   optim::MakeStep(optimizer_, step_ + 1));
  RETURN_IF_ERROR(SparseBackwardUpdate(
      weights_.data(), state1_.data(), state2_.data(), rows_, dim_, mean_, step,
      bags, grad, grad_stride, &workspace_, stream));
  ++step_;
  return absl::OkStatus();
}

}  // namespace dlrm::embedding::cuda
