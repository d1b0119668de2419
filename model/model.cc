// The DLRM step on R >= 1 ranks: input dist (lengths, then ids), shard
// lookups for the global batch, output dist, data-parallel dense
// forward/backward, backward dist, fused sparse updates, dense all-reduce.
//
// Every exchange has one layout: what rank a sends rank b is, for each shard
// b holds (owned_[b], table then shard order), a's local samples in order.
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
#include <span>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/random.h"
#include "core/status.h"
#include "model/step_util.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;
using comm::DataType;

using internal::Sized;
using StageClock = internal::StageClock<StageTimes>;

// Whether id `id` of a bag belongs to `shard` (rows only matter).
inline bool InRows(const embedding::Shard& shard, int64_t id) {
  return id >= shard.row_begin && id < shard.row_begin + shard.row_count;
}

// Bytes of `counts` elements of `size` bytes, leaving out this rank's own.
int64_t BytesToOthers(const std::vector<int64_t>& counts, int self,
                      size_t size) {
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) != self) total += counts[r];
  }
  return total * static_cast<int64_t>(size);
}

std::vector<int64_t> Prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> starts(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) {
    starts[r + 1] = starts[r] + counts[r];
  }
  return starts;
}

DataType TypeOf(const float*) { return DataType::kFloat32; }
DataType TypeOf(const int64_t*) { return DataType::kInt64; }

// One all-to-all of an exchange: the block this rank received, rank after
// rank (recv_counts), in `recv` (grown as needed). On one rank the block it
// sends itself is the one it receives: no copy.
template <typename Vec>
absl::StatusOr<const typename Vec::value_type*> Exchange(
    comm::Communicator* comm, const typename Vec::value_type* send,
    const std::vector<int64_t>& send_counts, Vec& recv,
    const std::vector<int64_t>& recv_counts) {
  if (comm->world_size() == 1) return send;
  int64_t total = 0;
  for (const int64_t c : recv_counts) total += c;
  typename Vec::value_type* out = Sized(recv, total);
  RETURN_IF_ERROR(
      comm->AllToAllV(send, send_counts, out, recv_counts, TypeOf(send)));
  return out;
}

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

const char* StageTimes::Name(int stage) {
  static const char* const kNames[] = {
      "input_dist", "lookup",     "output_dist", "bottom_fwd",   "inter_fwd",
      "top_fwd",    "loss",       "top_bwd",     "inter_bwd",    "bottom_bwd",
      "bwd_dist",   "emb_update", "allreduce",   "dense_update", "emb_prepare"};
  return kNames[stage];
}

