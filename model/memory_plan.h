// What a model of a config holds in memory before it is allocated: the
// embedding rows by tier, the row caches, the RocksDB buffers, the dense
// part and the step's buffers of one rank (docs/storage.md "Memory plan"),
// the memory this machine has for it, and the check that refuses a model
// that does not fit. The binaries that train print the plan at start and
// run the check before they allocate.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "embedding/sharding.h"

namespace dlrm::model {

// Bytes one rank of a model holds, by part.
struct MemoryPlan {
  int rank = 0;
  // Samples per training step the buffers are sized for.
  int64_t batch_size = 0;
  // One entry per table with a shard (or replica) on the rank, in config
  // order.
  struct Table {
    std::string name;
    // Where the rows live (a CPU model holds STORAGE_DEVICE tables as a
    // checkpoint load places them: on the host, or on RocksDB).
    StorageTier storage = STORAGE_HOST;
    // Host memory: the rows and optimizer state whole, or the row cache.
    int64_t host_bytes = 0;
    // Rows cached in host memory (STORAGE_ROCKSDB); 0 otherwise.
    int64_t cache_rows = 0;
    // Rows and state on RocksDB (disk, once every row is written).
    int64_t rocksdb_bytes = 0;
    // Device memory: the rows, or a device cache's slots.
    int64_t device_bytes = 0;
  };
  std::vector<Table> tables;

  // Host memory, by part:
  // STORAGE_HOST rows and optimizer state (and the host rows behind a
  // device cache).
  int64_t host_tables = 0;
  // The RocksDB row caches: records, slot bookkeeping, staging of a
  // batch's misses.
  int64_t row_caches = 0;
  // RocksDB's block cache and one write buffer per table on it, at most.
  int64_t rocksdb_buffers = 0;
  // The dense parameters: weights, gradients, optimizer state, bf16 copies,
  // the gradient all-reduce buffers of several ranks.
  int64_t dense = 0;
  // A step's buffers: two batches, the activations and gradients of the
  // MLPs and the interaction, the tables' backward scratch, and an
  // evaluation batch's.
  int64_t batch_buffers = 0;
  // The process before any model: code, libraries, threads.
  int64_t runtime = 0;

  // Not host memory:
  int64_t device = 0;
  int64_t rocksdb_disk = 0;

  // The host bytes of every part together.
  int64_t host_total() const {
    return host_tables + row_caches + rocksdb_buffers + dense + batch_buffers +
           runtime;
  }
  // The host bytes of everything but the embedding rows and their caches
  // (which --host-budget-mb bounds).
  int64_t host_without_tables() const {
    return rocksdb_buffers + dense + batch_buffers + runtime;
  }

  // Several lines: the parts, the tables by tier, the total.
  std::string ToString() const;
};

struct MemoryPlanOptions {
  // Rank whose part the plan counts. Default: 0.
  int rank = 0;
  // Samples per training step (the rank's local batch). Default: 2048.
  int64_t batch_size = 2048;
  // Samples per evaluation (Predict) call, 0 for none. Default: 8192
  // (EvalOptions.batch_size).
  int64_t eval_batch_size = 8192;

  absl::Status Validate() const;
};

// The plan of rank options.rank of `config` (normalised, its tiers
// planned: embedding::ApplyMemoryBudgets) under `plan` (valid for it; null:
// one process holding every table whole). InvalidArgument for bad options
// or a rank outside the plan.
absl::StatusOr<MemoryPlan> PlanMemory(const ModelConfig& config,
                                      const embedding::ShardingPlan* plan,
                                      const MemoryPlanOptions& options);

// The model's state by tier over every rank, as Admin GetModelInfo reports
// it: "host" (the rows in host memory and the row caches' records,
// embedding::HostBytesPerRank, plus each rank's dense weights and
// optimizer state), "rocksdb" (rows on RocksDB) and "device" (rows or
// device-cache slots in GPU memory, and the dense replicas on CUDA).
std::map<std::string, int64_t> StateBytesByTier(
    const ModelConfig& config, const embedding::ShardingPlan& plan);

// Memory this process may take.
struct MachineMemory {
  int64_t bytes = 0;
  // Where `bytes` came from, for messages ("MemAvailable in /proc/meminfo",
  // "the cgroup's memory.max less its usage", "DLRM_MACHINE_MEMORY_BYTES").
  std::string source;
};

// DLRM_MACHINE_MEMORY_BYTES when set (a decimal byte count; tests use it to
// stand for a small machine), else /proc/meminfo's MemAvailable, or the
// memory cgroup's limit less its usage when that is lower (v2 memory.max,
// v1 memory.limit_in_bytes). InvalidArgument for a bad
// DLRM_MACHINE_MEMORY_BYTES; Unavailable when /proc/meminfo cannot be read.
absl::StatusOr<MachineMemory> AvailableMemory();

// OK when `plan` (of `config`) fits `machine`; else ResourceExhausted
// naming what the model needs, what the machine has and the fix: a host
// budget that fits (--host-budget-mb N --rocksdb-dir DIR, N worked out
// by the tier planner), a lower one when the config has one, or a smaller
// batch when the rows are not what is too big.
absl::Status CheckMemory(const ModelConfig& config, const MemoryPlan& plan,
                         const MachineMemory& machine,
                         const embedding::ShardingPlan* sharding = nullptr);

// `planned`, or its ResourceExhausted error (a table that fits nowhere
// within PlannerOptions.memory_budget_bytes, which `flag` sets) saying what
// that budget is and pointing at --host-budget-mb, which bounds host memory.
absl::StatusOr<embedding::ShardingPlan> ExplainShardingBudget(
    absl::StatusOr<embedding::ShardingPlan> planned, const std::string& flag);

// PlanMemory, then CheckMemory against AvailableMemory(): the plan, or the
// errors of either.
absl::StatusOr<MemoryPlan> PlanAndCheckMemory(
    const ModelConfig& config, const embedding::ShardingPlan* plan,
    const MemoryPlanOptions& options);

}  // namespace dlrm::model
