// DeviceSlots: records moved between the host's interleaved layout (weights
// then state, per record) and the slot table's separate arrays through
// pinned staging and the GatherRows / ScatterRows kernels, or between a
// mapped host table's arrays and the slots with the LoadRecords /
// StoreRecords kernels; the device tier's cached store.
#include "embedding/cuda/device_slots.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_raii.h"
#include "core/cuda_status.h"
#include "core/device.h"
#include "core/status.h"
#include "embedding/cuda/cuda_embedding_table.h"
#include "embedding/cuda/cuda_store.h"
#include "embedding/cuda/embedding_kernels.h"

namespace dlrm::embedding::cuda {
namespace {

// Floats of records one staging chunk holds (16 MiB).
constexpr int64_t kChunkFloats = int64_t{1} << 22;

// The slot table's arrays as the record kernels take them.
RecordArrays ArraysOf(CudaEmbeddingTable& table) {
  RecordArrays a;
  a.weights = table.weights();
  a.state1 = table.state(0);
  a.state2 = table.state(1);
  a.rows = table.rows();
  a.dim = table.dim();
  a.state1_floats = table.state_floats(0);
  a.state2_floats = table.state_floats(1);
  return a;
}

// A record of the slot table: dim weights, then the floats of its two
// state arrays (state_floats(0), state_floats(1)).
struct RecordFloats {
  int64_t dim, state1, state2, total;
};
RecordFloats RecordFloatsOf(const CudaEmbeddingTable& table) {
  const int64_t dim = table.dim(), n1 = table.state_floats(0),
                n2 = table.state_floats(1);
  return {dim, n1, n2, dim + n1 + n2};
}

}  // namespace

struct DeviceSlots::Impl {
  std::unique_ptr<CudaEmbeddingTable> table;
  StagedSparseFeature batch;
  // The stream every call uses; `owned` when the slots made it.
  cudaStream_t stream = nullptr;
  dlrm::cuda::CudaStream owned;
  // ReadSlots / WriteSlots' chunks of records, two used in turn: each
  // packed as the table's arrays (rows x dim weights, then rows x
  // state_floats(0), then rows x state_floats(1)) on the host (pinned) and
  // on the device, with its slot numbers. `done` is recorded after the last
  // queued work that uses the chunk's host buffers, which are not refilled,
  // reallocated or read before it has passed (an event never recorded has
  // passed).
  struct Chunk {
    dlrm::cuda::PinnedBuffer<float> host_packed;
    dlrm::cuda::PinnedBuffer<int64_t> host_index;
    dlrm::cuda::DeviceBuffer<float> packed;
    dlrm::cuda::DeviceBuffer<int64_t> index;
    dlrm::cuda::CudaEvent done;
  };
  Chunk chunks[2];
  bool has_batch = false;
  // The mapped host table (MapHostTable), its arrays' registrations and
  // the arrays as the kernels address them.
  const EmbeddingTable* mapped = nullptr;
  std::vector<dlrm::cuda::HostRegistration> registrations;
  RecordArrays mapped_arrays;
  // LoadRows / StoreRows' row and slot numbers, in two pinned buffers used
  // in turn: buffer k is refilled only once `uploaded` (recorded after its
  // last upload was queued) has passed.
  struct IndexBuffer {
    dlrm::cuda::PinnedBuffer<int64_t> host;
    dlrm::cuda::DeviceBuffer<int64_t> device;
    dlrm::cuda::CudaEvent uploaded;
  };
  IndexBuffer pairs[2];
  int next_pairs = 0;
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
  RETURN_IF_ERROR(UseDeviceZero(spec));
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
  for (Impl::IndexBuffer& b : impl.pairs) {
    ASSIGN_OR_RETURN(b.uploaded, dlrm::cuda::CudaEvent::Create());
  }
  for (Impl::Chunk& c : impl.chunks) {
    ASSIGN_OR_RETURN(c.done, dlrm::cuda::CudaEvent::Create());
  }
  return d;
}

int64_t DeviceSlots::slots() const { return impl_->table->rows(); }

int64_t DeviceSlots::ChunkRows() const {
  return std::max<int64_t>(1,
                           kChunkFloats / RecordFloatsOf(*impl_->table).total);
}

absl::Status DeviceSlots::WaitForChunk(int k) {
  return impl_->chunks[k].done.Synchronize();
}

absl::Status DeviceSlots::StageIndex(int k, const int64_t* slots,
                                     int64_t rows) {
  Impl& impl = *impl_;
  Impl::Chunk& c = impl.chunks[k];
  // The chunk's last use is done: its buffers may be refilled or grown.
  RETURN_IF_ERROR(WaitForChunk(k));
  const int64_t floats = RecordFloatsOf(*impl.table).total;
  const size_t n = static_cast<size_t>(rows);
  RETURN_IF_ERROR(c.host_packed.Reserve(n * floats));
  RETURN_IF_ERROR(c.host_index.Reserve(n));
  // Growing frees with cudaFree, which waits for the device: no queued
  // kernel still reads the old memory.
  RETURN_IF_ERROR(c.packed.Resize(n * floats));
  RETURN_IF_ERROR(c.index.Resize(n));
  std::copy_n(slots, n, c.host_index.data());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(c.index.data(), c.host_index.data(),
                                       n * sizeof(int64_t),
                                       cudaMemcpyHostToDevice, impl.stream));
  // Recorded again after the chunk's records are queued; this covers a call
  // that fails in between.
  return c.done.Record(impl.stream);
}

