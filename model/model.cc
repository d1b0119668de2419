// The DLRM step on R >= 1 ranks: input dist (lengths, then ids), shard
// lookups for the global batch, output dist, data-parallel dense
// forward/backward, backward dist, fused sparse updates, dense all-reduce.
// The exchanges themselves are model/exchange.h's.
#include "model/model.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "comm/agree.h"
#include "core/config.h"
#include "core/config_change.h"
#include "core/random.h"
#include "core/status.h"
#include "model/step_util.h"
#include "optim/optimizer.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;
using comm::DataType;

using internal::Sized;
using StageClock = internal::StageClock<StageTimes>;

// Runs up to two all-reduce buckets, one after the other, on a background
// thread; Finish() waits for both and returns the first error. The
// destructor waits too, so an early return never leaves the thread running
// on buffers that are going away.
class OverlappedReduce {
 public:
  OverlappedReduce() = default;
  OverlappedReduce(const OverlappedReduce&) = delete;
  OverlappedReduce& operator=(const OverlappedReduce&) = delete;
  ~OverlappedReduce() { Finish().IgnoreError(); }

  void Start(std::function<absl::Status()> first) {
    worker_ = std::async(std::launch::async, [this, first = std::move(first)] {
      absl::Status s = first();
      std::function<absl::Status()> second = next_.get_future().get();
      if (s.ok() && second) s = second();
      return s;
    });
  }
  // Queues the second bucket (call once after Start).
  void Then(std::function<absl::Status()> second) {
    next_.set_value(std::move(second));
    queued_ = true;
  }
  absl::Status Finish() {
    if (!worker_.valid()) return absl::OkStatus();
    if (!queued_) Then(nullptr);
    return worker_.get();
  }

 private:
  std::future<absl::Status> worker_;
  std::promise<std::function<absl::Status()>> next_;
  bool queued_ = false;
};

}  // namespace

absl::Status ValidateBatch(const ModelConfig& config,
                           const data::Batch& batch) {
  if (batch.size > 0) {
    std::vector<int64_t> rows;
    for (const TableConfig& t : config.tables()) rows.push_back(t.rows());
    return batch.Validate(config.num_dense_features(), rows);
  }
  if (batch.size < 0 ||
      static_cast<int>(batch.sparse.size()) != config.tables_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: size ", batch.size, " with ", batch.sparse.size(),
        " sparse features (the model has ", config.tables_size(), ")"));
  }
  return absl::OkStatus();
}

