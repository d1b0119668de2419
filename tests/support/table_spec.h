// Table specs for the embedding store tests (header only: the test binaries
// that include it link dlrm_embedding themselves).
#ifndef DLRM_TESTS_SUPPORT_TABLE_SPEC_H_
#define DLRM_TESTS_SUPPORT_TABLE_SPEC_H_

#include <cstdint>

#include "embedding/embedding_store.h"
#include "tests/support/optimizer.h"

namespace dlrm::test {

// A whole table of `rows` x `dim` with MakeOptimizer(type) and `seed`.
inline embedding::TableSpec MakeTableSpec(int table_index, int64_t rows,
                                          int dim, Pooling pooling,
                                          OptimizerConfig::Type type,
                                          uint64_t seed) {
  embedding::TableSpec spec;
  spec.table_index = table_index;
  spec.rows = rows;
  spec.dim = dim;
  spec.pooling = pooling;
  spec.optimizer = MakeOptimizer(type);
  spec.seed = seed;
  return spec;
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_TABLE_SPEC_H_
