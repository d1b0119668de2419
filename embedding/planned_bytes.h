// The bytes a shard's tier plans to hold by place, from the tier's factory
// (embedding/store_factory.cc): what the planners (sharding_memory.h,
// tier_planner.h) and model/memory_plan.h count, so that a tier with its
// own memory shape changes the factory only.
#pragma once

#include "dlrm/config.pb.h"
#include "embedding/embedding_store.h"
#include "embedding/sharding_plan.h"

namespace dlrm::embedding {

// The weights and optimizer state (ShardBytes) `shard` of `table` holds
// under `rocksdb`, by place, as the store StoreOptionsFor(table, rocksdb,
// shard.row_count) makes keeps them: host, the rows in host memory (the
// whole shard on kHost and behind a device cache backed by host memory;
// the row cache, CachedRows of the shard's rows, of a RocksDB tier);
// device, the device tier's rows (with a device cache, only its slots);
// disk, a RocksDB tier's whole shard. Cache bookkeeping and staging are
// the memory plan's (model/memory_plan.cc).
StoreBytes PlannedShardBytes(const TableConfig& table,
                             const RocksDbConfig& rocksdb, const Shard& shard,
                             const OptimizerConfig& optimizer);

}  // namespace dlrm::embedding
