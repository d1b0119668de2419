// RanksPredictor: predictions from a model of several ranks while it
// trains, on a communicator of their own, from the weights of one completed
// step on every rank (docs/server.md "Predictions beside training").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/command_channel.h"
#include "comm/communicator.h"
#include "data/batch.h"
#include "dense/backend.h"
#include "embedding/embedding_table.h"
#include "model/exchange.h"
#include "model/model.h"
#include "model/predictor.h"

namespace dlrm::model {

struct RanksPredictorOptions {
  // Times a prediction pools every rank's shards before it gives up when
  // the ranks keep reporting different steps (Predict returns Aborted).
  // Default: 8.
  int max_attempts = 8;
  // While idle the leader sends a heartbeat this often, in seconds, so that
  // followers waiting for a prediction do not hit the communicator's op
  // timeout. Must be below that timeout. Default: 10.
  double heartbeat_seconds = 10;

  absl::Status Validate() const;
};

// One rank's side of predictions beside the training step on R > 1 ranks.
// The leader (rank 0) owns the whole prediction: it sends the command and
// the batch's ids to the shards, gets their pooled vectors back, and runs
// the dense part on its own copy of the dense parameters; the followers
// (Serve) only pool their shards, in host memory or on RocksDB
// (EmbeddingStore::PoolReadOnly, which changes no cache). Every rank pools
// under its model's weights_mutex() held shared, tagged with its
// Model::steps(), and never holds that lock across a collective (a step
// holds it exclusively across its own collectives). The ranks then all-gather
// their steps: when they agree, the pooled vectors are gathered and the
// prediction is of that step on every rank; when they differ (a rank finished
// the step's update before another), every rank pools again, up to max_attempts
// times.
//
// Why leader-centred: the leader's batch is the global batch (sizes
// {n, 0, ..., 0} to ShardExchange), so the followers need no dense copy, no
// batch slice and no probability gather, and a retry repeats only the
// pooling and one all-gather of R words.
//
// Every rank calls Create with the same config; the communicator is one of
// the ranks' own, used by nothing else. The leader's methods are
// thread-safe and run one at a time; Serve is a follower's loop. Borrows
// the model and the communicator, which must outlive the predictor.
class RanksPredictor final : public Predictor {
 public:
  // FailedPrecondition naming why when the weights cannot be read beside
  // the step: one rank (SnapshotPredictor's case), a table in GPU memory,
  // or a dense part not on the CPU. InvalidArgument for bad options
  // or a communicator of another world size than the model's. On rank 0
  // starts the heartbeat thread.
  static absl::StatusOr<std::unique_ptr<RanksPredictor>> Create(
      Model* model, comm::Communicator* comm, RanksPredictorOptions options);

  // Leader: Stop() (when not done yet), then ends the heartbeat.
  ~RanksPredictor();
  RanksPredictor(const RanksPredictor&) = delete;
  RanksPredictor& operator=(const RanksPredictor&) = delete;

  // Leader: click probabilities of every sample of `batch` into `probs`
  // (resized), and into *step (not null) the step whose weights gave them on
  // every rank. InvalidArgument naming the field and the sample for a batch
  // the model does not take, or an empty one (nothing is sent then);
  // Aborted when the ranks reported different steps in every attempt (the
  // caller may predict between steps instead; the followers are ready for
  // the next command); Unavailable once the communicator failed or after
  // Stop().
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs,
                       int64_t* step) override;

  // Leader: no prediction reads weights on any rank while the returned lock
  // is held (for a checkpoint restore, which may set every rank's step
  // count back). Predict and Stop wait for it: the holder must not call
  // them.
  std::unique_lock<std::mutex> Pause();

  // Leader: tells the followers' Serve loops to return; later Predicts
  // return Unavailable. Idempotent; the communicator's error when it failed.
  absl::Status Stop();

  // Follower: serves the leader's predictions until it says Stop (OK) or
  // the communicator fails (Unavailable naming it).
  absl::Status Serve();

 private:
  RanksPredictor(Model* model, comm::Communicator* comm,
                 RanksPredictorOptions options,
                 std::unique_ptr<dense::DenseBackend> dense);

  // Records a communicator error, which ends the predictions for good;
  // returns it named.
  absl::Status Broke(const absl::Status& status, const char* what) {
    return channel_.Break(status, what);
  }
  // Every rank: one prediction of the `n` samples of `batch` (the leader's
  // batch, its interaction input `t`; an empty batch and null on a
  // follower), the probabilities into *probs and the agreed step into *step
  // on the leader. Aborted when the ranks never agreed on a step;
  // communicator errors break the predictor.
  absl::Status Run(const data::Batch& batch, int64_t n, float* t,
                   std::vector<float>* probs, int64_t* step);
  // Under the shared weights lock: this rank's step, its model-parallel
  // shards' pools of the global batch into the exchange's buffer, and on
  // the leader the dense copy refreshed and the replicas pooled into `t`.
  // The exchange's error when it has no pooled buffer.
  absl::StatusOr<int64_t> PoolShards(const data::Batch& batch, float* t);

  Model* const model_;
  comm::Communicator* const comm_;
  const RanksPredictorOptions options_;
  const int rank_, world_;
  const int t_width_;  // a row of the interaction input

  // The commands over comm_; its Lock() runs one prediction (or command)
  // at a time and guards the members marked so.
  comm::CommandChannel channel_;
  // The exchanges over comm_; guarded by the channel's lock on the leader.
  ShardExchange exchange_;
  ShardLayout model_parallel_;  // owned() without data-parallel replicas
  // The ids each model-parallel local shard pools (model_parallel_ order),
  // and by local shard (owned()[rank] order) its index there, -1 for a
  // replica.
  std::vector<data::SparseFeature> ids_;
  std::vector<int> ids_index_;
  // Each local shard's PoolReadOnly result, in owned()[rank] order.
  std::vector<absl::Status> pooled_;
  data::Batch none_;  // a follower's share of every prediction: no sample
  // Leader: the dense part's copy and workspace, and the model's
  // weights_generation() it was copied at; guarded by the channel's lock.
  std::unique_ptr<dense::DenseBackend> dense_;
  static constexpr uint64_t kNeverCopied = ~uint64_t{0};
  uint64_t generation_ = kNeverCopied;
  bool stopped_ = false;  // guarded by the channel's lock
};

}  // namespace dlrm::model