const char* StageTimes::ExchangeName(int exchange) {
  static const char* const kNames[] = {"lengths", "ids", "pooled", "gradients",
                                       "dense_allreduce"};
  return kNames[exchange];
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
    comm::Communicator* comm, comm::Communicator* dense_comm) {
  RETURN_IF_ERROR(plan.Validate(requested));
  // Tiers from rocksdb.host_budget_bytes (per rank), when set: every rank
  // plans the same from the same config and plan.
  ASSIGN_OR_RETURN(const ModelConfig config,
                   embedding::ApplyHostBudget(requested, &plan));
  if (plan.world_size != comm->world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding plan is for ", plan.world_size,
                     " ranks, the communicator has ", comm->world_size()));
  }
  if (dense_comm != nullptr &&
      (dense_comm->world_size() != comm->world_size() ||
       dense_comm->rank() != comm->rank())) {
    return absl::InvalidArgumentError(
        "the dense communicator must join the same ranks as the main one");
  }
  // The step keeps its exchange buffers in host memory (the CUDA step is
  // not written yet).
  for (const comm::Communicator* c : {comm, dense_comm}) {
    if (c != nullptr && c->memory_space() != comm::MemorySpace::kHost) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the model's step exchanges host memory; the communicator takes ",
          comm::MemorySpaceName(c->memory_space()), " buffers"));
    }
  }
  // The dense part on config.device; FailedPrecondition here, before any
  // store is made, when that device is not usable.
  ASSIGN_OR_RETURN(std::unique_ptr<dense::DenseBackend> dense,
                   dense::CreateDenseBackend(config));
  std::unique_ptr<Model> m(new Model(config, plan, comm, std::move(dense)));
  m->dense_comm_ = dense_comm;

  m->owned_.resize(m->world_);
  for (int k = 0; k < config.tables_size(); ++k) {
    const auto& shards = plan.tables[k].shards;
    for (int i = 0; i < static_cast<int>(shards.size()); ++i) {
      m->owned_[shards[i].rank].push_back({k, i});
    }
  }
  m->replica_.assign(config.tables_size(), -1);
  m->owned_rocksdb_.resize(m->world_);
  for (int r = 0; r < m->world_; ++r) {
    for (const ShardRef& ref : m->owned_[r]) {
      if (m->OnRocksDb(ref.table)) m->owned_rocksdb_[r].push_back(ref);
    }
  }
  for (int k = 0; k < config.tables_size(); ++k) {
    m->any_rocksdb_ = m->any_rocksdb_ || m->OnRocksDb(k);
  }
  // Every rank's caches, by table, for the counters PrepareShards gathers.
  m->store_tables_.resize(m->world_);
  size_t most_tables = 0;
  for (int r = 0; r < m->world_; ++r) {
    for (const ShardRef& ref : m->owned_rocksdb_[r]) {
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
      for (const ShardRef& ref : m->owned_rocksdb_[r]) {
        if (ref.table != k) continue;
        s.cache_rows += CachedRows(config.rocksdb(),
                                   plan.tables[k].shards[ref.shard].row_count);
      }
      if (s.cache_rows > 0) m->store_stats_.push_back(s);
    }
  }
  bool mine_on_rocksdb = false;
  for (const ShardRef& ref : m->owned_[m->rank_]) {
    const int j = static_cast<int>(m->local_.size());
    m->all_locals_.push_back(j);
    if (plan.tables[ref.table].kind == SHARDING_DATA_PARALLEL) {
      m->replica_[ref.table] = j;
    }
    LocalShard ls;
    ls.table = ref.table;
    ls.shard = ref.shard;
    if (m->OnRocksDb(ref.table)) {
      // Its store comes below, once the database is open.
      m->rocksdb_locals_.push_back(j);
      mine_on_rocksdb = true;
    } else {
      auto host = std::make_unique<embedding::HostStore>(m->SpecOf(ref));
      ls.host = &host->table();
      ls.store = std::move(host);
    }
    m->local_.push_back(std::move(ls));
  }
  if (mine_on_rocksdb) {
    const fs::path base =
        fs::path(config.rocksdb().path()) / absl::StrCat("rank_", m->rank_);
    std::error_code ec;
    fs::create_directories(base, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat(
          "cannot create rocksdb.path ", base.string(), ": ", ec.message()));
    }
    embedding::RocksDbStoreOptions db_options;
    db_options.path = m->NewDatabaseDir();
    db_options.block_cache_bytes = config.rocksdb().block_cache_bytes();
    if (config.rocksdb().write_buffer_bytes() > 0) {
      db_options.write_buffer_bytes = config.rocksdb().write_buffer_bytes();
    }
    ASSIGN_OR_RETURN(m->row_db_, embedding::RowDatabase::Open(db_options));
    m->row_db_dir_ = db_options.path;
    ASSIGN_OR_RETURN(auto cached, m->CreateCachedStores(m->row_db_.get()));
    for (const int j : m->rocksdb_locals_) {
      m->local_[j].store = std::move(cached[j]);
    }
  }
  m->in_place_ =
      m->world_ == 1 && std::none_of(plan.tables.begin(), plan.tables.end(),
                                     [](const embedding::TablePlacement& p) {
                                       return p.kind == SHARDING_ROW_WISE;
                                     });
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
  if (row_db_ != nullptr) {
    row_db_.reset();
    std::error_code ec;
    fs::remove_all(row_db_dir_, ec);
    // rank_<r> too, unless another model's database is still in it.
    fs::remove(fs::path(row_db_dir_).parent_path(), ec);
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
  std::vector<int64_t> rows;
  for (const auto& t : config_.tables()) rows.push_back(t.rows());
  auto validate = [&](const data::Batch& b) -> absl::Status {
    if (b.size > 0) return b.Validate(config_.num_dense_features(), rows);
    if (b.size < 0 ||
        static_cast<int>(b.sparse.size()) != config_.tables_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch: size ", b.size, " with ", b.sparse.size(),
          " sparse features (the model has ", config_.tables_size(), ")"));
    }
    return absl::OkStatus();
  };
  const absl::Status status = validate(batch);
  // The next batch only steers a prefetch: a bad one is simply left out
  // (its own step rejects it).
  const int64_t next_size =
      next != nullptr && any_rocksdb_ && validate(*next).ok() ? next->size : 0;
  // One exchange settles the sizes, the verdict and the prefetch.
  const int64_t mine[3] = {status.ok() ? batch.size : 0, status.ok() ? 0 : 1,
                           next_size};
  std::vector<int64_t> all(3 * world_);
  RETURN_IF_ERROR(comm_->AllGather(mine, 3, all.data(), DataType::kInt64));
  sizes_.assign(world_, 0);
  next_sizes_.assign(world_, 0);
  int bad_rank = -1;
  for (int r = 0; r < world_; ++r) {
    sizes_[r] = all[3 * r];
    next_sizes_[r] = all[3 * r + 2];
    if (all[3 * r + 1] != 0 && bad_rank < 0) bad_rank = r;
  }
  RETURN_IF_ERROR(status);
  if (bad_rank >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch rejected: rank ", bad_rank, "'s local batch is invalid"));
  }
  starts_ = Prefix(sizes_);
  global_size_ = starts_[world_];
  if (global_size_ == 0) {
    return absl::InvalidArgumentError("batch: the global batch is empty");
  }
  return absl::OkStatus();
}