absl::Status DeviceSlots::ForEachChunk(
    const int64_t* slots, int64_t n,
    absl::FunctionRef<absl::Status(int k, int64_t done, int64_t rows)> chunk) {
  const int64_t chunk_rows = ChunkRows();
  for (int64_t done = 0, j = 0; done < n; done += chunk_rows, ++j) {
    const int k = static_cast<int>(j % 2);
    const int64_t rows = std::min(chunk_rows, n - done);
    RETURN_IF_ERROR(StageIndex(k, slots + done, rows));
    RETURN_IF_ERROR(chunk(k, done, rows));
  }
  return absl::OkStatus();
}

absl::Status DeviceSlots::ReadSlots(const int64_t* slots, int64_t n,
                                    float* records) {
  Impl& impl = *impl_;
  const RecordFloats f = RecordFloatsOf(*impl.table);
  const int64_t dim = f.dim, n1 = f.state1, n2 = f.state2;
  // Unpacks chunk `k` (rows [begin, begin + rows) of the call) into
  // `records` once its copy out has passed.
  auto unpack = [&](int k, int64_t begin, int64_t rows) -> absl::Status {
    RETURN_IF_ERROR(WaitForChunk(k));
    const float* hw = impl.chunks[k].host_packed.data();
    const float* h1 = hw + rows * dim;
    const float* h2 = h1 + rows * n1;
    for (int64_t i = 0; i < rows; ++i) {
      float* record = records + (begin + i) * f.total;
      std::copy_n(hw + i * dim, dim, record);
      std::copy_n(h1 + i * n1, n1, record + dim);
      std::copy_n(h2 + i * n2, n2, record + dim + n1);
    }
    return absl::OkStatus();
  };
  // Chunk j is queued, then the host unpacks chunk j - 1 while it runs
  // (chunk j - 2 used chunk j's buffers and was unpacked already).
  int last = -1;
  int64_t last_begin = 0, last_rows = 0;
  RETURN_IF_ERROR(ForEachChunk(
      slots, n, [&](int k, int64_t done, int64_t rows) -> absl::Status {
        Impl::Chunk& c = impl.chunks[k];
        float* w = c.packed.data();
        float* s1 = w + rows * dim;
        float* s2 = s1 + rows * n1;
        RETURN_IF_ERROR(impl.table->GatherRows(
            c.index.data(), rows, w, n1 > 0 ? s1 : nullptr,
            n2 > 0 ? s2 : nullptr, impl.stream));
        CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(c.host_packed.data(), w,
                            static_cast<size_t>(rows * f.total) * sizeof(float),
                            cudaMemcpyDeviceToHost, impl.stream));
        RETURN_IF_ERROR(c.done.Record(impl.stream));
        if (last >= 0) RETURN_IF_ERROR(unpack(last, last_begin, last_rows));
        last = k;
        last_begin = done;
        last_rows = rows;
        return absl::OkStatus();
      }));
  if (last >= 0) RETURN_IF_ERROR(unpack(last, last_begin, last_rows));
  return absl::OkStatus();
}

