// ShareReader: one rank's reading of its share of a dataset job's batches,
// each the SplitSamples part of a sample range, with the next share read
// ahead on a background thread (server::RankGroup's TrainStepAt).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "data/batch.h"
#include "data/range_reader.h"

namespace dlrm::server {

// Samples [begin, begin + size) of a job's data, in the data's order.
struct SampleRange {
  int64_t begin = 0;
  int64_t size = 0;
};

// The sizes of `world` contiguous parts of `total` samples: the first
// total % world parts get one sample more.
std::vector<int64_t> SplitSamples(int64_t total, int world);

// Rank `rank` of `world`'s part of `range`: its SplitSamples part.
SampleRange Share(SampleRange range, int rank, int world);

// Not thread-safe: one caller at a time (the rank group's lock); only the
// read ahead runs beside it, on its own thread.
class ShareReader {
 public:
  ShareReader(int rank, int world) : rank_(rank), world_(world) {}
  // Waits for a read ahead still running.
  ~ShareReader() { Wait(); }
  ShareReader(const ShareReader&) = delete;
  ShareReader& operator=(const ShareReader&) = delete;

  // Reads from `data` from now on (null: no data), after any read ahead of
  // the data before has finished.
  void Reset(std::unique_ptr<data::RangeReader> data);
  bool has_data() const { return data_ != nullptr; }

  // This rank's share of `range` into `out`: the one read ahead when it is
  // that range's (waiting for it if it is still being read), else read now.
  // FailedPrecondition without data; the reader's error naming the file.
  absl::Status Read(SampleRange range, data::Batch* out);

  // Starts reading this rank's share of `range` on a background thread,
  // for the next Read of that range.
  void ReadAhead(SampleRange range);

  // Reads this rank's share of `range` now, for the next Read of that
  // range, and returns it (null when it cannot be read: that Read reads
  // it again and reports the error). For a caller that needs the next
  // share's ids before the step (the prefetch of rows on RocksDB).
  const data::Batch* ReadNext(SampleRange range);

  // Waits for a read ahead still running.
  void Wait();

 private:
  const int rank_, world_;
  std::unique_ptr<data::RangeReader> data_;
  // The share read ahead and the range it is the share of; while
  // ahead_read_ is valid its read may still run, and only it touches data_
  // and ahead_.
  data::Batch ahead_;
  std::optional<SampleRange> ahead_range_;
  std::future<absl::Status> ahead_read_;
};

}  // namespace dlrm::server
