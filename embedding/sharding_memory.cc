// Bytes of a plan's shards by place (embedding/sharding_memory.h).
#include "embedding/sharding_memory.h"

#include <algorithm>

#include "core/config.h"
#include "embedding/dynamic_ids.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {

int64_t ShardBytes(const Shard& shard, const OptimizerConfig& optimizer) {
  const int64_t floats_per_row =
      shard.col_count +
      optim::SparseStateFloatsPerRow(optimizer, shard.col_count);
  return shard.row_count * floats_per_row * 4;
}

int64_t DeviceShardBytes(const TableConfig& table, const Shard& shard,
                         const OptimizerConfig& optimizer) {
  if (table.storage() != STORAGE_DEVICE) return 0;
  Shard slots = shard;
  if (table.device_cache_rows() > 0) {
    slots.row_count = std::min(shard.row_count, table.device_cache_rows());
  }
  return ShardBytes(slots, optimizer);
}

int64_t DynamicMapBytes(const TableConfig& table) {
  if (!table.dynamic()) return 0;
  return DynamicIdMap::BytesFor(DynamicIdOptionsFor(
      table.admission(), table.eviction(), table.rows(), /*seed=*/0));
}

int64_t HostBytesOfTable(const ModelConfig& config, int k,
                         const RocksDbConfig& rocksdb) {
  const TableConfig& t = config.tables(k);
  // A device table has no host copy unless it is cached (the whole table
  // then stays in host memory behind the device's slots, or its RocksDB
  // row cache does).
  if (t.storage() == STORAGE_DEVICE && t.device_cache_rows() == 0) {
    return DynamicMapBytes(t);
  }
  Shard shard;
  shard.row_count = RowsOnRocksDb(t) ? CachedRows(rocksdb, t.rows()) : t.rows();
  shard.col_count = t.dim();
  return ShardBytes(shard, config.sparse_optimizer()) + DynamicMapBytes(t);
}

std::vector<int64_t> HostBytesPerRank(const ModelConfig& config,
                                      const ShardingPlan& plan,
                                      const RocksDbConfig& rocksdb) {
  std::vector<int64_t> used(plan.world_size, 0);
  for (int k = 0; k < config.tables_size(); ++k) {
    const TableConfig& t = config.tables(k);
    for (const Shard& shard : plan.tables[k].shards) {
      used[shard.rank] += DynamicMapBytes(t);
    }
    if (t.storage() == STORAGE_DEVICE && t.device_cache_rows() == 0) {
      continue;
    }
    for (Shard shard : plan.tables[k].shards) {
      if (RowsOnRocksDb(t)) {
        shard.row_count = CachedRows(rocksdb, shard.row_count);
      }
      used[shard.rank] += ShardBytes(shard, config.sparse_optimizer());
    }
  }
  return used;
}

std::vector<int64_t> DeviceBytesPerRank(const ModelConfig& config,
                                        const ShardingPlan& plan) {
  std::vector<int64_t> used(plan.world_size, 0);
  for (int k = 0; k < config.tables_size(); ++k) {
    for (const Shard& shard : plan.tables[k].shards) {
      used[shard.rank] +=
          DeviceShardBytes(config.tables(k), shard, config.sparse_optimizer());
    }
  }
  return used;
}

}  // namespace dlrm::embedding
