// RankGroup's collective reads and writes of the whole model: the weight
// checksum, checkpoints saved and restored by every rank, and the weights
// export the leader writes from every rank's gathered tables.
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/safetensors.h"
#include "server/rank_group.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {

namespace fs = std::filesystem;
absl::StatusOr<uint64_t> RankGroup::WeightChecksum() {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  if (world_ > 1) RETURN_IF_ERROR(SendCommand(kChecksum, 0, {}));
  uint64_t checksum = 0;
  RETURN_IF_ERROR(RunChecksum(&checksum));
  return checksum;
}

absl::Status RankGroup::RunChecksum(uint64_t* checksum) {
  absl::StatusOr<uint64_t> c = model_->WeightChecksum();
  // Reading rows fails only on a RocksDB or communicator error: either way
  // the ranks no longer agree on what happened.
  if (!c.ok()) return Broke(c.status(), "WeightChecksum");
  if (checksum != nullptr) *checksum = *c;
  return absl::OkStatus();
}

absl::Status RankGroup::RunCheckpoint(bool save, const std::string& dir,
                                      const std::string& job,
                                      model::CheckpointInfo* info) {
  absl::StatusOr<model::CheckpointInfo> done =
      save ? model::SaveCheckpoint(*model_, dir, job)
           : model::RestoreCheckpoint(*model_, dir);
  if (model_->communicator_failed()) {
    const absl::Status broke =
        Broke(model_->communicator_error(),
              save ? "SaveCheckpoint" : "RestoreCheckpoint");
    // The save's outcome is what is on disk: rank 0 committed it.
    if (!save || rank_ != 0 || !done.ok()) return broke;
    spdlog::warn(
        "checkpoint {} is committed at step {}, but the job's ranks broke "
        "after it",
        dir, done->step);
  } else if (!done.ok()) {
    return done.status();
  }
  steps_.store(model_->steps());
  if (info != nullptr) *info = *done;
  return absl::OkStatus();
}

absl::StatusOr<model::CheckpointInfo> RankGroup::SaveCheckpoint(
    const std::string& dir_name, const std::string& job) {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  std::string path = fs::absolute(dir_name).lexically_normal().string();
  if (world_ > 1) {
    RETURN_IF_ERROR(SendCommand(kSave, static_cast<int64_t>(path.size()), {}));
    RETURN_IF_ERROR(BroadcastString(&path, static_cast<int64_t>(path.size())));
  }
  model::CheckpointInfo info;
  RETURN_IF_ERROR(RunCheckpoint(/*save=*/true, path, job, &info));
  return info;
}

absl::StatusOr<model::CheckpointInfo> RankGroup::RestoreCheckpoint(
    const std::string& dir_name) {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  // A restore may set the ranks' step counts back, so a prediction could
  // otherwise agree on a step number of weights from before and after it.
  std::unique_lock<std::mutex> no_predictions;
  if (predictor_ != nullptr) no_predictions = predictor_->Pause();
  predictions_paused_ = true;
  model::CheckpointInfo info;
  std::string path = fs::absolute(dir_name).lexically_normal().string();
  absl::Status s;
  if (world_ > 1) {
    s = SendCommand(kRestore, static_cast<int64_t>(path.size()), {});
    if (s.ok()) s = BroadcastString(&path, static_cast<int64_t>(path.size()));
  }
  if (s.ok()) s = RunCheckpoint(/*save=*/false, path, "", &info);
  // Every rank has applied the checkpoint before a prediction reads again.
  if (world_ > 1 && usable()) RestoreDone().IgnoreError();
  predictions_paused_ = false;
  if (no_predictions.owns_lock()) no_predictions.unlock();
  // Broke() left the prediction loops to this, as their lock was held.
  if (!usable() && predictor_ != nullptr) {
    predictor_->Stop().IgnoreError();
  }
  RETURN_IF_ERROR(s);
  return info;
}

absl::Status RankGroup::RestoreDone() {
  // A rank applies a checkpoint after the restore's last agreement, so the
  // leader may be done before the others have even started: this
  // all-gather ends only once every rank has.
  const int64_t done = 1;
  std::vector<int64_t> all(world_);
  const absl::Status s =
      comm_->AllGather(&done, 1, all.data(), comm::DataType::kInt64);
  if (!s.ok()) return Broke(s, "the end of a restore");
  return absl::OkStatus();
}

absl::StatusOr<model::ExportInfo> RankGroup::ExportWeights(
    const std::string& path) {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  RETURN_IF_ERROR(SendCommand(kExport, 0, {}));
  const std::string tmp = model::TemporaryPath(path);
  // Every table is gathered whatever fails, so that the ranks run the same
  // collectives; a rank's read error is shared by the agreement below.
  absl::Status gathered;
  absl::StatusOr<model::ExportInfo> info = model::WriteWeights(
      tmp, model_->config(), model_->dense_params(), model_->steps(),
      [&](int k, std::vector<float>* table) -> absl::StatusOr<const float*> {
        const absl::Status s = model_->GatherTable(k, table);
        if (!s.ok() && gathered.ok()) gathered = s;
        RETURN_IF_ERROR(s);
        return table->data();
      },
      [&](int k, std::vector<int64_t>* ids) {
        const absl::Status s = model_->GatherTableIds(k, ids);
        if (!s.ok() && gathered.ok()) gathered = s;
        return s;
      });
  const absl::Status agreed = Verdict(gathered, "an export's agreement");
  if (info.ok() && !agreed.ok()) {
    info = absl::InternalError(agreed.message());
  }
  if (info.ok() && usable()) {
    const absl::Status committed = model::CommitFile(tmp, path);
    if (!committed.ok()) info = committed;
  }
  if (!info.ok() || !usable()) {
    DefaultFileSystem()->RemoveAll(tmp).IgnoreError();
    if (!usable()) return channel_->broken();
    return absl::Status(
        info.status().code(),
        absl::StrCat("export to ", path, " failed: ", info.status().message()));
  }
  return info;
}

absl::Status RankGroup::FollowExport() {
  // model::WriteWeights' order: every dynamic table's ids, then the
  // tables.
  absl::Status gathered;
  const ModelConfig& config = model_->config();
  std::vector<int64_t> ids;
  for (int k = 0; k < config.tables_size(); ++k) {
    if (!config.tables(k).dynamic()) continue;
    const absl::Status s = model_->GatherTableIds(k, &ids);
    if (!s.ok() && gathered.ok()) gathered = s;
  }
  std::vector<float> table;
  for (int k = 0; k < config.tables_size(); ++k) {
    const absl::Status s = model_->GatherTable(k, &table);
    if (!s.ok() && gathered.ok()) gathered = s;
  }
  if (!gathered.ok()) {
    spdlog::warn("rank {}: cannot read its shards for an export: {}", rank_,
                 std::string(gathered.message()));
  }
  return Verdict(gathered, "an export's agreement");
}

}  // namespace dlrm::server
