// The DLRM training step and inference on one process (DESIGN.md "The
// model"; the R = 1 case of the hybrid-parallel step).
#include "model/dlrm_model.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/random.h"
#include "core/status.h"
#include "dense/interaction.h"
#include "dense/loss.h"
#include "embedding/sharding.h"
#include "model/step_util.h"

namespace dlrm::model {
namespace {

using internal::Sized;
using internal::Widths;
using StageClock = internal::StageClock<StageTimes>;

embedding::TableSpec SpecOfTable(const ModelConfig& config, int k) {
  const TableConfig& t = config.tables(k);
  embedding::TableSpec spec;
  spec.table_index = k;
  spec.rows = t.rows();
  spec.dim = t.dim();
  spec.pooling = t.pooling();
  spec.optimizer = config.sparse_optimizer();
  spec.seed = config.seed();
  return spec;
}

// The first error of `statuses`, else OK.
absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

embedding::StoreOptions StoreOptionsOfTable(const ModelConfig& config,
                                            int table) {
  embedding::StoreOptions o;
  if (config.tables(table).storage() != STORAGE_ROCKSDB) return o;
  const RocksDbConfig& r = config.rocksdb();
  o.kind = embedding::StoreKind::kRocksDbCache;
  o.rocksdb.path = r.path();
  o.rocksdb.cache_rows = CachedRowsOfTable(config, table);
  o.rocksdb.eviction = r.eviction() == RocksDbConfig::LFU
                           ? embedding::EvictionPolicy::kLfu
                           : embedding::EvictionPolicy::kLru;
  o.rocksdb.block_cache_bytes = r.block_cache_bytes();
  return o;
}

const char* StageTimes::Name(int stage) {
  static const char* const kNames[] = {
      "bottom_fwd",     "emb_fwd",      "inter_fwd",  "top_fwd",
      "loss",           "top_bwd",      "inter_bwd",  "bottom_bwd",
      "emb_bwd_update", "dense_update", "emb_prepare"};
  return kNames[stage];
}

DlrmModel::DlrmModel(const ModelConfig& config)
    : config_(config),
      num_vectors_(config.tables_size() + 1),
      vector_dim_(config.bottom_mlp(config.bottom_mlp_size() - 1)),
      interaction_dim_(0),
      t_width_(0),
      dot_(config.interaction() == INTERACTION_DOT),
      bottom_(config.num_dense_features(), Widths(config.bottom_mlp()),
              /*relu_last=*/true),
      top_(InteractionOutputDim(config), Widths(config.top_mlp()),
           /*relu_last=*/false) {
  t_width_ = vector_dim_;
  for (const auto& t : config.tables()) {
    table_rows_.push_back(t.rows());
    table_offset_.push_back(t_width_);
    t_width_ += t.dim();
  }
  interaction_dim_ = top_.in();
}

absl::StatusOr<std::unique_ptr<DlrmModel>> DlrmModel::Create(
    const ModelConfig& requested) {
  // Tiers from rocksdb.host_budget_bytes, when set.
  ASSIGN_OR_RETURN(const ModelConfig config,
                   embedding::ApplyHostBudget(requested));
  std::unique_ptr<DlrmModel> m(new DlrmModel(config));
  // The reference draws the bottom MLP, then the top MLP, from one stream.
  Rng rng(config.seed());
  m->bottom_.Init(&rng);
  m->top_.Init(&rng);
  const int num_tables = config.tables_size();
  m->stores_.resize(num_tables);
  m->tables_.resize(num_tables);
  m->prepared_.resize(num_tables);
  m->table_status_.resize(num_tables);
  bool any_rocksdb = false;
  for (int k = 0; k < num_tables; ++k) {
    if (m->IsHostTable(k)) {
      auto host =
          std::make_unique<embedding::HostStore>(SpecOfTable(config, k));
      m->tables_[k] = &host->table();
      m->stores_[k] = std::move(host);
    } else {
      any_rocksdb = true;
    }
  }
  if (any_rocksdb) {
    std::error_code ec;
    std::filesystem::create_directories(config.rocksdb().path(), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot create rocksdb.path ",
                                              config.rocksdb().path(), ": ",
                                              ec.message()));
    }
    embedding::RocksDbStoreOptions db_options =
        StoreOptionsOfTable(config, 0).rocksdb;
    db_options.path = m->NewDatabaseDir();
    db_options.block_cache_bytes = config.rocksdb().block_cache_bytes();
    if (config.rocksdb().write_buffer_bytes() > 0) {
      db_options.write_buffer_bytes = config.rocksdb().write_buffer_bytes();
    }
    ASSIGN_OR_RETURN(m->row_db_, embedding::RowDatabase::Open(db_options));
    m->row_db_dir_ = db_options.path;
    ASSIGN_OR_RETURN(auto cached, m->CreateCachedStores(m->row_db_.get()));
    for (int k = 0; k < num_tables; ++k) {
      if (cached[k] == nullptr) continue;
      m->tables_[k] =
          &static_cast<embedding::RocksDbCachedStore&>(*cached[k]).slot_array();
      m->stores_[k] = std::move(cached[k]);
    }
  }
  std::vector<dense::ParamRef> params = m->bottom_.Parameters("bottom_mlp");
  for (auto& p : m->top_.Parameters("top_mlp")) params.push_back(std::move(p));
  ASSIGN_OR_RETURN(m->dense_optimizer_,
                   dense::DenseOptimizer::Create(config.dense_optimizer(),
                                                 std::move(params)));
  return m;
}