Model::Model(const ModelConfig& config, const embedding::ShardingPlan& plan,
             comm::Communicator* comm,
             std::unique_ptr<dense::DenseBackend> dense)
    : config_(config),
      plan_(plan),
      comm_(comm),
      rank_(comm->rank()),
      world_(comm->world_size()),
      dense_(std::move(dense)),
      dense_bytes_(4 * (DenseParameterCount(config) + 1)),
      t_width_(dense_->interaction().dim) {
  for (const auto& t : config.tables()) {
    table_offset_.push_back(t_width_);
    t_width_ += t.dim();
  }
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const ModelConfig& config) {
  std::unique_ptr<comm::Communicator> comm = comm::MakeSingleRankCommunicator();
  ASSIGN_OR_RETURN(
      std::unique_ptr<Model> m,
      Create(config, embedding::WholeTablesPlan(config), comm.get()));
  m->owned_comm_ = std::move(comm);
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const ModelConfig& requested, const embedding::ShardingPlan& plan,
    comm::Communicator* comm, comm::Communicator* dense_comm,
    comm::Communicator* device_comm) {
  RETURN_IF_ERROR(plan.Validate(requested));
  // Tiers from device_budget_bytes and rocksdb.host_budget_bytes (per
  // rank), when set: every rank plans the same from the same config and
  // plan.
  ASSIGN_OR_RETURN(const ModelConfig config,
                   embedding::ApplyMemoryBudgets(requested, &plan));
  if (plan.world_size != comm->world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding plan is for ", plan.world_size,
                     " ranks, the communicator has ", comm->world_size()));
  }
  for (const comm::Communicator* c : {dense_comm, device_comm}) {
    if (c != nullptr &&
        (c->world_size() != comm->world_size() || c->rank() != comm->rank())) {
      return absl::InvalidArgumentError(
          "the dense and device communicators must join the same ranks as "
          "the main one");
    }
  }
  // Control traffic, ids and the dense all-reduce move host buffers; only
  // the pooled vectors and their gradients may move device ones.
  for (const comm::Communicator* c : {comm, dense_comm}) {
    if (c != nullptr && c->memory_space() != comm::MemorySpace::kHost) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the model's main and dense communicators take host memory; this "
          "one takes ",
          comm::MemorySpaceName(c->memory_space()),
          " buffers (pass a device communicator as device_comm)"));
    }
  }
  if (device_comm != nullptr &&
      device_comm->memory_space() != comm::MemorySpace::kDevice) {
    return absl::FailedPreconditionError(
        "device_comm takes host memory; it must be a device communicator");
  }
  // A table in device memory pools into, and updates from, device memory:
  // in place where the step exchanges nothing (one rank, no row-wise
  // table), else through the exchanges over a device communicator.
  const bool exchanges = plan.world_size > 1 ||
                         std::any_of(plan.tables.begin(), plan.tables.end(),
                                     [](const embedding::TablePlacement& p) {
                                       return p.kind == SHARDING_ROW_WISE;
                                     });
  for (int k = 0; k < config.tables_size(); ++k) {
    if (config.tables(k).storage() == STORAGE_DEVICE && exchanges &&
        device_comm == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", config.tables(k).name(),
          ": storage STORAGE_DEVICE where the step exchanges pooled vectors "
          "(this plan has ",
          plan.world_size,
          " ranks or a row-wise table) needs a device communicator for the "
          "exchanges (NCCL, or host-staged for ranks sharing a GPU); without "
          "one use STORAGE_HOST or STORAGE_ROCKSDB (the dense part still "
          "runs on CUDA)"));
    }
  }
  // The dense part on config.device; FailedPrecondition here, before any
  // store is made, when that device is not usable.
  ASSIGN_OR_RETURN(std::unique_ptr<dense::DenseBackend> dense,
                   dense::CreateDenseBackend(config));
  std::unique_ptr<Model> m(new Model(config, plan, comm, std::move(dense)));
  m->dense_comm_ = dense_comm;
  m->device_comm_ = device_comm;

  // The output and backward dists: over device_comm in the CUDA backend's
  // memory, on its stream (or host memory on the CPU backend: a host-staged
  // communicator over the CPU Device), else over comm in host memory.
  std::unique_ptr<ExchangeMemory> memory;
  if (device_comm != nullptr && m->dense_->cuda_stream() != nullptr) {
    ASSIGN_OR_RETURN(memory, MakeCudaExchangeMemory(m->dense_->cuda_stream()));
    RETURN_IF_ERROR(device_comm->SetStream(m->dense_->cuda_stream()));
    m->exchange_on_device_ = true;
  }
  m->exchange_ = std::make_unique<ShardExchange>(
      config, plan, comm, m->table_offset_, m->t_width_, device_comm,
      std::move(memory));
  m->replica_.assign(config.tables_size(), -1);
  m->owned_rocksdb_ =
      m->exchange_->Restricted([&m](int k) { return m->OnRocksDb(k); });
  auto has_cache = [&m](int k) {
    return m->OnRocksDb(k) || m->DeviceCached(k);
  };
  const ShardLayout owned_cached = m->exchange_->Restricted(has_cache);
  for (int k = 0; k < config.tables_size(); ++k) {
    m->any_cache_ = m->any_cache_ || has_cache(k);
  }
  // Every rank's caches, by table, for the counters PrepareShards gathers.
  m->store_tables_.resize(m->world_);
  size_t most_tables = 0;
  for (int r = 0; r < m->world_; ++r) {
    for (const ShardRef& ref : owned_cached[r]) {
      std::vector<int>& tables = m->store_tables_[r];
      if (std::find(tables.begin(), tables.end(), ref.table) == tables.end()) {
        tables.push_back(ref.table);
      }
    }
    most_tables = std::max(most_tables, m->store_tables_[r].size());
  }
  m->store_words_ =
      static_cast<int64_t>(most_tables) * embedding::StoreMetrics::kNumFields;
  for (int k = 0; k < config.tables_size(); ++k) {
    for (int r = 0; r < m->world_; ++r) {
      RankTableStore s;
      s.rank = r;
      s.table = k;
      s.device = m->DeviceCached(k);
      for (const ShardRef& ref : owned_cached[r]) {
        if (ref.table != k) continue;
        const int64_t rows = plan.tables[k].shards[ref.shard].row_count;
        // A device cache has at most one slot per row of its shard.
        s.cache_rows +=
            s.device ? std::min(rows, config.tables(k).device_cache_rows())
                     : CachedRows(config.rocksdb(), rows);
      }
      if (s.cache_rows > 0) m->store_stats_.push_back(s);
    }
  }
  bool mine_on_rocksdb = false;
  // Local device caches backed by RocksDB: made once their database is
  // open.
  std::vector<int> device_on_rocksdb;
  for (const ShardRef& ref : m->exchange_->owned()[m->rank_]) {
    const int j = static_cast<int>(m->local_.size());
    if (plan.tables[ref.table].kind == SHARDING_DATA_PARALLEL) {
      m->replica_[ref.table] = j;
    }
    if (has_cache(ref.table)) m->cache_locals_.push_back(j);
    LocalShard ls;
    ls.table = ref.table;
    ls.shard = ref.shard;
    if (m->OnRocksDb(ref.table)) {
      // Its store comes below, once the database is open.
      m->rocksdb_locals_.push_back(j);
      mine_on_rocksdb = true;
    } else if (RowsOnRocksDb(config.tables(ref.table))) {
      device_on_rocksdb.push_back(j);
    } else if (config.tables(ref.table).storage() == STORAGE_DEVICE) {
      ASSIGN_OR_RETURN(ls.store, m->CreateDeviceStore(ref, /*db=*/nullptr));
    } else {
      auto host = std::make_unique<embedding::HostStore>(m->SpecOf(ref));
      ls.host = &host->table();
      ls.store = std::move(host);
    }
    m->local_.push_back(std::move(ls));
  }
  if (mine_on_rocksdb || !device_on_rocksdb.empty()) {
    const fs::path base =
        fs::path(config.rocksdb().path()) / absl::StrCat("rank_", m->rank_);
    std::error_code ec;
    fs::create_directories(base, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat(
          "cannot create rocksdb.path ", base.string(), ": ", ec.message()));
    }
  }
  if (mine_on_rocksdb) {
    const embedding::RocksDbStoreOptions db_options = m->DatabaseOptions();
    ASSIGN_OR_RETURN(m->row_db_, embedding::RowDatabase::Open(db_options));
    m->row_db_dir_ = db_options.path;
    ASSIGN_OR_RETURN(auto cached, m->CreateCachedStores(m->row_db_.get()));
    for (const int j : m->rocksdb_locals_) {
      m->local_[j].store = std::move(cached[j]);
    }
  }
  if (!device_on_rocksdb.empty()) {
    ASSIGN_OR_RETURN(m->device_row_db_,
                     embedding::RowDatabase::Open(m->DatabaseOptions()));
    m->device_row_db_dir_ = m->device_row_db_->options().path;
    for (const int j : device_on_rocksdb) {
      LocalShard& ls = m->local_[j];
      ASSIGN_OR_RETURN(ls.store, m->CreateDeviceStore({ls.table, ls.shard},
                                                      m->device_row_db_.get()));
    }
  }
  m->in_place_ = !exchanges;
  // The columns of the interaction input written on the device: in place,
  // the device tables' shards'; through device exchanges, every
  // model-parallel table's and the device replicas'.
  std::vector<dense::ColumnRange> device_columns;
  for (const LocalShard& ls : m->local_) {
    if (ls.store->memory_space() != MemorySpace::kDevice) continue;
    m->any_device_ = true;
    if (!m->in_place_) continue;
    const int begin = static_cast<int>(m->TColumn(ls));
    device_columns.push_back({begin, begin + ls.store->spec().dim});
  }
  if (!m->in_place_ && m->exchange_on_device_) {
    for (int k = 0; k < config.tables_size(); ++k) {
      const int replica = m->replica_[k];
      if (m->IsDataParallel(k) &&
          (replica < 0 ||
           m->local_[replica].store->memory_space() != MemorySpace::kDevice)) {
        continue;
      }
      const int begin = static_cast<int>(m->table_offset_[k]);
      device_columns.push_back({begin, begin + config.tables(k).dim()});
    }
  }
  std::sort(device_columns.begin(), device_columns.end(),
            [](const dense::ColumnRange& a, const dense::ColumnRange& b) {
              return a.begin < b.begin;
            });
  RETURN_IF_ERROR(m->dense_->SetDeviceColumns(std::move(device_columns)));
  return m;
}

