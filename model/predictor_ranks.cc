// RanksPredictor: the prediction command loop, the pooling of every rank's
// shards under its shared weights lock, and the agreement on the step.
#include "model/predictor_ranks.h"

#include <algorithm>
#include <shared_mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace dlrm::model {
namespace {

// A command is two words: the op and its argument (kPredict: the batch's
// sample count).
enum Op : int64_t { kPredict = 2, kStop = 3 };
constexpr int64_t kCommandWords = 2;

}  // namespace

absl::Status RanksPredictorOptions::Validate() const {
  if (max_attempts < 1) {
    return absl::InvalidArgumentError("max_attempts must be at least 1");
  }
  if (!(heartbeat_seconds > 0)) {
    return absl::InvalidArgumentError("heartbeat_seconds must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RanksPredictor>> RanksPredictor::Create(
    Model* model, comm::Communicator* comm, RanksPredictorOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (model == nullptr || comm == nullptr) {
    return absl::InvalidArgumentError(
        "RanksPredictor needs a model and a communicator");
  }
  const ModelConfig& config = model->config();
  if (model->world_size() == 1) {
    return absl::FailedPreconditionError(
        "the model runs on one rank: no prediction is collective");
  }
  if (comm->world_size() != model->world_size() ||
      comm->rank() != model->rank() ||
      comm->memory_space() != comm::MemorySpace::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prediction communicator (rank ", comm->rank(), " of ",
                     comm->world_size(),
                     ") must take host memory and match the model's "
                     "rank ",
                     model->rank(), " of ", model->world_size()));
  }
  if (config.device() != DEVICE_CPU) {
    return absl::FailedPreconditionError(
        "the dense part is not on the CPU: its weights are not read beside "
        "the step");
  }
  for (const TableConfig& t : config.tables()) {
    if (!embedding::TableCapabilities(t, config.rocksdb(), t.rows())
             .read_beside_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", t.name(),
          " is in GPU memory: its rows are read through the step's stream"));
    }
  }
  // shards() is in table then shard order, the exchange's owned()
  // order for this rank.
  const embedding::ShardingPlan& plan = model->plan();
  std::vector<ShardRef> owned;
  for (int k = 0; k < config.tables_size(); ++k) {
    for (int i = 0; i < static_cast<int>(plan.tables[k].shards.size()); ++i) {
      if (plan.tables[k].shards[i].rank == model->rank())
        owned.push_back({k, i});
    }
  }
  const ShardSet& local = model->shards();
  if (local.size() != static_cast<int>(owned.size())) {
    return absl::InternalError(
        absl::StrCat("rank ", model->rank(), " holds ", local.size(),
                     " shards, its plan gives it ", owned.size()));
  }
  for (int j = 0; j < local.size(); ++j) {
    if (local[j].table != owned[j].table || local[j].shard != owned[j].shard) {
      return absl::InternalError(
          absl::StrCat("rank ", model->rank(), ": local shard ", j, " (table ",
                       config.tables(local[j].table).name(), " shard ",
                       local[j].shard, ") is not the plan's"));
    }
  }
  std::unique_ptr<dense::DenseBackend> dense;
  if (model->rank() == 0) {
    ASSIGN_OR_RETURN(dense, dense::CreateDenseBackend(config));
  }
  std::unique_ptr<RanksPredictor> p(
      new RanksPredictor(model, comm, std::move(options), std::move(dense)));
  if (p->rank_ == 0) {
    if (p->dense_->interaction().input_width != p->t_width_) {
      return absl::InternalError(
          absl::StrCat("the dense copy's interaction input is ",
                       p->dense_->interaction().input_width,
                       " wide, the model's ", p->t_width_));
    }
  }
  return p;
}

