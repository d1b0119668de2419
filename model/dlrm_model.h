// The single-process DLRM: bottom MLP, embedding bags, interaction, top MLP
// and BCE loss, with one call per training step (forward, loss, backward,
// sparse and dense updates) and a separate inference path.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/aligned.h"
#include "data/batch.h"
#include "dense/linear.h"
#include "dense/optimizer.h"
#include "dlrm/config.pb.h"
#include "embedding/embedding_store.h"
#include "embedding/embedding_table.h"
#include "embedding/rocksdb_store.h"

namespace dlrm::model {

// Wall time of each stage of the last training step, in seconds.
struct StageTimes {
  enum Stage {
    kBottomForward,
    kEmbeddingForward,
    kInteractionForward,
    kTopForward,
    kLoss,
    kTopBackward,
    kInteractionBackward,
    kBottomBackward,
    kEmbeddingBackwardUpdate,
    kDenseUpdate,
    // Making each table's rows resident (RocksDB tier; ~0 in host memory)
    // and starting the next batch's prefetch.
    kEmbeddingPrepare,
    kNumStages
  };
  static const char* Name(int stage);
  std::array<double, kNumStages> seconds{};
};

struct StepResult {
  // Mean BCE loss of the batch before the update.
  double loss = 0;
  int64_t samples = 0;
  StageTimes times;
};

// The store options of table `table` of a normalised config: kHost, or
// kRocksDbCache with the cache size, eviction and block cache of
// config.rocksdb (its path is left to the caller: the model's database).
embedding::StoreOptions StoreOptionsOfTable(const ModelConfig& config,
                                            int table);

// Owns all parameters and optimizer state. Every table is an
// EmbeddingStore: STORAGE_HOST tables a HostStore (the in-memory kernels
// unchanged), STORAGE_ROCKSDB tables a RocksDbCachedStore on the model's one
// RowDatabase, a fresh database in a new subdirectory of
// config.rocksdb.path that the model removes when it is destroyed (scratch:
// durability comes from checkpoints). Not thread-safe: TrainStep and Predict
// must not run concurrently (the server serialises them).
class DlrmModel {
 public:
  // `config` must be normalised (core/config.h). Initialises weights from
  // config.seed the way the DLRM reference does. Opening the RocksDB tier
  // fails with RocksDB's error (e.g. Internal, IOError as Internal) when
  // config.rocksdb.path cannot be created.
  static absl::StatusOr<std::unique_ptr<DlrmModel>> Create(
      const ModelConfig& config);

  // Closes the stores and the database, then removes the database's
  // directory.
  ~DlrmModel();
  DlrmModel(const DlrmModel&) = delete;
  DlrmModel& operator=(const DlrmModel&) = delete;

  // One step of SGD-style training on `batch`. InvalidArgument (naming the
  // field and sample) for a batch that does not fit the model;
  // ResourceExhausted when a table's batch has more unique ids than its
  // cache holds (RocksDB tier). A rejected batch leaves the weights and
  // optimizer state unchanged. `next`, if not null, is the batch the caller
  // will train on next: cached tables start reading its missing rows in the
  // background (it is only read during the call).
  absl::StatusOr<StepResult> TrainStep(const data::Batch& batch,
                                       const data::Batch* next = nullptr);

  // Click probabilities for every sample of `batch` (labels are ignored but
  // must be 0/1 if present). Does not change the weights (a cached table
  // may load rows into its cache, never marking them dirty).
  // ResourceExhausted as TrainStep.
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs);