embedding::TableSpec Model::SpecOf(const ShardRef& ref) const {
  const TableConfig& t = config_.tables(ref.table);
  const embedding::Shard& s = ShardOf(ref);
  embedding::TableSpec spec;
  spec.table_index = ref.table;
  spec.rows = s.row_count;
  spec.dim = s.col_count;
  // A row-wise shard pools sums; the sample's rank adds the shards' sums
  // and applies the mean itself (it alone knows whole bag lengths).
  spec.pooling = plan_.tables[ref.table].kind == SHARDING_ROW_WISE
                     ? POOLING_SUM
                     : t.pooling();
  spec.optimizer = config_.sparse_optimizer();
  spec.seed = config_.seed();
  spec.slice = embedding::TableSlice{t.rows(), s.row_begin, s.col_begin};
  return spec;
}

absl::Status Model::SetOptimizers(const OptimizerConfig& dense,
                                  const OptimizerConfig& sparse) {
  RETURN_IF_ERROR(optim::Validate(dense, "dense_optimizer"));
  RETURN_IF_ERROR(optim::ValidateSparse(sparse, "sparse_optimizer"));
  ModelConfig next = config_;
  *next.mutable_dense_optimizer() = dense;
  *next.mutable_sparse_optimizer() = sparse;
  for (const ConfigDifference& d : DiffConfigs(config_, next)) {
    if (d.mutability == FieldMutability::kImmutable) {
      return absl::InvalidArgumentError(
          absl::StrCat(d.field, " cannot change in a trained model (", d.before,
                       " -> ", d.after, ")"));
    }
  }
  WeightsWriter writer(*this);
  RETURN_IF_ERROR(dense_->SetOptimizerConfig(dense));
  for (LocalShard& ls : local_) {
    RETURN_IF_ERROR(ls.store->SetOptimizer(sparse));
  }
  // Only the two messages: readers on other threads may read the rest.
  *config_.mutable_dense_optimizer() = dense;
  *config_.mutable_sparse_optimizer() = sparse;
  return absl::OkStatus();
}

embedding::RocksDbStoreOptions Model::DatabaseOptions() const {
  embedding::RocksDbStoreOptions options;
  options.path = NewDatabaseDir();
  options.block_cache_bytes = config_.rocksdb().block_cache_bytes();
  if (config_.rocksdb().write_buffer_bytes() > 0) {
    options.write_buffer_bytes = config_.rocksdb().write_buffer_bytes();
  }
  return options;
}

absl::StatusOr<std::unique_ptr<embedding::EmbeddingStore>>
Model::CreateDeviceStore(const ShardRef& ref, embedding::RowDatabase* db) {
  const TableConfig& t = config_.tables(ref.table);
  const RocksDbConfig& r = config_.rocksdb();
  const embedding::EvictionPolicy eviction =
      r.eviction() == RocksDbConfig::LFU ? embedding::EvictionPolicy::kLfu
                                         : embedding::EvictionPolicy::kLru;
  const embedding::TableSpec spec = SpecOf(ref);
  // On the dense backend's device, its work on the backend's stream; with
  // device_cache_rows, a cache of hot rows there in front of the whole
  // table in host memory or on RocksDB (behind a row cache of its own).
  embedding::StoreOptions o;
  o.kind = embedding::StoreKind::kDevice;
  o.cuda_stream = dense_->cuda_stream();
  o.device_cache.cache_rows = t.device_cache_rows();
  o.device_cache.eviction = eviction;
  if (db != nullptr) {
    o.device_cache_backing = embedding::StoreKind::kRocksDbCache;
    o.rocksdb.path = db->options().path;
    o.rocksdb.cache_rows = CachedRows(r, spec.rows);
    o.rocksdb.eviction = eviction;
    o.rocksdb.block_cache_bytes = r.block_cache_bytes();
  }
  return embedding::CreateEmbeddingStore(spec, o, db);
}

