// The hybrid-parallel DLRM step of one rank (DESIGN.md "One training step
// across R ranks"): embedding shards model-parallel, MLPs data-parallel, and
// all-to-all exchanges between them, over a comm::Communicator.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/aligned.h"
#include "data/batch.h"
#include "dense/linear.h"
#include "dense/optimizer.h"
#include "dlrm/config.pb.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"

namespace dlrm::model {

// Wall time of each stage of a hybrid step, and the bytes each exchange
// moved out of this rank (what it sent, its own share included).
struct HybridStageTimes {
  enum Stage {
    kInputDist,   // all-to-all of bag lengths, then ids
    kLookup,      // pooling the shards for the global batch
    kOutputDist,  // all-to-all of pooled vectors to the samples' ranks
    kBottomForward,
    kInteractionForward,
    kTopForward,
    kLoss,
    kTopBackward,
    kInteractionBackward,
    kBottomBackward,
    kBackwardDist,     // all-to-all of pooled-vector gradients to the shards
    kEmbeddingUpdate,  // fused sparse backward + optimizer on the shards
    kAllReduce,        // dense gradients (and the loss)
    kDenseUpdate,
    kNumStages
  };
  static const char* Name(int stage);
  std::array<double, kNumStages> seconds{};

  enum Exchange { kLengths, kIds, kPooled, kGradients, kDense, kNumExchanges };
  static const char* ExchangeName(int exchange);
  std::array<int64_t, kNumExchanges> bytes_sent{};
};

struct HybridStepResult {
  // Mean BCE loss over the global batch, before the update.
  double loss = 0;
  // Samples in the global batch.
  int64_t global_samples = 0;
  HybridStageTimes times;
};

// One rank's part of a hybrid-parallel DLRM: replicas of the MLPs, the
// embedding shards the plan gives this rank, and replicas of data-parallel
// tables. Every rank calls TrainStep / Predict together with its own local
// batch (any sizes, 0 included). Not thread-safe.
//
// Equivalence: R ranks and one rank with the concatenated global batch take
// the same step up to float summation order: dense gradients are summed per
// rank and then across ranks, and row-wise shards' partial pools are summed
// shard by shard. Table-wise, column-wise and data-parallel tables pool and
// update with exactly the single-rank arithmetic.
class HybridModel {
 public:
  // `config` normalised; `plan` valid for it with plan.world_size ==
  // comm->world_size(). `comm` is borrowed and must outlive the model.
  // With `dense_comm` (a second communicator over the same ranks, also
  // borrowed), dense gradients are all-reduced in two buckets on a
  // background thread, overlapped with the rest of the backward pass.
  // Initial weights equal DlrmModel::Create(config)'s.
  static absl::StatusOr<std::unique_ptr<HybridModel>> Create(
      const ModelConfig& config, const embedding::ShardingPlan& plan,
      comm::Communicator* comm, comm::Communicator* dense_comm = nullptr);

  // One training step on the global batch made of every rank's local batch
  // (in rank order). InvalidArgument (naming field and sample) when any
  // rank's batch is bad; then no rank changes its model. Other errors come
  // from the communicator and leave the job unusable.
  absl::StatusOr<HybridStepResult> TrainStep(const data::Batch& local_batch);

  // Click probabilities of this rank's local samples. Collective; does not
  // change the model.
  absl::Status Predict(const data::Batch& local_batch,
                       std::vector<float>* probs);

  // Collective: every rank receives table k whole (rows x dim, row-major),
  // assembled from the shards. For tests, checkpoints and export.
  absl::Status GatherTable(int k, std::vector<float>* table);

  const ModelConfig& config() const { return config_; }
  const embedding::ShardingPlan& plan() const { return plan_; }
  int64_t steps() const { return steps_; }
  // For checkpoints, which restore the step count with it.
  void set_steps(int64_t steps) { steps_ = steps; }

