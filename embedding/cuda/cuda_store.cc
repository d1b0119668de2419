// CudaStore: the id checks, the stream, and records moved between the
// host's interleaved layout (weights then state, per row) and the device
// table's separate arrays through host staging chunks.
#include "embedding/cuda/cuda_store.h"

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
#include "optim/optimizer.h"

namespace dlrm::embedding::cuda {
namespace {

// Floats of records a staging chunk holds (16 MiB): bounds the host memory
// ReadRows / WriteRows and initialisation take, whatever the table's size.
constexpr int64_t kChunkFloats = int64_t{1} << 22;

cudaStream_t AsStream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

}  // namespace

absl::Status CheckDevicePointer(const TableSpec& spec, const void* ptr,
                                const char* what) {
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": ", what, " is null"));
  }
  cudaPointerAttributes attributes = {};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // An argument error, not a kernel fault: clear it.
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": ", what,
        ": cudaPointerGetAttributes failed: ", cudaGetErrorString(err)));
  }
  if (attributes.type != cudaMemoryTypeDevice &&
      attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": ", what,
                     " is host memory; the device tier takes device memory"));
  }
  return absl::OkStatus();
}

absl::Status UseDeviceZero(const TableSpec& spec) {
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec.table_index,
        ": the device tier needs a CUDA device: ", CudaUnavailableReason()));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  return absl::OkStatus();
}

absl::Status CheckKernelLimits(const TableSpec& spec,
                               const data::SparseFeature& ids) {
  const int64_t bags = ids.num_bags();
  const int64_t n = static_cast<int64_t>(ids.ids.size());
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (n > kMax || bags > kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": ", n, " ids in ", bags,
        " bags; the device tier takes at most 2^31 - 1 of each per batch"));
  }
  return absl::OkStatus();
}

CudaStore::CudaStore(const TableSpec& spec) : spec_(spec) {}

CudaStore::~CudaStore() {
  if (table_ != nullptr) cudaStreamSynchronize(AsStream(stream_));
}

absl::StatusOr<std::unique_ptr<CudaStore>> CudaStore::Create(
    const TableSpec& spec, void* stream) {
  RETURN_IF_ERROR(spec.Validate());
  RETURN_IF_ERROR(UseDeviceZero(spec));
  std::unique_ptr<CudaStore> store(new CudaStore(spec));
  if (stream == nullptr) {
    ASSIGN_OR_RETURN(dlrm::cuda::CudaStream own,
                     dlrm::cuda::CudaStream::Create());
    store->owned_stream_ =
        std::make_unique<dlrm::cuda::CudaStream>(std::move(own));
    stream = store->owned_stream_->get();
  }
  store->stream_ = stream;
  store->ids_ = std::make_unique<StagedSparseFeature>();
  ASSIGN_OR_RETURN(store->table_, CudaEmbeddingTable::Create(
                                      spec.table_index, spec.rows, spec.dim,
                                      spec.pooling, spec.optimizer));

  // Every row's initial record, as EmbeddingTable's constructor makes it:
  // InitialValue of the whole table's row and columns this slice covers.
  const int64_t table_rows =
      spec.slice.table_rows > 0 ? spec.slice.table_rows : spec.rows;
  std::vector<float> state(StateFloatsPerRow(spec.optimizer, spec.dim));
  optim::InitialSparseState(spec.optimizer, spec.dim, state.data());
  const int floats1 = store->table_->state_floats(0);
  const int floats2 = store->table_->state_floats(1);
  const int64_t chunk = store->ChunkRows();
  store->SizeStaging(std::min(chunk, spec.rows));
  for (int64_t begin = 0; begin < spec.rows; begin += chunk) {
    const int64_t count = std::min(chunk, spec.rows - begin);
#pragma omp parallel for schedule(static) if (count * spec.dim >= (1 << 17))
    for (int64_t i = 0; i < count; ++i) {
      InitialRow(spec.seed, spec.table_index, table_rows,
                 spec.slice.row_begin + begin + i, spec.slice.col_begin,
                 spec.dim, store->weights_stage_.data() + i * spec.dim);
    }
    std::fill_n(store->state_stage_[0].begin(), count * floats1,
                floats1 > 0 ? state[0] : 0.0f);
    std::fill_n(store->state_stage_[1].begin(), count * floats2,
                floats2 > 0 ? state[floats1] : 0.0f);
    RETURN_IF_ERROR(store->WriteStaged(begin, count));
  }
  return store;
}

int64_t CudaStore::RecordFloats() const {
  return spec_.dim + table_->state_floats(0) + table_->state_floats(1);
}

int64_t CudaStore::ChunkRows() const {
  return std::max<int64_t>(1, kChunkFloats / RecordFloats());
}

void CudaStore::SizeStaging(int64_t rows) {
  const int64_t sizes[3] = {rows * spec_.dim, rows * table_->state_floats(0),
                            rows * table_->state_floats(1)};
  std::vector<float>* stages[3] = {&weights_stage_, &state_stage_[0],
                                   &state_stage_[1]};
  for (int a = 0; a < 3; ++a) {
    if (static_cast<int64_t>(stages[a]->size()) < sizes[a]) {
      stages[a]->resize(sizes[a]);
    }
  }
}

