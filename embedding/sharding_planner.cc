// The greedy sharding planner (embedding/sharding_planner.h).
#include "embedding/sharding_planner.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "embedding/sharding_memory.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {
namespace {

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

// The bytes shard `s` of table `t` puts on its rank: weights (in its
// weight_precision) and optimizer state, and a dynamic table's id map over
// the shard's rows.
int64_t PlacedBytes(const TableConfig& t, const Shard& s,
                    const OptimizerConfig& optimizer) {
  return ShardBytes(s, optimizer, t.weight_precision()) +
         DynamicMapBytes(t, s.row_count);
}

// Rows each row-wise shard of `t` needs: a dynamic table's shard keeps its
// last row for ids without one.
int64_t MinRowsPerShard(const TableConfig& t) { return t.dynamic() ? 2 : 1; }

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
        PlacedBytes(t, {0, 0, t.rows(), 0, t.dim()}, opt), " bytes) ", what,
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
      extra[s.rank] += PlacedBytes(t, s, opt);
      extra_device[s.rank] += DeviceShardBytes(t, s, opt);
    }
    for (int r = 0; r < world; ++r) {
      if (extra[r] > 0 &&
          !loads.Fits(r, extra[r], extra_device[r], keep_device)) {
        return false;
      }
    }
    for (const Shard& s : p.shards) {
      loads.Add(s.rank, PlacedBytes(t, s, opt), DeviceShardBytes(t, s, opt),
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
    const int64_t bytes = PlacedBytes(t, s, opt);
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
        if (static_cast<int64_t>(ranks.size()) * MinRowsPerShard(t) >
            t.rows()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tables[", k, "] (", t.name(), ").shard_ranks: ", ranks.size(),
              " row ranges for ", t.rows(), " rows",
              t.dynamic() ? " (a dynamic table's shard needs 2)" : ""));
        }
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("tables[", k, "] (", t.name(),
                         ").sharding: unknown kind ", static_cast<int>(kind)));
    }
    if (ranks.empty() || !try_place(k, kind, ranks, /*keep_device=*/false)) {
      return budget_error(t, absl::StrCat("does not fit as pinned (",
                                          ShardingKindName(kind), ")"));
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
    // A dynamic table's map learns from the batches it prepares: a replica
    // would see only its rank's, so it is never replicated (row-wise, each
    // shard sees the ids routed to it by hash: docs/dynamic.md).
    if (world > 1 && !t.dynamic() &&
        ShardBytes(whole, opt, t.weight_precision()) <=
            options.data_parallel_max_bytes &&
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
    return world > 1 && t.rows() >= MinRowsPerShard(t) * world &&
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

}  // namespace dlrm::embedding
