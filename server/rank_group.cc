// RankGroup itself: its construction, the ranks' health and heartbeats,
// the leader's command header, the ranks' agreement on an outcome, and
// Shutdown. The operations are in rank_group_steps.cc (batches,
// optimizers), rank_group_data.cc (a dataset job's shares),
// rank_group_checkpoints.cc (checkpoints, checksum, export) and the
// followers' loop in rank_group_follow.cc.
#include "server/rank_group.h"

#include <chrono>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/agree.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {

const char* RankGroup::OpName(int64_t op) {
  switch (op) {
    case kHeartbeat:
      return "heartbeat";
    case kTrain:
      return "Train";
    case kPredict:
      return "Predict";
    case kSave:
      return "SaveCheckpoint";
    case kRestore:
      return "RestoreCheckpoint";
    case kShutdown:
      return "Shutdown";
    case kChecksum:
      return "WeightChecksum";
    case kExport:
      return "ExportWeights";
    case kData:
      return "OpenData";
    case kTrainAt:
      return "TrainStepAt";
    case kSetOptimizers:
      return "SetOptimizers";
  }
  return "unknown";
}

absl::Status RankGroupOptions::Validate() const {
  if (!(heartbeat_seconds > 0)) {
    return absl::InvalidArgumentError("heartbeat_seconds must be positive");
  }
  return absl::OkStatus();
}

RankGroup::RankGroup(std::unique_ptr<comm::Communicator> comm,
                     std::unique_ptr<comm::Communicator> predict_comm,
                     std::unique_ptr<model::Model> model,
                     RankGroupOptions options)
    : options_(std::move(options)),
      comm_(std::move(comm)),
      predict_comm_(std::move(predict_comm)),
      model_(std::move(model)),
      rank_(comm_->rank()),
      world_(comm_->world_size()),
      shares_(rank_, world_),
      steps_(model_->steps()) {
  comm::CommandChannelOptions channel;
  channel.words = kHeader + world_;
  channel.heartbeat_seconds = options_.heartbeat_seconds;
  channel.describe_break = [this] { return SilentRanks(); };
  // A broken job serves no prediction either: the followers' prediction
  // loops end (unless the prediction communicator failed too). A restore
  // holding the predictions' lock stops them itself.
  channel.on_break = [this] {
    if (rank_ == 0 && predictor_ != nullptr && !predictions_paused_) {
      predictor_->Stop().IgnoreError();
    }
  };
  channel_ =
      std::make_unique<comm::CommandChannel>(comm_.get(), std::move(channel));
  id_limits_ = data::TableIdLimits(model_->config());
  for (const TableConfig& t : model_->config().tables()) {
    any_prefetch_ =
        any_prefetch_ ||
        embedding::TableCapabilities(t, model_->config().rocksdb(), t.rows())
            .prefetch;
  }
}

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Create(
    std::unique_ptr<comm::Communicator> comm,
    std::unique_ptr<model::Model> model, RankGroupOptions options,
    std::unique_ptr<comm::Communicator> predict_comm) {
  if (comm == nullptr || model == nullptr) {
    return absl::InvalidArgumentError(
        "RankGroup needs a communicator and a model");
  }
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<RankGroup> g(new RankGroup(
      std::move(comm), std::move(predict_comm), std::move(model), options));
  if (g->world_ > 1 && g->predict_comm_ != nullptr) {
    // Every rank has the same config, so every rank decides alike.
    model::RanksPredictorOptions po;
    po.heartbeat_seconds = options.heartbeat_seconds;
    absl::StatusOr<std::unique_ptr<model::RanksPredictor>> predictor =
        model::RanksPredictor::Create(g->model_.get(), g->predict_comm_.get(),
                                      po);
    if (predictor.ok()) {
      g->predictor_ = std::move(*predictor);
    } else if (absl::IsFailedPrecondition(predictor.status())) {
      if (g->rank_ == 0) {
        spdlog::info("predictions run between training steps: {}",
                     std::string(predictor.status().message()));
      }
    } else {
      return predictor.status();
    }
  }
  return g;
}

RankGroup::~RankGroup() {
  if (rank_ == 0 && world_ > 1) {
    // Followers must not wait for commands that will never come; a group
    // already shut down or broken has nothing to say.
    Shutdown().IgnoreError();
  }
  channel_->StopHeartbeat();
  shares_.Wait();
}

int64_t RankGroup::steps() const { return steps_.load(); }

bool RankGroup::broken() const { return !usable(); }

