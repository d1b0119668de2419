// Sharding plans: which rank holds which rows and columns of every embedding
// table (docs/hybrid.md "Sharding kinds"), the greedy planner that makes one
// from table sizes, lookups per sample and each rank's memory and device memory
// budgets, and the tier planner that moves tables between tiers to fit them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"

namespace dlrm::embedding {

// A block of one table held by one rank: rows [row_begin, row_begin +
// row_count) and columns [col_begin, col_begin + col_count).
struct Shard {
  int rank = 0;
  int64_t row_begin = 0;
  int64_t row_count = 0;
  int col_begin = 0;
  int col_count = 0;
};

struct TablePlacement {
  ShardingKind kind = SHARDING_TABLE_WISE;
  // Table-wise: one shard. Column-wise: column blocks in column order.
  // Row-wise: row ranges in row order. Data-parallel: one full copy per
  // rank, in rank order.
  std::vector<Shard> shards;
};

struct ShardingPlan {
  int world_size = 1;
  // One per table, in ModelConfig.tables order.
  std::vector<TablePlacement> tables;

  // Checks the plan against a normalised config: one placement per table,
  // shards that tile the table exactly (replicas for data-parallel), ranks
  // in [0, world_size). InvalidArgument naming the table otherwise.
  absl::Status Validate(const ModelConfig& config) const;

  // One line per table ("C3 row-wise: rank 0 rows [0, 5000) ...") and the
  // bytes held by each rank; printed at start and shown by Admin.
  std::string ToString(const ModelConfig& config) const;
};

struct PlannerOptions {
  // Ranks in the job. Default: 1.
  int world_size = 1;
  // Bytes of embedding weights and optimizer state one rank may hold; 0
  // means unlimited. Default: 0.
  int64_t memory_budget_bytes = 0;
  // AUTO tables with at most this many bytes (weights + optimizer state) are
  // replicated on every rank when world_size > 1. Default: 64 KiB.
  int64_t data_parallel_max_bytes = 64 << 10;
  // Device memory bytes of STORAGE_DEVICE rows one rank may hold
  // (DeviceShardBytes); a soft limit: an AUTO device table goes where it
  // fits when some placement does, else as if there were no limit (the
  // tier planner then moves tables off the device). 0 means unlimited.
  // Default: 0.
  int64_t device_budget_bytes = 0;

  absl::Status Validate() const;
};

// Bytes of weights and optimizer state (optim::SparseStateFloatsPerRow of
// the normalised `optimizer` at the shard's width) of `shard`.
int64_t ShardBytes(const Shard& shard, const OptimizerConfig& optimizer);

// Device memory bytes of `shard` of `table`: 0 unless the table is
// STORAGE_DEVICE; its weights and state (ShardBytes), or with
// device_cache_rows only that many of its rows (the cache's slots).
int64_t DeviceShardBytes(const TableConfig& table, const Shard& shard,
                         const OptimizerConfig& optimizer);

// The plan of one process: every table of `config` whole (table-wise) on
// rank 0 of a world of one.
ShardingPlan WholeTablesPlan(const ModelConfig& config);

// Places every table of `config` (normalised). Tables pinned in the config
// (TableConfig.sharding / shard_ranks) are placed as pinned; the rest go,
// largest lookup cost first, to the rank with the least lookup cost that has
// room: whole (table-wise) when it fits, else split by columns (never with
// row-wise Adagrad, whose per-row state spans all columns), else by rows.
// Ranks tie on lookup cost are taken by device bytes, then bytes, so device
// tables spread; with options.device_budget_bytes, a STORAGE_DEVICE table
// takes the first of these placements that also fits every rank's device
// budget, and only when none does the first that fits the memory budget.
// InvalidArgument for a pin that names a bad rank or cannot be split that way;
// ResourceExhausted, naming the table and the budget, when a table fits
// nowhere.
absl::StatusOr<ShardingPlan> PlanSharding(const ModelConfig& config,
                                          const PlannerOptions& options);

// Tier choice from device and host memory budgets (docs/storage.md
// "Planner").
struct TierPlanOptions {
  // Bytes of device memory one rank may give embedding rows
  // (DeviceBytesPerRank). 0 means unlimited (no table leaves the device).
  // Default: 0.
  int64_t device_budget_bytes = 0;
  // Bytes of embedding rows (weights and optimizer state) one rank's host
  // memory may hold: as HostBytesPerRank counts them.
  // 0 means unlimited (no table moves). Default: 0.
  int64_t host_budget_bytes = 0;
  // The RocksDB tier of the tables that move (ModelConfig.rocksdb); its
  // path must be set when one does. Default: empty.
  RocksDbConfig rocksdb;

