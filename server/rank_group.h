// The leader/follower protocol of a server's ranks (docs/architecture.md
// "Process model"): rank 0, the leader, starts every collective operation by
// broadcasting a small command; ranks > 0, the followers, run the same
// Model collectives on the slice of the batch the leader scatters, or, in a
// dataset job, on the share of the job's data each reads itself. A server
// of one rank is a group of one: its leader runs the model directly.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/command_channel.h"
#include "comm/communicator.h"
#include "comm/coordinator.h"
#include "data/batch.h"
#include "data/range_reader.h"
#include "dlrm/service.pb.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/predictor_ranks.h"
#include "model/weights_export.h"
#include "server/share_reader.h"

namespace dlrm::server {

struct RankGroupOptions {
  // While idle the leader sends a heartbeat this often, in seconds, so that
  // followers waiting for a command do not hit the communicator's op
  // timeout, and a dead rank is noticed between requests. Must be below
  // that timeout. Default: 10.
  double heartbeat_seconds = 10;
  // Followers: sends this rank's heartbeat to rank 0's coordinator
  // (comm::CoordinatorClient::Heartbeat), every kRankHeartbeatSeconds on a
  // thread of its own while Follow() runs; a failure is logged (once until
  // one succeeds again). Null: none. Default: null.
  std::function<absl::Status()> send_heartbeat;
  // Leader: every rank's last heartbeat (comm::CoordinatorServer::
  // Heartbeats), read when the group breaks, to name the ranks that went
  // silent, and by RankGroup::Health(). Null: none. Default: null.
  std::function<std::vector<comm::RankHeartbeat>()> heartbeats;

  absl::Status Validate() const;
};

// How often a follower sends its heartbeat (RankGroupOptions::
// send_heartbeat), in seconds; a rank not heard of for kSilentSeconds is
// named as silent (dead or frozen) when the group breaks.
inline constexpr double kRankHeartbeatSeconds = 1;
inline constexpr double kSilentSeconds = 3;

// One rank of a job as the leader sees it (RankGroup::RankHealth).
struct RankHealth {
  int rank = 0;
  // As the rank reported it; empty before its first heartbeat.
  std::string host;
  // Seconds since its last heartbeat; -1 before the first.
  double heartbeat_age_seconds = -1;
  // Times the group broke with this rank named as silent.
  int64_t failures = 0;
};

// One rank of a job of R >= 1 ranks: its communicator and its Model.
// The leader's methods (TrainStep, Predict, checkpoints, Shutdown) are
// thread-safe and run one at a time; Follow() is the followers' whole life.
//
// A communicator error breaks the group: the job cannot go on, and every
// later leader call returns Unavailable naming the original error.
class RankGroup {
 public:
  // Takes ownership of `comm` and `model` (built over a communicator of the
  // same ranks: `comm` itself, or for one rank any single-rank one). On
  // rank 0 of a job with several ranks, starts the heartbeat thread.
  // `predict_comm` (may be null; used only on several ranks): a third
  // communicator of the same ranks, for predictions beside training
  // (model::RanksPredictor) when the model allows them; every rank must
  // pass one or none. Then the leader's ranks_predictor() predicts, and a
  // follower's Follow() serves its predictions on a thread of its own.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Create(
      std::unique_ptr<comm::Communicator> comm,
      std::unique_ptr<model::Model> model, RankGroupOptions options,
      std::unique_ptr<comm::Communicator> predict_comm = nullptr);

  // Leader: Shutdown() (if not done yet), then stops the heartbeat.
  ~RankGroup();

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  // Whether a communicator error has put the ranks out of service (every
  // collective call answers Unavailable from then on).
  bool broken() const;
  const ModelConfig& config() const { return model_->config(); }
  const embedding::ShardingPlan& plan() const { return model_->plan(); }
  // Steps taken; does not wait for a running operation.
  int64_t steps() const;
  // This rank's model, for readers on other threads that synchronise
  // through its weights_mutex() (model::SnapshotPredictor); every other use
  // goes through the methods here.
  model::Model* local_model() { return model_.get(); }
  // Leader: the predictor that runs predictions beside training on several
  // ranks, or null (one rank, no prediction communicator, or a model whose
  // weights cannot be read beside the step). Lives as long as the group.
  model::RanksPredictor* ranks_predictor() { return predictor_.get(); }
  // Model::dense_precision() of this rank's model.
  DensePrecision dense_precision() const { return model_->dense_precision(); }