absl::Status DeviceSlots::WriteSlots(const int64_t* slots, int64_t n,
                                     const float* records) {
  Impl& impl = *impl_;
  const RecordFloats f = RecordFloatsOf(*impl.table);
  const int64_t dim = f.dim, n1 = f.state1, n2 = f.state2;
  // The host packs chunk j while chunk j - 1's copy and scatter run (its
  // StageIndex waited for chunk j - 2's copy from these buffers); the call
  // returns once the last is queued (`records` are in the pinned chunks by
  // then).
  return ForEachChunk(
      slots, n, [&](int k, int64_t done, int64_t rows) -> absl::Status {
        Impl::Chunk& c = impl.chunks[k];
        float* hw = c.host_packed.data();
        float* h1 = hw + rows * dim;
        float* h2 = h1 + rows * n1;
        for (int64_t i = 0; i < rows; ++i) {
          const float* record = records + (done + i) * f.total;
          std::copy_n(record, dim, hw + i * dim);
          std::copy_n(record + dim, n1, h1 + i * n1);
          std::copy_n(record + dim + n1, n2, h2 + i * n2);
        }
        float* w = c.packed.data();
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
            w, hw, static_cast<size_t>(rows * f.total) * sizeof(float),
            cudaMemcpyHostToDevice, impl.stream));
        const float* s1 = w + rows * dim;
        const float* s2 = s1 + rows * n1;
        RETURN_IF_ERROR(impl.table->ScatterRows(
            c.index.data(), rows, w, n1 > 0 ? s1 : nullptr,
            n2 > 0 ? s2 : nullptr, impl.stream));
        return c.done.Record(impl.stream);
      });
}

bool DeviceSlots::MapHostTable(EmbeddingTable& table) {
  Impl& impl = *impl_;
  // No queued copy may still use the arrays of a table mapped before.
  if (!impl.registrations.empty()) {
    cudaStreamSynchronize(impl.stream);
  }
  impl.registrations.clear();
  impl.mapped = nullptr;
  impl.mapped_arrays = RecordArrays{};
  if (table.dim() != spec_.dim ||
      table.state_floats(0) != impl.table->state_floats(0) ||
      table.state_floats(1) != impl.table->state_floats(1)) {
    return false;
  }
  RecordArrays arrays;
  arrays.rows = table.rows();
  arrays.dim = table.dim();
  arrays.state1_floats = table.state_floats(0);
  arrays.state2_floats = table.state_floats(1);
  float* host[3] = {table.weights(), table.state1().data(),
                    table.state2().data()};
  const size_t floats[3] = {static_cast<size_t>(table.rows()) * table.dim(),
                            table.state1().size(), table.state2().size()};
  float** device[3] = {&arrays.weights, &arrays.state1, &arrays.state2};
  // The arrays' page ranges, those that share a page merged into one:
  // cudaHostRegister refuses a page that is registered already, and the
  // arrays are 64-byte aligned, not page-aligned.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (int k = 0; k < 3; ++k) {
    if (floats[k] == 0) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(host[k]);
    const uintptr_t end = begin + floats[k] * sizeof(float);
    ranges.emplace_back(begin / page * page, (end + page - 1) / page * page);
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first < merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  for (const auto& [begin, end] : merged) {
    absl::StatusOr<dlrm::cuda::HostRegistration> r =
        dlrm::cuda::HostRegistration::Register(reinterpret_cast<void*>(begin),
                                               end - begin);
    if (!r.ok()) {
      std::fprintf(stderr,
                   "dlrm: table %d: the device cache's host tier cannot be "
                   "pinned and mapped (%s); its rows move through staged "
                   "copies\n",
                   spec_.table_index, r.status().ToString().c_str());
      impl.registrations.clear();
      return false;
    }
    impl.registrations.push_back(std::move(r).value());
  }
  // Each array's device address: its offset in the range that holds it.
  for (int k = 0; k < 3; ++k) {
    if (floats[k] == 0) continue;
    const uintptr_t at = reinterpret_cast<uintptr_t>(host[k]);
    for (const dlrm::cuda::HostRegistration& r : impl.registrations) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(r.host_pointer());
      if (at >= begin && at < begin + r.bytes()) {
        *device[k] = reinterpret_cast<float*>(
            static_cast<char*>(r.device_pointer()) + (at - begin));
      }
    }
  }
  impl.mapped = &table;
  impl.mapped_arrays = arrays;
  return true;
}

