// DeviceSlots: records moved between the host's interleaved layout (weights
// then state, per record) and the slot table's separate arrays through
// pinned staging and the GatherRows / ScatterRows kernels; the device
// tier's cached store.
#include "embedding/cuda/device_slots.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_raii.h"
#include "core/cuda_status.h"
#include "core/device.h"
#include "core/status.h"
#include "embedding/cuda/cuda_embedding_table.h"
#include "embedding/cuda/cuda_store.h"

namespace dlrm::embedding::cuda {
namespace {

// Floats of records one staging chunk holds (16 MiB).
constexpr int64_t kChunkFloats = int64_t{1} << 22;

}  // namespace

struct DeviceSlots::Impl {
  std::unique_ptr<CudaEmbeddingTable> table;
  StagedSparseFeature batch;
  // The stream every call uses; `owned` when the slots made it.
  cudaStream_t stream = nullptr;
  dlrm::cuda::CudaStream owned;
  // One chunk of records, packed as the table's arrays (rows x dim weights,
  // then rows x state_floats(0), then rows x state_floats(1)): on the host
  // (pinned) and on the device; and the chunk's slot numbers.
  dlrm::cuda::PinnedBuffer<float> host_packed;
  dlrm::cuda::PinnedBuffer<int64_t> host_index;
  dlrm::cuda::DeviceBuffer<float> packed;
  dlrm::cuda::DeviceBuffer<int64_t> index;
  bool has_batch = false;
};

DeviceSlots::DeviceSlots(const TableSpec& spec)
    : spec_(spec), impl_(std::make_unique<Impl>()) {}

DeviceSlots::~DeviceSlots() {
  if (impl_->table != nullptr) cudaStreamSynchronize(impl_->stream);
}

absl::StatusOr<std::unique_ptr<DeviceSlots>> DeviceSlots::Create(
    const TableSpec& spec, int64_t slots, void* stream) {
  RETURN_IF_ERROR(spec.Validate());
  if (slots <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": slots must be positive, got ", slots));
  }
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec.table_index,
        ": the device tier needs a CUDA device: ", CudaUnavailableReason()));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  std::unique_ptr<DeviceSlots> d(new DeviceSlots(spec));
  Impl& impl = *d->impl_;
  if (stream == nullptr) {
    ASSIGN_OR_RETURN(impl.owned, dlrm::cuda::CudaStream::Create());
    impl.stream = impl.owned.get();
  } else {
    impl.stream = static_cast<cudaStream_t>(stream);
  }
  ASSIGN_OR_RETURN(impl.table,
                   CudaEmbeddingTable::Create(spec.table_index, slots, spec.dim,
                                              spec.pooling, spec.optimizer));
  return d;
}

int64_t DeviceSlots::slots() const { return impl_->table->rows(); }

int64_t DeviceSlots::ChunkRows() const {
  const int64_t floats =
      spec_.dim + impl_->table->state_floats(0) + impl_->table->state_floats(1);
  return std::max<int64_t>(1, kChunkFloats / floats);
}

absl::Status DeviceSlots::StageIndex(const int64_t* slots, int64_t rows) {
  Impl& impl = *impl_;
  const int64_t floats =
      spec_.dim + impl.table->state_floats(0) + impl.table->state_floats(1);
  const size_t n = static_cast<size_t>(rows);
  RETURN_IF_ERROR(impl.host_packed.Reserve(n * floats));
  RETURN_IF_ERROR(impl.host_index.Reserve(n));
  RETURN_IF_ERROR(impl.packed.Resize(n * floats));
  RETURN_IF_ERROR(impl.index.Resize(n));
  std::copy_n(slots, n, impl.host_index.data());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      impl.index.data(), impl.host_index.data(), n * sizeof(int64_t),
      cudaMemcpyHostToDevice, impl.stream));
  return absl::OkStatus();
}