  absl::Status Validate() const;
};

// Host bytes of table `k` of a normalised config under `rocksdb`: the whole
// table on STORAGE_HOST, its row cache (CachedRowsOfTable's rows) on
// STORAGE_ROCKSDB, 0 on STORAGE_DEVICE (with device_cache_rows, what is
// behind the device: the whole table, or its row cache when
// device_cache_backing is STORAGE_ROCKSDB).
int64_t HostBytesOfTable(const ModelConfig& config, int k,
                         const RocksDbConfig& rocksdb);

// Host bytes of embedding rows each rank holds under `plan` (valid for the
// normalised `config`): STORAGE_HOST shards whole, the row cache of each
// STORAGE_ROCKSDB shard (CachedRows of the shard's rows under `rocksdb`);
// STORAGE_DEVICE shards count nothing, or with device_cache_rows what is
// behind the device (whole, or the row cache of a RocksDB backing).
std::vector<int64_t> HostBytesPerRank(const ModelConfig& config,
                                      const ShardingPlan& plan,
                                      const RocksDbConfig& rocksdb);

// Device memory bytes of embedding rows each rank holds under `plan` (valid
// for the normalised `config`): the DeviceShardBytes of its shards.
std::vector<int64_t> DeviceBytesPerRank(const ModelConfig& config,
                                        const ShardingPlan& plan);

// `config` (normalised) with tables moved between tiers to fit the budgets,
// in two passes; `plan` null means one process holding every table whole.
// First the device: STORAGE_DEVICE tables (cached or not) move to
// STORAGE_HOST (device_cache_rows and device_cache_backing cleared),
// largest device bytes first, ties by config order, until every rank's
// DeviceBytesPerRank fits options.device_budget_bytes; this always ends
// within it. Then the host, largest (bytes of weights and state) first,
// ties by config order, until every rank's host bytes (HostBytesPerRank)
// fit options.host_budget_bytes: STORAGE_HOST tables (those just moved
// too) move to STORAGE_ROCKSDB, and STORAGE_DEVICE tables with a device
// cache backed by host memory get device_cache_backing STORAGE_ROCKSDB
// (their slots stay on the device). In either pass a table moves only
// while it has a shard on a rank still over that budget.
// ModelConfig.rocksdb becomes options.rocksdb when a table uses the tier.
// InvalidArgument for bad options (naming the field); ResourceExhausted,
// naming the rank, the budget and the bytes still needed, when even every
// table it can move on RocksDB does not fit the host budget.
absl::StatusOr<ModelConfig> PlanStorageTiers(
    const ModelConfig& config, const TierPlanOptions& options,
    const ShardingPlan* plan = nullptr);

// PlanStorageTiers with the config's own budgets and tier
// (device_budget_bytes, rocksdb.host_budget_bytes, rocksdb): `config`
// unchanged when both budgets are 0. The models apply it when they are
// created, so a checkpoint's config (already planned) plans to itself.
absl::StatusOr<ModelConfig> ApplyMemoryBudgets(
    const ModelConfig& config, const ShardingPlan* plan = nullptr);

}  // namespace dlrm::embedding
