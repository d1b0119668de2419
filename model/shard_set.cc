// ShardSet: one rank's stores, built through the tiers' factory, and the
// databases they need.
#include "model/shard_set.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

// A database directory's options: the config's block cache and write
// buffer, at `path`.
embedding::RocksDbStoreOptions DatabaseOptions(const ModelConfig& config,
                                               const std::string& path) {
  embedding::RocksDbStoreOptions options;
  options.path = path;
  options.block_cache_bytes = config.rocksdb().block_cache_bytes();
  if (config.rocksdb().write_buffer_bytes() > 0) {
    options.write_buffer_bytes = config.rocksdb().write_buffer_bytes();
  }
  return options;
}

}  // namespace

embedding::TableSpec ShardSpec(const ModelConfig& config,
                               const embedding::ShardingPlan& plan,
                               const ShardRef& ref) {
  const TableConfig& t = config.tables(ref.table);
  const embedding::Shard& s = plan.tables[ref.table].shards[ref.shard];
  embedding::TableSpec spec;
  spec.table_index = ref.table;
  spec.rows = s.row_count;
  spec.dim = s.col_count;
  spec.pooling = plan.tables[ref.table].kind == SHARDING_ROW_WISE ? POOLING_SUM
                                                                  : t.pooling();
  spec.optimizer = config.sparse_optimizer();
  spec.seed = config.seed();
  spec.slice = embedding::TableSlice{t.rows(), s.row_begin, s.col_begin};
  spec.precision = t.weight_precision();
  return spec;
}

absl::StatusOr<std::unique_ptr<ShardSet>> ShardSet::Create(
    const ModelConfig& config, const embedding::ShardingPlan& plan, int rank,
    const std::vector<ShardRef>& refs, void* cuda_stream) {
  std::unique_ptr<ShardSet> set(new ShardSet(config, plan, rank, cuda_stream));
  for (const ShardRef& ref : refs) {
    Shard shard{ref.table, ref.shard, nullptr};
    ASSIGN_OR_RETURN(shard.store,
                     set->MakeStore(ref, &set->db_, &set->scratch_db_));
    set->shards_.push_back(std::move(shard));
  }
  return set;
}

absl::StatusOr<std::unique_ptr<embedding::EmbeddingStore>> ShardSet::MakeStore(
    const ShardRef& ref, Database* checkpointed, Database* scratch) const {
  const embedding::TableSpec spec = ShardSpec(config_, plan_, ref);
  embedding::StoreOptions options = embedding::StoreOptionsFor(
      config_.tables(ref.table), config_.rocksdb(), spec.rows);
  options.cuda_stream = cuda_stream_;
  embedding::RowDatabase* db = nullptr;
  if (embedding::NeedsDatabase(options)) {
    Database* where =
        embedding::TierCapabilities(options, spec.rows).checkpoint ==
                embedding::CheckpointForm::kDatabase
            ? checkpointed
            : scratch;
    if (where->db == nullptr) RETURN_IF_ERROR(OpenDatabase("", where));
    db = where->db.get();
    options.rocksdb.path = db->options().path;
  }
  return embedding::CreateEmbeddingStore(spec, options, db);
}

absl::Status ShardSet::OpenDatabase(const std::string& from,
                                    Database* out) const {
  // Unique per rank, process and call: ranks on one host, several models
  // in one process and a restore next to the live database never share
  // one.
  static std::atomic<int64_t> counter{0};
  const fs::path base =
      fs::path(config_.rocksdb().path()) / absl::StrCat("rank_", rank_);
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create rocksdb.path ",
                                            base.string(), ": ", ec.message()));
  }
  fs::path dir;
  do {
    dir = base / absl::StrCat("rows-", ::getpid(), "-", counter++);
  } while (fs::exists(dir));
  const embedding::RocksDbStoreOptions options =
      DatabaseOptions(config_, dir.string());
  auto db = from.empty()
                ? embedding::RowDatabase::Open(options)
                : embedding::RowDatabase::RestoreCheckpoint(from, options);
  if (!db.ok()) {
    fs::remove_all(dir, ec);
    return db.status();
  }
  out->db = *std::move(db);
  out->dir = dir.string();
  return absl::OkStatus();
}

ShardSet::~ShardSet() {
  shards_.clear();
  for (Database* d : {&db_, &scratch_db_}) {
    if (d->db == nullptr) continue;
    d->db.reset();
    std::error_code ec;
    fs::remove_all(d->dir, ec);
    // rank_<r> too, unless another database is still in it.
    fs::remove(fs::path(d->dir).parent_path(), ec);
  }
}

ShardSet::Staged::~Staged() {
  stores.clear();
  if (database.db != nullptr) {
    database.db.reset();
    std::error_code ec;
    fs::remove_all(database.dir, ec);
  }
}

bool ShardSet::InDatabase(int j) const {
  return store(j)->capabilities().checkpoint ==
         embedding::CheckpointForm::kDatabase;
}

int ShardSet::WholeLocal(int k) const {
  if (plan_.tables[k].kind != SHARDING_TABLE_WISE &&
      plan_.tables[k].kind != SHARDING_DATA_PARALLEL) {
    return -1;
  }
  for (int j = 0; j < size(); ++j) {
    if (shards_[j].table == k) return j;
  }
  return -1;
}

embedding::EmbeddingStore* ShardSet::WholeStore(int k) const {
  const int j = WholeLocal(k);
  return j < 0 ? nullptr : store(j);
}

embedding::EmbeddingTable* ShardSet::WholeHostTable(int k) const {
  auto* host = dynamic_cast<embedding::HostStore*>(WholeStore(k));
  return host == nullptr ? nullptr : &host->table();
}

embedding::StoreMetrics ShardSet::HostCacheMetrics() const {
  embedding::StoreMetrics total;
  for (const Shard& s : shards_) {
    const embedding::StoreCapabilities c = s.store->capabilities();
    if (c.cache_rows > 0 && !c.device_cache) total += s.store->metrics();
  }
  return total;
}

embedding::StoreBytes ShardSet::MemoryBytes() const {
  embedding::StoreBytes total;
  for (const Shard& s : shards_) total += s.store->MemoryBytes();
  return total;
}

absl::StatusOr<std::unique_ptr<ShardSet::Staged>> ShardSet::Stage(
    const std::string& dir) const {
  if (db_.db == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " holds no shard whose rows are in a database"));
  }
  auto staged = std::make_unique<Staged>();
  // On error the staged copy (and its directory) goes away with `staged`.
  RETURN_IF_ERROR(OpenDatabase(dir, &staged->database));
  staged->stores.resize(shards_.size());
  for (int j = 0; j < size(); ++j) {
    if (!InDatabase(j)) continue;
    ASSIGN_OR_RETURN(staged->stores[j],
                     MakeStore({shards_[j].table, shards_[j].shard},
                               &staged->database, /*scratch=*/nullptr));
  }
  return staged;
}

void ShardSet::Swap(std::unique_ptr<Staged> staged) {
  for (int j = 0; j < size(); ++j) {
    if (staged->stores[j] != nullptr) {
      shards_[j].store = std::move(staged->stores[j]);
    }
  }
  staged->stores.clear();
  std::swap(db_, staged->database);
  // `staged` now holds the old database: dropping it removes it.
}

}  // namespace dlrm::model
