// The host-memory tier, the table spec's and options' checks (the factory
// that picks a tier is store_factory.cc).
#include "embedding/embedding_store.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status.h"
#include "embedding/row_precision.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {

absl::Status TableSpec::Validate() const {
  if (rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_index, ": rows must be positive, got ", rows));
  }
  if (dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_index, ": dim must be positive, got ", dim));
  }
  if (pooling != POOLING_SUM && pooling != POOLING_MEAN) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table_index, ": pooling must be sum or mean"));
  }
  if (!optim::VisitElementWise(optimizer.type(), [](auto) {})) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table_index, ": optimizer.type ",
                     OptimizerConfig::Type_Name(optimizer.type()),
                     " has no embedding-row rule (optim::ValidateSparse)"));
  }
  if (!RowPrecision_IsValid(precision)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_index, ": precision is invalid, got ", precision));
  }
  if (slice.row_begin < 0 || slice.col_begin < 0 ||
      (slice.table_rows > 0 && slice.row_begin + rows > slice.table_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table_index, ": slice rows [", slice.row_begin,
                     ", ", slice.row_begin + rows, ") outside the table's ",
                     slice.table_rows, " rows"));
  }
  return absl::OkStatus();
}

int StateFloatsPerRow(const OptimizerConfig& optimizer, int dim) {
  return optim::SparseStateFloatsPerRow(optimizer, dim);
}

int64_t TableSpec::RecordFloats() const {
  return dim + StateFloatsPerRow(optimizer, dim);
}

HostStore::HostStore(const TableSpec& spec)
    : spec_(spec),
      table_(spec.table_index, spec.rows, spec.dim, spec.pooling,
             spec.optimizer, spec.seed, spec.slice, spec.precision) {}

StoreCapabilities HostStore::capabilities() const {
  return TierCapabilities(StoreOptions{}, spec_.rows);
}

StoreBytes HostStore::MemoryBytes() const {
  return {.host = TableBytes(table_)};
}

int64_t TableBytes(const EmbeddingTable& table) {
  const int64_t weights = table.rows() * table.dim();
  const int64_t state = table.state1().size() + table.state2().size();
  return weights * WeightBytes(table.precision()) +
         state * static_cast<int64_t>(sizeof(float));
}

absl::Status SaveHostCopy(EmbeddingStore& store, RowsSink& sink) {
  const TableSpec& spec = store.spec();
  auto copy = std::make_unique<HostStore>(spec);
  const int64_t floats = spec.RecordFloats();
  constexpr int64_t kChunkRows = 4096;
  std::vector<float> records;
  for (int64_t begin = 0; begin < spec.rows; begin += kChunkRows) {
    const int64_t count = std::min(kChunkRows, spec.rows - begin);
    records.resize(count * floats);
    RETURN_IF_ERROR(store.ReadRows(begin, count, records.data()));
    RETURN_IF_ERROR(copy->WriteRows(begin, count, records.data()));
  }
  copy->set_step(store.step());
  const EmbeddingTable& rows = copy->table();
  return sink.Tensors(rows, std::move(copy));
}

absl::Status HostStore::Forward(const data::SparseFeature& prepared, float* out,
                                int64_t out_stride) const {
  table_.Forward(prepared, out, out_stride);
  return absl::OkStatus();
}

absl::Status CheckOptimizerChange(const TableSpec& spec,
                                  const OptimizerConfig& optimizer) {
  if (optimizer.type() != spec.optimizer.type()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": the optimizer type cannot change (",
        OptimizerConfig::Type_Name(spec.optimizer.type()), " -> ",
        OptimizerConfig::Type_Name(optimizer.type()), ")"));
  }
  if (optimizer.initial_accumulator() != spec.optimizer.initial_accumulator()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": initial_accumulator cannot change (",
        spec.optimizer.initial_accumulator(), " -> ",
        optimizer.initial_accumulator(), ")"));
  }
  return absl::OkStatus();
}

absl::Status HostStore::SetOptimizer(const OptimizerConfig& optimizer) {
  RETURN_IF_ERROR(CheckOptimizerChange(spec_, optimizer));
  spec_.optimizer = optimizer;
  table_.set_optimizer(optimizer);
  return absl::OkStatus();
}

absl::Status HostStore::BackwardUpdate(const data::SparseFeature& prepared,
                                       const float* grad, int64_t grad_stride) {
  table_.BackwardUpdate(prepared, grad, grad_stride);
  return absl::OkStatus();
}