absl::Status CudaStore::WriteStaged(int64_t begin, int64_t count) {
  return table_->WriteRowRange(begin, count, weights_stage_.data(),
                               state_stage_[0].data(), state_stage_[1].data(),
                               AsStream(stream_));
}

absl::StatusOr<const data::SparseFeature*> CudaStore::Prepare(
    const data::SparseFeature& ids) {
  prepared_ = nullptr;
  RETURN_IF_ERROR(CheckKernelLimits(spec_, ids));
  RETURN_IF_ERROR(CheckBagOffsets(spec_.table_index, ids));
  RETURN_IF_ERROR(CheckIdsInRange(spec_.table_index, spec_.rows, ids));
  // Queued behind the previous batch's kernels, which read the other slot:
  // the host does not wait for them.
  RETURN_IF_ERROR(ids_->Upload(ids, AsStream(stream_)));
  prepared_ = &ids;
  return &ids;
}

absl::Status CudaStore::CheckPrepared(
    const data::SparseFeature& prepared) const {
  if (&prepared != prepared_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec_.table_index,
        ": the batch is not the result of the last successful Prepare"));
  }
  return absl::OkStatus();
}

absl::Status CudaStore::Forward(const data::SparseFeature& prepared, float* out,
                                int64_t out_stride) const {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  if (prepared.num_bags() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckDevicePointer(spec_, out, "Forward's out"));
  return table_->Forward(ids_->bags(), out, out_stride, AsStream(stream_));
}

absl::Status CudaStore::BackwardUpdate(const data::SparseFeature& prepared,
                                       const float* grad, int64_t grad_stride) {
  RETURN_IF_ERROR(CheckPrepared(prepared));
  if (!prepared.ids.empty()) {
    RETURN_IF_ERROR(CheckDevicePointer(spec_, grad, "BackwardUpdate's grad"));
  }
  return table_->BackwardUpdate(ids_->bags(), grad, grad_stride,
                                AsStream(stream_));
}

absl::Status CudaStore::Synchronize() {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream_)));
  return absl::OkStatus();
}

absl::Status CudaStore::ForEachChunk(
    int64_t begin, int64_t count,
    absl::FunctionRef<absl::Status(int64_t done, int64_t rows)> chunk) {
  RETURN_IF_ERROR(CheckRowRange(spec_, begin, count));
  const int64_t chunk_rows = ChunkRows();
  SizeStaging(std::min(chunk_rows, count));
  for (int64_t done = 0; done < count; done += chunk_rows) {
    RETURN_IF_ERROR(chunk(done, std::min(chunk_rows, count - done)));
  }
  return absl::OkStatus();
}

absl::Status CudaStore::ReadRows(int64_t begin, int64_t count, float* out) {
  const int64_t floats = RecordFloats();
  const int dim = spec_.dim;
  const int64_t n1 = table_->state_floats(0), n2 = table_->state_floats(1);
  return ForEachChunk(begin, count, [&](int64_t done, int64_t rows) {
    RETURN_IF_ERROR(table_->ReadRowRange(
        begin + done, rows, weights_stage_.data(), state_stage_[0].data(),
        state_stage_[1].data(), AsStream(stream_)));
    for (int64_t i = 0; i < rows; ++i) {
      float* record = out + (done + i) * floats;
      std::copy_n(weights_stage_.data() + i * dim, dim, record);
      std::copy_n(state_stage_[0].data() + i * n1, n1, record + dim);
      std::copy_n(state_stage_[1].data() + i * n2, n2, record + dim + n1);
    }
    return absl::OkStatus();
  });
}

absl::Status CudaStore::PoolReadOnly(const data::SparseFeature& ids, float* out,
                                     int64_t out_stride) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "table ", spec_.table_index,
      ": rows in GPU memory are not read beside the store's stream"));
}

absl::Status CudaStore::WriteRows(int64_t begin, int64_t count,
                                  const float* records) {
  const int64_t floats = RecordFloats();
  const int dim = spec_.dim;
  const int64_t n1 = table_->state_floats(0), n2 = table_->state_floats(1);
  return ForEachChunk(begin, count, [&](int64_t done, int64_t rows) {
    for (int64_t i = 0; i < rows; ++i) {
      const float* record = records + (done + i) * floats;
      std::copy_n(record, dim, weights_stage_.data() + i * dim);
      std::copy_n(record + dim, n1, state_stage_[0].data() + i * n1);
      std::copy_n(record + dim + n1, n2, state_stage_[1].data() + i * n2);
    }
    return WriteStaged(begin + done, rows);
  });
}

int64_t CudaStore::step() const { return table_->step(); }

void CudaStore::set_step(int64_t step) { table_->set_step(step); }

absl::Status CudaStore::SetOptimizer(const OptimizerConfig& optimizer) {
  RETURN_IF_ERROR(CheckOptimizerChange(spec_, optimizer));
  spec_.optimizer = optimizer;
  table_->set_optimizer(optimizer);
  return absl::OkStatus();
}

}  // namespace dlrm::embedding::cuda