DlrmModel::~DlrmModel() {
  stores_.clear();
  tables_.clear();
  if (row_db_ != nullptr) {
    row_db_.reset();
    std::error_code ec;
    std::filesystem::remove_all(row_db_dir_, ec);
  }
}

std::string DlrmModel::NewDatabaseDir() const {
  // Unique per process and per call, so several models (and a restore next
  // to the live database) never share a directory.
  static std::atomic<int64_t> counter{0};
  const std::filesystem::path base(config_.rocksdb().path());
  while (true) {
    const std::filesystem::path dir =
        base / absl::StrCat("rows-", ::getpid(), "-", counter++);
    if (!std::filesystem::exists(dir)) return dir.string();
  }
}

absl::StatusOr<std::vector<std::unique_ptr<embedding::EmbeddingStore>>>
DlrmModel::CreateCachedStores(embedding::RowDatabase* db) const {
  std::vector<std::unique_ptr<embedding::EmbeddingStore>> stores(
      config_.tables_size());
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (IsHostTable(k)) continue;
    embedding::StoreOptions options = StoreOptionsOfTable(config_, k);
    options.rocksdb.path = db->options().path;
    ASSIGN_OR_RETURN(stores[k], embedding::CreateEmbeddingStore(
                                    SpecOfTable(config_, k), options, db));
  }
  return stores;
}

absl::Status DlrmModel::ValidateBatch(const data::Batch& batch) const {
  return batch.Validate(config_.num_dense_features(), table_rows_);
}

absl::Status DlrmModel::PrepareTables(const data::Batch& batch) {
  const int num_tables = static_cast<int>(stores_.size());
  if (row_db_ == nullptr) {
    // Host stores return the ids themselves: no work worth a thread team.
    for (int k = 0; k < num_tables; ++k) {
      ASSIGN_OR_RETURN(prepared_[k], stores_[k]->Prepare(batch.sparse[k]));
    }
    return absl::OkStatus();
  }
  // Cached tables read RocksDB independently (the database is
  // thread-safe, each store has one caller).
#pragma omp parallel for schedule(dynamic, 1)
  for (int k = 0; k < num_tables; ++k) {
    absl::StatusOr<const data::SparseFeature*> p =
        stores_[k]->Prepare(batch.sparse[k]);
    if (p.ok()) {
      prepared_[k] = *p;
      table_status_[k] = absl::OkStatus();
    } else {
      prepared_[k] = nullptr;
      table_status_[k] = p.status();
    }
  }
  return FirstError(table_status_);
}

