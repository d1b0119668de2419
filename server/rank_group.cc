// RankGroup: commands, batch scatter / probability gather, each rank's
// reading of a dataset job's data, heartbeats, and the collective
// checkpoints and export over the Communicator.
#include "server/rank_group.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/agree.h"
#include "core/status.h"
#include "dlrm/service.pb.h"
#include "google/protobuf/text_format.h"
#include "model/safetensors.h"
#include "server/datasets.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {
namespace {

namespace fs = std::filesystem;

// A command is kHeader words (op, argument, kExtra more arguments) and then
// one word per rank: the bytes of the rank's batch slice (Train, Predict).
enum Op : int64_t {
  kHeartbeat = comm::CommandChannel::kHeartbeatOp,
  kTrain = 2,
  kPredict = 3,
  kSave = 4,
  kRestore = 5,
  kShutdown = 6,
  kChecksum = 7,
  kExport = 8,
  kData = 9,      // argument: bytes of the dataset spec that follows; 0 closes
  kTrainAt = 10,  // argument: 1 with a next range; extra: the two ranges
  // argument: bytes of the ModelConfig (its two optimizers) that follows
  kSetOptimizers = 11,
};
constexpr int kExtra = 4;
constexpr int kHeader = 2 + kExtra;

const char* OpName(int64_t op) {
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

}  // namespace

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
  for (const TableConfig& t : model_->config().tables()) {
    table_rows_.push_back(t.rows());
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

absl::Status RankGroup::ScatterBatch(const std::vector<std::string>& parts,
                                     const std::vector<int64_t>& bytes,
                                     bool labels, data::Batch* slice) {
  std::vector<int64_t> send_counts(world_, 0), recv_counts(world_, 0);
  std::string send, recv;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) {
      send_counts[r] = bytes[r];
      send += parts[r];
    }
  } else {
    recv_counts[0] = bytes[rank_];
    recv.resize(bytes[rank_]);
  }
  const absl::Status s = comm_->AllToAllV(send.data(), send_counts, recv.data(),
                                          recv_counts, comm::DataType::kUint8);
  if (!s.ok()) return Broke(s, "the batch scatter");
  if (rank_ == 0) return absl::OkStatus();  // the leader sliced its own part
  const int num_dense = model_->config().num_dense_features();
  const absl::Status decoded = data::DecodeColumns(
      recv, num_dense, static_cast<int>(table_rows_.size()), slice);
  if (!decoded.ok()) {
    // The leader encoded what it validated, so this is a bug; a slice
    // without sparse features makes every rank refuse the step together
    // instead of leaving this one out of the collectives.
    spdlog::error("rank {}: bad batch slice from the leader: {}", rank_,
                  std::string(decoded.message()));
    slice->Reset(num_dense, 0);
    slice->size = 0;
  }
  return absl::OkStatus();
}

absl::Status RankGroup::GatherProbs(const std::vector<float>& local,
                                    const std::vector<int64_t>& sizes,
                                    std::vector<float>* all) {
  std::vector<int64_t> send_counts(world_, 0), recv_counts(world_, 0);
  send_counts[0] = static_cast<int64_t>(local.size());
  if (rank_ == 0) {
    recv_counts = sizes;
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    all->resize(total);
  }
  const absl::Status s = comm_->AllToAllV(
      local.data(), send_counts, rank_ == 0 ? all->data() : nullptr,
      recv_counts, comm::DataType::kFloat32);
  if (!s.ok()) return Broke(s, "the prediction gather");
  return absl::OkStatus();
}

absl::Status RankGroup::BroadcastString(std::string* text, int64_t size) {
  text->resize(size);
  const absl::Status s =
      comm_->Broadcast(text->data(), size, comm::DataType::kUint8, 0);
  if (!s.ok()) return Broke(s, "a command's argument");
  return absl::OkStatus();
}

absl::Status RankGroup::RunStep(const data::Batch& local,
                                const data::Batch* next, bool train,
                                const std::vector<int64_t>& sizes,
                                std::vector<float>* probs,
                                model::StepResult* result) {
  if (train) {
    absl::StatusOr<model::StepResult> r = model_->TrainStep(local, next);
    if (!r.ok()) {
      // Refusals every rank agreed on (a bad batch, a batch over a shard's
      // cache) change nothing and leave the group usable.
      if (absl::IsInvalidArgument(r.status()) ||
          absl::IsResourceExhausted(r.status())) {
        return r.status();
      }
      return Broke(r.status(), "Train");
    }
    steps_.store(model_->steps());
    if (result != nullptr) *result = *std::move(r);
    return absl::OkStatus();
  }
  std::vector<float> mine;
  absl::Status s = model_->Predict(local, &mine);
  if (!s.ok()) {
    if (absl::IsInvalidArgument(s) || absl::IsResourceExhausted(s)) return s;
    return Broke(s, "Predict");
  }
  return GatherProbs(mine, sizes, probs);
}

