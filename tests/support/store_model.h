// What the tests of a model over its storage tiers share: a small
// three-table model (multi-hot, one mean-pooled table) whose every update
// visibly moves the rows, the same model with its tables on RocksDB, and a
// model built or failed as a test expectation.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "model/model.h"

namespace dlrm::test {

// Tables C1-C3 of 2000, 3000 and 1500 rows at dim 8, four ids per bag (C2
// mean-pooled), rows of precision `precision`; MLPs 5-16-8 and 8-16-1; SGD
// for the dense part and `sparse` for the tables, at rates large enough
// that every update visibly moves the rows; normalised.
inline ModelConfig StoreTestConfig(OptimizerConfig::Type sparse, uint64_t seed,
                                   RowPrecision precision = ROW_FP32) {
  ModelConfig c;
  c.set_num_dense_features(5);
  c.set_embedding_dim(8);
  const int64_t rows[] = {2000, 3000, 1500};
  for (int k = 0; k < 3; ++k) {
    TableConfig* t = c.add_tables();
    t->set_name(absl::StrCat("C", k + 1));
    t->set_rows(rows[k]);
    t->set_multi_hot_size(4);
    t->set_pooling(k == 1 ? POOLING_MEAN : POOLING_SUM);
    t->set_weight_precision(precision);
  }
  c.add_bottom_mlp(16);
  c.add_bottom_mlp(8);
  c.add_top_mlp(16);
  c.add_top_mlp(1);
  c.mutable_dense_optimizer()->set_type(OptimizerConfig::SGD);
  c.mutable_sparse_optimizer()->set_type(sparse);
  c.mutable_sparse_optimizer()->set_learning_rate(
      sparse == OptimizerConfig::ADAM ? 0.01f : 0.5f);
  c.set_seed(seed);
  auto n = NormalizeModelConfig(c);
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *n : c;
}

// `base` with every table on RocksDB under `dir`: a cache of `cache_rows`
// rows, or 10% of the rows when 0, evicting by `eviction`.
inline ModelConfig OnRocksDb(
    const ModelConfig& base, const std::string& dir, int64_t cache_rows = 0,
    RocksDbConfig::Eviction eviction = RocksDbConfig::LRU) {
  RocksDbConfig r;
  r.set_path(dir);
  r.set_cache_rows(cache_rows);
  r.set_cache_fraction(0.1);
  r.set_eviction(eviction);
  auto c = PlaceTablesOnRocksDb(base, {"all"}, r);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : base;
}

// Model::Create(c), or null after a failed expectation naming the status.
inline std::unique_ptr<model::Model> MakeModel(const ModelConfig& c) {
  auto m = model::Model::Create(c);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

}  // namespace dlrm::test