absl::Status DlrmModel::Embed(const data::Batch& batch, const float* bottom_out,
                              float* t) {
  const int d = vector_dim_;
  for (int64_t s = 0; s < batch.size; ++s) {
    std::memcpy(t + s * t_width_, bottom_out + s * d, sizeof(float) * d);
  }
  const int num_tables = static_cast<int>(stores_.size());
  // Tables are independent and each is small per batch: one table per
  // thread keeps every row update in a fixed order (deterministic).
#pragma omp parallel for schedule(dynamic, 1)
  for (int k = 0; k < num_tables; ++k) {
    table_status_[k] =
        stores_[k]->Forward(*prepared_[k], t + table_offset_[k], t_width_);
  }
  return FirstError(table_status_);
}

absl::StatusOr<StepResult> DlrmModel::TrainStep(const data::Batch& batch,
                                                const data::Batch* next) {
  RETURN_IF_ERROR(ValidateBatch(batch));
  const int64_t n = batch.size;
  const int d = vector_dim_;
  StepResult result;
  result.samples = n;
  StageClock clock(&result.times);

  // Before anything changes: a batch that does not fit a cache is rejected
  // here with every weight as it was.
  RETURN_IF_ERROR(PrepareTables(batch));
  // A bad next batch is simply not prefetched; its own step rejects it.
  if (next != nullptr && row_db_ != nullptr && ValidateBatch(*next).ok()) {
    for (size_t k = 0; k < stores_.size(); ++k) {
      RETURN_IF_ERROR(stores_[k]->Prefetch(next->sparse[k]));
    }
  }
  clock.Mark(StageTimes::kEmbeddingPrepare);

  const float* bottom_out = bottom_.Forward(batch.dense.data(), n);
  clock.Mark(StageTimes::kBottomForward);

  float* t = Sized(t_, n * t_width_);
  float* z = dot_ ? Sized(z_, n * interaction_dim_) : t;
  RETURN_IF_ERROR(Embed(batch, bottom_out, t));
  clock.Mark(StageTimes::kEmbeddingForward);
  if (dot_) dense::DotInteractionForward(t, n, num_vectors_, d, z);
  clock.Mark(StageTimes::kInteractionForward);

  const float* logits = top_.Forward(z, n);
  clock.Mark(StageTimes::kTopForward);

  float* dlogits = Sized(dlogits_, n);
  result.loss = dense::BceWithLogits(logits, batch.labels.data(), n,
                                     1.0f / static_cast<float>(n), dlogits);
  clock.Mark(StageTimes::kLoss);

  float* dz = Sized(dz_, n * interaction_dim_);
  top_.Backward(z, dlogits, n, dz);
  clock.Mark(StageTimes::kTopBackward);

  float* dt = dz;
  if (dot_) {
    dt = Sized(dt_, n * t_width_);
    dense::DotInteractionBackward(t, dz, n, num_vectors_, d, dt);
  }
  clock.Mark(StageTimes::kInteractionBackward);

  float* dbottom = Sized(dbottom_, n * d);
  for (int64_t s = 0; s < n; ++s) {
    std::memcpy(dbottom + s * d, dt + s * t_width_, sizeof(float) * d);
  }
  bottom_.Backward(batch.dense.data(), dbottom, n, /*dx=*/nullptr);
  clock.Mark(StageTimes::kBottomBackward);

  const int num_tables = static_cast<int>(stores_.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int k = 0; k < num_tables; ++k) {
    table_status_[k] = stores_[k]->BackwardUpdate(
        *prepared_[k], dt + table_offset_[k], t_width_);
  }
  RETURN_IF_ERROR(FirstError(table_status_));
  clock.Mark(StageTimes::kEmbeddingBackwardUpdate);

  dense_optimizer_->Step();
  clock.Mark(StageTimes::kDenseUpdate);
  ++steps_;
  return result;
}