void RankGroup::Split(const data::Batch& batch, bool labels, data::Batch* local,
                      std::vector<std::string>* parts,
                      std::vector<int64_t>* bytes) {
  const std::vector<int64_t> sizes = SplitSamples(batch.size, world_);
  parts->assign(world_, "");
  bytes->assign(world_, 0);
  batch.Slice(0, sizes[0], local);
  for (int64_t r = 1, start = sizes[0]; r < world_; start += sizes[r], ++r) {
    data::EncodeColumns(batch, start, start + sizes[r], labels, &(*parts)[r]);
    (*bytes)[r] = static_cast<int64_t>((*parts)[r].size());
  }
}

absl::Status RankGroup::ScatterNext(const data::Batch* next,
                                    data::Batch* slice) {
  std::vector<std::string> parts;
  std::vector<int64_t> bytes(world_, 0);
  if (rank_ == 0) Split(*next, /*labels=*/false, slice, &parts, &bytes);
  const absl::Status s =
      comm_->Broadcast(bytes.data(), world_, comm::DataType::kInt64, 0);
  if (!s.ok()) return Broke(s, "the next batch's sizes");
  return ScatterBatch(parts, bytes, /*labels=*/false, slice);
}

absl::Status RankGroup::Lead(const data::Batch& batch, const data::Batch* next,
                             bool train, std::vector<float>* probs,
                             model::StepResult* result) {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  // Checked here so that the error names the sample of the whole batch.
  RETURN_IF_ERROR(
      batch.Validate(model_->config().num_dense_features(), table_rows_));
  // A next batch only steers the prefetch of tables on RocksDB: sent when
  // there are such tables and it is valid.
  const bool send_next =
      train && next != nullptr && next->size > 0 && any_prefetch_ &&
      next->Validate(model_->config().num_dense_features(), table_rows_).ok();
  const std::vector<int64_t> sizes = SplitSamples(batch.size, world_);
  if (world_ == 1) {
    // The whole batch is the leader's: no slice to cut or send.
    return RunStep(batch, send_next ? next : nullptr, train, sizes, probs,
                   result);
  }
  std::vector<std::string> parts;
  std::vector<int64_t> bytes;
  data::Batch local, next_local;
  Split(batch, /*labels=*/train, &local, &parts, &bytes);
  RETURN_IF_ERROR(
      SendCommand(train ? kTrain : kPredict, send_next ? 1 : 0, bytes));
  RETURN_IF_ERROR(ScatterBatch(parts, bytes, train, &local));
  if (send_next) RETURN_IF_ERROR(ScatterNext(next, &next_local));
  return RunStep(local, send_next ? &next_local : nullptr, train, sizes, probs,
                 result);
}

absl::StatusOr<model::StepResult> RankGroup::TrainStep(
    const data::Batch& batch, const data::Batch* next) {
  model::StepResult result;
  RETURN_IF_ERROR(Lead(batch, next, /*train=*/true, nullptr, &result));
  return result;
}

absl::Status RankGroup::Predict(const data::Batch& batch,
                                std::vector<float>* probs) {
  return Lead(batch, nullptr, /*train=*/false, probs, nullptr);
}

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

absl::Status RankGroup::SetOptimizers(const OptimizerConfig& dense,
                                      const OptimizerConfig& sparse) {
  ModelConfig both;
  *both.mutable_dense_optimizer() = dense;
  *both.mutable_sparse_optimizer() = sparse;
  std::string bytes;
  if (!both.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialise the optimizers");
  }
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  if (world_ > 1) {
    const int64_t size = static_cast<int64_t>(bytes.size());
    RETURN_IF_ERROR(SendCommand(kSetOptimizers, size, {}));
    RETURN_IF_ERROR(BroadcastString(&bytes, size));
  }
  return ApplyOptimizers(bytes);
}

