// CUDA kernels of the embedding tables: pooled EmbeddingBag lookups (sum or
// mean over multi-hot bags) and the sparse backward pass fused with the
// optimizer (ids deduplicated by a radix sort, each touched row updated once
// by one thread group, no atomics, no dense gradient). They compute what
// EmbeddingTable's CPU kernels compute (embedding_table.h), in the same
// order of float operations except where a hot row's gradient is summed in
// chunks: see docs/cuda.md.
// All pointers are device pointers; work is queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/cuda/cuda_raii.h"
#include "embedding/sparse_chunks.h"
#include "optim/rules.h"

namespace dlrm::embedding::cuda {

// One table's ids for a batch in device memory, laid out as
// data::SparseFeature: bag s holds ids[offsets[s] .. offsets[s + 1]).
// Borrowed pointers; they must stay valid until the queued work is done.
struct DeviceBags {
  // num_bags + 1 entries, offsets[0] == 0, non-decreasing, last == num_ids.
  const int64_t* offsets = nullptr;
  const int64_t* ids = nullptr;
  int64_t num_bags = 0;
  int64_t num_ids = 0;
};

// Widest row the kernels take (registers hold a whole row in the backward
// pass): 1024 columns when dim % 4 == 0, 256 otherwise.
int MaxDim(int dim);

// Pools each bag into row s of `out` (out + s * out_stride): the sum of its
// rows, divided by the bag size when `mean`; an empty bag gives zeros. Ids
// must lie in [0, rows) (the batch is validated on the host first); an id
// outside it is skipped rather than read. InvalidArgument for a dim over
// MaxDim(dim) or a stride below dim; Internal on a launch error.
absl::Status PoolForward(const float* weights, int64_t rows, int dim, bool mean,
                         const DeviceBags& bags, float* out, int64_t out_stride,
                         cudaStream_t stream);

// Scratch device memory of SparseBackwardUpdate, grown to the largest batch
// seen and reused. Not thread-safe: one per stream. For n ids: the sort's
// keys and bags, the runs (unique_keys, counts, starts: n each), and when
// n > kSparseChunk the chunk plan (chunk_counts, chunk_starts: n + 1 each)
// and the chunks' partial sums (MaxSplitChunks(n) x dim floats, n * dim / 32
// at most: sparse_chunks.h).
struct BackwardWorkspace {
  dlrm::cuda::DeviceBuffer<uint64_t> keys, sorted_keys, unique_keys;
  dlrm::cuda::DeviceBuffer<int32_t> bags, sorted_bags, counts, starts;
  dlrm::cuda::DeviceBuffer<int32_t> num_unique;
  dlrm::cuda::DeviceBuffer<int32_t> chunk_counts, chunk_starts;
  dlrm::cuda::DeviceBuffer<float> partials;
  dlrm::cuda::RawDeviceBuffer cub_temp;
};

// Applies one optimizer step (`step`: its rule's constants, from
// optim::MakeStep; the rule's functions in optim/rules.h) to every row of
// `weights` (rows x dim) that occurs in `bags`, with the row's gradient: the
// sum over its occurrences (in bag order) of grad row s (grad + s *
// grad_stride), scaled by 1 / bag size when `mean`; a row with more than
// kSparseChunk occurrences sums them in chunks of kSparseChunk, then adds
// the chunks' sums in chunk order (sparse_chunks.h; the host stand-in
// sparse_backward_host.h computes the same sums). state1/state2 as
// EmbeddingTable (the rule's kSparseState arrays; one the rule lacks may be
// null). Ids outside [0, rows) are skipped. Deterministic: the same inputs
// give the same bits. InvalidArgument for a dim over MaxDim(dim), over 256
// without 16-byte aligned rows (pointers and a stride that is a multiple of
// 4), a stride below dim or more than 2^31 - 1 ids; Internal on a CUDA
// error; ResourceExhausted when the workspace cannot grow.
absl::Status SparseBackwardUpdate(float* weights, float* state1, float* state2,
                                  int64_t rows, int dim, bool mean,
                                  const optim::AnyStep& step,
                                  const DeviceBags& bags, const float* grad,
                                  int64_t grad_stride, BackwardWorkspace* ws,
                                  cudaStream_t stream);

// Copies whole rows of `width` floats between `table` (table_rows x width,
// row-major) and a packed array of n rows: GatherRows sets packed row i to
// table row index[i], ScatterRows sets table row index[i] to packed row i
// (indices distinct), for i in [0, n). An index outside [0, table_rows) is
// skipped. 64-bit indexing throughout. InvalidArgument for a negative
// size; Internal on a launch error.
absl::Status GatherRows(const float* table, int64_t table_rows, int64_t width,
                        const int64_t* index, int64_t n, float* packed,
                        cudaStream_t stream);
absl::Status ScatterRows(const float* packed, const int64_t* index, int64_t n,
                         int64_t width, float* table, int64_t table_rows,
                         cudaStream_t stream);

// One table's row arrays as kernels address them: device memory, or host
// memory mapped for the device (dlrm::cuda::HostRegistration). `rows` x
// `dim` weights, then `rows` x state1_floats and `rows` x state2_floats of
// optimizer state (the arrays of EmbeddingTable; null where 0 floats).
struct RecordArrays {
  float* weights = nullptr;
  float* state1 = nullptr;
  float* state2 = nullptr;
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t state1_floats = 0;
  int64_t state2_floats = 0;
};

// Copies whole records (weights and optimizer state) between a table and
// slots of the same dim and state sizes, for i in [0, n): LoadRecords sets
// slot slot_ids[i] to row rows[i] of `table`, StoreRecords sets row rows[i]
// of `table` to slot slot_ids[i] (destinations distinct). `rows` and
// `slot_ids` are device memory; a pair with either index out of range is
// skipped. 64-bit indexing. The CPU reference is embedding::CopyRecords
// (embedding_table.h). InvalidArgument for a negative n, shapes that differ
// or a null array of positive width; Internal on a launch error.
absl::Status LoadRecords(const RecordArrays& table, const int64_t* rows,
                         const RecordArrays& slots, const int64_t* slot_ids,
                         int64_t n, cudaStream_t stream);
absl::Status StoreRecords(const RecordArrays& slots, const int64_t* slot_ids,
                          const RecordArrays& table, const int64_t* rows,
                          int64_t n, cudaStream_t stream);

}  // namespace dlrm::embedding::cuda
