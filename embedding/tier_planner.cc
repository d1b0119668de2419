// The tier planner (embedding/tier_planner.h).
#include "embedding/tier_planner.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "embedding/planned_bytes.h"
#include "embedding/sharding_memory.h"

namespace dlrm::embedding {

absl::Status TierPlanOptions::Validate() const {
  if (host_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_budget_bytes must be >= 0, got ", host_budget_bytes));
  }
  if (device_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_budget_bytes must be >= 0, got ", device_budget_bytes));
  }
  return absl::OkStatus();
}

namespace {

// Moves tables of `c`, with `move`, largest `table_bytes` first (ties by
// config order; a negative size: the table cannot move), while some rank's
// bytes (`per_rank`) exceed `budget`, each only while it has a shard on
// such a rank. Returns the names of the tables moved; `used` is left with
// the bytes of each rank after the moves.
std::vector<std::string> MoveUntilWithin(
    ModelConfig& c, const ShardingPlan& p, int64_t budget,
    const std::function<std::vector<int64_t>(const ModelConfig&)>& per_rank,
    const std::function<int64_t(int)>& table_bytes,
    const std::function<void(TableConfig*)>& move, std::vector<int64_t>* used) {
  // Ranks over the budget (none when everything fits).
  auto over = [&] {
    *used = per_rank(c);
    std::vector<bool> is_over(p.world_size, false);
    bool any = false;
    for (int r = 0; r < p.world_size; ++r) {
      is_over[r] = (*used)[r] > budget;
      any = any || is_over[r];
    }
    return any ? is_over : std::vector<bool>();
  };
  std::vector<std::pair<int64_t, int>> movable;  // (-bytes, index)
  for (int k = 0; k < c.tables_size(); ++k) {
    const int64_t bytes = table_bytes(k);
    if (bytes >= 0) movable.emplace_back(-bytes, k);
  }
  std::sort(movable.begin(), movable.end());
  std::vector<std::string> moved;
  for (const auto& entry : movable) {
    const int k = entry.second;
    const std::vector<bool> is_over = over();
    if (is_over.empty()) break;
    bool helps = false;
    for (const Shard& shard : p.tables[k].shards) {
      helps = helps || is_over[shard.rank];
    }
    if (!helps) continue;
    move(c.mutable_tables(k));
    moved.push_back(c.tables(k).name());
  }
  over();
  return moved;
}

}  // namespace

absl::StatusOr<ModelConfig> PlanStorageTiers(const ModelConfig& config,
                                             const TierPlanOptions& options,
                                             const ShardingPlan* plan) {
  RETURN_IF_ERROR(options.Validate());
  if (options.host_budget_bytes == 0 && options.device_budget_bytes == 0) {
    return config;
  }
  const ShardingPlan one_rank = WholeTablesPlan(config);
  const ShardingPlan& p = plan != nullptr ? *plan : one_rank;
  ModelConfig c = config;
  const OptimizerConfig& opt = c.sparse_optimizer();
  std::vector<int64_t> used;
  if (options.device_budget_bytes > 0) {
    // Every device table on the host leaves 0 bytes on every device: this
    // pass always ends within the budget.
    MoveUntilWithin(
        c, p, options.device_budget_bytes,
        [&p](const ModelConfig& m) { return DeviceBytesPerRank(m, p); },
        [&](int k) -> int64_t {
          const TableConfig& t = c.tables(k);
          if (t.storage() != STORAGE_DEVICE) return -1;
          int64_t bytes = 0;
          for (const Shard& shard : p.tables[k].shards) {
            bytes += DeviceShardBytes(t, shard, opt);
          }
          return bytes;
        },
        [](TableConfig* t) {
          t->set_storage(STORAGE_HOST);
          t->clear_device_cache_rows();
          t->clear_device_cache_backing();
        },
        &used);
  }
  if (options.host_budget_bytes == 0) return c;
  const std::vector<std::string> moved = MoveUntilWithin(
      c, p, options.host_budget_bytes,
      [&](const ModelConfig& m) {
        return HostBytesPerRank(m, p, options.rocksdb);
      },
      // Host tables, and device caches backed by host memory (their
      // backing moves to RocksDB; the slots stay on the device).
      [&](int k) -> int64_t {
        const TableConfig& t = c.tables(k);
        if (t.storage() != STORAGE_HOST &&
            !(t.storage() == STORAGE_DEVICE && t.device_cache_rows() > 0 &&
              t.device_cache_backing() == STORAGE_HOST)) {
          return -1;
        }
        int64_t bytes = 0;
        for (const Shard& shard : p.tables[k].shards) {
          bytes += PlannedShardBytes(t, options.rocksdb, shard, opt).host;
        }
        return bytes;
      },
      [](TableConfig* t) {
        if (t->storage() == STORAGE_DEVICE) {
          t->set_device_cache_backing(STORAGE_ROCKSDB);
        } else {
          t->set_storage(STORAGE_ROCKSDB);
        }
      },
      &used);
  for (int r = 0; r < p.world_size; ++r) {
    if (used[r] <= options.host_budget_bytes) continue;
    return absl::ResourceExhaustedError(absl::StrCat(
        "host_budget_bytes = ", options.host_budget_bytes,
        " is too small: with every table it can move on RocksDB, rank ", r,
        "'s host tables and row caches still need ", used[r],
        " bytes; raise the budget or shrink rocksdb.cache_rows / "
        "cache_fraction"));
  }
  bool any_rocksdb = false;
  for (const TableConfig& t : c.tables()) {
    any_rocksdb = any_rocksdb || RowsOnRocksDb(t);
  }
  if (!any_rocksdb) return c;
  if (options.rocksdb.path().empty() && !moved.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rocksdb.path is empty but table ", moved.front(),
                     " must move to RocksDB to fit the host budget"));
  }
  // Normalises with the tier's defaults and checks the result.
  return PlaceTablesOnRocksDb(std::move(c), {}, options.rocksdb);
}

absl::StatusOr<ModelConfig> ApplyMemoryBudgets(const ModelConfig& config,
                                               const ShardingPlan* plan) {
  if (config.rocksdb().host_budget_bytes() == 0 &&
      config.device_budget_bytes() == 0) {
    return config;
  }
  TierPlanOptions options;
  options.device_budget_bytes = config.device_budget_bytes();
  options.host_budget_bytes = config.rocksdb().host_budget_bytes();
  options.rocksdb = config.rocksdb();
  return PlanStorageTiers(config, options, plan);
}

}  // namespace dlrm::embedding
