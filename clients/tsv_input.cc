// A Criteo TSV BatchSource over any std::istream, tolerant of a missing
// label column.
#include "clients/tsv_input.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/source_checks.h"

namespace dlrm::clients {
namespace {

class StreamSource final : public data::BatchSource {
 public:
  StreamSource(std::istream* in, std::string name, data::CriteoOptions options)
      : in_(in), name_(std::move(name)), options_(std::move(options)) {}

  absl::StatusOr<bool> Next(int64_t max_samples, data::Batch* batch) override {
    const int num_dense = options_.num_dense;
    const int num_sparse = static_cast<int>(options_.table_rows.size());
    RETURN_IF_ERROR(
        data::StartBatch(num_dense, num_sparse, max_samples, batch));
    const int64_t unlabelled_columns = num_dense + num_sparse;
    while (batch->size < max_samples && std::getline(*in_, line_)) {
      ++line_number_;
      if (!line_.empty() && line_.back() == '\r') line_.pop_back();
      if (line_.empty()) continue;
      const std::string where = absl::StrCat(name_, ":", line_number_);
      const int64_t columns = std::count(line_.begin(), line_.end(), '\t') + 1;
      if (columns == unlabelled_columns) {
        labelled_.assign("0\t");
        labelled_.append(line_);
        RETURN_IF_ERROR(data::ParseCriteoLine(labelled_, num_dense, num_sparse,
                                              where, &record_));
      } else {
        RETURN_IF_ERROR(data::ParseCriteoLine(line_, num_dense, num_sparse,
                                              where, &record_));
      }
      data::AppendCriteoRecord(record_, options_, batch);
    }
    if (in_->bad()) {
      return absl::DataLossError(
          absl::StrCat(name_, ": read failed after line ", line_number_));
    }
    return batch->size > 0;
  }

  absl::Status Rewind() override {
    in_->clear();
    in_->seekg(0);
    if (in_->fail()) {
      in_->clear();
      return absl::FailedPreconditionError(
          absl::StrCat(name_, " cannot be rewound (not a seekable file)"));
    }
    line_number_ = 0;
    return absl::OkStatus();
  }

 private:
  std::istream* in_;
  std::string name_;
  data::CriteoOptions options_;
  int64_t line_number_ = 0;
  std::string line_;
  std::string labelled_;
  data::CriteoRecord record_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<data::BatchSource>> OpenCriteoStream(
    std::istream* in, std::string name, data::CriteoOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (in == nullptr) {
    return absl::InvalidArgumentError("OpenCriteoStream: no input stream");
  }
  return std::unique_ptr<data::BatchSource>(
      new StreamSource(in, std::move(name), std::move(options)));
}

}  // namespace dlrm::clients
