// The chunk plan of the sparse backward pass: how a unique row's run of
// occurrences (its stretch of the sorted (id, bag) pairs) is cut into chunks
// whose gradient sums run in parallel and are then added in chunk order.
// Compiled for the host and the device (core/host_device.h), so the CUDA
// kernels (cuda/sparse_backward.cu) and their host stand-in
// (sparse_backward_host.h) cut the same chunks.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace dlrm::embedding {

// Most occurrences one chunk sums. A run of at most this many is one serial
// sum in bag order, as the CPU table sums it (the same bits); a longer run
// is cut into chunks of kSparseChunk occurrences, the last one shorter.
// Why 64: a run costs about kSparseChunk dependent rounds (bag index, bag
// size, gradient row) in the chunk kernel plus count / kSparseChunk loads
// in the combine, which are independent (about four in flight); for
// Criteo's tiny tables (3-155 rows, 10^4-10^5 hits of a row per batch) the
// two halves balance at 40-90 (reasoned, not timed: no GPU has run it).
inline constexpr int32_t kSparseChunk = 64;

// Chunks a run of `count` occurrences is cut into: 0 when it is summed
// whole (count <= kSparseChunk), otherwise ceil(count / kSparseChunk).
DLRM_HOST_DEVICE constexpr int32_t SplitChunks(int32_t count) {
  return count <= kSparseChunk ? 0 : (count - 1) / kSparseChunk + 1;
}

// An upper bound on the chunks of all runs of a batch of `n` occurrences,
// which sizes the partial sums before the runs are known: a split run of c
// occurrences has ceil(c / C) <= 2 floor(c / C) chunks, and the floors add
// up to at most floor(n / C).
DLRM_HOST_DEVICE constexpr int64_t MaxSplitChunks(int64_t n) {
  return 2 * (n / kSparseChunk);
}

// The last index s in [0, n) with sorted[s] <= x, for a non-decreasing
// `sorted` with sorted[0] <= x (equal entries pass to the last of them):
// a binary search, the sparse backward's for an occurrence's bag and a
// chunk's run.
template <typename T>
DLRM_HOST_DEVICE inline int64_t LastAtMost(const T* sorted, int64_t n,
                                           int64_t x) {
  int64_t lo = 0, hi = n;  // sorted[lo] <= x < sorted[hi] (or the end)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The run that chunk j belongs to: the last k in [0, num_runs) with
// chunk_starts[k] <= j, where chunk_starts is the exclusive sum of
// SplitChunks over the runs (runs of no chunks share their start with the
// next run, so the search passes them) and j < the chunks' total.
DLRM_HOST_DEVICE inline int64_t RunOfChunk(const int32_t* chunk_starts,
                                           int64_t num_runs, int64_t j) {
  return LastAtMost(chunk_starts, num_runs, j);
}

// Occurrences [begin, end) of the sorted pairs that chunk `chunk` (counted
// from 0 within its run) of a run starting at `run_start` with `run_count`
// occurrences sums.
struct ChunkRange {
  int64_t begin = 0;
  int64_t end = 0;
};
DLRM_HOST_DEVICE inline ChunkRange ChunkOccurrences(int64_t run_start,
                                                    int64_t run_count,
                                                    int64_t chunk) {
  ChunkRange r;
  r.begin = run_start + chunk * kSparseChunk;
  const int64_t run_end = run_start + run_count;
  r.end = r.begin + kSparseChunk < run_end ? r.begin + kSparseChunk : run_end;
  return r;
}

}  // namespace dlrm::embedding