absl::Status DeviceSlots::ReadSlots(const int64_t* slots, int64_t n,
                                    float* records) {
  Impl& impl = *impl_;
  const int64_t dim = spec_.dim;
  const int64_t n1 = impl.table->state_floats(0);
  const int64_t n2 = impl.table->state_floats(1);
  const int64_t floats = dim + n1 + n2;
  const int64_t chunk = ChunkRows();
  for (int64_t done = 0; done < n; done += chunk) {
    const int64_t rows = std::min(chunk, n - done);
    // The previous chunk's copy out of the staging is done (synchronised
    // below), so the staging may be reused or grown.
    RETURN_IF_ERROR(StageIndex(slots + done, rows));
    float* w = impl.packed.data();
    float* s1 = w + rows * dim;
    float* s2 = s1 + rows * n1;
    RETURN_IF_ERROR(impl.table->GatherRows(impl.index.data(), rows, w,
                                           n1 > 0 ? s1 : nullptr,
                                           n2 > 0 ? s2 : nullptr, impl.stream));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(impl.host_packed.data(), w,
                        static_cast<size_t>(rows * floats) * sizeof(float),
                        cudaMemcpyDeviceToHost, impl.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl.stream));
    const float* hw = impl.host_packed.data();
    const float* h1 = hw + rows * dim;
    const float* h2 = h1 + rows * n1;
    for (int64_t i = 0; i < rows; ++i) {
      float* record = records + (done + i) * floats;
      std::copy_n(hw + i * dim, dim, record);
      std::copy_n(h1 + i * n1, n1, record + dim);
      std::copy_n(h2 + i * n2, n2, record + dim + n1);
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceSlots::WriteSlots(const int64_t* slots, int64_t n,
                                     const float* records) {
  Impl& impl = *impl_;
  const int64_t dim = spec_.dim;
  const int64_t n1 = impl.table->state_floats(0);
  const int64_t n2 = impl.table->state_floats(1);
  const int64_t floats = dim + n1 + n2;
  const int64_t chunk = ChunkRows();
  for (int64_t done = 0; done < n; done += chunk) {
    const int64_t rows = std::min(chunk, n - done);
    // The previous chunk's copies from the staging are done (synchronised
    // below), so it may be refilled.
    RETURN_IF_ERROR(StageIndex(slots + done, rows));
    float* hw = impl.host_packed.data();
    float* h1 = hw + rows * dim;
    float* h2 = h1 + rows * n1;
    for (int64_t i = 0; i < rows; ++i) {
      const float* record = records + (done + i) * floats;
      std::copy_n(record, dim, hw + i * dim);
      std::copy_n(record + dim, n1, h1 + i * n1);
      std::copy_n(record + dim + n1, n2, h2 + i * n2);
    }
    float* w = impl.packed.data();
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        w, hw, static_cast<size_t>(rows * floats) * sizeof(float),
        cudaMemcpyHostToDevice, impl.stream));
    const float* s1 = w + rows * dim;
    const float* s2 = s1 + rows * n1;
    RETURN_IF_ERROR(impl.table->ScatterRows(
        impl.index.data(), rows, w, n1 > 0 ? s1 : nullptr,
        n2 > 0 ? s2 : nullptr, impl.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl.stream));
  }
  return absl::OkStatus();
}

absl::Status DeviceSlots::SetBatch(const data::SparseFeature& slot_ids) {
  impl_->has_batch = false;
  const int64_t bags = slot_ids.num_bags();
  const int64_t n = static_cast<int64_t>(slot_ids.ids.size());
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (n > kMax || bags > kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec_.table_index, ": ", n, " ids in ", bags,
        " bags; the device tier takes at most 2^31 - 1 of each per batch"));
  }
  // Queued behind the previous batch's kernels, which read the other id
  // slot (StagedSparseFeature): the host does not wait for them.
  RETURN_IF_ERROR(impl_->batch.Upload(slot_ids, impl_->stream));
  impl_->has_batch = true;
  return absl::OkStatus();
}

absl::Status DeviceSlots::Forward(float* out, int64_t out_stride) const {
  if (!impl_->has_batch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec_.table_index, ": no batch uploaded to the slots"));
  }
  if (impl_->batch.bags().num_bags == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckDevicePointer(spec_, out, "Forward's out"));
  return impl_->table->Forward(impl_->batch.bags(), out, out_stride,
                               impl_->stream);
}

absl::Status DeviceSlots::BackwardUpdate(const float* grad,
                                         int64_t grad_stride) {
  if (!impl_->has_batch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec_.table_index, ": no batch uploaded to the slots"));
  }
  if (impl_->batch.bags().num_ids > 0) {
    RETURN_IF_ERROR(CheckDevicePointer(spec_, grad, "BackwardUpdate's grad"));
  }
  return impl_->table->BackwardUpdate(impl_->batch.bags(), grad, grad_stride,
                                      impl_->stream);
}

absl::Status DeviceSlots::Synchronize() {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

int64_t DeviceSlots::step() const { return impl_->table->step(); }

void DeviceSlots::set_step(int64_t step) { impl_->table->set_step(step); }

absl::StatusOr<std::unique_ptr<CachedStore>> CreateDeviceCachedStore(
    const TableSpec& spec, const CacheOptions& cache, void* stream,
    std::unique_ptr<EmbeddingStore> backing) {
  RETURN_IF_ERROR(spec.Validate());
  RETURN_IF_ERROR(cache.Validate());
  // More slots than rows could never be used.
  CacheOptions options = cache;
  options.cache_rows = std::min(cache.cache_rows, spec.rows);
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceSlots> slots,
                   DeviceSlots::Create(spec, options.cache_rows, stream));
  if (backing == nullptr) backing = std::make_unique<HostStore>(spec);
  return CachedStore::Create(spec, options, std::move(slots),
                             std::move(backing));
}

}  // namespace dlrm::embedding::cuda