namespace {

comm::CommandChannelOptions ChannelOptions(
    const RanksPredictorOptions& options) {
  comm::CommandChannelOptions channel;
  channel.words = kCommandWords;
  channel.heartbeat_seconds = options.heartbeat_seconds;
  channel.name = "prediction communicator";
  channel.waiting_for = "a prediction";
  return channel;
}

// A row of the interaction input: the bottom MLP's output, then every
// table's pooled vector.
int InteractionWidth(const Model& model) {
  const ModelConfig& config = model.config();
  if (config.tables_size() == 0) return 0;
  const int last = config.tables_size() - 1;
  return static_cast<int>(model.table_column(last)) + config.tables(last).dim();
}

std::vector<int> TableColumns(const Model& model) {
  std::vector<int> columns;
  for (int k = 0; k < model.config().tables_size(); ++k) {
    columns.push_back(static_cast<int>(model.table_column(k)));
  }
  return columns;
}

}  // namespace

RanksPredictor::RanksPredictor(Model* model, comm::Communicator* comm,
                               RanksPredictorOptions options,
                               std::unique_ptr<dense::DenseBackend> dense)
    : model_(model),
      comm_(comm),
      options_(std::move(options)),
      rank_(comm->rank()),
      world_(comm->world_size()),
      t_width_(InteractionWidth(*model)),
      channel_(comm, ChannelOptions(options_)),
      exchange_(model->config(), model->plan(), comm, TableColumns(*model),
                t_width_),
      dense_(std::move(dense)) {
  const ModelConfig& config = model->config();
  model_parallel_ = exchange_.Restricted([&](int k) {
    return model->plan().tables[k].kind != SHARDING_DATA_PARALLEL;
  });
  for (const ShardRef& ref : exchange_.owned()[rank_]) {
    const bool replica =
        model->plan().tables[ref.table].kind == SHARDING_DATA_PARALLEL;
    ids_index_.push_back(replica ? -1 : static_cast<int>(ids_.size()));
    if (!replica) ids_.emplace_back();
  }
  none_.Reset(config.num_dense_features(), config.tables_size());
  none_.size = 0;
}

RanksPredictor::~RanksPredictor() {
  if (rank_ == 0) Stop().IgnoreError();
  channel_.StopHeartbeat();
}

std::unique_lock<std::mutex> RanksPredictor::Pause() { return channel_.Lock(); }

absl::Status RanksPredictor::Stop() {
  const std::unique_lock<std::mutex> lock = channel_.Lock();
  if (stopped_) return absl::OkStatus();
  stopped_ = true;
  channel_.Close();
  RETURN_IF_ERROR(channel_.broken());
  return channel_.Send({kStop, 0}, "a prediction command");
}

absl::Status RanksPredictor::Predict(const data::Batch& batch,
                                     std::vector<float>* probs, int64_t* step) {
  if (rank_ != 0) {
    return absl::FailedPreconditionError(
        "only rank 0 starts a prediction; the others Serve");
  }
  RETURN_IF_ERROR(ValidateBatch(model_->config(), batch));
  const int64_t n = batch.size;
  if (n == 0) return absl::InvalidArgumentError("batch: the batch is empty");
  const std::unique_lock<std::mutex> lock = channel_.Lock();
  RETURN_IF_ERROR(channel_.broken());
  if (stopped_) {
    return absl::UnavailableError("predictions beside training were stopped");
  }
  ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
  RETURN_IF_ERROR(channel_.Send({kPredict, n}, "a prediction command"));
  return Run(batch, n, t, probs, step);
}

absl::Status RanksPredictor::Serve() {
  if (rank_ == 0) {
    return absl::FailedPreconditionError("rank 0 leads; it does not Serve");
  }
  std::vector<int64_t> command;
  for (;;) {
    RETURN_IF_ERROR(channel_.Receive(&command));
    switch (command[0]) {
      case kPredict: {
        // Aborted (no agreed step) leaves every rank ready for the next
        // command; only a communicator error ends the loop.
        const absl::Status done =
            Run(none_, command[1], nullptr, nullptr, nullptr);
        if (absl::Status b = channel_.broken(); !b.ok()) return b;
        if (!done.ok() && !absl::IsAborted(done)) {
          spdlog::warn("rank {}: prediction failed: {}", rank_,
                       std::string(done.message()));
        }
        break;
      }
      case kStop:
        return absl::OkStatus();
      default:
        return absl::InternalError(absl::StrCat(
            "rank ", rank_, ": unknown prediction command ", command[0]));
    }
  }
}