absl::Status Model::DistributeIds(
    const data::Batch& batch, const std::vector<int64_t>& sizes,
    const std::vector<std::vector<ShardRef>>& owned,
    const std::vector<int>& locals,
    const std::vector<data::SparseFeature*>& out_features, StageTimes* times) {
  const int64_t n = batch.size;
  const std::vector<ShardRef>& mine = owned[rank_];

  // Part 1: bag lengths (row-wise: the ids in the shard's rows).
  std::vector<int64_t> len_send(world_), len_recv(world_);
  for (int o = 0; o < world_; ++o) {
    len_send[o] = static_cast<int64_t>(owned[o].size()) * n;
  }
  for (int r = 0; r < world_; ++r) {
    len_recv[r] = static_cast<int64_t>(mine.size()) * sizes[r];
  }
  const std::vector<int64_t> len_send_at = Prefix(len_send);
  int64_t* lengths = Sized(send_i64_, len_send_at[world_]);
  std::vector<int64_t> id_send(world_, 0);
  for (int o = 0; o < world_; ++o) {
    int64_t* out = lengths + len_send_at[o];
    for (const ShardRef& ref : owned[o]) {
      const data::SparseFeature& f = batch.sparse[ref.table];
      const embedding::Shard& s = ShardOf(ref);
      const bool row_wise = plan_.tables[ref.table].kind == SHARDING_ROW_WISE;
      for (int64_t l = 0; l < n; ++l) {
        int64_t len = f.bag_size(l);
        if (row_wise) {
          len = 0;
          for (int64_t p = f.offsets[l]; p < f.offsets[l + 1]; ++p) {
            len += InRows(s, f.ids[p]);
          }
        }
        *out++ = len;
        id_send[o] += len;
      }
    }
  }
  const std::vector<int64_t> len_recv_at = Prefix(len_recv);
  ASSIGN_OR_RETURN(const int64_t* rlengths,
                   Exchange(comm_, lengths, len_send, recv_i64_, len_recv));
  times->bytes_sent[StageTimes::kLengths] += BytesToOthers(len_send, rank_, 8);

  // Part 2: the ids (row-wise: shard-local).
  std::vector<int64_t> id_recv(world_, 0);
  for (int r = 0; r < world_; ++r) {
    for (int64_t i = 0; i < len_recv[r]; ++i) {
      id_recv[r] += rlengths[len_recv_at[r] + i];
    }
  }
  const std::vector<int64_t> id_send_at = Prefix(id_send);
  const std::vector<int64_t> id_recv_at = Prefix(id_recv);
  int64_t* ids = Sized(send_ids_, id_send_at[world_]);
  for (int o = 0; o < world_; ++o) {
    int64_t* out = ids + id_send_at[o];
    for (const ShardRef& ref : owned[o]) {
      const data::SparseFeature& f = batch.sparse[ref.table];
      const embedding::Shard& s = ShardOf(ref);
      if (plan_.tables[ref.table].kind == SHARDING_ROW_WISE) {
        for (int64_t p = 0; p < (n > 0 ? f.offsets[n] : 0); ++p) {
          if (InRows(s, f.ids[p])) *out++ = f.ids[p] - s.row_begin;
        }
      } else if (n > 0) {
        out = std::copy(f.ids.begin(), f.ids.begin() + f.offsets[n], out);
      }
    }
  }
  ASSIGN_OR_RETURN(const int64_t* rids,
                   Exchange(comm_, ids, id_send, recv_ids_, id_recv));
  times->bytes_sent[StageTimes::kIds] += BytesToOthers(id_send, rank_, 8);

  // Each local shard's bags for the whole global batch, in global order.
  for (data::SparseFeature* g : out_features) {
    g->offsets.assign(1, 0);
    g->ids.clear();
  }
  for (int r = 0; r < world_; ++r) {
    const int64_t* rl = rlengths + len_recv_at[r];
    const int64_t* ri = rids + id_recv_at[r];
    for (size_t i = 0; i < locals.size(); ++i) {
      data::SparseFeature& g = *out_features[i];
      int64_t count = 0;
      for (int64_t l = 0; l < sizes[r]; ++l) {
        count += rl[l];
        g.offsets.push_back(g.offsets.back() + rl[l]);
      }
      g.ids.insert(g.ids.end(), ri, ri + count);
      rl += sizes[r];
      ri += count;
    }
  }
  return absl::OkStatus();
}

