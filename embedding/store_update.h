// The sparse update of many stores at once on OpenMP threads, a big
// table's rows shared among threads (EmbeddingStore::BeginUpdate): the
// model's step and dlrm_bench_embedding call it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "data/batch.h"
#include "embedding/embedding_store.h"

namespace dlrm::embedding {

// One store's update: BackwardUpdate(*prepared, grad, grad_stride).
struct StoreUpdate {
  // Borrowed; distinct stores. Default: null (invalid).
  EmbeddingStore* store = nullptr;
  // BackwardUpdate's arguments. Default: null (invalid), 0.
  const data::SparseFeature* prepared = nullptr;
  const float* grad = nullptr;
  int64_t grad_stride = 0;
  // Out: the update's status. Default: OK.
  absl::Status status;
};

// A range of one store's distinct rows, as UpdateStores hands them out.
struct RowRange {
  // Index of the store in the call's list.
  int store = 0;
  // Distinct rows [begin, end) of its batch.
  int64_t begin = 0;
  int64_t end = 0;
  // Its share of the store's work (ids x dim), which orders the hand-out.
  int64_t work = 0;
};

// The work one range of UpdateStores aims at, for stores of work[j] (ids x
// dim) at `threads` threads: all the work / (2 x threads), at least 1. A
// store with more is split.
int64_t RangeShare(std::span<const int64_t> work, int threads);

// The ranges UpdateStores cuts for stores of work[j] with units[j] distinct
// rows (0: not split): each store with units in ceil(work / share) ranges
// of even row counts, at most one per 256 rows and at least one; every such
// store's [0, units) covered once; the ranges with the most work first
// (ties by store, then row). work and units have one entry per store.
std::vector<RowRange> PlanRowRanges(std::span<const int64_t> work,
                                    std::span<const int64_t> units,
                                    int64_t share);

// Runs every update, with the bits each BackwardUpdate alone gives, on the
// threads of OpenMP loops. A store with more than its share of the work
// (RangeShare) is split: its BeginUpdate (deduplication) in the first
// loop, its distinct rows in the ranges of PlanRowRanges in the second (two
// threads never touch one row), its EndUpdate after; the other stores take
// their whole BackwardUpdate in the first loop, which hands out the stores
// with the most ids x dim first. (A tier whose BeginUpdate does the whole
// update gives no ranges.) With no store to split this is one loop, as
// BackwardUpdate store by store. Sets each update's status (the first error
// of its calls; a split store whose BeginUpdate or a range failed gets no
// EndUpdate). Call it outside any parallel region; it opens its own.
void UpdateStores(std::span<StoreUpdate> updates);

}  // namespace dlrm::embedding
