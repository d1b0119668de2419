// The DLRM model and its training step on R >= 1 ranks (docs/architecture.md
// "One step"): embedding shards model-parallel, MLPs data-parallel, and
// all-to-all exchanges between them over a comm::Communicator. One process
// is R = 1: its communicator's exchanges are copies, and the same code runs.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/aligned.h"
#include "data/batch.h"
#include "dense/backend.h"
#include "dense/linear.h"
#include "dense/optimizer.h"
#include "dlrm/config.pb.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "embedding/sharding.h"
#include "model/exchange.h"
#include "model/shard_set.h"
#include "model/stage_times.h"
#include "model/step_util.h"

namespace dlrm::model {

// Model::GatherTableIds' marks of rows that hold no id.
inline constexpr int64_t kFreeRowId = -1;
inline constexpr int64_t kKeptRowId = -2;

// The stores of one rank for one cached or dynamic table (its shards of
// the table together): the row caches of a table on RocksDB, the device
// caches of a STORAGE_DEVICE table with device_cache_rows, the id maps of
// a dynamic table (StoreMetrics' ids_* fields, on any tier).
struct RankTableStore {
  int rank = 0;
  int table = 0;
  // 0 for a dynamic table without a cache.
  int64_t cache_rows = 0;
  // Whether the caches are device caches (their rows_read / rows_written
  // count records read from and written back to the tier behind them).
  bool device = false;
  // Whether the table is dynamic.
  bool dynamic = false;
  embedding::StoreMetrics metrics;
};

struct StepResult {
  // Mean BCE loss over the global batch, before the update.
  double loss = 0;
  // Samples in the global batch (every rank's local batch).
  int64_t samples = 0;
  StageTimes times;
  // Every rank's caches and dynamic tables' maps, table then rank order,
  // as of this step's prepare (write-backs still queued count when they
  // are written). Empty when no table is on RocksDB, has a device cache or
  // is dynamic.
  std::vector<RankTableStore> stores;
};

// OK when `batch` is a batch a model of `config` takes: Batch::Validate
// against its dense width and data::TableIdLimits (a static table's ids in
// [0, rows), a dynamic table's raw ids in [0, 2^63 - 1); InvalidArgument
// naming the field and the sample), or an empty batch with one sparse
// feature per table.
absl::Status ValidateBatch(const ModelConfig& config, const data::Batch& batch);

// One rank's part of a DLRM: replicas of the MLPs, the embedding shards the
// plan gives this rank, and replicas of data-parallel tables. Every rank
// calls TrainStep / Predict / GatherTable / WeightChecksum together, each
// with its own local batch (any sizes, 0 included); on one rank these are
// plain calls. Not thread-safe, except that readers of the weights on other
// threads may run beside it under weights_mutex() (model/predictor.h).
//
// Every shard (and replica) is an EmbeddingStore of its table's tier,
// built with the databases it needs by the rank's ShardSet
// (model/shard_set.h); the step asks the stores and their tier's
// capabilities what to do (prefetch, caches), never a table's storage
// field. Each shard's RocksDB cache holds cache_fraction of the shard's
// rows, or cache_rows rows (at most the shard's rows) when cache_rows is
// set (docs/hybrid.md "Tables on RocksDB").
//
// The dense part (MLPs, interaction, loss, dense optimizer) runs on the
// dense backend of config.device (dense/backend.h): the CPU, or CUDA device
// 0. STORAGE_DEVICE tables live in that device's memory: on one rank
// without row-wise tables they pool into, and update from, the backend's
// device interaction input and gradient in place; otherwise the step needs
// a device communicator (Create's `device_comm`), whose output and
// backward dists move device buffers (model/exchange.h).
//
// Equivalence: R ranks and one rank with the concatenated global batch take
// the same step up to float summation order: dense gradients are summed per
// rank and then across ranks, and row-wise shards' partial pools are summed
// shard by shard. Table-wise, column-wise and data-parallel tables pool and
// update with exactly the single-rank arithmetic. A table on RocksDB trains
// bitwise like the same table in host memory.
class Model {
 public:
  // One process: every table whole on rank 0 (embedding::WholeTablesPlan)
  // over a single-rank communicator the model owns. `config` normalised;
  // initialises weights from config.seed the way the DLRM reference does.
  // FailedPrecondition naming why when config.device is DEVICE_CUDA and no
  // GPU is usable (dense::CreateDenseBackend). Opening the RocksDB tier fails
  // with RocksDB's error (e.g. Internal) when config.rocksdb.path cannot be
  // created.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const ModelConfig& config);