absl::Status DlrmModel::Predict(const data::Batch& batch,
                                std::vector<float>* probs) {
  RETURN_IF_ERROR(ValidateBatch(batch));
  RETURN_IF_ERROR(PrepareTables(batch));
  const int64_t n = batch.size;
  float* bottom_out = Sized(infer_bottom_, n * vector_dim_);
  bottom_.Infer(batch.dense.data(), n, bottom_out, &infer_scratch_);
  float* t = Sized(infer_t_, n * t_width_);
  float* z = dot_ ? Sized(infer_z_, n * interaction_dim_) : t;
  RETURN_IF_ERROR(Embed(batch, bottom_out, t));
  if (dot_) dense::DotInteractionForward(t, n, num_vectors_, vector_dim_, z);
  float* logits = Sized(infer_logits_, n);
  top_.Infer(z, n, logits, &infer_scratch_);
  probs->resize(n);
  for (int64_t s = 0; s < n; ++s) (*probs)[s] = dense::Sigmoid(logits[s]);
  return absl::OkStatus();
}

uint64_t DlrmModel::WeightChecksum() const {
  uint64_t h = 0;
  auto add = [&h](const float* p, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof(bits));
      h = Mix64(h ^ bits);
    }
  };
  for (const dense::Mlp* mlp : {&bottom_, &top_}) {
    for (const dense::Linear& l : mlp->layers()) {
      add(l.weight(), static_cast<int64_t>(l.in()) * l.out());
      add(l.bias(), l.out());
    }
  }
  std::vector<float> record;
  for (size_t k = 0; k < stores_.size(); ++k) {
    if (IsHostTable(static_cast<int>(k))) {
      add(tables_[k]->weights(), tables_[k]->rows() * tables_[k]->dim());
      continue;
    }
    // Reading a row changes no weight; the store is only borrowed here.
    embedding::EmbeddingStore& store = *stores_[k];
    const embedding::TableSpec& spec = store.spec();
    record.resize(spec.dim +
                  embedding::StateFloatsPerRow(spec.optimizer, spec.dim));
    for (int64_t row = 0; row < spec.rows; ++row) {
      // Rows are in range, so ReadRow fails only on a RocksDB error, which
      // a checksum cannot report: it then covers the rows read so far.
      if (!store.ReadRow(row, record.data()).ok()) return h;
      add(record.data(), spec.dim);
    }
  }
  return h;
}

embedding::StoreMetrics DlrmModel::RocksDbMetrics() const {
  embedding::StoreMetrics total;
  for (const auto& store : stores_) total += store->metrics();
  return total;
}

absl::Status DlrmModel::CheckpointRows(const std::string& dir) {
  if (row_db_ == nullptr) {
    return absl::FailedPreconditionError(
        "CheckpointRows: no table uses STORAGE_ROCKSDB");
  }
  for (auto& store : stores_) RETURN_IF_ERROR(store->Flush());
  return row_db_->Checkpoint(dir);
}

absl::Status DlrmModel::RestoreRows(const std::string& dir) {
  if (row_db_ == nullptr) {
    return absl::FailedPreconditionError(
        "RestoreRows: no table uses STORAGE_ROCKSDB");
  }
  embedding::RocksDbStoreOptions options = row_db_->options();
  options.path = NewDatabaseDir();
  auto db = embedding::RowDatabase::RestoreCheckpoint(dir, options);
  if (!db.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(options.path, ec);
    return db.status();
  }
  auto cached = CreateCachedStores(db->get());
  if (!cached.ok()) {
    db->reset();
    std::error_code ec;
    std::filesystem::remove_all(options.path, ec);
    return cached.status();
  }
  // Nothing can fail from here: swap in the restored tier.
  for (size_t k = 0; k < stores_.size(); ++k) {
    if ((*cached)[k] == nullptr) continue;
    tables_[k] = &static_cast<embedding::RocksDbCachedStore&>(*(*cached)[k])
                      .slot_array();
    stores_[k] = std::move((*cached)[k]);
    prepared_[k] = nullptr;
  }
  row_db_ = *std::move(db);
  std::error_code ec;
  std::filesystem::remove_all(row_db_dir_, ec);
  row_db_dir_ = options.path;
  return absl::OkStatus();
}

}  // namespace dlrm::model
