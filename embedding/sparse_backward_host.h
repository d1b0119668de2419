// A host stand-in of the CUDA sparse backward pass
// (cuda/embedding_kernels.h, SparseBackwardUpdate): the same inputs, the
// same pipeline (expand, stable sort of (id, bag) pairs, run-length encode,
// exclusive scan, the chunk plan of sparse_chunks.h, chunk partial sums,
// their combine in chunk order) and the same float operations in the same
// order, so the CPU can test the plan and the arithmetic the GPU runs. Built
// everywhere, with or without CUDA. Not a fast path: the CPU table
// (embedding_table.h) is the CPU's kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "data/batch.h"
#include "optim/rules.h"

namespace dlrm::embedding {

// One chunk of a split run: its run k and its occurrences [begin, end) of
// the sorted pairs.
struct SparseChunk {
  int64_t run = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// What each stage of the pipeline produces, as the device's
// BackwardWorkspace holds it (n occurrences, u runs). Reused across calls.
struct SparseBackwardProducts {
  // Every occurrence's sort key (its id, or `rows` for an id outside
  // [0, rows), so that it sorts last and is skipped) and bag, stably sorted
  // by key: a row's occurrences stay in bag order. n each.
  std::vector<uint64_t> sorted_keys;
  std::vector<int32_t> sorted_bags;
  // The runs of sorted_keys: key, length, first occurrence. u each.
  std::vector<uint64_t> unique_keys;
  std::vector<int32_t> counts, starts;
  // Exclusive sum of SplitChunks over the runs (0 for the out-of-range run),
  // u + 1 entries: the last is the number of chunks. (The device scans n + 1
  // entries, zeros past the runs: the same first u + 1.)
  std::vector<int32_t> chunk_starts;
  // The chunk list, in chunk order (run by run, in occurrence order).
  std::vector<SparseChunk> chunks;
  // chunks.size() x dim: each chunk's gradient sum.
  std::vector<float> partials;
  // u x dim: each run's gradient (zeros for the out-of-range run): a whole
  // run's sum when it is not split, its chunks' partials added in chunk
  // order when it is.
  std::vector<float> row_grads;
};

// Runs the pipeline up to the rows' gradients for a batch whose bag s has
// ids[offsets[s] .. offsets[s + 1]) and loss gradient grad row s (grad + s *
// grad_stride), each occurrence's term scaled by 1 / bag size when `mean`.
// `bags` must be well formed (offsets as data::SparseFeature says); ids may
// lie outside [0, rows). InvalidArgument, with `out` unspecified, for
// dim < 1, a stride below dim, rows < 0, or more than 2^31 - 1 ids or bags.
absl::Status SparseBackwardGradients(int64_t rows, int dim, bool mean,
                                     const data::SparseFeature& bags,
                                     const float* grad, int64_t grad_stride,
                                     SparseBackwardProducts* out);

// SparseBackwardUpdate on the host: SparseBackwardGradients, then `step`'s
// rule (optim::UpdateSparseRow, the CPU table's row update) applied once to
// every row in [0, rows) that occurs, with its row gradient. weights is
// rows x dim; state1 / state2 as EmbeddingTable (null where the rule has no
// such array). A batch without ids changes nothing. Errors as
// SparseBackwardGradients, before anything is written.
absl::Status SparseBackwardUpdateHost(float* weights, float* state1,
                                      float* state2, int64_t rows, int dim,
                                      bool mean, const optim::AnyStep& step,
                                      const data::SparseFeature& bags,
                                      const float* grad, int64_t grad_stride,
                                      SparseBackwardProducts* products);

}  // namespace dlrm::embedding