absl::StatusOr<std::vector<std::unique_ptr<embedding::EmbeddingStore>>>
Model::CreateCachedStores(embedding::RowDatabase* db) const {
  std::vector<std::unique_ptr<embedding::EmbeddingStore>> stores(local_.size());
  const RocksDbConfig& r = config_.rocksdb();
  for (const int j : rocksdb_locals_) {
    const ShardRef ref{local_[j].table, local_[j].shard};
    const embedding::TableSpec spec = SpecOf(ref);
    embedding::StoreOptions o;
    o.kind = embedding::StoreKind::kRocksDbCache;
    o.rocksdb.path = db->options().path;
    // The budget applies per shard: cache_rows rows (a shard can receive
    // every id of a batch), or cache_fraction of the rows the shard holds
    // (so a table's caches together hold that fraction of it).
    o.rocksdb.cache_rows = CachedRows(r, spec.rows);
    o.rocksdb.eviction = r.eviction() == RocksDbConfig::LFU
                             ? embedding::EvictionPolicy::kLfu
                             : embedding::EvictionPolicy::kLru;
    o.rocksdb.block_cache_bytes = r.block_cache_bytes();
    ASSIGN_OR_RETURN(stores[j], embedding::CreateEmbeddingStore(spec, o, db));
  }
  return stores;
}

std::string Model::NewDatabaseDir() const {
  // Unique per rank, process and call: ranks on one host, several models in
  // one process and a restore next to the live database never share one.
  static std::atomic<int64_t> counter{0};
  const fs::path base =
      fs::path(config_.rocksdb().path()) / absl::StrCat("rank_", rank_);
  while (true) {
    const fs::path dir =
        base / absl::StrCat("rows-", ::getpid(), "-", counter++);
    if (!fs::exists(dir)) return dir.string();
  }
}

Model::~Model() {
  local_.clear();
  for (auto [db, dir] : {std::pair{&row_db_, &row_db_dir_},
                         std::pair{&device_row_db_, &device_row_db_dir_}}) {
    if (*db == nullptr) continue;
    db->reset();
    std::error_code ec;
    fs::remove_all(*dir, ec);
    // rank_<r> too, unless another database is still in it.
    fs::remove(fs::path(*dir).parent_path(), ec);
  }
}

