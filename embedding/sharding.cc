// The sharding plan's checks and printing, and the greedy planner.
#include "embedding/sharding.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "core/status.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {
namespace {

const char* KindName(ShardingKind kind) {
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

// Column blocks of a table split `parts` ways: multiples of 4 columns when
// dim allows (whole SIMD lanes and 16-byte rows), otherwise single columns,
// the first blocks one unit wider when the split is uneven.
std::vector<std::pair<int, int>> ColumnBlocks(int dim, int parts) {
  const int unit = dim % 4 == 0 ? 4 : 1;
  const int units = dim / unit;
  std::vector<std::pair<int, int>> blocks;
  int begin = 0;
  for (int p = 0; p < parts; ++p) {
    const int count = (units / parts + (p < units % parts ? 1 : 0)) * unit;
    blocks.emplace_back(begin, count);
    begin += count;
  }
  return blocks;
}

int MaxColumnParts(int dim) { return dim % 4 == 0 ? dim / 4 : dim; }

std::vector<std::pair<int64_t, int64_t>> RowRanges(int64_t rows, int parts) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t begin = 0;
  for (int p = 0; p < parts; ++p) {
    const int64_t count = rows / parts + (p < rows % parts ? 1 : 0);
    ranges.emplace_back(begin, count);
    begin += count;
  }
  return ranges;
}

// Running totals of the ranks while tables are placed.
class RankLoads {
 public:
  RankLoads(int world_size, int64_t budget, int64_t device_budget)
      : budget_(budget),
        device_budget_(device_budget),
        bytes_(world_size, 0),
        device_(world_size, 0),
        cost_(world_size, 0) {}

  // Whether `rank` can take `bytes` more within the memory budget and, when
  // `keep_device`, `device_bytes` more within the device budget.
  bool Fits(int rank, int64_t bytes, int64_t device_bytes,
            bool keep_device) const {
    if (budget_ != 0 && bytes_[rank] + bytes > budget_) return false;
    return !keep_device || device_bytes == 0 || device_budget_ == 0 ||
           device_[rank] + device_bytes <= device_budget_;
  }
  void Add(int rank, int64_t bytes, int64_t device_bytes, double cost) {
    bytes_[rank] += bytes;
    device_[rank] += device_bytes;
    cost_[rank] += cost;
  }
  // Ranks ordered by lookup cost, then device bytes, then bytes held, then
  // rank.
  std::vector<int> ByLoad() const {
    std::vector<int> ranks(bytes_.size());
    std::iota(ranks.begin(), ranks.end(), 0);
    std::stable_sort(ranks.begin(), ranks.end(), [this](int a, int b) {
      if (cost_[a] != cost_[b]) return cost_[a] < cost_[b];
      if (device_[a] != device_[b]) return device_[a] < device_[b];
      return bytes_[a] < bytes_[b];
    });
    return ranks;
  }

 private:
  int64_t budget_;
  int64_t device_budget_;
  std::vector<int64_t> bytes_;
  std::vector<int64_t> device_;
  std::vector<double> cost_;
};

TablePlacement MakePlacement(ShardingKind kind, const TableConfig& t,
                             const std::vector<int>& ranks) {
  TablePlacement p;
  p.kind = kind;
  const int n = static_cast<int>(ranks.size());
  if (kind == SHARDING_COLUMN_WISE) {
    const auto blocks = ColumnBlocks(t.dim(), n);
    for (int i = 0; i < n; ++i) {
      p.shards.push_back(
          {ranks[i], 0, t.rows(), blocks[i].first, blocks[i].second});
    }
  } else if (kind == SHARDING_ROW_WISE) {
    const auto ranges = RowRanges(t.rows(), n);
    for (int i = 0; i < n; ++i) {
      p.shards.push_back(
          {ranks[i], ranges[i].first, ranges[i].second, 0, t.dim()});
    }
  } else {
    for (int r : ranks) p.shards.push_back({r, 0, t.rows(), 0, t.dim()});
  }
  return p;
}

// Lookup cost of a table: floats pooled and moved per sample.
double LookupCost(const TableConfig& t) {
  return static_cast<double>(t.multi_hot_size()) * t.dim();
}

}  // namespace

