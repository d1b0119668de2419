// A sharding plan: which rank holds which rows and columns of every
// embedding table (docs/hybrid.md "Sharding kinds"), its checks and its
// printing.
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

// "table-wise", "column-wise", "row-wise", "data-parallel"; "auto" for any
// other kind.
const char* ShardingKindName(ShardingKind kind);

// The plan of one process: every table of `config` whole (table-wise) on
// rank 0 of a world of one.
ShardingPlan WholeTablesPlan(const ModelConfig& config);

}  // namespace dlrm::embedding
