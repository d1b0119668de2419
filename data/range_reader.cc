// RangeReader: sample ranges of a BatchSource by Skip and Rewind.
#include "data/range_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::data {

RangeReader::RangeReader(std::unique_ptr<BatchSource> source, int num_dense,
                         int num_sparse, std::string name)
    : source_(std::move(source)),
      num_dense_(num_dense),
      num_sparse_(num_sparse),
      name_(std::move(name)) {}

absl::Status RangeReader::Read(int64_t begin, int64_t count, Batch* batch) {
  batch->Reset(num_dense_, num_sparse_);
  if (begin < 0 || count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": sample range [",
                                                   begin, ", ", begin, " + ",
                                                   count, ") is negative"));
  }
  if (count == 0) return absl::OkStatus();
  // Until this read is done the position is unknown: an error anywhere
  // below makes the next Read start from the first sample.
  int64_t at = position_;
  position_ = -1;
  if (at < 0 || begin < at) {
    RETURN_IF_ERROR(source_->Rewind());
    at = 0;
  }
  if (begin > at) {
    ASSIGN_OR_RETURN(const int64_t skipped, source_->Skip(begin - at));
    at += skipped;
    if (at < begin) {
      return absl::OutOfRangeError(absl::StrCat(
          name_, ": the data ends at sample ", at, ", before the range [",
          begin, ", ", begin + count, ") (did it change while the job ran?)"));
    }
  }
  ASSIGN_OR_RETURN(bool more, source_->Next(count, batch));
  int64_t got = more ? batch->size : 0;
  // Sources fill a batch in one Next except at the end of the data; this
  // loop keeps the contract for any source.
  while (more && got < count) {
    ASSIGN_OR_RETURN(more, source_->Next(count - got, &more_));
    if (!more || more_.size == 0) break;
    batch->Append(more_);
    got += more_.size;
  }
  if (got < count) {
    batch->Reset(num_dense_, num_sparse_);
    return absl::OutOfRangeError(
        absl::StrCat(name_, ": the data ends at sample ", begin + got,
                     ", before the range [", begin, ", ", begin + count,
                     ") (did it change while the job ran?)"));
  }
  position_ = begin + count;
  return absl::OkStatus();
}

}  // namespace dlrm::data
