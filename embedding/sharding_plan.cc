// The sharding plan's checks and printing (embedding/sharding_plan.h).
#include "embedding/sharding_plan.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "embedding/sharding_memory.h"

namespace dlrm::embedding {

const char* ShardingKindName(ShardingKind kind) {
  switch (kind) {
    case SHARDING_TABLE_WISE:
      return "table-wise";
    case SHARDING_COLUMN_WISE:
      return "column-wise";
    case SHARDING_ROW_WISE:
      return "row-wise";
    case SHARDING_DATA_PARALLEL:
      return "data-parallel";
    default:
      return "auto";
  }
}

absl::Status ShardingPlan::Validate(const ModelConfig& config) const {
  if (static_cast<int>(tables.size()) != config.tables_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding plan has ", tables.size(), " tables, the model ",
                     config.tables_size()));
  }
  for (int k = 0; k < config.tables_size(); ++k) {
    const TableConfig& t = config.tables(k);
    const TablePlacement& p = tables[k];
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding plan: table ", t.name(), " (",
                       ShardingKindName(p.kind), "): ", why));
    };
    if (p.shards.empty()) return bad("no shards");
    int64_t next_row = 0;
    int next_col = 0;
    for (size_t i = 0; i < p.shards.size(); ++i) {
      const Shard& s = p.shards[i];
      if (s.rank < 0 || s.rank >= world_size) {
        return bad(absl::StrCat("shard ", i, " on rank ", s.rank,
                                ", not in [0, ", world_size, ")"));
      }
      bool whole_rows = s.row_begin == 0 && s.row_count == t.rows();
      bool whole_cols = s.col_begin == 0 && s.col_count == t.dim();
      switch (p.kind) {
        case SHARDING_TABLE_WISE:
          if (p.shards.size() != 1 || !whole_rows || !whole_cols) {
            return bad("must be one shard holding the whole table");
          }
          break;
        case SHARDING_DATA_PARALLEL:
          if (!whole_rows || !whole_cols || s.rank != static_cast<int>(i) ||
              static_cast<int>(p.shards.size()) != world_size) {
            return bad("must be one whole copy on every rank, in rank order");
          }
          break;
        case SHARDING_COLUMN_WISE:
          if (!whole_rows || s.col_begin != next_col || s.col_count <= 0) {
            return bad(absl::StrCat("shard ", i,
                                    " does not continue the column blocks"));
          }
          next_col += s.col_count;
          break;
        case SHARDING_ROW_WISE:
          if (!whole_cols || s.row_begin != next_row || s.row_count < 0) {
            return bad(
                absl::StrCat("shard ", i, " does not continue the row ranges"));
          }
          next_row += s.row_count;
          break;
        default:
          return bad("unknown sharding kind");
      }
    }
    if (p.kind == SHARDING_COLUMN_WISE && next_col != t.dim()) {
      return bad(absl::StrCat("column blocks cover ", next_col, " of ", t.dim(),
                              " columns"));
    }
    if (p.kind == SHARDING_ROW_WISE && next_row != t.rows()) {
      return bad(absl::StrCat("row ranges cover ", next_row, " of ", t.rows(),
                              " rows"));
    }
  }
  return absl::OkStatus();
}