absl::Status CheckRowRange(const TableSpec& spec, int64_t begin,
                           int64_t count) {
  if (begin < 0 || count < 0 || begin > spec.rows - count) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.table_index, ": rows [", begin, ", ",
                     begin + count, ") outside [0, ", spec.rows, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckBagOffsets(int table_index, const data::SparseFeature& ids) {
  const int64_t n = static_cast<int64_t>(ids.ids.size());
  const bool offsets_ok =
      ids.offsets.empty()
          ? n == 0
          : ids.offsets.front() == 0 && ids.offsets.back() == n &&
                std::is_sorted(ids.offsets.begin(), ids.offsets.end());
  if (!offsets_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_index,
        ": malformed offsets (they must start at 0, never decrease and end "
        "at the ",
        n, " ids)"));
  }
  return absl::OkStatus();
}

absl::Status CheckIdsInRange(int table_index, int64_t rows,
                             const data::SparseFeature& ids) {
  for (size_t p = 0; p < ids.ids.size(); ++p) {
    const int64_t row = ids.ids[p];
    if (row < 0 || row >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", table_index, ": id ", row, " at position ", p,
                       " outside [0, ", rows, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostStore::ReadRows(int64_t begin, int64_t count, float* out) {
  RETURN_IF_ERROR(CheckRowRange(spec_, begin, count));
  const int64_t floats = spec_.RecordFloats();
  for (int64_t i = 0; i < count; ++i) {
    table_.ReadRecord(begin + i, out + i * floats);
  }
  return absl::OkStatus();
}

absl::Status HostStore::WriteRows(int64_t begin, int64_t count,
                                  const float* records) {
  RETURN_IF_ERROR(CheckRowRange(spec_, begin, count));
  const int64_t floats = spec_.RecordFloats();
  for (int64_t i = 0; i < count; ++i) {
    table_.WriteRecord(begin + i, records + i * floats);
  }
  return absl::OkStatus();
}

namespace {

// The fields RocksDbStoreOptions and CacheOptions share: InvalidArgument
// naming `options`' field unless cache_rows is positive and eviction is
// LRU or LFU.
absl::Status CheckCacheRowsAndEviction(absl::string_view options,
                                       int64_t cache_rows,
                                       EvictionPolicy eviction) {
  if (cache_rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        options, ".cache_rows must be positive, got ", cache_rows));
  }
  if (eviction != EvictionPolicy::kLru && eviction != EvictionPolicy::kLfu) {
    return absl::InvalidArgumentError(
        absl::StrCat(options, ".eviction is neither LRU nor LFU"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RocksDbStoreOptions::Validate() const {
  if (path.empty()) {
    return absl::InvalidArgumentError("RocksDbStoreOptions.path is empty");
  }
  RETURN_IF_ERROR(
      CheckCacheRowsAndEviction("RocksDbStoreOptions", cache_rows, eviction));
  if (block_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RocksDbStoreOptions.block_cache_bytes must be >= 0, got ",
                     block_cache_bytes));
  }
  if (bloom_bits_per_key < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RocksDbStoreOptions.bloom_bits_per_key must be >= 0, got ",
        bloom_bits_per_key));
  }
  if (write_buffer_bytes < (int64_t{64} << 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RocksDbStoreOptions.write_buffer_bytes must be >= 65536, got ",
        write_buffer_bytes));
  }
  if (write_retries < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RocksDbStoreOptions.write_retries must be >= 0, got ", write_retries));
  }
  return absl::OkStatus();
}

absl::Status CacheOptions::Validate() const {
  return CheckCacheRowsAndEviction("CacheOptions", cache_rows, eviction);
}

absl::Status StoreOptions::Validate() const {
  switch (kind) {
    case StoreKind::kHost:
      return absl::OkStatus();
    case StoreKind::kRocksDbCache:
      return rocksdb.Validate();
    case StoreKind::kDevice:
      if (device_cache.cache_rows == 0) return absl::OkStatus();
      RETURN_IF_ERROR(device_cache.Validate());
      if (device_cache_backing == StoreKind::kHost) return absl::OkStatus();
      if (device_cache_backing == StoreKind::kRocksDbCache) {
        return rocksdb.Validate();
      }
      return absl::InvalidArgumentError(
          "StoreOptions.device_cache_backing must be kHost or kRocksDbCache");
  }
  return absl::InvalidArgumentError("StoreOptions.kind is unknown");
}

}  // namespace dlrm::embedding