  const ModelConfig& config() const { return config_; }
  // Rows of each table, in config order.
  const std::vector<int64_t>& table_rows() const { return table_rows_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

  dense::Mlp& bottom() { return bottom_; }
  dense::Mlp& top() { return top_; }
  // The rows in host memory of each table, in config order: the whole
  // table for STORAGE_HOST; for STORAGE_ROCKSDB the cache's slot array
  // (rows() is the cache size and row i is slot i, not table row i): read
  // those tables' rows through store(k).ReadRow instead.
  const std::vector<embedding::EmbeddingTable*>& tables() { return tables_; }
  // The store of table `k` (borrowed; replaced by RestoreRows).
  embedding::EmbeddingStore& store(int k) { return *stores_[k]; }
  // Whether table `k` lives in host memory (its tables()[k] is the table).
  bool IsHostTable(int k) const {
    return config_.tables(k).storage() == STORAGE_HOST;
  }
  // Whether any table uses STORAGE_ROCKSDB.
  bool HasRocksDbTables() const { return row_db_ != nullptr; }
  dense::DenseOptimizer& dense_optimizer() { return *dense_optimizer_; }

  // Cache counters summed over the RocksDB-tier tables (zeros without any).
  embedding::StoreMetrics RocksDbMetrics() const;

  // Flushes every cached table and writes a checkpoint of the RocksDB tier
  // (rows, optimizer state, step counters) to `dir`, which must not exist
  // (AlreadyExists). FailedPrecondition when no table uses RocksDB.
  absl::Status CheckpointRows(const std::string& dir);

  // Replaces the rows of every RocksDB-tier table with those of the
  // checkpoint in `dir` (made by CheckpointRows), in a fresh database; the
  // old one is removed. NotFound when `dir` is not a directory,
  // FailedPrecondition when no table uses RocksDB. On error the model is
  // unchanged.
  absl::Status RestoreRows(const std::string& dir);

  // A checksum of every weight (dense and embedding, RocksDB-tier rows read
  // in row order), equal for equal weights whatever the tiers; for tests
  // that a rejected batch changes nothing.
  uint64_t WeightChecksum() const;

 private:
  explicit DlrmModel(const ModelConfig& config);

  absl::Status ValidateBatch(const data::Batch& batch) const;
  // Makes every table's rows of `batch` resident (prepared_[k]); the first
  // table's error otherwise. Changes no weights.
  absl::Status PrepareTables(const data::Batch& batch);
  // Fills the interaction input `t` ([batch x t_width_]): the bottom MLP
  // output first, then each table's pooled embedding at table_offset_[k],
  // from prepared_.
  absl::Status Embed(const data::Batch& batch, const float* bottom_out,
                     float* t);
  // A new, not yet existing directory under config_.rocksdb().path for a
  // database.
  std::string NewDatabaseDir() const;
  // The RocksDB-tier stores on `db`, indexed by table (null for host
  // tables).
  absl::StatusOr<std::vector<std::unique_ptr<embedding::EmbeddingStore>>>
  CreateCachedStores(embedding::RowDatabase* db) const;

  ModelConfig config_;
  std::vector<int64_t> table_rows_;
  std::vector<int> table_offset_;  // where table k starts in a row of t_
  int num_vectors_;                // tables + 1
  int vector_dim_;                 // d (the bottom MLP's output width)
  int interaction_dim_;            // top MLP input width
  int t_width_;                    // floats per sample in the interaction input
  bool dot_;
  dense::Mlp bottom_, top_;
  // The RocksDB tier (null when every table is in host memory) and its
  // directory; declared before stores_ so that it outlives them.
  std::unique_ptr<embedding::RowDatabase> row_db_;
  std::string row_db_dir_;
  std::vector<std::unique_ptr<embedding::EmbeddingStore>> stores_;
  std::vector<embedding::EmbeddingTable*> tables_;
  // Each table's ids of the batch being run, as its store prepared them,
  // and each table's status from a parallel loop.
  std::vector<const data::SparseFeature*> prepared_;
  std::vector<absl::Status> table_status_;
  std::unique_ptr<dense::DenseOptimizer> dense_optimizer_;
  int64_t steps_ = 0;

  // Training buffers (grown on demand, reused across steps).
  AlignedVector<float> t_, z_, dz_, dt_, dlogits_, dbottom_;
  // Inference buffers.
  AlignedVector<float> infer_bottom_, infer_t_, infer_z_, infer_logits_,
      infer_scratch_;
};

}  // namespace dlrm::model
