// The bytes a sharding plan puts on each rank: weights and optimizer state
// of a shard, in host memory (whole tables, RocksDB row caches) and in
// device memory. The planners fit these to budgets; ShardingPlan::ToString
// prints them.
#pragma once

#include <cstdint>
#include <vector>

#include "dlrm/config.pb.h"
#include "embedding/sharding_plan.h"

namespace dlrm::embedding {

// Bytes of weights (4 each, 2 in a 16-bit `precision`) and optimizer state
// (optim::SparseStateFloatsPerRow of the normalised `optimizer` at the
// shard's width, fp32) of `shard`.
int64_t ShardBytes(const Shard& shard, const OptimizerConfig& optimizer,
                   RowPrecision precision = ROW_FP32);

// Device memory bytes of `shard` of `table`: 0 unless the table is
// STORAGE_DEVICE; its weights and state (ShardBytes), or with
// device_cache_rows only that many of its rows (the cache's slots).
int64_t DeviceShardBytes(const TableConfig& table, const Shard& shard,
                         const OptimizerConfig& optimizer);

// Host bytes of a dynamic table's id map (DynamicIdMap::BytesFor) over
// `rows` rows (a shard's: every shard holds a map over its rows, on any
// tier; PlannedShardBytes counts it), or over the whole table; 0 for a
// static table.
int64_t DynamicMapBytes(const TableConfig& table, int64_t rows);
inline int64_t DynamicMapBytes(const TableConfig& table) {
  return DynamicMapBytes(table, table.rows());
}
// Host bytes of table `k` of a normalised config under `rocksdb`: the whole
// table on STORAGE_HOST, its row cache (CachedRowsOfTable's rows) on
// STORAGE_ROCKSDB, 0 on STORAGE_DEVICE (with device_cache_rows, what is
// behind the device: the whole table, or its row cache when
// device_cache_backing is STORAGE_ROCKSDB); a dynamic table's id map
// besides (DynamicMapBytes, through PlannedShardBytes).
int64_t HostBytesOfTable(const ModelConfig& config, int k,
                         const RocksDbConfig& rocksdb);

// Host bytes of embedding rows each rank holds under `plan` (valid for the
// normalised `config`): STORAGE_HOST shards whole, the row cache of each
// STORAGE_ROCKSDB shard (CachedRows of the shard's rows under `rocksdb`);
// STORAGE_DEVICE shards count nothing, or with device_cache_rows what is
// behind the device (whole, or the row cache of a RocksDB backing); each
// shard of a dynamic table its id map besides.
std::vector<int64_t> HostBytesPerRank(const ModelConfig& config,
                                      const ShardingPlan& plan,
                                      const RocksDbConfig& rocksdb);

// Device memory bytes of embedding rows each rank holds under `plan` (valid
// for the normalised `config`): the DeviceShardBytes of its shards.
std::vector<int64_t> DeviceBytesPerRank(const ModelConfig& config,
                                        const ShardingPlan& plan);

}  // namespace dlrm::embedding
