// RotatingSource: pre-generated batches in rotation.
#include "data/rotating_source.h"

#include "absl/strings/str_cat.h"

namespace dlrm::data {

absl::StatusOr<bool> RotatingSource::Next(int64_t max_samples, Batch* batch) {
  if (next_ == count_) {
    *batch = Batch();
    return false;
  }
  const Batch& b = (*batches_)[next_++ % batches_->size()];
  if (b.size > max_samples) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pre-generated batch of ", b.size, " > max_samples ", max_samples));
  }
  *batch = b;
  return true;
}

absl::Status RotatingSource::Rewind() {
  next_ = 0;
  return absl::OkStatus();
}

}  // namespace dlrm::data
