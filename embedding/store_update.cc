// UpdateStores: the big stores' BeginUpdate beside the others' whole
// update, then the big stores' row ranges, each an OpenMP loop with the
// biggest work handed out first, then their EndUpdate.
#include "embedding/store_update.h"

#include <omp.h>

#include <algorithm>
#include <vector>

namespace dlrm::embedding {
namespace {

// A store is cut into ranges of about 1 / (kRangesPerThread x threads) of
// all the work, so the biggest table's rows are spread over every thread
// and the dynamic hand-out can even out the rest.
constexpr int64_t kRangesPerThread = 2;
// No range has fewer distinct rows than this (a range's cost is its rows'
// loads; a smaller one would spend more on the hand-out).
constexpr int64_t kMinRangeRows = 256;

}  // namespace

int64_t RangeShare(std::span<const int64_t> work, int threads) {
  int64_t total = 0;
  for (const int64_t w : work) total += w;
  return std::max<int64_t>(1,
                           total / (kRangesPerThread * std::max(1, threads)));
}

std::vector<RowRange> PlanRowRanges(std::span<const int64_t> work,
                                    std::span<const int64_t> units,
                                    int64_t share) {
  const int n = static_cast<int>(work.size());
  share = std::max<int64_t>(1, share);
  std::vector<RowRange> ranges;
  for (int j = 0; j < n; ++j) {
    if (units[j] <= 0) continue;
    const int64_t pieces =
        std::clamp<int64_t>((work[j] + share - 1) / share, 1,
                            std::max<int64_t>(1, units[j] / kMinRangeRows));
    for (int64_t p = 0; p < pieces; ++p) {
      ranges.push_back(RowRange{j, units[j] * p / pieces,
                                units[j] * (p + 1) / pieces, work[j] / pieces});
    }
  }
  std::stable_sort(
      ranges.begin(), ranges.end(),
      [](const RowRange& a, const RowRange& b) { return a.work > b.work; });
  return ranges;
}

void UpdateStores(std::span<StoreUpdate> updates) {
  const int n = static_cast<int>(updates.size());
  std::vector<int64_t> work(n), units(n, 0);
  std::vector<int> by_work(n);
  for (int j = 0; j < n; ++j) {
    work[j] = static_cast<int64_t>(updates[j].prepared->ids.size()) *
              updates[j].store->spec().dim;
    by_work[j] = j;
  }
  std::stable_sort(by_work.begin(), by_work.end(),
                   [&](int a, int b) { return work[a] > work[b]; });
  const int threads = omp_get_max_threads();
  const int64_t share = RangeShare(work, threads);
  // Only with several threads is a store worth splitting.
  std::vector<char> split(n, 0);
  for (int j = 0; j < n; ++j) split[j] = threads > 1 && work[j] > share;

#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int i = 0; i < n; ++i) {
    const int j = by_work[i];
    StoreUpdate& u = updates[j];
    if (!split[j]) {
      u.status = u.store->BackwardUpdate(*u.prepared, u.grad, u.grad_stride);
      continue;
    }
    absl::StatusOr<int64_t> begun =
        u.store->BeginUpdate(*u.prepared, u.grad, u.grad_stride);
    u.status = begun.status();
    if (begun.ok()) units[j] = *begun;
  }

  const std::vector<RowRange> ranges = PlanRowRanges(work, units, share);
  const int num_ranges = static_cast<int>(ranges.size());
  std::vector<absl::Status> range_status(num_ranges);
#pragma omp parallel for schedule(dynamic, 1) if (num_ranges > 1)
  for (int i = 0; i < num_ranges; ++i) {
    const RowRange& r = ranges[i];
    range_status[i] = updates[r.store].store->UpdateRange(r.begin, r.end);
  }
  for (int i = 0; i < num_ranges; ++i) {
    absl::Status& status = updates[ranges[i].store].status;
    if (status.ok()) status = range_status[i];
  }

  for (int j = 0; j < n; ++j) {
    if (split[j] && updates[j].status.ok()) {
      updates[j].status = updates[j].store->EndUpdate();
    }
  }
}

}  // namespace dlrm::embedding