  // One rank of R: `config` normalised; `plan` valid for it with
  // plan.world_size == comm->world_size(). `comm` is borrowed and must
  // outlive the model; it carries the control traffic, the input dist and
  // the dense all-reduce (unless dense_comm or device_comm does); it and
  // `dense_comm` take host memory (FailedPrecondition otherwise). With
  // `dense_comm` (a second communicator over the same ranks, also
  // borrowed), dense gradients are all-reduced in two buckets on a
  // background thread, overlapped with the rest of the backward pass.
  //
  // With `device_comm` (a device communicator over the same ranks,
  // borrowed likewise: NCCL, single-rank device, or host-staged), the output
  // and backward dists, and without `dense_comm` the dense all-reduce, move
  // device buffers over it: on the CUDA dense backend, device memory, the
  // communicator set to the backend's stream
  // (SetStream) and every model-parallel table's columns of the
  // interaction input written on the device; on the CPU backend, host
  // memory (then `device_comm` must be host-staged over the CPU Device).
  // STORAGE_DEVICE tables that need an exchange (several ranks, or a
  // row-wise table) need it on CUDA: FailedPrecondition naming the table
  // otherwise. InvalidArgument when a communicator joins other ranks.
  //
  // Initial weights equal Create(config)'s. Opening this rank's database
  // fails with RocksDB's error when its directory cannot be made.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const ModelConfig& config, const embedding::ShardingPlan& plan,
      comm::Communicator* comm, comm::Communicator* dense_comm = nullptr,
      comm::Communicator* device_comm = nullptr);

  // Closes the stores and the database, then removes the database's
  // directory.
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // One training step on the global batch made of every rank's local batch
  // (in rank order). InvalidArgument (naming field and sample) when any
  // rank's batch is bad; ResourceExhausted when a shard on RocksDB gets
  // more unique ids than its cache holds (on any rank: the ranks agree
  // before anything changes, and the error names the rank). Then no rank
  // changes its model. Other errors come from the communicator (or RocksDB)
  // and leave the job unusable.
  //
  // `next_local`, if not null, is this rank's part of the batch the ranks
  // will train on next: its ids are sent to the shards on RocksDB (one more
  // all-to-all of lengths and ids, counted in the lengths and ids
  // exchanges), which start reading their missing rows in the background.
  // Ranks may differ in whether they pass one (a rank without one, or with
  // an invalid one, contributes no samples to the prefetch).
  //
  // `read_loss` false, on one rank: result.loss is NaN and the step does
  // not wait for the device to compute it (on CUDA the host may then fill
  // the next step's inputs while this step's kernels run). The step itself
  // is the same either way. On several ranks the loss is all-reduced with
  // the gradients and always read.
  absl::StatusOr<StepResult> TrainStep(const data::Batch& local_batch,
                                       const data::Batch* next_local = nullptr,
                                       bool read_loss = true);

  // Click probabilities of this rank's local samples (labels are ignored
  // but must be 0/1 if present). Collective; does not change the model (a
  // shard on RocksDB may load rows into its cache, never marking them
  // dirty). InvalidArgument and ResourceExhausted as TrainStep.
  absl::Status Predict(const data::Batch& local_batch,
                       std::vector<float>* probs);

  // Collective: every rank receives table k whole (rows x dim, row-major),
  // assembled from the shards (rows on RocksDB read through their store).
  // For tests, checkpoints and export.
  absl::Status GatherTable(int k, std::vector<float>* table);

  // Collective: every rank receives dynamic table k's raw ids by row
  // (rows entries): the id row r holds, kFreeRowId for a row without one
  // (empty, or its id's time to live ran out: DynamicIdMap::Lookup misses
  // it), kKeptRowId for the row kept for ids without a row. A column-wise
  // table's blocks share one map: the first block's is taken.
  // FailedPrecondition when table k is not dynamic.
  absl::Status GatherTableIds(int k, std::vector<int64_t>* ids);

  // Collective: a checksum of every weight (dense and embedding, each table
  // gathered whole, rows on RocksDB read in row order), equal for equal
  // weights whatever the rank count, plan or tiers; for tests that a
  // rejected batch changes nothing and that R ranks equal one process.
  absl::StatusOr<uint64_t> WeightChecksum();