absl::Status Model::PrepareShards() {
  if (!any_rocksdb_) {
    // Host stores return the ids themselves: nothing can fail, nothing to
    // agree on, no collective.
    for (LocalShard& ls : local_) {
      ASSIGN_OR_RETURN(ls.prepared, ls.store->Prepare(*ls.ids));
    }
    return absl::OkStatus();
  }
  // Shards on RocksDB read independently (the database is thread-safe,
  // each store has one caller).
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
  for (const int j : rocksdb_locals_) {
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
  // Word 0: the status code; then the start of the message; then `extra`.
  constexpr int kWords = 32;
  constexpr size_t kText = (kWords - 1) * sizeof(int64_t);
  const int64_t width = kWords + static_cast<int64_t>(extra.size());
  std::vector<int64_t> mine(width, 0);
  mine[0] = static_cast<int64_t>(local.code());
  const size_t len = std::min(kText, local.message().size());
  std::memcpy(&mine[1], local.message().data(), len);
  std::copy(extra.begin(), extra.end(), mine.begin() + kWords);
  std::vector<int64_t> all(static_cast<size_t>(width) * world_);
  if (absl::Status s =
          comm_->AllGather(mine.data(), width, all.data(), DataType::kInt64);
      !s.ok()) {
    communicator_failed_ = true;
    return s;
  }
  if (all_extra != nullptr && !extra.empty()) {
    all_extra->clear();
    for (int r = 0; r < world_; ++r) {
      const auto begin = all.begin() + width * r + kWords;
      all_extra->insert(all_extra->end(), begin, begin + extra.size());
    }
  }
  if (!local.ok()) return local;
  for (int r = 0; r < world_; ++r) {
    const int64_t* theirs = &all[static_cast<size_t>(width) * r];
    if (theirs[0] == 0) continue;
    const char* text = reinterpret_cast<const char*>(&theirs[1]);
    return absl::Status(static_cast<absl::StatusCode>(theirs[0]),
                        absl::StrCat(what, " ", r, ": ",
                                     std::string(text, strnlen(text, kText))));
  }
  return absl::OkStatus();
}

absl::Status Model::EmbedForward(const data::Batch& batch, StageTimes* times) {
  StageClock clock(times);
  const int64_t n = batch.size;

  if (in_place_) {
    for (LocalShard& ls : local_) ls.ids = &batch.sparse[ls.table];
  } else {
    std::vector<data::SparseFeature*> out_features;
    for (LocalShard& ls : local_) {
      out_features.push_back(&ls.global_ids);
      ls.ids = &ls.global_ids;
    }
    RETURN_IF_ERROR(
        DistributeIds(batch, sizes_, owned_, all_locals_, out_features, times));
  }
  clock.Mark(StageTimes::kInputDist);

  // Before anything changes: a batch that does not fit a shard's cache on
  // any rank is refused on every rank.
  RETURN_IF_ERROR(PrepareShards());
  clock.Mark(StageTimes::kPrepare);

  if (in_place_) {
    // Every shard's columns of the interaction input, for this rank's (the
    // whole) batch.
    ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
    const int num_local = static_cast<int>(local_.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      ls.status = ls.store->Forward(*ls.prepared, t + TColumn(ls), t_width_);
    }
    for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
    clock.Mark(StageTimes::kLookup);
    return absl::OkStatus();
  }

  // Lookup: each model-parallel shard pools the global batch, straight into
  // the output-dist send buffer (rank by rank, shard by shard).
  std::vector<int64_t> out_send(world_, 0), out_recv(world_, 0);
  for (int r = 0; r < world_; ++r) {
    for (const LocalShard& ls : local_) {
      if (!IsDataParallel(ls.table)) {
        out_send[r] += sizes_[r] * ls.store->spec().dim;
      }
    }
  }
  for (int o = 0; o < world_; ++o) {
    for (const ShardRef& ref : owned_[o]) {
      if (!IsDataParallel(ref.table)) {
        out_recv[o] += n * ShardOf(ref).col_count;
      }
    }
  }
  const std::vector<int64_t> out_send_at = Prefix(out_send);
  const std::vector<int64_t> out_recv_at = Prefix(out_recv);
  float* send = Sized(send_f_, out_send_at[world_]);
  const int num_local = static_cast<int>(local_.size());
  std::vector<int64_t> col_at(num_local + 1, 0);
  for (int j = 0; j < num_local; ++j) {
    col_at[j + 1] =
        col_at[j] +
        (IsDataParallel(local_[j].table) ? 0 : local_[j].store->spec().dim);
  }
  // Rank r's block is [its samples x all model-parallel columns] and starts
  // at starts_[r] x stride, so pooling the global batch at that stride puts
  // every sample's vector in its rank's block.
  const int64_t stride = col_at[num_local];
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < num_local; ++j) {
    LocalShard& ls = local_[j];
    ls.status = IsDataParallel(ls.table)
                    ? absl::OkStatus()
                    : ls.store->Forward(*ls.prepared, send + col_at[j], stride);
  }
  for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
  clock.Mark(StageTimes::kLookup);

  ASSIGN_OR_RETURN(const float* recv,
                   Exchange(comm_, send, out_send, recv_f_, out_recv));
  times->bytes_sent[StageTimes::kPooled] += BytesToOthers(out_send, rank_, 4);

  // Assemble this rank's pooled vectors: column blocks side by side,
  // row-wise partial sums added, data-parallel tables pooled locally.
  ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (plan_.tables[k].kind != SHARDING_ROW_WISE) continue;
    const int dim = config_.tables(k).dim();
    for (int64_t l = 0; l < n; ++l) {
      std::fill_n(t + l * t_width_ + table_offset_[k], dim, 0.0f);
    }
  }
  for (int o = 0; o < world_; ++o) {
    int64_t o_stride = 0;
    for (const ShardRef& ref : owned_[o]) {
      if (!IsDataParallel(ref.table)) o_stride += ShardOf(ref).col_count;
    }
    const float* block = recv + out_recv_at[o];
    int64_t col = 0;
    for (const ShardRef& ref : owned_[o]) {
      if (IsDataParallel(ref.table)) continue;
      const embedding::Shard& s = ShardOf(ref);
      const bool row_wise = plan_.tables[ref.table].kind == SHARDING_ROW_WISE;
      for (int64_t l = 0; l < n; ++l) {
        const float* src = block + l * o_stride + col;
        float* dst = t + l * t_width_ + table_offset_[ref.table] + s.col_begin;
        if (row_wise) {
          for (int c = 0; c < s.col_count; ++c) dst[c] += src[c];
        } else {
          std::memcpy(dst, src, sizeof(float) * s.col_count);
        }
      }
      col += s.col_count;
    }
  }
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (plan_.tables[k].kind == SHARDING_ROW_WISE &&
        config_.tables(k).pooling() == POOLING_MEAN) {
      const int dim = config_.tables(k).dim();
      for (int64_t l = 0; l < n; ++l) {
        const int64_t len = batch.sparse[k].bag_size(l);
        if (len == 0) continue;
        const float scale = 1.0f / static_cast<float>(len);
        float* v = t + l * t_width_ + table_offset_[k];
        for (int c = 0; c < dim; ++c) v[c] *= scale;
      }
    } else if (replica_[k] >= 0 && n > 0) {
      LocalShard& ls = local_[replica_[k]];
      if (ls.host != nullptr) {
        // In host memory: pool the local bags straight from the batch.
        ls.host->Forward(batch.sparse[k], t + table_offset_[k], t_width_);
        continue;
      }
      // On RocksDB the store pools only the batch it prepared (the global
      // one, which the update needs): pool it all, keep this rank's rows.
      const int dim = config_.tables(k).dim();
      float* all = Sized(replica_out_, global_size_ * dim);
      RETURN_IF_ERROR(ls.store->Forward(*ls.prepared, all, dim));
      for (int64_t l = 0; l < n; ++l) {
        std::memcpy(t + l * t_width_ + table_offset_[k],
                    all + (starts_[rank_] + l) * dim, sizeof(float) * dim);
      }
    }
  }
  clock.Mark(StageTimes::kOutputDist);
  return absl::OkStatus();
}