Model::StagedRows::~StagedRows() {
  stores.clear();
  if (db != nullptr) {
    db.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

std::vector<Model::ShardState> Model::LocalShards() {
  std::vector<ShardState> out;
  out.reserve(local_.size());
  for (LocalShard& s : local_) {
    out.push_back({s.table, s.shard, s.host, s.store.get()});
  }
  return out;
}

embedding::StoreMetrics Model::RocksDbMetrics() const {
  embedding::StoreMetrics total;
  for (const int j : rocksdb_locals_) total += local_[j].store->metrics();
  return total;
}

absl::Status Model::CheckpointRows(const std::string& dir) {
  if (row_db_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CheckpointRows: rank ", rank_, " holds no shard on RocksDB"));
  }
  for (const int j : rocksdb_locals_) {
    RETURN_IF_ERROR(local_[j].store->Flush());
  }
  return row_db_->Checkpoint(dir);
}

absl::StatusOr<std::unique_ptr<Model::StagedRows>> Model::StageRows(
    const std::string& dir) {
  if (row_db_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("StageRows: rank ", rank_, " holds no shard on RocksDB"));
  }
  auto staged = std::make_unique<StagedRows>();
  embedding::RocksDbStoreOptions options = row_db_->options();
  options.path = NewDatabaseDir();
  auto db = dir.empty()
                ? embedding::RowDatabase::Open(options)
                : embedding::RowDatabase::RestoreCheckpoint(dir, options);
  if (!db.ok()) {
    std::error_code ec;
    fs::remove_all(options.path, ec);
    return db.status();
  }
  staged->db = *std::move(db);
  staged->dir = options.path;
  // On error the staged copy (and its directory) goes away with `staged`.
  ASSIGN_OR_RETURN(staged->stores, CreateCachedStores(staged->db.get()));
  return staged;
}

void Model::SwapInRows(std::unique_ptr<StagedRows> staged) {
  for (const int j : rocksdb_locals_) {
    local_[j].store = std::move(staged->stores[j]);
    local_[j].prepared = nullptr;
  }
  staged->stores.clear();
  std::swap(row_db_, staged->db);
  std::swap(row_db_dir_, staged->dir);
  // `staged` now holds the old database: dropping it removes it.
}

absl::Status Model::AgreeOnBatch(const data::Batch& batch,
                                 const data::Batch* next) {
  auto validate = [this](const data::Batch& b) {
    return ValidateBatch(config_, b);
  };
  const absl::Status status = validate(batch);
  // The next batch only steers a prefetch: a bad one is simply left out
  // (its own step rejects it).
  const int64_t next_size =
      next != nullptr && any_cache_ && validate(*next).ok() ? next->size : 0;
  // One exchange settles the sizes, the verdict and the prefetch.
  const int64_t mine[3] = {status.ok() ? batch.size : 0, status.ok() ? 0 : 1,
                           next_size};
  std::vector<int64_t> all(3 * world_);
  RETURN_IF_ERROR(comm_->AllGather(mine, 3, all.data(), DataType::kInt64));
  std::vector<int64_t> sizes(world_, 0);
  next_sizes_.assign(world_, 0);
  int bad_rank = -1;
  for (int r = 0; r < world_; ++r) {
    sizes[r] = all[3 * r];
    next_sizes_[r] = all[3 * r + 2];
    if (all[3 * r + 1] != 0 && bad_rank < 0) bad_rank = r;
  }
  RETURN_IF_ERROR(status);
  if (bad_rank >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch rejected: rank ", bad_rank, "'s local batch is invalid"));
  }
  exchange_->SetBatchSizes(sizes);
  if (exchange_->global_size() == 0) {
    return absl::InvalidArgumentError("batch: the global batch is empty");
  }
  return absl::OkStatus();
}

absl::Status Model::PrepareShards() {
  if (!any_cache_) {
    // Host stores return the ids themselves, device stores without a cache
    // only check and upload them: nothing to agree on, no collective.
    for (LocalShard& ls : local_) {
      ASSIGN_OR_RETURN(ls.prepared, ls.store->Prepare(*ls.ids));
    }
    return absl::OkStatus();
  }
  // Cached shards load independently (the database is thread-safe, each
  // store has one caller).
  const int num_local = static_cast<int>(local_.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < num_local; ++j) {
    LocalShard& ls = local_[j];
    absl::StatusOr<const data::SparseFeature*> p = ls.store->Prepare(*ls.ids);
    ls.prepared = p.ok() ? *p : nullptr;
    ls.status = p.status();
  }
  absl::Status local;
  for (const LocalShard& ls : local_) {
    if (!ls.status.ok()) {
      const embedding::Shard& s = plan_.tables[ls.table].shards[ls.shard];
      local = absl::Status(
          ls.status.code(),
          absl::StrCat("rank ", rank_, ", table ",
                       config_.tables(ls.table).name(), " shard ", ls.shard,
                       " (rows ", s.row_begin, "-", s.row_begin + s.row_count,
                       ", cols ", s.col_begin, "-", s.col_begin + s.col_count,
                       "): ", ls.status.message()));
      break;
    }
  }
  // The ids reach a shard only through the input dist, so no rank can
  // refuse before the exchange; every rank learns here, before anything
  // changes, whether all shards are ready. The caches' counters ride
  // along: every rank learns every rank's (store_stats_).
  constexpr int kFields = embedding::StoreMetrics::kNumFields;
  std::vector<int64_t> mine(store_words_, 0), all;
  const std::vector<int>& tables = store_tables_[rank_];
  for (const int j : cache_locals_) {
    const size_t at = std::find(tables.begin(), tables.end(), local_[j].table) -
                      tables.begin();
    const embedding::StoreMetrics m = local_[j].store->metrics();
    for (int f = 0; f < kFields; ++f) {
      mine[at * kFields + f] += m.*embedding::StoreMetrics::kFields[f];
    }
  }
  const absl::Status agreed = AgreeOnStatus(local, mine, &all);
  if (all.empty()) return agreed;
  for (RankTableStore& s : store_stats_) {
    const std::vector<int>& theirs = store_tables_[s.rank];
    const size_t at =
        std::find(theirs.begin(), theirs.end(), s.table) - theirs.begin();
    const int64_t* words = &all[s.rank * store_words_ + at * kFields];
    for (int f = 0; f < kFields; ++f) {
      s.metrics.*embedding::StoreMetrics::kFields[f] = words[f];
    }
  }
  return agreed;
}

absl::Status Model::AgreeOnStatus(const absl::Status& local,
                                  const std::vector<int64_t>& extra,
                                  std::vector<int64_t>* all_extra,
                                  const char* what) {
  comm::Agreement agreed =
      comm::AgreeOnStatus(*comm_, local, extra, all_extra, what);
  if (!agreed.communicator.ok()) {
    communicator_failed_ = true;
    communicator_error_ = agreed.communicator;
    return agreed.communicator;
  }
  return agreed.verdict;
}

absl::Status Model::EmbedForward(const data::Batch& batch, bool predict,
                                 StageTimes* times) {
  StageClock clock(times);
  const int64_t n = batch.size;

  if (in_place_) {
    for (LocalShard& ls : local_) ls.ids = &batch.sparse[ls.table];
  } else {
    std::vector<data::SparseFeature*> out;
    for (LocalShard& ls : local_) {
      out.push_back(&ls.global_ids);
      ls.ids = &ls.global_ids;
    }
    RETURN_IF_ERROR(exchange_->DistributeIds(batch, exchange_->sizes(),
                                             exchange_->owned(), out, times));
  }
  clock.Mark(StageTimes::kInputDist);

  // Before anything changes: a batch that does not fit a shard's cache on
  // any rank is refused on every rank.
  RETURN_IF_ERROR(PrepareShards());
  clock.Mark(StageTimes::kPrepare);

  const int num_local = static_cast<int>(local_.size());
  if (in_place_) {
    // Every shard's columns of the interaction input, for this rank's (the
    // whole) batch: in host memory, or on the device for stores there
    // (queued on the dense backend's stream, ahead of the interaction).
    ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
    float* device_t = nullptr;
    if (any_device_) {
      ASSIGN_OR_RETURN(device_t, dense_->DeviceInteractionInput(n, predict));
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      float* out =
          ls.store->memory_space() == MemorySpace::kDevice ? device_t : t;
      // (An empty batch may have no buffer at all.)
      ls.status = ls.store->Forward(
          *ls.prepared, out == nullptr ? nullptr : out + TColumn(ls), t_width_);
    }
    for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
    clock.Mark(StageTimes::kLookup);
    return absl::OkStatus();
  }

  // Lookup: each model-parallel shard pools the global batch into the
  // output dist's send buffer: straight there when its store is in the
  // exchange's memory space, else into the host copy, uploaded after.
  ASSIGN_OR_RETURN(float* send, exchange_->PooledBuffer());
  std::vector<int> uploads;
  for (int j = 0; j < num_local; ++j) {
    if (!IsDataParallel(local_[j].table) && !InExchangeSpace(local_[j])) {
      uploads.push_back(j);
    }
  }
  float* host_send = uploads.empty() ? nullptr : exchange_->HostPooledBuffer();
  const int64_t stride = exchange_->pooled_stride();
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < num_local; ++j) {
    LocalShard& ls = local_[j];
    float* out = InExchangeSpace(ls) ? send : host_send;
    ls.status =
        IsDataParallel(ls.table)
            ? absl::OkStatus()
            : ls.store->Forward(*ls.prepared, out + exchange_->PooledColumn(j),
                                stride);
  }
  for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
  RETURN_IF_ERROR(exchange_->UploadPooled(uploads));
  clock.Mark(StageTimes::kLookup);

  // This rank's pooled vectors from every shard (into the device
  // interaction input when the exchanges run on the device), then
  // data-parallel tables pooled locally.
  ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
  float* exchange_t = t;
  if (exchange_on_device_) {
    ASSIGN_OR_RETURN(exchange_t, dense_->DeviceInteractionInput(n, predict));
  }
  RETURN_IF_ERROR(exchange_->GatherPooled(batch, exchange_t, times));
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (replica_[k] < 0 || n == 0) continue;
    LocalShard& ls = local_[replica_[k]];
    if (ls.host != nullptr) {
      // In host memory: pool the local bags straight from the batch.
      ls.host->Forward(batch.sparse[k], t + table_offset_[k], t_width_);
      continue;
    }
    const int dim = config_.tables(k).dim();
    const int64_t start = exchange_->start(rank_);
    if (ls.store->memory_space() == MemorySpace::kDevice) {
      // In device memory (the exchanges are there too): pool the global
      // batch it prepared into scratch, keep this rank's rows.
      ASSIGN_OR_RETURN(float* all, exchange_->memory().Buffer(
                                       ExchangeMemory::kScratch,
                                       exchange_->global_size() * dim));
      RETURN_IF_ERROR(ls.store->Forward(*ls.prepared, all, dim));
      ColumnBlock mine;
      mine.src = all + start * dim;
      mine.src_stride = dim;
      mine.dst = exchange_t + table_offset_[k];
      mine.dst_stride = t_width_;
      mine.rows = n;
      mine.cols = dim;
      RETURN_IF_ERROR(exchange_->memory().Columns({&mine, 1}));
      continue;
    }
    // On RocksDB the store pools only the batch it prepared (the global
    // one, which the update needs): pool it all, keep this rank's rows.
    float* all = Sized(replica_out_, exchange_->global_size() * dim);
    RETURN_IF_ERROR(ls.store->Forward(*ls.prepared, all, dim));
    for (int64_t l = 0; l < n; ++l) {
      std::memcpy(t + l * t_width_ + table_offset_[k], all + (start + l) * dim,
                  sizeof(float) * dim);
    }
  }
  clock.Mark(StageTimes::kOutputDist);
  return absl::OkStatus();
}

