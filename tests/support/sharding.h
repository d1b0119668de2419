// The multi-rank tests' four-table model and its shardings by name (header
// only: the binaries that include it link dlrm_core themselves).
#ifndef DLRM_TESTS_SUPPORT_SHARDING_H_
#define DLRM_TESTS_SUPPORT_SHARDING_H_

#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
#include "dlrm/config.pb.h"

namespace dlrm::test {

// Four tables of dim 16 (so column-wise can split 4 ways), one mean-pooled
// multi-hot (row-wise shards then sum partial pools the gather divides),
// SGD on the dense part and Adam on the tables (per element: column-wise
// shards update exactly like the whole row), seed 17; `extra` (config
// text) added; normalized.
inline ModelConfig FourTableConfig(const std::string& extra = "") {
  auto parsed = ParseModelConfigText(R"(
    num_dense_features: 4 embedding_dim: 16
    tables { name: "a" rows: 60 }
    tables { name: "b" rows: 45 multi_hot_size: 3 pooling: POOLING_MEAN }
    tables { name: "c" rows: 80 multi_hot_size: 2 }
    tables { name: "d" rows: 7 }
    bottom_mlp: [16, 16] top_mlp: [16, 1] interaction: INTERACTION_DOT
    dense_optimizer { type: SGD learning_rate: 0.1 }
    sparse_optimizer { type: ADAM learning_rate: 0.01 }
    seed: 17
  )" + extra);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto c = NormalizeModelConfig(*parsed);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Shards table `k` of a model over `world` ranks as `kind` names:
// "table" (table-wise on rank (k + 1) % world), "one_owner" (table-wise on
// rank 0: the other ranks own nothing), "column" (column-wise over every
// rank, the last first), "row" (row-wise), "data" (data-parallel), "mixed"
// (table k of four gets the k-th of table-wise on the last rank,
// column-wise, row-wise and data-parallel). Any other kind leaves the
// table as it is (the plan decides) and returns false.
inline bool ShardTableAs(const std::string& kind, int k, int world,
                         TableConfig* t) {
  if (kind == "table") {
    t->set_sharding(SHARDING_TABLE_WISE);
    t->add_shard_ranks((k + 1) % world);
  } else if (kind == "one_owner") {
    t->set_sharding(SHARDING_TABLE_WISE);
    t->add_shard_ranks(0);
  } else if (kind == "column") {
    t->set_sharding(SHARDING_COLUMN_WISE);
    for (int r = world - 1; r >= 0; --r) t->add_shard_ranks(r);
  } else if (kind == "row") {
    t->set_sharding(SHARDING_ROW_WISE);
  } else if (kind == "data") {
    t->set_sharding(SHARDING_DATA_PARALLEL);
  } else if (kind == "mixed") {
    const ShardingKind kinds[] = {SHARDING_TABLE_WISE, SHARDING_COLUMN_WISE,
                                  SHARDING_ROW_WISE, SHARDING_DATA_PARALLEL};
    t->set_sharding(kinds[k]);
    if (k == 0) t->add_shard_ranks(world - 1);
  } else {
    return false;
  }
  return true;
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_SHARDING_H_