  // A shard this rank holds, for checkpoints: the plan's table and shard
  // index and its storage (valid while the model lives).
  struct ShardState {
    int table;
    int shard;
    embedding::EmbeddingTable* storage;
  };
  // This rank's shards (data-parallel replicas included), in table then
  // shard order.
  std::vector<ShardState> LocalShards();
  // The MLPs' parameters ("bottom_mlp.0.weight", ...) and their optimizer.
  const std::vector<dense::ParamRef>& dense_params() const {
    return dense_params_;
  }
  dense::DenseOptimizer& dense_optimizer() { return *dense_optimizer_; }
  dense::Mlp& bottom() { return bottom_; }
  dense::Mlp& top() { return top_; }

 private:
  // A shard this rank holds: the plan's shard index, and its table.
  struct LocalShard {
    int table;
    int shard;
    std::unique_ptr<embedding::EmbeddingTable> storage;
    // Ids of the global batch routed to this shard (row-wise: shard-local).
    data::SparseFeature global_ids;
  };
  // A shard as every rank sees it: which table, which shard of it.
  struct ShardRef {
    int table;
    int shard;
  };

  HybridModel(const ModelConfig& config, const embedding::ShardingPlan& plan,
              comm::Communicator* comm);

  const embedding::Shard& ShardOf(const ShardRef& s) const {
    return plan_.tables[s.table].shards[s.shard];
  }
  bool IsDataParallel(int table) const {
    return plan_.tables[table].kind == SHARDING_DATA_PARALLEL;
  }
  // Validates the local batch and agrees with every rank on the verdict.
  absl::Status AgreeOnBatch(const data::Batch& batch);
  // All-reduces the gradients of dense_params_[begin, end) (and *loss_sum
  // when not null) over `comm`, in place.
  absl::Status ReduceBucket(comm::Communicator* comm, size_t begin, size_t end,
                            double* loss_sum);
  // Bytes of the dense all-reduce: every gradient and the loss.
  int64_t DenseBytes() const;
  // Input dist, lookup and output dist; fills t_ for the local batch and
  // leaves the shards' global_ids in place for the backward.
  absl::Status EmbedForward(const data::Batch& batch, HybridStageTimes* times);

  ModelConfig config_;
  embedding::ShardingPlan plan_;
  comm::Communicator* comm_;
  comm::Communicator* dense_comm_ = nullptr;  // optional, for overlap
  int rank_;
  int world_;

  int num_vectors_;
  int vector_dim_;
  int interaction_dim_;
  int t_width_;
  std::vector<int> table_offset_;
  bool dot_;
  dense::Mlp bottom_, top_;
  std::unique_ptr<dense::DenseOptimizer> dense_optimizer_;
  std::vector<dense::ParamRef> dense_params_;

  // owned_[r]: every shard rank r holds (model-parallel and data-parallel
  // replicas), in table then shard order: the layout of every exchange.
  std::vector<std::vector<ShardRef>> owned_;
  std::vector<LocalShard> local_;  // this rank's, in owned_[rank_] order
  // replica_[k]: index into local_ of data-parallel table k's copy, or -1.
  std::vector<int> replica_;
  int64_t steps_ = 0;

  // Per step: every rank's local batch size and where its samples start.
  std::vector<int64_t> sizes_, starts_;
  int64_t global_size_ = 0;
  // Exchange and activation buffers, grown on demand.
  std::vector<int64_t> send_i64_, recv_i64_, send_ids_, recv_ids_;
  AlignedVector<float> send_f_, recv_f_, pooled_, t_, z_, dz_, dt_, dlogits_,
      dbottom_, grad_flat_, grad_flat_top_;
};

// docs/hybrid.md's formula: the bytes `rank` sends to other ranks in one
// training step, per exchange, for its `local` batch when the ranks' local
// sizes are `sizes`. The step's HybridStageTimes::bytes_sent must equal it.
std::array<int64_t, HybridStageTimes::kNumExchanges> PredictedExchangeBytes(
    const ModelConfig& config, const embedding::ShardingPlan& plan,
    const data::Batch& local, const std::vector<int64_t>& sizes, int rank);

}  // namespace dlrm::model