absl::Status Model::PrefetchNext(const data::Batch* next, StageTimes* times) {
  if (in_place_) {
    // Every store (those without a cache return at once): the device
    // tier's cache stages its next misses while the queued kernels run.
    for (LocalShard& ls : local_) {
      RETURN_IF_ERROR(ls.store->Prefetch(next->sparse[ls.table]));
    }
    return absl::OkStatus();
  }
  std::vector<data::SparseFeature*> out;
  for (const int j : rocksdb_locals_) out.push_back(&local_[j].next_ids);
  // A rank whose next batch was left out contributes no samples.
  data::Batch none;
  const data::Batch* mine = next;
  if (next_sizes_[rank_] == 0) {
    none.Reset(config_.num_dense_features(), config_.tables_size());
    mine = &none;
  }
  RETURN_IF_ERROR(
      exchange_->DistributeIds(*mine, next_sizes_, owned_rocksdb_, out, times));
  for (const int j : rocksdb_locals_) {
    RETURN_IF_ERROR(local_[j].store->Prefetch(local_[j].next_ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Model::TrainStep(const data::Batch& batch,
                                            const data::Batch* next,
                                            bool read_loss) {
  RETURN_IF_ERROR(AgreeOnBatch(batch, next));
  StepResult result;
  result.samples = exchange_->global_size();
  StageTimes& times = result.times;
  const int64_t n = batch.size;

  RETURN_IF_ERROR(EmbedForward(batch, /*predict=*/false, &times));
  StageClock clock(&times);
  // The next batch's rows load in the background while this step computes
  // (every rank takes this branch or none: next_sizes_ is agreed).
  int64_t next_total = 0;
  for (const int64_t s : next_sizes_) next_total += s;
  if (next_total > 0) {
    RETURN_IF_ERROR(PrefetchNext(next, &times));
    clock.Mark(StageTimes::kPrepare);
  }
  // The dense forward and backward on the interaction input EmbedForward
  // filled.
  const float* x = batch.dense.data();
  RETURN_IF_ERROR(dense_->BottomForward(x, n));
  clock.Mark(StageTimes::kBottomForward);
  RETURN_IF_ERROR(dense_->InteractionForward(n));
  clock.Mark(StageTimes::kInteractionForward);
  RETURN_IF_ERROR(dense_->TopForward(n));
  clock.Mark(StageTimes::kTopForward);
  // Every rank scales by the global batch, so the all-reduced gradient is
  // the global mean's. The loss is read later (ReadLoss): with the
  // gradients on several ranks, at the end of the step on one.
  RETURN_IF_ERROR(
      dense_->QueueLoss(batch.labels.data(), n,
                        1.0f / static_cast<float>(exchange_->global_size())));
  clock.Mark(StageTimes::kLoss);
  RETURN_IF_ERROR(dense_->TopBackward(n));
  clock.Mark(StageTimes::kTopBackward);
  // With a dense communicator, the top MLP's gradients (and the loss) are
  // all-reduced while the rest of the backward runs, then the bottom MLP's
  // once they exist. Nothing below touches the top MLP's gradients.
  double loss_sum = std::numeric_limits<double>::quiet_NaN();
  const bool overlapped = dense_comm_ != nullptr;
  OverlappedReduce overlap;
  if (overlapped) {
    overlap.Start([this, n, &loss_sum] {
      return ReduceBucket(dense_comm_, dense::GradBucket::kTop, n, &loss_sum);
    });
  }
  ASSIGN_OR_RETURN(const float* dt, dense_->InteractionBackward(n));
  clock.Mark(StageTimes::kInteractionBackward);
  RETURN_IF_ERROR(dense_->BottomBackward(x, n));
  clock.Mark(StageTimes::kBottomBackward);
  if (overlapped) {
    overlap.Then([this, n] {
      return ReduceBucket(dense_comm_, dense::GradBucket::kBottom, n, nullptr);
    });
  }

  // From here to the dense update the step writes weights: readers on
  // other threads wait (weights_mutex()).
  std::optional<WeightsWriter> writing(std::in_place, *this);
  RETURN_IF_ERROR(UpdateShards(batch, dt, &clock));
  clock.Mark(StageTimes::kEmbeddingUpdate);

  // Dense gradients and the loss sum: the top bucket (and the loss) may
  // already be in flight on the dense communicator.
  RETURN_IF_ERROR(overlap.Finish());
  if (!overlapped && device_comm_ != nullptr) {
    RETURN_IF_ERROR(ReduceOnDevice(n, &loss_sum));
  } else if (!overlapped) {
    RETURN_IF_ERROR(ReduceBucket(comm_, dense::GradBucket::kAll, n, &loss_sum));
  }
  times.bytes_sent[StageTimes::kDense] += world_ > 1 ? dense_bytes_ : 0;
  clock.Mark(StageTimes::kAllReduce);
  RETURN_IF_ERROR(dense_->Update());
  clock.Mark(StageTimes::kDenseUpdate);
  if (world_ == 1 && read_loss) {
    // After the whole step is queued: on CUDA this waits for the forward
    // and the loss's copy only, while the backward and update run on.
    ASSIGN_OR_RETURN(const double local_mean, dense_->ReadLoss());
    loss_sum = local_mean * static_cast<double>(n);
    clock.Mark(StageTimes::kLoss);
  }
  result.loss = loss_sum / static_cast<double>(exchange_->global_size());
  ++steps_;
  writing.reset();
  result.stores = store_stats_;
  return result;
}

absl::Status Model::UpdateShards(const data::Batch& batch, const float* dt,
                                 internal::StageClock<StageTimes>* clock) {
  const int num_local = static_cast<int>(local_.size());
  if (in_place_) {
    // Each shard reads its columns of the interaction gradient in place: the
    // host copy, or for stores on the device the backend's device gradient
    // (their updates queue on its stream, after the gradient).
    const float* device_dt = dense_->DeviceInteractionGradient();
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      const float* grad =
          ls.store->memory_space() == MemorySpace::kDevice ? device_dt : dt;
      ls.status = ls.store->BackwardUpdate(
          *ls.prepared, grad == nullptr ? nullptr : grad + TColumn(ls),
          t_width_);
    }
  } else {
    // From the device interaction gradient when the exchanges run on the
    // device.
    const float* exchange_dt =
        exchange_on_device_ ? dense_->DeviceInteractionGradient() : dt;
    ASSIGN_OR_RETURN(
        const float* grads,
        exchange_->ScatterGradients(batch, exchange_dt, clock->times()));
    // Shards outside the exchange's memory space take theirs to host memory.
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      if (InExchangeSpace(ls)) continue;
      const int64_t count = exchange_->global_size() * ls.store->spec().dim;
      RETURN_IF_ERROR(exchange_->memory().Download(
          Sized(ls.host_grads, count), grads + exchange_->GradientOffset(j),
          count));
    }
    clock->Mark(StageTimes::kBackwardDist);
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      const float* g = InExchangeSpace(ls)
                           ? grads + exchange_->GradientOffset(j)
                           : ls.host_grads.data();
      ls.status =
          ls.store->BackwardUpdate(*ls.prepared, g, ls.store->spec().dim);
    }
  }
  for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
  return absl::OkStatus();
}

absl::Status Model::ReduceBucket(comm::Communicator* comm,
                                 dense::GradBucket bucket, int64_t samples,
                                 double* loss_sum) {
  // A sum over one rank is what it holds.
  if (comm->world_size() == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::span<float> flat,
                   dense_->PackGradients(bucket, loss_sum != nullptr ? 1 : 0));
  if (loss_sum != nullptr) {
    // The loss was queued before this bucket's backward, whose gradients
    // are packed: no wait in practice.
    ASSIGN_OR_RETURN(const double local_mean, dense_->ReadLoss());
    flat.back() = static_cast<float>(local_mean * static_cast<double>(samples));
  }
  RETURN_IF_ERROR(comm->AllReduceSum(
      flat.data(), static_cast<int64_t>(flat.size()), DataType::kFloat32));
  if (loss_sum != nullptr) *loss_sum = flat.back();
  return dense_->UnpackGradients(bucket);
}

absl::Status Model::ReduceOnDevice(int64_t samples, double* loss_sum) {
  if (world_ == 1) return absl::OkStatus();
  // The flat buffer is in the exchange's memory (the backend's device
  // memory on CUDA, host memory on the CPU backend): the loss goes in and
  // out of its last float through the exchange memory's copies.
  ASSIGN_OR_RETURN(const std::span<float> flat,
                   dense_->PackDeviceGradients(dense::GradBucket::kAll, 1));
  const int64_t count = static_cast<int64_t>(flat.size());
  float* loss_at = flat.data() + count - 1;
  ASSIGN_OR_RETURN(const double local_mean, dense_->ReadLoss());
  const float loss =
      static_cast<float>(local_mean * static_cast<double>(samples));
  ExchangeMemory& memory = exchange_->memory();
  RETURN_IF_ERROR(memory.Upload(&loss, 1, loss_at, 1, 1, 1));
  RETURN_IF_ERROR(
      device_comm_->AllReduceSum(flat.data(), count, DataType::kFloat32));
  float summed = 0;
  RETURN_IF_ERROR(memory.Download(&summed, loss_at, 1));
  *loss_sum = summed;
  return dense_->UnpackDeviceGradients(dense::GradBucket::kAll);
}

absl::Status Model::Predict(const data::Batch& batch,
                            std::vector<float>* probs) {
  RETURN_IF_ERROR(AgreeOnBatch(batch, nullptr));
  StageTimes times;
  RETURN_IF_ERROR(EmbedForward(batch, /*predict=*/true, &times));
  probs->resize(batch.size);
  return dense_->Predict(batch.dense.data(), batch.size, probs->data());
}

int Model::WholeLocal(int k) const {
  if (replica_[k] >= 0) return replica_[k];
  if (plan_.tables[k].kind != SHARDING_TABLE_WISE) return -1;
  for (size_t j = 0; j < local_.size(); ++j) {
    if (local_[j].table == k) return static_cast<int>(j);
  }
  return -1;
}

embedding::EmbeddingStore* Model::WholeStore(int k) {
  const int j = WholeLocal(k);
  return j < 0 ? nullptr : local_[j].store.get();
}

embedding::EmbeddingTable* Model::WholeHostTable(int k) {
  const int j = WholeLocal(k);
  return j < 0 ? nullptr : local_[j].host;
}

absl::StatusOr<uint64_t> Model::WeightChecksum() {
  uint64_t h = 0;
  auto add = [&h](const float* p, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof(bits));
      h = Mix64(h ^ bits);
    }
  };
  for (const dense::ParamRef& p : dense_params()) add(p.value, p.size);
  std::vector<float> table;
  for (int k = 0; k < config_.tables_size(); ++k) {
    RETURN_IF_ERROR(GatherTable(k, &table));
    add(table.data(), static_cast<int64_t>(table.size()));
  }
  return h;
}

