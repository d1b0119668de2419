// The tier planner: moves tables between device memory, host memory and
// RocksDB until each rank's rows fit its device and host memory budgets
// (docs/storage.md "Planner").
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "embedding/sharding_plan.h"

namespace dlrm::embedding {

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