absl::Status PlannerOptions::Validate() const {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("planner: world_size must be >= 1, got ", world_size));
  }
  if (memory_budget_bytes < 0 || data_parallel_max_bytes < 0 ||
      device_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        "planner: memory_budget_bytes, data_parallel_max_bytes and "
        "device_budget_bytes must be >= 0");
  }
  return absl::OkStatus();
}

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
                       KindName(p.kind), "): ", why));
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
                    "): ", KindName(p.kind));
    for (const Shard& s : p.shards) {
      if (s.rank >= 0 && s.rank < world_size) {
        Shard host = s;
        if (on_rocksdb) {
          stored[s.rank] += ShardBytes(s, config.sparse_optimizer());
          host.row_count = CachedRows(config.rocksdb(), s.row_count);
        }
        if (on_device) {
          // Cached: the slots on the device, every row in host memory (or
          // on RocksDB behind its row cache, above).
          if (t.device_cache_rows() == 0) host.row_count = 0;
          device[s.rank] += DeviceShardBytes(t, s, config.sparse_optimizer());
        }
        bytes[s.rank] += ShardBytes(host, config.sparse_optimizer());
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

absl::StatusOr<ShardingPlan> PlanSharding(const ModelConfig& config,
                                          const PlannerOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  const int world = options.world_size;
  const OptimizerConfig& opt = config.sparse_optimizer();
  ShardingPlan plan;
  plan.world_size = world;
  plan.tables.resize(config.tables_size());
  RankLoads loads(world, options.memory_budget_bytes,
                  options.device_budget_bytes);

  auto budget_error = [&](const TableConfig& t, const std::string& what) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "planner: table ", t.name(), " (", t.rows(), " x ", t.dim(), ", ",
        ShardBytes({0, 0, t.rows(), 0, t.dim()}, opt), " bytes) ", what,
        " within the per-rank budget of ", options.memory_budget_bytes,
        " bytes over ", world, " ranks"));
  };
  // Places `t` as `kind` on `ranks` if every shard fits (the device budget
  // too when `keep_device`); returns whether.
  auto try_place = [&](int k, ShardingKind kind, const std::vector<int>& ranks,
                       bool keep_device) {
    const TableConfig& t = config.tables(k);
    TablePlacement p = MakePlacement(kind, t, ranks);
    std::vector<int64_t> extra(world, 0), extra_device(world, 0);
    for (const Shard& s : p.shards) {
      extra[s.rank] += ShardBytes(s, opt);
      extra_device[s.rank] += DeviceShardBytes(t, s, opt);
    }
    for (int r = 0; r < world; ++r) {
      if (extra[r] > 0 &&
          !loads.Fits(r, extra[r], extra_device[r], keep_device)) {
        return false;
      }
    }
    for (const Shard& s : p.shards) {
      loads.Add(s.rank, ShardBytes(s, opt), DeviceShardBytes(t, s, opt),
                static_cast<double>(t.multi_hot_size()) * s.col_count);
    }
    plan.tables[k] = std::move(p);
    return true;
  };
  auto all_ranks = [world] {
    std::vector<int> r(world);
    std::iota(r.begin(), r.end(), 0);
    return r;
  };
  // The `n` least-loaded ranks that can each take shard `s` of table `t`
  // (within the device budget too when `keep_device`).
  auto least_loaded = [&](int n, const TableConfig& t, const Shard& s,
                          bool keep_device) {
    const int64_t bytes = ShardBytes(s, opt);
    const int64_t device_bytes = DeviceShardBytes(t, s, opt);
    std::vector<int> picked;
    for (int r : loads.ByLoad()) {
      if (static_cast<int>(picked.size()) == n) break;
      if (loads.Fits(r, bytes, device_bytes, keep_device)) picked.push_back(r);
    }
    return picked;
  };

  // Pinned tables first, in config order; then the rest, costliest first.
  std::vector<int> automatic;
  for (int k = 0; k < config.tables_size(); ++k) {
    const TableConfig& t = config.tables(k);
    const ShardingKind kind = t.sharding();
    if (kind == SHARDING_AUTO) {
      if (t.shard_ranks_size() > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tables[", k, "] (", t.name(),
            ").shard_ranks needs a sharding kind other than AUTO"));
      }
      automatic.push_back(k);
      continue;
    }
    std::vector<int> ranks(t.shard_ranks().begin(), t.shard_ranks().end());
    for (int r : ranks) {
      if (r < 0 || r >= world) {
        return absl::InvalidArgumentError(
            absl::StrCat("tables[", k, "] (", t.name(), ").shard_ranks: rank ",
                         r, " is not in [0, ", world, ")"));
      }
    }
    const int n = static_cast<int>(ranks.size());
    switch (kind) {
      case SHARDING_DATA_PARALLEL:
        ranks = all_ranks();
        break;
      case SHARDING_TABLE_WISE:
        if (n > 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tables[", k, "] (", t.name(), ").shard_ranks: table-wise takes ",
              "one rank, got ", n));
        }
        if (n == 0) {
          ranks = least_loaded(1, t, {0, 0, t.rows(), 0, t.dim()},
                               /*keep_device=*/false);
        }
        break;
      case SHARDING_COLUMN_WISE:
        if (n == 0) {
          const int parts = std::min(world, MaxColumnParts(t.dim()));
          ranks = loads.ByLoad();
          ranks.resize(parts);
        } else if (n > MaxColumnParts(t.dim())) {
          return absl::InvalidArgumentError(
              absl::StrCat("tables[", k, "] (", t.name(), ").shard_ranks: ", n,
                           " column blocks for dim ", t.dim(), " (at most ",
                           MaxColumnParts(t.dim()), ")"));
        }
        break;
      case SHARDING_ROW_WISE:
        if (n == 0) ranks = all_ranks();
        if (static_cast<int64_t>(ranks.size()) > t.rows()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tables[", k, "] (", t.name(), ").shard_ranks: ", ranks.size(),
              " row ranges for ", t.rows(), " rows"));
        }
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("tables[", k, "] (", t.name(),
                         ").sharding: unknown kind ", static_cast<int>(kind)));
    }
    if (ranks.empty() || !try_place(k, kind, ranks, /*keep_device=*/false)) {
      return budget_error(
          t, absl::StrCat("does not fit as pinned (", KindName(kind), ")"));
    }
  }

  std::stable_sort(automatic.begin(), automatic.end(), [&](int a, int b) {
    const TableConfig &ta = config.tables(a), &tb = config.tables(b);
    if (LookupCost(ta) != LookupCost(tb))
      return LookupCost(ta) > LookupCost(tb);
    return ta.rows() * ta.dim() > tb.rows() * tb.dim();
  });
  // Places AUTO table `k`: replicated when small, else whole, else split
  // by columns, else by rows; returns whether some placement fit.
  auto place_auto = [&](int k, bool keep_device) {
    const TableConfig& t = config.tables(k);
    const Shard whole{0, 0, t.rows(), 0, t.dim()};
    if (world > 1 &&
        ShardBytes(whole, opt) <= options.data_parallel_max_bytes &&
        try_place(k, SHARDING_DATA_PARALLEL, all_ranks(), keep_device)) {
      return true;
    }
    std::vector<int> one = least_loaded(1, t, whole, keep_device);
    if (!one.empty() && try_place(k, SHARDING_TABLE_WISE, one, keep_device)) {
      return true;
    }
    // An optimizer with per-row state (row-wise Adagrad's accumulator)
    // keeps one value per row over all its columns; column blocks would
    // each keep their own and train differently from one process, so such
    // tables are split by rows instead.
    const int max_parts = optim::SparseStateSpansColumns(opt)
                              ? 1
                              : std::min(world, MaxColumnParts(t.dim()));
    for (int parts = 2; parts <= max_parts; ++parts) {
      // The widest block is the first; every picked rank must take it.
      const int widest = ColumnBlocks(t.dim(), parts)[0].second;
      const std::vector<int> ranks =
          least_loaded(parts, t, {0, 0, t.rows(), 0, widest}, keep_device);
      if (static_cast<int>(ranks.size()) == parts &&
          try_place(k, SHARDING_COLUMN_WISE, ranks, keep_device)) {
        return true;
      }
    }
    return world > 1 && t.rows() >= world &&
           try_place(k, SHARDING_ROW_WISE, all_ranks(), keep_device);
  };
  for (int k : automatic) {
    const TableConfig& t = config.tables(k);
    // A device table first within the device budget; when nothing fits
    // there, as if there were none (the tier planner moves tables off).
    const bool device_limited =
        t.storage() == STORAGE_DEVICE && options.device_budget_bytes > 0;
    if (device_limited && place_auto(k, /*keep_device=*/true)) continue;
    if (!place_auto(k, /*keep_device=*/false)) {
      return budget_error(t, "fits nowhere");
    }
  }
  RETURN_IF_ERROR(plan.Validate(config));
  return plan;
}

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

