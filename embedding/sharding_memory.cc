// Bytes of a plan's shards by place (embedding/sharding_memory.h).
#include "embedding/sharding_memory.h"

#include "core/config.h"
#include "embedding/dynamic_ids.h"
#include "embedding/planned_bytes.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {

int64_t ShardBytes(const Shard& shard, const OptimizerConfig& optimizer,
                   RowPrecision precision) {
  const int64_t bytes_per_row =
      shard.col_count * (precision == ROW_FP32 ? 4 : 2) +
      optim::SparseStateFloatsPerRow(optimizer, shard.col_count) * 4;
  return shard.row_count * bytes_per_row;
}

int64_t DeviceShardBytes(const TableConfig& table, const Shard& shard,
                         const OptimizerConfig& optimizer) {
  // Device bytes do not depend on the RocksDB options.
  return PlannedShardBytes(table, RocksDbConfig(), shard, optimizer).device;
}

int64_t DynamicMapBytes(const TableConfig& table, int64_t rows) {
  if (!table.dynamic()) return 0;
  return DynamicIdMap::BytesFor(DynamicIdOptionsFor(
      table.admission(), table.eviction(), rows, /*seed=*/0));
}

int64_t HostBytesOfTable(const ModelConfig& config, int k,
                         const RocksDbConfig& rocksdb) {
  const TableConfig& t = config.tables(k);
  Shard whole;
  whole.row_count = t.rows();
  whole.col_count = t.dim();
  return PlannedShardBytes(t, rocksdb, whole, config.sparse_optimizer()).host;
}

std::vector<int64_t> HostBytesPerRank(const ModelConfig& config,
                                      const ShardingPlan& plan,
                                      const RocksDbConfig& rocksdb) {
  std::vector<int64_t> used(plan.world_size, 0);
  for (int k = 0; k < config.tables_size(); ++k) {
    for (const Shard& shard : plan.tables[k].shards) {
      used[shard.rank] += PlannedShardBytes(config.tables(k), rocksdb, shard,
                                            config.sparse_optimizer())
                              .host;
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