absl::Status RankGroup::CheckUsable() const {
  if (const absl::Status broken = channel_->broken(); !broken.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the job's ranks are out of service (", broken.message(),
                     "); restart every rank of the job"));
  }
  if (shut_down_) {
    return absl::UnavailableError("the job's ranks have been shut down");
  }
  return absl::OkStatus();
}

std::string RankGroup::SilentRanks() {
  if (!options_.heartbeats || world_ < 2) return "";
  // A rank that just died was heard of less than a heartbeat ago: wait
  // for it to fall silent, but not longer than a silent rank takes.
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration<double>(kSilentSeconds + kRankHeartbeatSeconds);
  for (;;) {
    std::map<int, comm::RankHeartbeat> beats;
    for (comm::RankHeartbeat& b : options_.heartbeats()) {
      beats[b.rank] = std::move(b);
    }
    std::string silent, ages;
    std::vector<int> named;
    for (int r = 1; r < world_; ++r) {
      const auto it = beats.find(r);
      if (it == beats.end()) {
        absl::StrAppend(&silent, "; rank ", r, ": no heartbeat ever received");
        named.push_back(r);
        continue;
      }
      const std::string age = absl::StrFormat("%.1f", it->second.age_seconds);
      if (it->second.age_seconds >= kSilentSeconds) {
        absl::StrAppend(&silent, "; rank ", r, " on ", it->second.host,
                        " is silent: last heartbeat ", age, " s ago");
        named.push_back(r);
      } else {
        absl::StrAppend(&ages, ages.empty() ? "" : ", ", "rank ", r, " on ",
                        it->second.host, " ", age, " s ago");
      }
    }
    if (!named.empty()) {
      std::lock_guard<std::mutex> lock(health_mu_);
      for (const int r : named) ++failures_[r];
      return silent;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::StrCat("; every rank still sends heartbeats (", ages,
                          "): a network fault or a rank's own error");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::vector<RankHealth> RankGroup::Health() const {
  std::vector<server::RankHealth> out;
  if (!options_.heartbeats || world_ < 2) return out;
  std::map<int, comm::RankHeartbeat> beats;
  for (comm::RankHeartbeat& b : options_.heartbeats()) {
    beats[b.rank] = std::move(b);
  }
  std::lock_guard<std::mutex> lock(health_mu_);
  for (int r = 1; r < world_; ++r) {
    server::RankHealth h;
    h.rank = r;
    if (const auto it = beats.find(r); it != beats.end()) {
      h.host = it->second.host;
      h.heartbeat_age_seconds = it->second.age_seconds;
    }
    if (const auto it = failures_.find(r); it != failures_.end()) {
      h.failures = it->second;
    }
    out.push_back(std::move(h));
  }
  return out;
}

absl::Status RankGroup::SendCommand(int64_t op, int64_t arg,
                                    const std::vector<int64_t>& per_rank,
                                    const std::vector<int64_t>& extra) {
  std::vector<int64_t> command(kHeader + world_, 0);
  command[0] = op;
  command[1] = arg;
  for (size_t i = 0; i < extra.size() && i < size_t(kExtra); ++i) {
    command[2 + i] = extra[i];
  }
  for (size_t r = 0; r < per_rank.size() && r < size_t(world_); ++r) {
    command[kHeader + r] = per_rank[r];
  }
  return channel_->Send(std::move(command), OpName(op));
}

absl::Status RankGroup::BroadcastString(std::string* text, int64_t size) {
  text->resize(size);
  const absl::Status s =
      comm_->Broadcast(text->data(), size, comm::DataType::kUint8, 0);
  if (!s.ok()) return Broke(s, "a command's argument");
  return absl::OkStatus();
}

absl::Status RankGroup::Verdict(const absl::Status& local, const char* what) {
  if (world_ == 1) return local;
  const comm::Agreement agreed = comm::AgreeOnStatus(*comm_, local);
  if (!agreed.communicator.ok()) return Broke(agreed.communicator, what);
  return agreed.verdict;
}

absl::Status RankGroup::Shutdown() {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  if (shut_down_) return absl::OkStatus();
  if (predictor_ != nullptr) {
    // First, so that a follower's prediction loop has ended by the time
    // its Follow() returns. A broken prediction communicator leaves that
    // loop to its own error.
    const absl::Status stopped = predictor_->Stop();
    if (!stopped.ok()) {
      spdlog::warn("could not stop the ranks' prediction loops: {}",
                   std::string(stopped.message()));
    }
  }
  RETURN_IF_ERROR(CheckUsable());
  shut_down_ = true;
  if (world_ == 1) return absl::OkStatus();
  const absl::Status sent = SendCommand(kShutdown, 0, {});
  channel_->Close();
  return sent;
}

}  // namespace dlrm::server
