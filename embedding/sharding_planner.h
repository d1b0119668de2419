// The greedy sharding planner: a plan from table sizes, lookups per sample
// and each rank's memory and device memory budgets (docs/hybrid.md
// "Sharding kinds").
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "embedding/sharding_plan.h"

namespace dlrm::embedding {

struct PlannerOptions {
  // Ranks in the job. Default: 1.
  int world_size = 1;
  // Bytes of embedding weights and optimizer state (and dynamic tables' id
  // maps) one rank may hold; 0 means unlimited. Default: 0.
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

// Places every table of `config` (normalised). Tables pinned in the config
// (TableConfig.sharding / shard_ranks) are placed as pinned; the rest go,
// largest lookup cost first, to the rank with the least lookup cost that has
// room: whole (table-wise) when it fits, else split by columns (never with
// row-wise Adagrad, whose per-row state spans all columns), else by rows
// (a dynamic table is never replicated; its row-wise shards need 2 rows
// each). A shard's bytes are its weights and optimizer state (ShardBytes)
// and a dynamic table's id map over its rows (DynamicMapBytes).
// Ranks tie on lookup cost are taken by device bytes, then bytes, so device
// tables spread; with options.device_budget_bytes, a STORAGE_DEVICE table
// takes the first of these placements that also fits every rank's device
// budget, and only when none does the first that fits the memory budget.
// InvalidArgument for a pin that names a bad rank or cannot be split that way;
// ResourceExhausted, naming the table and the budget, when a table fits
// nowhere.
absl::StatusOr<ShardingPlan> PlanSharding(const ModelConfig& config,
                                          const PlannerOptions& options);

}  // namespace dlrm::embedding