  // The lock of the weights' readers on other threads (SnapshotPredictor):
  // they hold it shared while they read embedding rows or copy the dense
  // parameters. The model holds it exclusively only while it writes weights:
  // in TrainStep from the sparse update to the end of the dense update (with
  // a dynamic table, whose prepare admits ids, from the input dist on), and
  // in a checkpoint restore (WeightsWriter), so a reader sees the weights of
  // one step, never a mix.
  std::shared_mutex& weights_mutex() const { return weights_mu_; }
  // Bumped once each time the weights have changed (a step, a restore):
  // readers compare it to know whether their copies are current. Read it
  // under weights_mutex() (shared) for a value that matches the weights.
  uint64_t weights_generation() const { return weights_generation_.load(); }
  // Exclusive access to the weights for as long as it lives, for code that
  // writes them from outside the step (a restore); bumps the generation on
  // destruction.
  class WeightsWriter {
   public:
    explicit WeightsWriter(Model& model)
        : model_(model), lock_(model.weights_mu_) {}
    ~WeightsWriter() { ++model_.weights_generation_; }
    WeightsWriter(const WeightsWriter&) = delete;
    WeightsWriter& operator=(const WeightsWriter&) = delete;

   private:
    Model& model_;
    std::unique_lock<std::shared_mutex> lock_;
  };
  // Table k's columns in a row of the interaction input (after the bottom
  // MLP's output, in table order).
  int64_t table_column(int k) const { return table_offset_[k]; }