std::string ShardingPlan::ToString(const ModelConfig& config) const {
  std::string out = absl::StrCat("sharding plan over ", world_size,
                                 world_size == 1 ? " rank\n" : " ranks\n");
  // Host bytes (RocksDB shards: their caches), bytes on RocksDB and bytes
  // in device memory.
  std::vector<int64_t> bytes(world_size, 0), stored(world_size, 0),
      device(world_size, 0);
  std::vector<double> cost(world_size, 0);
  bool any_rocksdb = false, any_device = false;
  for (size_t k = 0; k < tables.size(); ++k) {
    const TableConfig& t = config.tables(k);
    const TablePlacement& p = tables[k];
    // Rows stored in RocksDB: the table's, or its device cache's backing.
    const bool on_rocksdb = RowsOnRocksDb(t);
    const bool on_device = t.storage() == STORAGE_DEVICE;
    any_rocksdb = any_rocksdb || on_rocksdb;
    any_device = any_device || on_device;
    absl::StrAppend(&out, "  ", t.name(), " (", t.rows(), " x ", t.dim(),
                    "): ", ShardingKindName(p.kind));
    for (const Shard& s : p.shards) {
      if (s.rank >= 0 && s.rank < world_size) {
        Shard host = s;
        if (on_rocksdb) {
          stored[s.rank] +=
              ShardBytes(s, config.sparse_optimizer(), t.weight_precision());
          host.row_count = CachedRows(config.rocksdb(), s.row_count);
        }
        if (on_device) {
          // Cached: the slots on the device, every row in host memory (or
          // on RocksDB behind its row cache, above).
          if (t.device_cache_rows() == 0) host.row_count = 0;
          device[s.rank] += DeviceShardBytes(t, s, config.sparse_optimizer());
        }
        bytes[s.rank] +=
            ShardBytes(host, config.sparse_optimizer(), t.weight_precision());
        cost[s.rank] += static_cast<double>(t.multi_hot_size()) * s.col_count;
      }
    }
    switch (p.kind) {
      case SHARDING_TABLE_WISE:
        absl::StrAppend(&out, " on rank ", p.shards[0].rank);
        break;
      case SHARDING_DATA_PARALLEL:
        absl::StrAppend(&out, " on all ranks");
        break;
      case SHARDING_COLUMN_WISE:
        for (const Shard& s : p.shards) {
          absl::StrAppend(&out, ", rank ", s.rank, " cols [", s.col_begin, ", ",
                          s.col_begin + s.col_count, ")");
        }
        break;
      case SHARDING_ROW_WISE:
        for (const Shard& s : p.shards) {
          absl::StrAppend(&out, ", rank ", s.rank, " rows [", s.row_begin, ", ",
                          s.row_begin + s.row_count, ")");
        }
        break;
      default:
        break;
    }
    if (on_rocksdb) {
      int64_t cached = 0;
      for (const Shard& s : p.shards) {
        cached += CachedRows(config.rocksdb(), s.row_count);
      }
      absl::StrAppend(&out, "; on rocksdb with ",
                      p.shards.size() == 1 ? "a cache of " : "caches of ",
                      cached, " rows", p.shards.size() == 1 ? "" : " in all");
    }
    if (on_device) absl::StrAppend(&out, "; in device memory");
    absl::StrAppend(&out, "\n");
  }
  for (int r = 0; r < world_size; ++r) {
    absl::StrAppend(
        &out, absl::StrFormat("  rank %d: %.1f MiB", r, bytes[r] / 1048576.0));
    if (any_rocksdb || any_device) {
      absl::StrAppend(&out, " in host memory");
    }
    if (any_rocksdb) {
      absl::StrAppend(&out, absl::StrFormat(", %.1f MiB on rocksdb",
                                            stored[r] / 1048576.0));
    }
    if (any_device) {
      absl::StrAppend(&out, absl::StrFormat(", %.1f MiB in device memory",
                                            device[r] / 1048576.0));
    }
    absl::StrAppend(
        &out, absl::StrFormat(", %.0f floats looked up per sample\n", cost[r]));
  }
  return out;
}

ShardingPlan WholeTablesPlan(const ModelConfig& config) {
  ShardingPlan plan;
  plan.world_size = 1;
  for (const TableConfig& t : config.tables()) {
    TablePlacement p;
    p.kind = SHARDING_TABLE_WISE;
    p.shards.push_back({0, 0, t.rows(), 0, t.dim()});
    plan.tables.push_back(std::move(p));
  }
  return plan;
}

}  // namespace dlrm::embedding
