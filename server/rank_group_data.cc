// RankGroup's dataset jobs: every rank opens the job's data (OpenData,
// CloseData) and trains on its own share of a sample range (TrainStepAt),
// read through its ShareReader.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/datasets.h"
#include "server/rank_group.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {

absl::Status RankGroup::OpenData(const DatasetSpec& spec) {
  std::string bytes;
  if (spec.source_case() == DatasetSpec::SOURCE_NOT_SET ||
      !spec.SerializeToString(&bytes)) {
    return absl::InvalidArgumentError("the dataset spec has no source");
  }
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (world_ > 1) {
    RETURN_IF_ERROR(SendCommand(kData, size, {}));
    RETURN_IF_ERROR(BroadcastString(&bytes, size));
  }
  return SetData(bytes);
}

absl::Status RankGroup::CloseData() {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  if (world_ > 1) RETURN_IF_ERROR(SendCommand(kData, 0, {}));
  return SetData("");
}

absl::Status RankGroup::SetData(const std::string& bytes) {
  shares_.Reset(nullptr);
  absl::Status local;
  if (!bytes.empty()) {
    DatasetSpec spec;
    absl::StatusOr<OpenedDataset> opened =
        spec.ParseFromString(bytes)
            ? OpenResolvedDataset(spec, model_->config(), "train")
            : absl::InternalError("the dataset spec from rank 0 is garbled");
    if (opened.ok()) {
      shares_.Reset(std::make_unique<data::RangeReader>(
          std::move(opened->source), model_->config().num_dense_features(),
          static_cast<int>(id_limits_.size()), DatasetName(spec)));
    } else {
      local = opened.status();
      spdlog::warn("rank {}: cannot open the job's data: {}", rank_,
                   std::string(local.message()));
    }
  }
  const absl::Status agreed = Verdict(local, "opening the job's data");
  if (!agreed.ok()) shares_.Reset(nullptr);
  return agreed;
}

absl::StatusOr<model::StepResult> RankGroup::TrainStepAt(
    SampleRange batch, const SampleRange* next) {
  if (batch.begin < 0 || batch.size < 1 ||
      (next != nullptr && (next->begin < 0 || next->size < 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample ranges must start at >= 0 and hold >= 1 sample: [",
                     batch.begin, ", +", batch.size, ")"));
  }
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  if (!shares_.has_data()) {
    return absl::FailedPreconditionError(
        "TrainStepAt needs the job's data (OpenData)");
  }
  if (world_ > 1) {
    const bool has_next = next != nullptr;
    RETURN_IF_ERROR(
        SendCommand(kTrainAt, has_next ? 1 : 0, {},
                    {batch.begin, batch.size, has_next ? next->begin : 0,
                     has_next ? next->size : 0}));
  }
  model::StepResult result;
  RETURN_IF_ERROR(RunStepAt(batch, next, &result));
  return result;
}

absl::Status RankGroup::RunStepAt(SampleRange batch, const SampleRange* next,
                                  model::StepResult* result) {
  const absl::Status read = shares_.Read(batch, &share_);
  const data::Batch* next_share = nullptr;
  if (read.ok() && next != nullptr && any_prefetch_) {
    // The next share's ids steer the prefetch of rows on RocksDB: read it
    // before the step. One that cannot be read only misses its prefetch;
    // the step that trains on it reads it again and reports the error.
    next_share = shares_.ReadNext(*next);
  } else if (read.ok() && next != nullptr) {
    // Generated or parsed while this step computes.
    shares_.ReadAhead(*next);
  }
  if (!read.ok()) {
    spdlog::warn("rank {}: cannot read its share of samples [{}, {}): {}",
                 rank_, batch.begin, batch.begin + batch.size,
                 std::string(read.message()));
    // A share without sparse features makes the model refuse the step on
    // every rank, in the agreement it holds anyway; the ranks then learn
    // why below.
    share_.Reset(model_->config().num_dense_features(), 0);
  }
  const absl::Status stepped =
      RunStep(share_, next_share, /*train=*/true, {}, nullptr, result);
  if (!absl::IsInvalidArgument(stepped) || !usable()) return stepped;
  const absl::Status why = Verdict(read, "a read error's verdict");
  return why.ok() ? stepped : why;
}

}  // namespace dlrm::server