  // Leader: one training step on the global `batch` (split by sample over
  // the ranks). InvalidArgument for a batch that does not fit, and
  // ResourceExhausted for one with more unique ids than a shard's RocksDB
  // cache holds (no rank changes; the group goes on); Unavailable once the
  // group is broken. `next` (may be null): the batch the leader will train
  // on next; with tables on RocksDB its slices go to the ranks too, whose
  // shards prefetch its rows during this step.
  absl::StatusOr<model::StepResult> TrainStep(
      const data::Batch& batch, const data::Batch* next = nullptr);

  // Leader: click probabilities of every sample of `batch` (resized).
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs);

  // Leader: every rank opens `spec` as the data TrainStepAt reads, in place
  // of any before. `spec` as ResolveDataset (server/datasets.h) returns it:
  // its paths were checked here and every rank opens them as they are, so
  // on several hosts the files must be at the same paths on each. An error
  // is the first failing rank's, "rank r: " and its message (naming the
  // file); then no rank holds data. InvalidArgument for a spec without a
  // source; Unavailable once the group is broken.
  absl::Status OpenData(const DatasetSpec& spec);

  // Leader: every rank drops the data OpenData opened (closing its files).
  // Unavailable once the group is broken.
  absl::Status CloseData();

  // Leader: one training step on samples [batch.begin, batch.begin +
  // batch.size) of the data OpenData opened. Rank r reads only its share,
  // the SplitSamples(batch.size) part TrainStep would send it, so the step
  // equals TrainStep on those samples read whole. `next` (may be null):
  // the range the leader trains on next; with tables on RocksDB each rank
  // reads its share of it now, its shards prefetch the rows, and the next
  // TrainStepAt on that range trains on the shares already read. A rank
  // that cannot read its share (a malformed line, a vanished file, data
  // shorter than the range) makes the step fail on every rank with its
  // error, "rank r: " and the message naming the file and place; nothing
  // changes and the group goes on. InvalidArgument for an empty or negative
  // range; FailedPrecondition without OpenData; otherwise as TrainStep.
  absl::StatusOr<model::StepResult> TrainStepAt(SampleRange batch,
                                                const SampleRange* next);

  // Leader: every rank takes part in model::SaveCheckpoint of `dir`
  // (docs/checkpoints.md), which replaces a previous checkpoint there; `job`
  // goes into the manifest (model::Manifest::job). Its errors (on any rank;
  // the group goes on); Unavailable once the group is broken.
  absl::StatusOr<model::CheckpointInfo> SaveCheckpoint(
      const std::string& dir, const std::string& job = "");

  // Leader: every rank takes part in model::RestoreCheckpoint of `dir`,
  // which reads a checkpoint of any rank count and plan; predictions beside
  // training (ranks_predictor()) wait for it. NotFound when `dir` holds no
  // checkpoint; FailedPrecondition when its architecture differs from the
  // job's; on error no rank changes.
  absl::StatusOr<model::CheckpointInfo> RestoreCheckpoint(
      const std::string& dir);

  // Leader: every rank's model takes `dense` and `sparse` as its
  // optimizers between two steps (model::Model::SetOptimizers; the next
  // step on every rank uses them). InvalidArgument naming the field for a
  // value or a change refused (no rank changes); another error breaks the
  // group; Unavailable once the group is broken.
  absl::Status SetOptimizers(const OptimizerConfig& dense,
                             const OptimizerConfig& sparse);

  // Leader: model::Model::WeightChecksum over every rank (collective).
  // Unavailable once the group is broken; a failure to read rows breaks it.
  absl::StatusOr<uint64_t> WeightChecksum();

  // Leader: writes the model's weights to the safetensors file `path`
  // (model::WriteWeights' names): every rank takes part in gathering each
  // table whole, one at a time, and the leader writes it. `path` is
  // replaced only once the file is complete and every rank read its shards.
  // The file system's errors naming the path; Internal when another rank
  // failed; Unavailable once the group is broken.
  absl::StatusOr<model::ExportInfo> ExportWeights(const std::string& path);

  // Leader: every rank > 0's last heartbeat and failures, by rank (empty
  // on one rank or without RankGroupOptions::heartbeats). Does not wait
  // for a running operation.
  std::vector<RankHealth> Health() const;

  // Leader: tells the followers' prediction loops (ranks_predictor()) to
  // stop, then the followers to exit after the current operation. Later
  // calls return Unavailable. Idempotent.
  absl::Status Shutdown();

  // Follower: obeys the leader's commands until it says Shutdown (OK) or the
  // communicator fails (that error); meanwhile serves the leader's
  // predictions beside training on another thread, and returns once that
  // loop has ended too (told to stop, or its communicator failed).
  absl::Status Follow();

 private:
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
    kData = 9,  // argument: bytes of the dataset spec that follows; 0 closes
    kTrainAt = 10,  // argument: 1 with a next range; extra: the two ranges
    // argument: bytes of the ModelConfig (its two optimizers) that follows
    kSetOptimizers = 11,
  };
  static constexpr int kExtra = 4;
  static constexpr int kHeader = 2 + kExtra;
  // The op's name, for log lines and errors ("unknown" for another value).
  static const char* OpName(int64_t op);

  RankGroup(std::unique_ptr<comm::Communicator> comm,
            std::unique_ptr<comm::Communicator> predict_comm,
            std::unique_ptr<model::Model> model, RankGroupOptions options);
  // Follower: obeys the leader's commands (Follow without the predictions).
  absl::Status FollowCommands();

  // Leader, with the channel's lock held: OK, or Unavailable once broken
  // or shut down.
  absl::Status CheckUsable() const;
  // Leader, with the channel's lock held: broadcasts a command: `op`,
  // `arg`, one word per rank (the bytes of its batch slice) and up to four
  // `extra` words.
  absl::Status SendCommand(int64_t op, int64_t arg,
                           const std::vector<int64_t>& per_rank,
                           const std::vector<int64_t>& extra = {});
  // Records a communicator error, which breaks the group; returns it named,
  // on the leader with the ranks that went silent (SilentRanks).
  absl::Status Broke(const absl::Status& status, const char* what) {
    return channel_->Break(status, what);
  }
  bool usable() const { return channel_->broken().ok(); }
  // Leader: "; rank 1 on HOST: last heartbeat 37.2 s ago" for every rank
  // not heard of for kSilentSeconds, waiting up to that long for a rank
  // that just died to fall silent (counting each in failures_); else the
  // ranks' heartbeat ages. Empty without heartbeats.
  std::string SilentRanks();

  // Leader: validates and splits `batch`, sends the command and the slices,
  // and runs the step (train) or the prediction with every rank.
  absl::Status Lead(const data::Batch& batch, const data::Batch* next,
                    bool train, std::vector<float>* probs,
                    model::StepResult* result);
  // Leader: splits `batch` into the ranks' slices (the leader's own into
  // `local`, the others serialised into parts / bytes).
  void Split(const data::Batch& batch, bool labels, data::Batch* local,
             std::vector<std::string>* parts, std::vector<int64_t>* bytes);
  // Every rank: the leader sends parts[r] (bytes[r] long) to rank r; a
  // follower decodes its part into `slice`.
  absl::Status ScatterBatch(const std::vector<std::string>& parts,
                            const std::vector<int64_t>& bytes, bool labels,
                            data::Batch* slice);
  // Every rank: trains on, or predicts `local`; a prediction's
  // probabilities are gathered into the leader's `probs` (`sizes`: every
  // rank's sample count, leader only). Communicator errors break the group.
  absl::Status RunStep(const data::Batch& local, const data::Batch* next,
                       bool train, const std::vector<int64_t>& sizes,
                       std::vector<float>* probs, model::StepResult* result);
  // Every rank, after a kTrain command with a next batch: the leader
  // broadcasts the next slices' sizes and scatters them (`next` on the
  // leader), each rank decodes its own into `slice`.
  absl::Status ScatterNext(const data::Batch* next, data::Batch* slice);
  // Every rank: the model's checksum into *checksum (leader; null on a
  // follower). Errors break the group.
  absl::Status RunChecksum(uint64_t* checksum);
  absl::Status GatherProbs(const std::vector<float>& local,
                           const std::vector<int64_t>& sizes,
                           std::vector<float>* all);
  // Every rank: model::SaveCheckpoint (`save`) or RestoreCheckpoint of
  // `dir`, with *info the result when not null. A communicator error breaks
  // the group.
  absl::Status RunCheckpoint(bool save, const std::string& dir,
                             const std::string& job,
                             model::CheckpointInfo* info);
  // Every rank, after a restore that did not break the group: returns once
  // every rank has applied it (an all-gather). Errors break the group.
  absl::Status RestoreDone();
  // Follower: its part of ExportWeights (the gathers, then the agreement).
  absl::Status FollowExport();
  // Every rank: broadcasts the leader's `text` of `size` bytes.
  absl::Status BroadcastString(std::string* text, int64_t size);
  // Every rank: SetOptimizers' part, from the serialised ModelConfig
  // `bytes` holding the two optimizers, agreed with Verdict.
  absl::Status ApplyOptimizers(const std::string& bytes);
  // Every rank: opens the serialised DatasetSpec `bytes` as the shares' data
  // (empty: none) and agrees on it with Verdict.
  absl::Status SetData(const std::string& bytes);
  // Every rank: reads its share of `batch` and trains on it while its share
  // of `next` (if any) is read in the background; with tables on RocksDB
  // the next share is read first instead, and steers the prefetch. A
  // rank's read error fails the step on every rank with that rank's
  // message.
  absl::Status RunStepAt(SampleRange batch, const SampleRange* next,
                         model::StepResult* result);
  // Every rank: comm::AgreeOnStatus of `local` (its own error, else the
  // first failing rank's code, "rank r: " and its message, else OK).
  // Communicator errors (`what` names the exchange) break the group.
  absl::Status Verdict(const absl::Status& local, const char* what);

  const RankGroupOptions options_;
  std::unique_ptr<comm::Communicator> comm_;
  // The leader's commands over comm_, its heartbeats and the broken state;
  // its Lock() guards the members marked so and the collectives.
  std::unique_ptr<comm::CommandChannel> channel_;
  // Declared before the model and the predictor, which borrow it.
  std::unique_ptr<comm::Communicator> predict_comm_;
  std::unique_ptr<model::Model> model_;
  const int rank_, world_;
  // data::TableIdLimits of the model: what batches are validated against.
  std::vector<int64_t> id_limits_;
  // Whether a table's stores take the next batch (StoreCapabilities::
  // prefetch; then a next batch is worth sending).
  bool any_prefetch_ = false;
  // A dataset job's data on this rank (OpenData) and the share of the last
  // step's training batch; guarded by the channel's lock on the leader.
  ShareReader shares_;
  data::Batch share_;

  bool shut_down_ = false;  // guarded by the channel's lock
  // The leader holds ranks_predictor()'s Pause() (a restore): Broke() then
  // leaves stopping the prediction loops to the restore.
  bool predictions_paused_ = false;
  std::atomic<int64_t> steps_{0};
  mutable std::mutex health_mu_;     // guards failures_
  std::map<int, int64_t> failures_;  // by rank (SilentRanks)
  // Predictions beside training (may be null); declared last so that it
  // goes first, before the model and communicator it borrows.
  std::unique_ptr<model::RanksPredictor> predictor_;
};

}  // namespace dlrm::server