int64_t HostBytesOfTable(const ModelConfig& config, int k,
                         const RocksDbConfig& rocksdb) {
  const TableConfig& t = config.tables(k);
  // A device table has no host copy unless it is cached (the whole table
  // then stays in host memory behind the device's slots, or its RocksDB
  // row cache does).
  if (t.storage() == STORAGE_DEVICE && t.device_cache_rows() == 0) return 0;
  Shard shard;
  shard.row_count = RowsOnRocksDb(t) ? CachedRows(rocksdb, t.rows()) : t.rows();
  shard.col_count = t.dim();
  return ShardBytes(shard, config.sparse_optimizer());
}

std::vector<int64_t> HostBytesPerRank(const ModelConfig& config,
                                      const ShardingPlan& plan,
                                      const RocksDbConfig& rocksdb) {
  std::vector<int64_t> used(plan.world_size, 0);
  for (int k = 0; k < config.tables_size(); ++k) {
    const TableConfig& t = config.tables(k);
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

namespace {

// One process holding every table whole.
ShardingPlan OneRankPlan(const ModelConfig& config) {
  ShardingPlan plan;
  for (const TableConfig& t : config.tables()) {
    TablePlacement p;
    p.kind = SHARDING_TABLE_WISE;
    p.shards.push_back({0, 0, t.rows(), 0, t.dim()});
    plan.tables.push_back(std::move(p));
  }
  return plan;
}

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
  const ShardingPlan one_rank = OneRankPlan(config);
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
          bytes += ShardBytes(shard, opt);
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
