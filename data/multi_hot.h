// Multi-hot bags derived from one-hot categorical rows, in the spirit of the
// MLPerf DLRM-DCNv2 reference, which derives its multi-hot Criteo 1TB from
// the one-hot days (docs/benchmark.md "Multi-hot data").
//
// A bag of k ids for one-hot row v of a table of `rows` rows is
//   v, then for j = 1 .. k-1: floor(HashKey(seed, v, j) * rows / 2^64)
// (HashKey from core/random.h), so the bag is a pure function of (seed,
// rows, k, v): the same value gets the same bag in every file, reader,
// record and rank. Table t of a dataset uses seed kMultiHotSeed + t.
//
// A dynamic table (TableConfig.dynamic) has no rows to scale into: its bag
// for raw id v is v, then DynamicId(HashKey(seed, v, j)) (the hash's low
// 63 bits, data/batch.h) for j = 1 .. k-1, the same hashes with no modulo.
#pragma once

#include <cstdint>

namespace dlrm::data {

// Base seed of the derivation; table t's seed is kMultiHotSeed + t (as
// MLPerf's reference seeds one fixed generator for its tables).
inline constexpr uint64_t kMultiHotSeed = 0;

// Longest bag the derivation and the Criteo readers accept: far above any
// real table's (MLPerf DCNv2's longest is 100), low enough that a bad size
// cannot ask for gigabytes per batch.
inline constexpr int kMaxMultiHotSize = 1 << 16;

// Seed of table `table` (0-based) of a dataset.
inline uint64_t MultiHotTableSeed(int table) {
  return kMultiHotSeed + static_cast<uint64_t>(table);
}

// Writes the `size` ids of the bag of one-hot row `row` to out[0 .. size):
// out[0] = row, the others uniform in [0, rows) as the header says.
// Requires 0 <= row < rows and 1 <= size; `out` holds `size` ids.
void DeriveMultiHotBag(int64_t row, int64_t rows, int size, uint64_t seed,
                       int64_t* out);

// The bag of a dynamic table's raw id `id` (in [0, 2^63 - 1)): out[0] = id,
// the others DynamicId(HashKey(seed, id, j)). Requires 1 <= size; `out`
// holds `size` ids.
void DeriveDynamicMultiHotBag(int64_t id, int size, uint64_t seed,
                              int64_t* out);

}  // namespace dlrm::data
