// ShareReader: the share arithmetic, the read ahead and its hand-over.
#include "server/share_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dlrm::server {

std::vector<int64_t> SplitSamples(int64_t total, int world) {
  std::vector<int64_t> sizes(world, total / world);
  for (int r = 0; r < total % world; ++r) ++sizes[r];
  return sizes;
}

SampleRange Share(SampleRange range, int rank, int world) {
  const std::vector<int64_t> sizes = SplitSamples(range.size, world);
  SampleRange mine{range.begin, sizes[rank]};
  for (int r = 0; r < rank; ++r) mine.begin += sizes[r];
  return mine;
}

void ShareReader::Reset(std::unique_ptr<data::RangeReader> data) {
  Wait();
  ahead_range_.reset();
  data_ = std::move(data);
}

absl::Status ShareReader::Read(SampleRange range, data::Batch* out) {
  if (data_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, " has no data open"));
  }
  const bool ahead = ahead_range_.has_value() &&
                     ahead_range_->begin == range.begin &&
                     ahead_range_->size == range.size;
  const absl::Status read_ahead =
      ahead_read_.valid() ? ahead_read_.get() : absl::OkStatus();
  ahead_range_.reset();
  if (ahead && read_ahead.ok()) {
    std::swap(*out, ahead_);
    return absl::OkStatus();
  }
  // Not read ahead, or that read failed: read it now (and report its error
  // if it fails again).
  const SampleRange mine = Share(range, rank_, world_);
  return data_->Read(mine.begin, mine.size, out);
}

void ShareReader::ReadAhead(SampleRange range) {
  Wait();
  if (data_ == nullptr) return;
  ahead_range_ = range;
  const SampleRange mine = Share(range, rank_, world_);
  ahead_read_ = std::async(std::launch::async, [this, mine] {
    return data_->Read(mine.begin, mine.size, &ahead_);
  });
}

const data::Batch* ShareReader::ReadNext(SampleRange range) {
  Wait();
  ahead_range_.reset();
  if (data_ == nullptr) return nullptr;
  const SampleRange mine = Share(range, rank_, world_);
  if (!data_->Read(mine.begin, mine.size, &ahead_).ok()) return nullptr;
  ahead_range_ = range;
  return &ahead_;
}

void ShareReader::Wait() {
  if (ahead_read_.valid()) ahead_read_.get().IgnoreError();
}

}  // namespace dlrm::server