absl::StatusOr<int64_t> RanksPredictor::PoolShards(const data::Batch& batch,
                                                   float* t) {
  ASSIGN_OR_RETURN(float* send, exchange_.PooledBuffer());
  std::shared_lock<std::shared_mutex> reading(model_->weights_mutex());
  const int64_t step = model_->steps();
  if (rank_ == 0) {
    const uint64_t generation = model_->weights_generation();
    if (generation != generation_) {
      RETURN_IF_ERROR(model_->CopyDenseParamsTo(*dense_));
      generation_ = generation;
    }
  }
  const int64_t stride = exchange_.pooled_stride();
  const std::vector<ShardRef>& mine = exchange_.owned()[rank_];
  const int num_local = static_cast<int>(mine.size());
  // The stores are asked for under the lock: a restore replaces those of
  // tables on RocksDB. PoolReadOnly reads a RocksDB shard's rows wherever
  // they are (cache slot, write-back buffer, database) and changes nothing.
  const ShardSet& local = model_->shards();
  pooled_.assign(num_local, absl::OkStatus());
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < num_local; ++j) {
    const int k = mine[j].table;
    if (ids_index_[j] >= 0) {
      pooled_[j] = local[j].store->PoolReadOnly(
          ids_[ids_index_[j]], send + exchange_.PooledColumn(j), stride);
    } else if (batch.size > 0) {
      // A replica pools the leader's samples straight into the interaction
      // input, as the step's data-parallel tables do.
      pooled_[j] = local[j].store->PoolReadOnly(
          batch.sparse[k], t + model_->table_column(k), t_width_);
    }
  }
  for (int j = 0; j < num_local; ++j) {
    if (!pooled_[j].ok()) {
      return absl::Status(
          pooled_[j].code(),
          absl::StrCat("table ", model_->config().tables(mine[j].table).name(),
                       ": ", pooled_[j].message()));
    }
  }
  return step;
}

absl::Status RanksPredictor::Run(const data::Batch& batch, int64_t n, float* t,
                                 std::vector<float>* probs, int64_t* step) {
  // Every sample is the leader's: the shards pool the whole batch for it.
  std::vector<int64_t> sizes(world_, 0);
  sizes[0] = n;
  exchange_.SetBatchSizes(sizes);
  std::vector<data::SparseFeature*> out;
  for (data::SparseFeature& f : ids_) out.push_back(&f);
  StageTimes times;
  absl::Status s =
      exchange_.DistributeIds(batch, sizes, model_parallel_, out, &times);
  if (!s.ok()) return Broke(s, "a prediction's ids");
  std::vector<int64_t> steps(world_);
  int64_t low = 0, high = 0;
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    // A rank whose stores could not be read (a RocksDB read failed) offers
    // step -1, which no rank agrees with: every rank tries again, and after
    // the attempts the prediction runs between steps, where the error is
    // reported if it persists.
    const absl::StatusOr<int64_t> pooled = PoolShards(batch, t);
    if (!pooled.ok()) {
      spdlog::warn("rank {}: a prediction's pooling failed (tried again): {}",
                   rank_, pooled.status().ToString());
    }
    const int64_t mine = pooled.ok() ? *pooled : -1;
    s = comm_->AllGather(&mine, 1, steps.data(), comm::DataType::kInt64);
    if (!s.ok()) return Broke(s, "a prediction's steps");
    low = *std::min_element(steps.begin(), steps.end());
    high = *std::max_element(steps.begin(), steps.end());
    // A rank behind is inside that step's weight writes, or just past its
    // collectives: its next pooling waits for the writes (its shared lock)
    // and most likely sees the step the others saw.
    if (low != high) continue;
    s = exchange_.GatherPooled(batch, t, &times);
    if (!s.ok()) return Broke(s, "a prediction's pooled vectors");
    if (rank_ != 0) return absl::OkStatus();
    probs->resize(n);
    *step = low;
    return dense_->Predict(batch.dense.data(), n, probs->data());
  }
  return absl::AbortedError(
      absl::StrCat("the ranks' weights were of different steps in each of ",
                   options_.max_attempts, " attempts (last: steps ", low,
                   " to ", high, ")"));
}

}  // namespace dlrm::model
