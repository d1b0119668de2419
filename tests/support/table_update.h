// Random bags and gradients for the embedding kernel tests, and the check
// that runs a table's fused sparse update against a plain reference,
// bitwise (header only: the test binaries that include it link
// dlrm_embedding and OpenMP themselves).
#ifndef DLRM_TESTS_SUPPORT_TABLE_UPDATE_H_
#define DLRM_TESTS_SUPPORT_TABLE_UPDATE_H_

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/random.h"
#include "data/batch.h"
#include "embedding/embedding_table.h"
#include "tests/support/expect.h"

namespace dlrm::test {

// `bags` bags of 0..max_hot ids from [0, rows) (about one in six empty when
// max_hot > 1, skewed to small ids so a bag often repeats one), and one bag
// holding a single id three times.
inline data::SparseFeature SmallIdBags(Rng& rng, int64_t rows, int64_t bags,
                                       int max_hot) {
  data::SparseFeature f;
  f.offsets.push_back(0);
  for (int64_t s = 0; s < bags; ++s) {
    const int64_t n = max_hot > 1 && rng.Below(6) == 0
                          ? 0
                          : 1 + rng.Below(static_cast<uint64_t>(max_hot));
    for (int64_t i = 0; i < n; ++i) {
      const double u = rng.Uniform();
      f.ids.push_back(std::min<int64_t>(rows - 1, u * u * u * rows));
    }
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  const int64_t id = rng.Below(static_cast<uint64_t>(rows));
  for (int i = 0; i < 3; ++i) f.ids.push_back(id);
  f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  return f;
}

// `n` standard normal floats (at least one).
inline std::vector<float> NormalFloats(Rng& rng, int64_t n) {
  std::vector<float> v(std::max<int64_t>(n, 1));
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

// Two steps of `table.BackwardUpdate` at `threads` OpenMP threads, each on
// SmallIdBags(rng, rows, bags, max_hot) and NormalFloats gradients of stride
// dim + 3, and of `reference(w, s1, s2, step, ids, grad, stride)` on copies
// of the table's `weights` (rows x dim of W: the table's fp32 weights or
// 16-bit words) and optimizer state taken first; then the table against the
// copies, bitwise, the failures naming `label`.
template <typename W, typename Reference>
void ExpectTwoUpdatesMatchReference(embedding::EmbeddingTable& table,
                                    const W* weights, int64_t rows, int dim,
                                    int64_t bags, int max_hot, int threads,
                                    Rng& rng, const std::string& label,
                                    Reference reference) {
  std::vector<W> w(weights, weights + rows * dim);
  std::vector<float> s1(table.state1().begin(), table.state1().end());
  std::vector<float> s2(table.state2().begin(), table.state2().end());
  const int saved = omp_get_max_threads();
  for (int step = 1; step <= 2; ++step) {
    const data::SparseFeature ids = SmallIdBags(rng, rows, bags, max_hot);
    const int64_t stride = dim + 3;
    const std::vector<float> grad = NormalFloats(rng, ids.num_bags() * stride);
    omp_set_num_threads(threads);
    table.BackwardUpdate(ids, grad.data(), stride);
    omp_set_num_threads(saved);
    reference(w.data(), s1.data(), s2.data(), step, ids, grad.data(), stride);
  }
  EXPECT_EQ(BitDifferences(weights, w.data(), w.size(), label + " weights"), 0);
  EXPECT_EQ(BitDifferences(table.state1().data(), s1.data(), s1.size(),
                           label + " s1"),
            0);
  EXPECT_EQ(BitDifferences(table.state2().data(), s2.data(), s2.size(),
                           label + " s2"),
            0);
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_TABLE_UPDATE_H_
