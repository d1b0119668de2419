// What the tests of a model over its storage tiers share: a small
// three-table model (multi-hot, one mean-pooled table) whose every update
// visibly moves the rows, the same model with its tables on RocksDB, a
// model built or failed as a test expectation, scratch directories, two
// models trained side by side, the rows read back through the stores and
// the weights export compared.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "data/batch.h"
#include "embedding/embedding_store.h"
#include "model/model.h"
#include "model/weights_export.h"
#include "tests/support/files.h"

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

// TempDir()/`test`_`name`_PID, removed if it is there (not created).
inline std::string ScratchDir(const std::string& test,
                              const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      (test + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

// Trains `a` and `b` on each batch in turn, `b` given the next batch to
// prefetch when `prefetch`: both steps succeed with the same loss.
inline void TrainBothExpectSameLoss(model::Model& a, model::Model& b,
                                    std::span<const data::Batch> batches,
                                    bool prefetch = false) {
  for (size_t i = 0; i < batches.size(); ++i) {
    const data::Batch* next =
        prefetch && i + 1 < batches.size() ? &batches[i + 1] : nullptr;
    auto x = a.TrainStep(batches[i]);
    auto y = b.TrainStep(batches[i], next);
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(x->loss, y->loss) << "step " << i;
  }
}

// The losses of `m` trained on batches[begin, end), one step each; a step
// that fails is a test failure and ends the list there.
inline std::vector<double> TrainLosses(model::Model& m,
                                       const std::vector<data::Batch>& batches,
                                       int begin, int end) {
  std::vector<double> losses;
  for (int i = begin; i < end; ++i) {
    auto r = m.TrainStep(batches[i]);
    EXPECT_TRUE(r.ok()) << "step " << i << ": " << r.status();
    if (!r.ok()) break;
    losses.push_back(r->loss);
  }
  return losses;
}

// Every table's records (weights as floats, then optimizer state), read
// through the stores with ReadRows, each followed by the table's step when
// `with_steps`.
inline std::vector<float> StoreRecords(model::Model& m, bool with_steps) {
  std::vector<float> out;
  for (int k = 0; k < m.config().tables_size(); ++k) {
    embedding::EmbeddingStore& s = *m.shards().WholeStore(k);
    const int64_t floats = s.spec().dim + embedding::StateFloatsPerRow(
                                              s.spec().optimizer, s.spec().dim);
    std::vector<float> records(s.spec().rows * floats);
    EXPECT_TRUE(s.ReadRows(0, s.spec().rows, records.data()).ok());
    out.insert(out.end(), records.begin(), records.end());
    if (with_steps) out.push_back(static_cast<float>(s.step()));
  }
  return out;
}

// Exports `a` and `b` as `dir`/host.safetensors and `dir`/rocks.safetensors:
// both succeed and the files are the same bytes. Returns b's file.
inline std::string ExpectSameExport(model::Model& a, model::Model& b,
                                    const std::string& dir) {
  const std::string pa =
      (std::filesystem::path(dir) / "host.safetensors").string();
  const std::string pb =
      (std::filesystem::path(dir) / "rocks.safetensors").string();
  EXPECT_TRUE(model::ExportSafetensors(a, pa).ok());
  EXPECT_TRUE(model::ExportSafetensors(b, pb).ok());
  EXPECT_EQ(ReadFile(pa), ReadFile(pb));
  return pb;
}

}  // namespace dlrm::test