absl::Status Model::GatherTable(int k, std::vector<float>* table) {
  const TableConfig& t = config_.tables(k);
  const int dim = t.dim();
  table->assign(static_cast<size_t>(t.rows()) * dim, 0.0f);
  std::vector<float> record;
  // Every other rank contributes zeros: the sum is exact. A replica is
  // whole on every rank: no exchange.
  absl::Status local;
  for (LocalShard& ls : local_) {
    if (ls.table != k) continue;
    const embedding::Shard& s = plan_.tables[k].shards[ls.shard];
    if (ls.host != nullptr) {
      const float* w = ls.host->weights();
      for (int64_t r = 0; r < s.row_count; ++r) {
        std::memcpy(table->data() + (s.row_begin + r) * dim + s.col_begin,
                    w + r * s.col_count, sizeof(float) * s.col_count);
      }
      continue;
    }
    // Through the store (RocksDB, device memory), a chunk of rows a call.
    const embedding::TableSpec& spec = ls.store->spec();
    const int64_t floats =
        spec.dim + embedding::StateFloatsPerRow(spec.optimizer, spec.dim);
    constexpr int64_t kChunkRows = 4096;
    for (int64_t begin = 0; begin < s.row_count && local.ok();
         begin += kChunkRows) {
      const int64_t count = std::min(kChunkRows, s.row_count - begin);
      record.resize(count * floats);
      local = ls.store->ReadRows(begin, count, record.data());
      for (int64_t r = 0; r < count && local.ok(); ++r) {
        std::memcpy(
            table->data() + (s.row_begin + begin + r) * dim + s.col_begin,
            record.data() + r * floats, sizeof(float) * s.col_count);
      }
    }
  }
  if (replica_[k] >= 0) return local;
  RETURN_IF_ERROR(comm_->AllReduceSum(
      table->data(), static_cast<int64_t>(table->size()), DataType::kFloat32));
  return local;
}

}  // namespace dlrm::model
