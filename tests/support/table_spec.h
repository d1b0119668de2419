// Table specs, ids, gradients and records for the embedding store tests
// (header only: the test binaries that include it link dlrm_embedding
// themselves).
#ifndef DLRM_TESTS_SUPPORT_TABLE_SPEC_H_
#define DLRM_TESTS_SUPPORT_TABLE_SPEC_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/random.h"
#include "core/status.h"
#include "data/batch.h"
#include "embedding/embedding_store.h"
#include "tests/support/optimizer.h"

namespace dlrm::test {

// A whole table of `rows` x `dim` with MakeOptimizer(type) and `seed`.
inline embedding::TableSpec MakeTableSpec(int table_index, int64_t rows,
                                          int dim, Pooling pooling,
                                          OptimizerConfig::Type type,
                                          uint64_t seed) {
  return embedding::TableSpec{.table_index = table_index,
                              .rows = rows,
                              .dim = dim,
                              .pooling = pooling,
                              .optimizer = MakeOptimizer(type),
                              .seed = seed,
                              .slice = {}};
}

// A store test's parameters: optimizer, pooling, eviction policy.
using StoreCase =
    std::tuple<OptimizerConfig::Type, Pooling, embedding::EvictionPolicy>;

// The name of a StoreCase, e.g. "RowwiseAdagradSumLru", for
// INSTANTIATE_TEST_SUITE_P.
inline std::string StoreCaseName(
    const ::testing::TestParamInfo<StoreCase>& info) {
  const OptimizerConfig::Type type = std::get<0>(info.param);
  return std::string(type == OptimizerConfig::SGD       ? "Sgd"
                     : type == OptimizerConfig::ADAGRAD ? "Adagrad"
                     : type == OptimizerConfig::ROWWISE_ADAGRAD
                         ? "RowwiseAdagrad"
                         : "Adam") +
         (std::get<1>(info.param) == POOLING_SUM ? "Sum" : "Mean") +
         (std::get<2>(info.param) == embedding::EvictionPolicy::kLru ? "Lru"
                                                                     : "Lfu");
}

// One bag of `ids`.
inline data::SparseFeature Bag(std::vector<int64_t> ids) {
  data::SparseFeature f;
  f.offsets = {0, static_cast<int64_t>(ids.size())};
  f.ids = std::move(ids);
  return f;
}

// `bags` bags of 0..max_hot ids (one in eight empty), id i of a bag
// `pick(f, i)` (f: the ids so far).
template <typename Pick>
data::SparseFeature RandomBags(Rng& rng, int64_t bags, int max_hot, Pick pick) {
  data::SparseFeature f;
  f.offsets.push_back(0);
  for (int64_t s = 0; s < bags; ++s) {
    const int64_t n = rng.Below(8) == 0 ? 0 : 1 + rng.Below(max_hot);
    for (int64_t i = 0; i < n; ++i) f.ids.push_back(pick(f, i));
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  return f;
}

// RandomBags of ids skewed as a cache sees them: 60% from 32 hot rows, 25%
// from the first 332, the rest uniform over the table; with `repeats`, one
// in four (after the first) a repeat of the bag's previous id.
inline data::SparseFeature SkewedIds(Rng& rng, int64_t rows, int64_t bags,
                                     int max_hot, bool repeats) {
  return RandomBags(rng, bags, max_hot,
                    [&](const data::SparseFeature& f, int64_t i) -> int64_t {
                      const uint64_t u = rng.Below(100);
                      if (repeats && i > 0 && rng.Below(4) == 0) {
                        return f.ids.back();
                      }
                      if (u < 60) return rng.Below(std::min<int64_t>(32, rows));
                      if (u < 85) {
                        return rng.Below(std::min<int64_t>(332, rows));
                      }
                      return rng.Below(rows);
                    });
}

// RandomBags of ids half from a hot set of 64 rows, half uniform over the
// table, and one in four (after the first) a repeat of the bag's previous
// id (duplicates within a bag).
inline data::SparseFeature HotHalfIds(Rng& rng, int64_t rows, int64_t bags,
                                      int max_hot) {
  return RandomBags(rng, bags, max_hot,
                    [&](const data::SparseFeature& f, int64_t i) -> int64_t {
                      if (i > 0 && rng.Below(4) == 0) return f.ids.back();
                      if (rng.Below(2) == 0) {
                        return rng.Below(std::min<int64_t>(64, rows));
                      }
                      return rng.Below(rows);
                    });
}

// A normal gradient for `bags` bags of `dim` (at least one float).
inline std::vector<float> RandomGrad(Rng& rng, int64_t bags, int dim) {
  std::vector<float> g(std::max<int64_t>(1, bags * dim));
  for (float& x : g) x = static_cast<float>(rng.Normal());
  return g;
}

// store.Prepare(batches[i]), with the prefetch of batches[i + 1] that
// `prefetch` asks for: 0 none, 1 after the Prepare (as the model does), 2
// before it. The first error of the calls.
inline absl::StatusOr<const data::SparseFeature*> PrepareWithPrefetch(
    embedding::EmbeddingStore& store,
    const std::vector<data::SparseFeature>& batches, int i, int prefetch) {
  if (prefetch == 2) RETURN_IF_ERROR(store.Prefetch(batches[i + 1]));
  ASSIGN_OR_RETURN(const data::SparseFeature* prepared,
                   store.Prepare(batches[i]));
  if (prefetch == 1) RETURN_IF_ERROR(store.Prefetch(batches[i + 1]));
  return prepared;
}

// Every row's record (weights, then optimizer state) of `store`.
inline std::vector<float> AllRecords(embedding::EmbeddingStore& store) {
  const embedding::TableSpec& spec = store.spec();
  const int64_t floats =
      spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim);
  std::vector<float> records(spec.rows * floats);
  const absl::Status st = store.ReadRows(0, spec.rows, records.data());
  EXPECT_TRUE(st.ok()) << st;
  return records;
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_TABLE_SPEC_H_