  const ModelConfig& config() const { return config_; }
  // Replaces this rank's optimizers with `dense` and `sparse` from the next
  // step on (the dense backend's and every shard's store's), and config()'s
  // dense_optimizer and sparse_optimizer with them, so a checkpoint saves
  // them. Both normalised; they may differ from config()'s only in what
  // core/config_change.h lets change (rates, schedules, eps, ...).
  // InvalidArgument naming the field for a value optim::Validate refuses
  // (a negative or NaN learning rate) or a field that may not change;
  // nothing changes then. A store's error otherwise (the model is then
  // part changed: the caller's job breaks). Takes the weights lock. Not
  // collective: on several ranks every rank calls it between the same two
  // steps (server::RankGroup::SetOptimizers).
  absl::Status SetOptimizers(const OptimizerConfig& dense,
                             const OptimizerConfig& sparse);
  const embedding::ShardingPlan& plan() const { return plan_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int64_t steps() const { return steps_; }
  // For checkpoints, which restore the step count with it.
  void set_steps(int64_t steps) { steps_ = steps; }

  // This rank's shards (data-parallel replicas included), in table then
  // shard order, and their stores (model/shard_set.h). A restore of the
  // database form swaps stores (SwapInRows).
  const ShardSet& shards() const { return *shards_; }
  // The dense parameters ("bottom_mlp.0.weight", ..., under DCN
  // "interaction.crossnet.0.V", ..., then "top_mlp....") and their
  // optimizer, in host memory: the dense backend's host view
  // (dense/backend.h), which a restore may write.
  const std::vector<dense::ParamRef>& dense_params() const {
    return dense_->params();
  }
  dense::DenseOptimizer& dense_optimizer() { return dense_->optimizer(); }
  // Copies the dense weights of the last completed step (or restore) into
  // `dst`, a prediction backend of this model's config
  // (dense::DenseBackend::CopyParamsTo): from any thread, with
  // weights_mutex() held shared.
  absl::Status CopyDenseParamsTo(dense::DenseBackend& dst) const {
    return dense_->CopyParamsTo(dst);
  }
  // After writing dense_params() (a restore, under a WeightsWriter): makes
  // CopyDenseParamsTo read what was written (DenseBackend::PublishHostView).
  absl::Status PublishDenseParams() { return dense_->PublishHostView(); }
  dense::Mlp& bottom() { return dense_->bottom(); }
  dense::Mlp& top() { return dense_->top(); }
  // The precision the dense GEMMs run at: config().dense_precision(), or
  // PRECISION_FP32 where the CPU has no bf16 instructions.
  DensePrecision dense_precision() const { return dense_->precision(); }
  // What the dense backend's CUDA graphs have done (dense::GraphCounts; all
  // zero on the CPU or with gpu_cuda_graphs off).
  dense::GraphCounts dense_graph_counts() const {
    return dense_->graph_counts();
  }

  // Collective: every rank learns whether every rank's `local` is OK, and
  // receives every rank's `extra` words (the same count on every rank) into
  // *all_extra in rank order when not null. Returns `local`'s error, else
  // the first failing rank's (its code, "rank <r>: " and its message), else
  // OK; a communicator error as is, after which
  // communicator_failed() is true.
  absl::Status Agree(const absl::Status& local,
                     const std::vector<int64_t>& extra = {},
                     std::vector<int64_t>* all_extra = nullptr) {
    return AgreeOnStatus(local, extra, all_extra, "rank");
  }
  // Whether a collective of Agree failed in the communicator (the ranks no
  // longer agree on what happened).
  bool communicator_failed() const { return communicator_failed_; }
  // The communicator's error that set communicator_failed() (OK before).
  const absl::Status& communicator_error() const { return communicator_error_; }

  // Puts the stores ShardSet::Stage made in place of the live ones
  // (ShardSet::Swap) and forgets the prepared batch. Cannot fail.
  void SwapInRows(std::unique_ptr<ShardSet::Staged> staged);

 private:
  // A shard this rank holds: the plan's shard index, and its rows.
  struct LocalShard {
    int table;
    int shard;
    // shards_'s store (BindStores).
    embedding::EmbeddingStore* store = nullptr;
    // The rows in host memory (a HostStore), else null.
    embedding::EmbeddingTable* host = nullptr;
    // Ids of the global batch routed to this shard (row-wise: shard-local),
    // and what the store's Prepare made of them (valid until the next
    // Prepare).
    data::SparseFeature global_ids;
    const data::SparseFeature* prepared = nullptr;
    // The ids Prepare takes: &global_ids, or the batch's own feature when
    // the exchanges are elided (in_place_).
    const data::SparseFeature* ids = nullptr;
    // Ids of the next global batch (prefetch_locals_ only).
    data::SparseFeature next_ids;
    // The shard's gradients for the global batch in host memory, when the
    // backward dist delivers them in another memory space.
    AlignedVector<float> host_grads;
    absl::Status status;  // scratch of parallel loops
  };
  Model(const ModelConfig& config, const embedding::ShardingPlan& plan,
        comm::Communicator* comm, std::unique_ptr<dense::DenseBackend> dense);
  // Points every local shard at its store in shards_ (after Create and a
  // swap).
  void BindStores();

  const embedding::Shard& ShardOf(const ShardRef& s) const {
    return plan_.tables[s.table].shards[s.shard];
  }
  bool IsDataParallel(int table) const {
    return plan_.tables[table].kind == SHARDING_DATA_PARALLEL;
  }
  // What table k's stores do (the same on every rank:
  // embedding::TableCapabilities).
  embedding::StoreCapabilities TableCapabilities(int k) const {
    return embedding::TableCapabilities(config_.tables(k), config_.rocksdb(),
                                        config_.tables(k).rows());
  }
  // Validates the local batch (and `next`, if any) and agrees with every
  // rank on the verdict, the local sizes and the next batch's local sizes
  // (next_sizes_: 0 where a rank has no valid next batch).
  absl::Status AgreeOnBatch(const data::Batch& batch, const data::Batch* next);
  // Prepares every local shard's global ids; with tables on RocksDB, every
  // rank learns whether all ranks succeeded, and all fail together.
  // `predict`: through PrepareLookup (no dynamic table admits an id).
  absl::Status PrepareShards(bool predict);
  // comm::AgreeOnStatus over comm_ ("<what> <r>: ..." names the first
  // failing rank); a communicator error sets communicator_failed().
  absl::Status AgreeOnStatus(const absl::Status& local,
                             const std::vector<int64_t>& extra = {},
                             std::vector<int64_t>* all_extra = nullptr,
                             const char* what = "batch refused by rank");
  // All-reduces the dense gradients of `bucket` over `comm`, in place; when
  // `loss_sum` is not null, also the loss sum, into *loss_sum: this rank's
  // is the backend's last loss (ReadLoss, read once the gradients are
  // packed) times `samples`, its local batch. Does nothing on one rank.
  absl::Status ReduceBucket(comm::Communicator* comm, dense::GradBucket bucket,
                            int64_t samples, double* loss_sum);
  // As ReduceBucket for every dense gradient and the loss sum, over
  // device_comm_, in the dense backend's device memory
  // (PackDeviceGradients).
  absl::Status ReduceOnDevice(int64_t samples, double* loss_sum);
  // Input dist, prepare, lookup and output dist; fills the interaction
  // input for the local batch (the training step's, or Predict's when
  // `predict`: they differ on the device) and leaves the shards' prepared
  // ids in place for the backward.
  absl::Status EmbedForward(const data::Batch& batch, bool predict,
                            StageTimes* times);
  // Each shard's fused sparse backward and optimizer step from the
  // interaction gradient `dt` (this rank's samples, rows of t_width_): in
  // place on one rank without row-wise tables, else after the backward
  // dist, whose time goes to *clock.
  absl::Status UpdateShards(const data::Batch& batch, const float* dt,
                            internal::StageClock<StageTimes>* clock);
  // Fills by_work_ with the indices of local_, the shards with the most
  // work first (prepared ids times dim; ties in local_ order), after the
  // step's prepare. The lookup's parallel loop over shards hands them out
  // in this order: a dynamic schedule in table order leaves one thread
  // alone with a big table picked up late (DCNv2's C21 holds 100 of its
  // 214 ids per sample), largest-first keeps the threads' shares even. The
  // order is the batch's alone and each shard's result does not depend on
  // it. (The update orders its own work: embedding::UpdateStores.)
  void OrderShardsByWork();
  // Sends the next batch's ids to the shards on RocksDB and starts their
  // prefetch (TrainStep with a next batch on some rank; `next` may be null
  // on this one, which then sends no samples).
  absl::Status PrefetchNext(const data::Batch* next, StageTimes* times);
  ModelConfig config_;
  embedding::ShardingPlan plan_;
  // The single-rank communicator of a one-process model (Create(config));
  // null when the caller owns the communicator.
  std::unique_ptr<comm::Communicator> owned_comm_;
  comm::Communicator* comm_;
  comm::Communicator* dense_comm_ = nullptr;  // optional, for overlap
  // Optional: the output and backward dists' and, without dense_comm_, the
  // dense all-reduce's.
  comm::Communicator* device_comm_ = nullptr;
  int rank_;
  int world_;

  // The dense part; its interaction input is t (below).
  std::unique_ptr<dense::DenseBackend> dense_;
  // Bytes of the dense all-reduce: every gradient and the loss.
  int64_t dense_bytes_;
  // A row of t, the interaction input: the bottom MLP's output, then every
  // table's pooled vector from table_offset_[k].
  int t_width_;
  std::vector<int> table_offset_;

  // One rank and no row-wise table: every exchange would be the identity,
  // so shards prepare the batch's own ids, pool straight into t_ and update
  // from the interaction gradient in place (no staging buffers, no copies).
  bool in_place_ = false;
  // Whether a local shard is in device memory (STORAGE_DEVICE).
  bool any_device_ = false;
  // Whether the output and backward dists run in the dense backend's
  // device memory (a device communicator on the CUDA backend): then the
  // exchanges read and write its device interaction input and gradient.
  bool exchange_on_device_ = false;
  // Whether local shard `ls` pools and updates in the exchange's memory
  // space (else through the exchange's host copies).
  bool InExchangeSpace(const LocalShard& ls) const {
    return ls.store->memory_space() == exchange_->memory_space();
  }
  // The local shard's columns in a row of t_.
  int64_t TColumn(const LocalShard& ls) const {
    return table_offset_[ls.table] +
           plan_.tables[ls.table].shards[ls.shard].col_begin;
  }
  // Whether any table of the model has a cache (StoreCapabilities::
  // cache_rows) or is dynamic (the same on every rank: it decides the
  // extra collectives: the prepare's agreed verdict and counters, the next
  // batch's size).
  bool any_cache_ = false;
  // This rank's stores and the databases they need.
  std::unique_ptr<ShardSet> shards_;

  // local_'s indices, most work first (OrderShardsByWork).
  std::vector<int> by_work_;

  // The step's exchanges, and their layout: every shard of every rank.
  std::unique_ptr<ShardExchange> exchange_;
  // The exchange's layout restricted to tables whose stores take the next
  // batch (StoreCapabilities::prefetch): the prefetch's.
  ShardLayout owned_prefetch_;
  // This rank's shards, in exchange_->owned()[rank_] order (shards_'s).
  std::vector<LocalShard> local_;
  // Indices into local_ of the shards that take the next batch.
  std::vector<int> prefetch_locals_;
  // Indices into local_ of the shards with a cache or of a dynamic table,
  // whose counters the prepare gathers.
  std::vector<int> cache_locals_;
  // replica_[k]: index into local_ of data-parallel table k's copy, or -1.
  std::vector<int> replica_;
  // store_tables_[r]: the tables with a cache (or dynamic) rank
  // r holds shards of, in order; store_words_: the counter words each rank
  // sends (the most tables any rank has, times StoreMetrics::kNumFields);
  // store_stats_: every rank's counters as of the last prepare.
  std::vector<std::vector<int>> store_tables_;
  int64_t store_words_ = 0;
  std::vector<RankTableStore> store_stats_;
  int64_t steps_ = 0;
  bool communicator_failed_ = false;
  absl::Status communicator_error_;
  // Readers of the weights on other threads (weights_mutex()).
  mutable std::shared_mutex weights_mu_;
  std::atomic<uint64_t> weights_generation_{0};

  // Per step: every rank's next batch size (prefetch); the local and
  // global sizes of the batch itself are exchange_'s.
  std::vector<int64_t> next_sizes_;
  // A data-parallel replica on RocksDB pools the global batch here.
  AlignedVector<float> replica_out_;
};

}  // namespace dlrm::model