absl::Status Model::PrefetchNext(const data::Batch* next, StageTimes* times) {
  if (in_place_) {
    for (const int j : rocksdb_locals_) {
      RETURN_IF_ERROR(local_[j].store->Prefetch(next->sparse[local_[j].table]));
    }
    return absl::OkStatus();
  }
  std::vector<data::SparseFeature*> out_features;
  for (const int j : rocksdb_locals_) {
    out_features.push_back(&local_[j].next_ids);
  }
  // A rank whose next batch was left out contributes no samples.
  data::Batch none;
  const data::Batch* mine = next;
  if (next_sizes_[rank_] == 0) {
    none.Reset(config_.num_dense_features(), config_.tables_size());
    mine = &none;
  }
  RETURN_IF_ERROR(DistributeIds(*mine, next_sizes_, owned_rocksdb_,
                                rocksdb_locals_, out_features, times));
  for (const int j : rocksdb_locals_) {
    RETURN_IF_ERROR(local_[j].store->Prefetch(local_[j].next_ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Model::TrainStep(const data::Batch& batch,
                                            const data::Batch* next) {
  RETURN_IF_ERROR(AgreeOnBatch(batch, next));
  StepResult result;
  result.samples = global_size_;
  StageTimes& times = result.times;
  const int64_t n = batch.size;

  RETURN_IF_ERROR(EmbedForward(batch, &times));
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
  // the global mean's.
  ASSIGN_OR_RETURN(const double local_mean,
                   dense_->Loss(batch.labels.data(), n,
                                1.0f / static_cast<float>(global_size_)));
  clock.Mark(StageTimes::kLoss);
  RETURN_IF_ERROR(dense_->TopBackward(n));
  clock.Mark(StageTimes::kTopBackward);
  // With a dense communicator, the top MLP's gradients (and the loss) are
  // all-reduced while the rest of the backward runs, then the bottom MLP's
  // once they exist. Nothing below touches the top MLP's gradients.
  double loss_sum = local_mean * static_cast<double>(n);
  const bool overlapped = dense_comm_ != nullptr;
  OverlappedReduce overlap;
  if (overlapped) {
    overlap.Start([this, &loss_sum] {
      return ReduceBucket(dense_comm_, dense::GradBucket::kTop, &loss_sum);
    });
  }
  ASSIGN_OR_RETURN(const float* dt, dense_->InteractionBackward(n));
  clock.Mark(StageTimes::kInteractionBackward);
  RETURN_IF_ERROR(dense_->BottomBackward(x, n));
  clock.Mark(StageTimes::kBottomBackward);
  if (overlapped) {
    overlap.Then([this] {
      return ReduceBucket(dense_comm_, dense::GradBucket::kBottom, nullptr);
    });
  }

  if (in_place_) {
    // Each shard reads its columns of the interaction gradient in place.
    const int num_local = static_cast<int>(local_.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      ls.status =
          ls.store->BackwardUpdate(*ls.prepared, dt + TColumn(ls), t_width_);
    }
    for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
  } else {
    RETURN_IF_ERROR(ExchangeAndUpdate(batch, dt, &times, &clock));
  }
  clock.Mark(StageTimes::kEmbeddingUpdate);

  // Dense gradients and the loss sum: the top bucket (and the loss) may
  // already be in flight on the dense communicator.
  RETURN_IF_ERROR(overlap.Finish());
  if (!overlapped) {
    RETURN_IF_ERROR(ReduceBucket(comm_, dense::GradBucket::kAll, &loss_sum));
  }
  times.bytes_sent[StageTimes::kDense] += world_ > 1 ? dense_bytes_ : 0;
  result.loss = loss_sum / static_cast<double>(global_size_);
  clock.Mark(StageTimes::kAllReduce);
  RETURN_IF_ERROR(dense_->Update());
  clock.Mark(StageTimes::kDenseUpdate);
  ++steps_;
  result.stores = store_stats_;
  return result;
}

absl::Status Model::ExchangeAndUpdate(
    const data::Batch& batch, const float* dt, StageTimes* times_out,
    internal::StageClock<StageTimes>* clock_out) {
  const int64_t n = batch.size;
  StageTimes& times = *times_out;
  internal::StageClock<StageTimes>& clock = *clock_out;
  // Backward dist: every shard (replicas included) gets the gradients of
  // its pooled vectors for this rank's samples; row-wise shards of a mean
  // table get them already divided by the bag length.
  std::vector<int64_t> g_send(world_, 0), g_recv(world_, 0);
  for (int o = 0; o < world_; ++o) {
    for (const ShardRef& ref : owned_[o]) {
      g_send[o] += n * ShardOf(ref).col_count;
    }
  }
  for (int r = 0; r < world_; ++r) {
    for (const LocalShard& ls : local_) {
      g_recv[r] += sizes_[r] * ls.store->spec().dim;
    }
  }
  const std::vector<int64_t> g_send_at = Prefix(g_send);
  const std::vector<int64_t> g_recv_at = Prefix(g_recv);
  float* send = Sized(send_f_, g_send_at[world_]);
  for (int o = 0; o < world_; ++o) {
    float* out = send + g_send_at[o];
    for (const ShardRef& ref : owned_[o]) {
      const embedding::Shard& s = ShardOf(ref);
      const bool scale = plan_.tables[ref.table].kind == SHARDING_ROW_WISE &&
                         config_.tables(ref.table).pooling() == POOLING_MEAN;
      for (int64_t l = 0; l < n; ++l) {
        const float* g =
            dt + l * t_width_ + table_offset_[ref.table] + s.col_begin;
        if (scale) {
          const int64_t len = batch.sparse[ref.table].bag_size(l);
          // The same factor the single-rank backward multiplies by.
          const float f = len > 0 ? 1.0f / static_cast<float>(len) : 0.0f;
          for (int c = 0; c < s.col_count; ++c) out[c] = g[c] * f;
        } else {
          std::memcpy(out, g, sizeof(float) * s.col_count);
        }
        out += s.col_count;
      }
    }
  }
  ASSIGN_OR_RETURN(const float* recv,
                   Exchange(comm_, send, g_send, recv_f_, g_recv));
  times.bytes_sent[StageTimes::kGradients] += BytesToOthers(g_send, rank_, 4);
  clock.Mark(StageTimes::kBackwardDist);

  // Each shard's gradients for the global batch, then its fused update.
  const int num_local = static_cast<int>(local_.size());
  std::vector<int64_t> grad_at(num_local + 1, 0);
  for (int j = 0; j < num_local; ++j) {
    grad_at[j + 1] = grad_at[j] + global_size_ * local_[j].store->spec().dim;
  }
  // On one rank the received block is already in this layout (shard after
  // shard, every sample).
  const float* grads = recv;
  if (world_ > 1) {
    float* regrouped = Sized(pooled_, grad_at[num_local]);
    for (int r = 0; r < world_; ++r) {
      const float* in = recv + g_recv_at[r];
      for (int j = 0; j < num_local; ++j) {
        const int dim = local_[j].store->spec().dim;
        const int64_t count = sizes_[r] * dim;
        std::memcpy(regrouped + grad_at[j] + starts_[r] * dim, in,
                    sizeof(float) * count);
        in += count;
      }
    }
    grads = regrouped;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < num_local; ++j) {
    LocalShard& ls = local_[j];
    ls.status = ls.store->BackwardUpdate(*ls.prepared, grads + grad_at[j],
                                         ls.store->spec().dim);
  }
  for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
  return absl::OkStatus();
}

absl::Status Model::ReduceBucket(comm::Communicator* comm,
                                 dense::GradBucket bucket, double* loss_sum) {
  // A sum over one rank is what it holds.
  if (comm->world_size() == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::span<float> flat,
                   dense_->PackGradients(bucket, loss_sum != nullptr ? 1 : 0));
  if (loss_sum != nullptr) flat.back() = static_cast<float>(*loss_sum);
  RETURN_IF_ERROR(comm->AllReduceSum(
      flat.data(), static_cast<int64_t>(flat.size()), DataType::kFloat32));
  if (loss_sum != nullptr) *loss_sum = flat.back();
  return dense_->UnpackGradients(bucket);
}

absl::Status Model::Predict(const data::Batch& batch,
                            std::vector<float>* probs) {
  RETURN_IF_ERROR(AgreeOnBatch(batch, nullptr));
  StageTimes times;
  RETURN_IF_ERROR(EmbedForward(batch, &times));
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
    const embedding::TableSpec& spec = ls.store->spec();
    record.resize(spec.dim +
                  embedding::StateFloatsPerRow(spec.optimizer, spec.dim));
    for (int64_t r = 0; r < s.row_count && local.ok(); ++r) {
      local = ls.store->ReadRow(r, record.data());
      std::memcpy(table->data() + (s.row_begin + r) * dim + s.col_begin,
                  record.data(), sizeof(float) * s.col_count);
    }
  }
  if (replica_[k] >= 0) return local;
  RETURN_IF_ERROR(comm_->AllReduceSum(
      table->data(), static_cast<int64_t>(table->size()), DataType::kFloat32));
  return local;
}

std::array<int64_t, StageTimes::kNumExchanges> PredictedExchangeBytes(
    const ModelConfig& c, const embedding::ShardingPlan& plan,
    const data::Batch& local, const std::vector<int64_t>& sizes, int rank,
    const data::Batch* next) {
  std::array<int64_t, StageTimes::kNumExchanges> b{};
  const int world = plan.world_size;
  const int64_t n = local.size;
  for (int k = 0; k < c.tables_size(); ++k) {
    const auto& p = plan.tables[k];
    for (const embedding::Shard& s : p.shards) {
      const bool mp = p.kind != SHARDING_DATA_PARALLEL;
      if (s.rank != rank && next != nullptr &&
          c.tables(k).storage() == STORAGE_ROCKSDB) {
        // The prefetch: the next batch's lengths and ids, RocksDB shards
        // only.
        b[StageTimes::kLengths] += 8 * next->size;
        for (int64_t id : next->sparse[k].ids) {
          b[StageTimes::kIds] +=
              id >= s.row_begin && id < s.row_begin + s.row_count ? 8 : 0;
        }
      }
      if (s.rank != rank) {
        b[StageTimes::kLengths] += 8 * n;
        for (int64_t id : local.sparse[k].ids) {
          b[StageTimes::kIds] +=
              id >= s.row_begin && id < s.row_begin + s.row_count ? 8 : 0;
        }
        b[StageTimes::kGradients] += 4 * n * s.col_count;
      } else if (mp) {
        for (int o = 0; o < world; ++o) {
          if (o != rank) {
            b[StageTimes::kPooled] += 4 * sizes[o] * s.col_count;
          }
        }
      }
    }
  }
  if (world > 1) {
    b[StageTimes::kDense] = 4 * (DenseParameterCount(c) + 1);
  }
  return b;
}

}  // namespace dlrm::model
