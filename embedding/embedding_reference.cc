// The plain-loop references of EmbeddingTable's kernels
// (embedding/embedding_table.h, namespace reference): what the optimized
// lookups and fused updates are tested against.
#include <vector>

#include "embedding/embedding_table.h"
#include "embedding/row_precision.h"
#include "optim/optimizer.h"

namespace dlrm::embedding {

namespace reference {

void PoolForward(const float* weights, int dim, Pooling pooling,
                 const data::SparseFeature& ids, float* out,
                 int64_t out_stride) {
  for (int64_t s = 0; s < ids.num_bags(); ++s) {
    float* o = out + s * out_stride;
    for (int c = 0; c < dim; ++c) o[c] = 0.0f;
    for (int64_t p = ids.offsets[s]; p < ids.offsets[s + 1]; ++p) {
      for (int c = 0; c < dim; ++c) o[c] += weights[ids.ids[p] * dim + c];
    }
    const int64_t n = ids.bag_size(s);
    if (pooling == POOLING_MEAN && n > 0) {
      const float scale = 1.0f / static_cast<float>(n);
      for (int c = 0; c < dim; ++c) o[c] *= scale;
    }
  }
}

void DenseGradientUpdate(float* weights, float* state1, float* state2,
                         int64_t rows, int dim, Pooling pooling,
                         const OptimizerConfig& optimizer, int64_t step,
                         const data::SparseFeature& ids, const float* grad,
                         int64_t grad_stride) {
  std::vector<float> dense(static_cast<size_t>(rows) * dim, 0.0f);
  std::vector<bool> touched(rows, false);
  for (int64_t s = 0; s < ids.num_bags(); ++s) {
    const int64_t n = ids.bag_size(s);
    for (int64_t p = ids.offsets[s]; p < ids.offsets[s + 1]; ++p) {
      const int64_t r = ids.ids[p];
      touched[r] = true;
      for (int c = 0; c < dim; ++c) {
        const float gs = grad[s * grad_stride + c];
        if (pooling == POOLING_MEAN) {
          dense[r * dim + c] += gs * (1.0f / static_cast<float>(n));
        } else {
          dense[r * dim + c] += gs;
        }
      }
    }
  }

  // The optimizer's math is the shared rule's (tested on its own in
  // optim_test); what this checks is the gradient each row gets.
  int64_t floats[2] = {0, 0};
  const std::span<const optim::StateArray> arrays =
      optim::SparseState(optimizer);
  for (size_t k = 0; k < arrays.size() && k < 2; ++k) {
    floats[k] = optim::FloatsPerRow(arrays[k], dim);
  }
  optim::VisitElementWise(optimizer.type(), [&](auto rule) {
    using Rule = decltype(rule);
    const typename Rule::Step constants = Rule::MakeStep(optimizer, step);
    for (int64_t r = 0; r < rows; ++r) {
      if (!touched[r]) continue;
      optim::UpdateSparseRow<Rule>(constants, dense.data() + r * dim, dim,
                                   weights + r * dim, state1 + r * floats[0],
                                   state2 + r * floats[1]);
    }
  });
}

void DenseGradientUpdate16(uint16_t* words, RowPrecision precision,
                           float* state1, float* state2, int64_t rows, int dim,
                           Pooling pooling, const OptimizerConfig& optimizer,
                           int64_t step, const data::SparseFeature& ids,
                           const float* grad, int64_t grad_stride,
                           uint64_t seed, int table, int64_t row_begin,
                           int col_begin) {
  const size_t n = static_cast<size_t>(rows) * dim;
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = WordToFloat(precision, words[i]);
  std::vector<bool> touched(rows, false);
  for (int64_t id : ids.ids) touched[id] = true;
  DenseGradientUpdate(w.data(), state1, state2, rows, dim, pooling, optimizer,
                      step, ids, grad, grad_stride);
  for (int64_t r = 0; r < rows; ++r) {
    if (!touched[r]) continue;
    const uint64_t key = RoundingRowKey(seed, table, row_begin + r, step);
    for (int c = 0; c < dim; ++c) {
      words[r * dim + c] = FloatToWordStochastic(
          precision, w[r * dim + c], RoundingBits(key, col_begin + c));
    }
  }
}

}  // namespace reference

}  // namespace dlrm::embedding