absl::Status DeviceSlots::CheckMapped(const EmbeddingTable& table) const {
  if (&table != impl_->mapped) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", table.table_index(),
                     ": not the host table mapped into the device slots"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const int64_t*> DeviceSlots::UploadPairs(const int64_t* a,
                                                        const int64_t* b,
                                                        int64_t n) {
  Impl& impl = *impl_;
  Impl::IndexBuffer& buffer = impl.pairs[impl.next_pairs];
  impl.next_pairs ^= 1;
  // Its last upload has read the pinned buffer: it may be refilled (or
  // reallocated).
  RETURN_IF_ERROR(buffer.uploaded.Synchronize());
  const size_t count = 2 * static_cast<size_t>(n);
  RETURN_IF_ERROR(buffer.host.Reserve(count));
  // Grows with cudaFree / cudaMalloc, which wait for the device: no queued
  // kernel still reads the old memory.
  RETURN_IF_ERROR(buffer.device.Resize(count));
  std::copy_n(a, n, buffer.host.data());
  std::copy_n(b, n, buffer.host.data() + n);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer.device.data(), buffer.host.data(),
                                       count * sizeof(int64_t),
                                       cudaMemcpyHostToDevice, impl.stream));
  RETURN_IF_ERROR(buffer.uploaded.Record(impl.stream));
  return buffer.device.data();
}

absl::Status DeviceSlots::LoadRows(const EmbeddingTable& table,
                                   const int64_t* rows, const int64_t* slots,
                                   int64_t n) {
  RETURN_IF_ERROR(CheckMapped(table));
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t* index, UploadPairs(rows, slots, n));
  Impl& impl = *impl_;
  const RecordArrays device_slots = ArraysOf(*impl.table);
  return LoadRecords(impl.mapped_arrays, index, device_slots, index + n, n,
                     impl.stream);
}

absl::Status DeviceSlots::StoreRows(const int64_t* slots, const int64_t* rows,
                                    int64_t n, EmbeddingTable& table) {
  RETURN_IF_ERROR(CheckMapped(table));
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t* index, UploadPairs(slots, rows, n));
  Impl& impl = *impl_;
  const RecordArrays device_slots = ArraysOf(*impl.table);
  return StoreRecords(device_slots, index, impl.mapped_arrays, index + n, n,
                      impl.stream);
}

absl::Status DeviceSlots::SetBatch(const data::SparseFeature& slot_ids) {
  impl_->has_batch = false;
  RETURN_IF_ERROR(CheckKernelLimits(spec_, slot_ids));
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

void DeviceSlots::set_optimizer(const OptimizerConfig& optimizer) {
  impl_->table->set_optimizer(optimizer);
}

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
