// The tiers' factory: a table's StoreOptions from its config
// (StoreOptionsFor), what each tier does (TierCapabilities), the bytes it
// plans to hold by place (PlannedShardBytes), and
// CreateEmbeddingStore, which builds the store of a StoreKind (host memory,
// RocksDB behind a host cache, device memory, a device cache over host
// memory or RocksDB; any of them behind a dynamic table's id map). In a file of
// its own, apart from the tiers, so that code using only the host or device
// tier (the CUDA tests) does not link RocksDB.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/device.h"
#include "core/status.h"
#include "embedding/dynamic_ids.h"
#include "embedding/dynamic_store.h"
#include "embedding/embedding_store.h"
#include "embedding/planned_bytes.h"
#include "embedding/rocksdb_store.h"
#include "embedding/sharding_memory.h"

#if defined(DLRM_WITH_CUDA)
#include "embedding/cuda/cuda_store.h"
#include "embedding/cuda/device_slots.h"
#endif

namespace dlrm::embedding {

StoreCapabilities TierCapabilities(const StoreOptions& options, int64_t rows) {
  StoreCapabilities c;
  switch (options.kind) {
    case StoreKind::kHost:
      c.read_beside_step = true;
      return c;
    case StoreKind::kRocksDbCache:
      c.prefetch = true;
      c.read_beside_step = true;
      c.cache_rows = std::min(rows, options.rocksdb.cache_rows);
      c.checkpoint = CheckpointForm::kDatabase;
      return c;
    case StoreKind::kDevice:
      // Read through the step's stream only; a device cache is saved
      // through ReadRows, whatever tier is behind it.
      c.cache_rows = std::min(rows, options.device_cache.cache_rows);
      c.device_cache = c.cache_rows > 0;
      return c;
  }
  return c;
}

StoreOptions StoreOptionsFor(const TableConfig& table,
                             const RocksDbConfig& rocksdb, int64_t rows) {
  const EvictionPolicy eviction = rocksdb.eviction() == RocksDbConfig::LFU
                                      ? EvictionPolicy::kLfu
                                      : EvictionPolicy::kLru;
  StoreOptions o;
  // The row cache's budget applies per shard: cache_rows rows (a shard can
  // receive every id of a batch), or cache_fraction of the rows the shard
  // holds (so a table's caches together hold that fraction of it).
  o.rocksdb.cache_rows = CachedRows(rocksdb, rows);
  o.rocksdb.eviction = eviction;
  o.rocksdb.block_cache_bytes = rocksdb.block_cache_bytes();
  if (rocksdb.write_buffer_bytes() > 0) {
    o.rocksdb.write_buffer_bytes = rocksdb.write_buffer_bytes();
  }
  switch (table.storage()) {
    case STORAGE_ROCKSDB:
      o.kind = StoreKind::kRocksDbCache;
      break;
    case STORAGE_DEVICE:
      // With device_cache_rows, a cache of hot rows in device memory in
      // front of the whole table in host memory or on RocksDB (behind a
      // row cache of its own).
      o.kind = StoreKind::kDevice;
      o.device_cache.cache_rows = table.device_cache_rows();
      o.device_cache.eviction = eviction;
      o.device_cache_backing =
          RowsOnRocksDb(table) ? StoreKind::kRocksDbCache : StoreKind::kHost;
      break;
    case STORAGE_HOST:
    default:  // ValidateConfig refuses values StorageTier does not name
      o.kind = StoreKind::kHost;
      break;
  }
  if (table.dynamic()) {
    o.dynamic = true;
    o.admission = table.admission();
    o.eviction = table.eviction();
    o.unadmitted = table.unadmitted();
  }
  return o;
}

StoreCapabilities TableCapabilities(const TableConfig& table,
                                    const RocksDbConfig& rocksdb,
                                    int64_t rows) {
  return TierCapabilities(StoreOptionsFor(table, rocksdb, rows), rows);
}

StoreBytes PlannedShardBytes(const TableConfig& table,
                             const RocksDbConfig& rocksdb, const Shard& shard,
                             const OptimizerConfig& optimizer) {
  const StoreOptions o = StoreOptionsFor(table, rocksdb, shard.row_count);
  const RowPrecision precision = table.weight_precision();
  const auto rows_bytes = [&](int64_t rows) {
    Shard part = shard;
    part.row_count = rows;
    return ShardBytes(part, optimizer, precision);
  };
  StoreBytes b;
  // A dynamic table's id map, in host memory whatever the tier.
  b.host = DynamicMapBytes(table, shard.row_count);
  StoreKind rows_tier = o.kind;
  if (o.kind == StoreKind::kDevice) {
    const int64_t slots = o.device_cache.cache_rows;
    b.device = rows_bytes(slots > 0 ? std::min(shard.row_count, slots)
                                    : shard.row_count);
    if (slots == 0) return b;
    rows_tier = o.device_cache_backing;
  }
  if (rows_tier == StoreKind::kRocksDbCache) {
    b.host += rows_bytes(o.rocksdb.cache_rows);
    b.disk = ShardBytes(shard, optimizer, precision);
  } else {
    b.host += ShardBytes(shard, optimizer, precision);
  }
  return b;
}

bool NeedsDatabase(const StoreOptions& options) {
  return options.kind == StoreKind::kRocksDbCache ||
         (options.kind == StoreKind::kDevice &&
          options.device_cache.cache_rows > 0 &&
          options.device_cache_backing == StoreKind::kRocksDbCache);
}

absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateEmbeddingStore(
    const TableSpec& spec, const StoreOptions& options, RowDatabase* db) {
  RETURN_IF_ERROR(spec.Validate());
  RETURN_IF_ERROR(options.Validate());
  if (spec.precision != ROW_FP32 && options.kind == StoreKind::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": ", RowPrecision_Name(spec.precision),
        " rows are kept by the host and RocksDB tiers only (the device tier "
        "keeps fp32 rows)"));
  }
  if (options.dynamic) {
    // The tier's store of the table's rows, then the map in front.
    StoreOptions inner_options = options;
    inner_options.dynamic = false;
    ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> inner,
                     CreateEmbeddingStore(spec, inner_options, db));
    DynamicStoreOptions dynamic;
    dynamic.ids = DynamicIdOptionsFor(options.admission, options.eviction,
                                      spec.rows, spec.seed);
    dynamic.unadmitted = options.unadmitted;
    ASSIGN_OR_RETURN(std::unique_ptr<DynamicStore> store,
                     DynamicStore::Create(std::move(inner), dynamic));
    return std::unique_ptr<EmbeddingStore>(std::move(store));
  }
  if (options.kind == StoreKind::kHost) {
    return std::make_unique<HostStore>(spec);
  }
  if (options.kind == StoreKind::kDevice) {
#if defined(DLRM_WITH_CUDA)
    if (options.device_cache.cache_rows > 0) {
      // The whole table behind the slots: host memory or RocksDB.
      StoreOptions backing_options;
      backing_options.kind = options.device_cache_backing;
      backing_options.rocksdb = options.rocksdb;
      ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingStore> backing,
                       CreateEmbeddingStore(spec, backing_options, db));
      ASSIGN_OR_RETURN(std::unique_ptr<CachedStore> cached,
                       cuda::CreateDeviceCachedStore(spec, options.device_cache,
                                                     options.cuda_stream,
                                                     std::move(backing)));
      return std::unique_ptr<EmbeddingStore>(std::move(cached));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaStore> store,
                     cuda::CudaStore::Create(spec, options.cuda_stream));
    return std::unique_ptr<EmbeddingStore>(std::move(store));
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", spec.table_index,
        ": the device tier needs a CUDA device: ", CudaUnavailableReason()));
#endif
  }
  if (db == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_index, ": the RocksDB tier needs a RowDatabase"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCachedStore> store,
                   RocksDbCachedStore::Create(spec, options.rocksdb, db));
  return std::unique_ptr<EmbeddingStore>(std::move(store));
}

}  // namespace dlrm::embedding