absl::Status RankGroup::ApplyOptimizers(const std::string& bytes) {
  ModelConfig both;
  const absl::Status local =
      both.ParseFromString(bytes)
          ? model_->SetOptimizers(both.dense_optimizer(),
                                  both.sparse_optimizer())
          : absl::InternalError("the optimizers from rank 0 are garbled");
  const absl::Status agreed = Verdict(local, "setting the optimizers");
  // A refusal (a bad value) changes no rank; anything else may have
  // changed some ranks and not others.
  if (!agreed.ok() && !absl::IsInvalidArgument(agreed) && usable()) {
    return Broke(agreed, "SetOptimizers");
  }
  return agreed;
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
          static_cast<int>(table_rows_.size()), DatasetName(spec)));
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

absl::Status RankGroup::Verdict(const absl::Status& local, const char* what) {
  if (world_ == 1) return local;
  const comm::Agreement agreed = comm::AgreeOnStatus(*comm_, local);
  if (!agreed.communicator.ok()) return Broke(agreed.communicator, what);
  return agreed.verdict;
}

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

absl::Status RankGroup::Follow() {
  if (rank_ == 0) {
    return absl::FailedPreconditionError("rank 0 leads; it does not follow");
  }
  // Heartbeats to rank 0's coordinator, which names this rank if it dies
  // or freezes.
  std::mutex beat_mu;
  std::condition_variable beat_cv;
  bool stop_beats = false;
  std::thread beats;
  if (options_.send_heartbeat) {
    beats = std::thread([&] {
      bool failing = false;
      std::unique_lock<std::mutex> lock(beat_mu);
      while (!stop_beats) {
        lock.unlock();
        const absl::Status s = options_.send_heartbeat();
        if (!s.ok() && !failing) {
          spdlog::warn("rank {}: heartbeat to rank 0 failed: {}", rank_,
                       s.ToString());
        }
        failing = !s.ok();
        lock.lock();
        beat_cv.wait_for(lock,
                         std::chrono::duration<double>(kRankHeartbeatSeconds));
      }
    });
  }
  const auto stop = [&] {
    {
      std::lock_guard<std::mutex> lock(beat_mu);
      stop_beats = true;
    }
    beat_cv.notify_all();
    if (beats.joinable()) beats.join();
  };
  if (predictor_ == nullptr) {
    const absl::Status s = FollowCommands();
    stop();
    return s;
  }
  std::thread predictions([this] {
    const absl::Status s = predictor_->Serve();
    if (!s.ok()) {
      spdlog::error("rank {}: predictions beside training ended: {}", rank_,
                    std::string(s.message()));
    }
  });
  const absl::Status s = FollowCommands();
  // The leader stops the prediction loop before it says Shutdown; when the
  // leader is gone, the loop's communicator fails too (at the latest after
  // its op timeout).
  predictions.join();
  stop();
  return s;
}

absl::Status RankGroup::FollowCommands() {
  std::vector<int64_t> command;
  data::Batch slice, next_slice;
  std::string path;
  for (;;) {
    absl::Status s = channel_->Receive(&command);
    if (!s.ok()) return s;
    const std::vector<int64_t> bytes(command.begin() + kHeader, command.end());
    const int64_t op = command[0];
    switch (op) {
      case kTrain:
      case kPredict:
        s = ScatterBatch({}, bytes, op == kTrain, &slice);
        if (s.ok() && command[1] == 1) s = ScatterNext(nullptr, &next_slice);
        if (s.ok()) {
          s = RunStep(slice, command[1] == 1 ? &next_slice : nullptr,
                      op == kTrain, {}, nullptr, nullptr);
        }
        break;
      case kSave:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = RunCheckpoint(/*save=*/true, path, "", nullptr);
        break;
      case kRestore:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = RunCheckpoint(/*save=*/false, path, "", nullptr);
        if (usable()) RestoreDone().IgnoreError();
        break;
      case kChecksum:
        s = RunChecksum(nullptr);
        break;
      case kExport:
        s = FollowExport();
        break;
      case kData:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = SetData(path);
        break;
      case kTrainAt: {
        const SampleRange next{command[4], command[5]};
        s = RunStepAt({command[2], command[3]},
                      command[1] == 1 ? &next : nullptr, nullptr);
        break;
      }
      case kSetOptimizers:
        s = BroadcastString(&path, command[1]);
        if (s.ok()) s = ApplyOptimizers(path);
        break;
      case kShutdown:
        return absl::OkStatus();
      default:
        return absl::InternalError(
            absl::StrCat("rank ", rank_, ": unknown command ", op));
    }
    if (!usable()) return channel_->broken();
    if (!s.ok()) {
      spdlog::warn("rank {}: {} refused: {}", rank_, OpName(op),
                   std::string(s.message()));
    }
  }
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
  absl::Status gathered;
  std::vector<float> table;
  for (int k = 0; k < model_->config().tables_size(); ++k) {
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
