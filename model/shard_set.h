// The embedding shards one rank holds and the stores their rows live in
// (docs/architecture.md "Where rows live"): every store is built through
// the tiers' factory (embedding::StoreOptionsFor, CreateEmbeddingStore),
// and the RocksDB databases the tiers need are opened, owned and removed
// here. Model, checkpoints, the predictors and metrics ask the set and its
// stores (EmbeddingStore::capabilities, MemoryBytes, Save), not a table's
// storage field.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"
#include "embedding/embedding_store.h"
#include "embedding/row_database.h"
#include "embedding/sharding.h"
#include "model/exchange.h"

namespace dlrm::model {

// What shard `ref` of `plan`'s store holds: its rows and columns, the
// config's sparse optimizer and seed; a row-wise shard pools sums (the
// sample's rank adds the shards' sums and applies the mean itself: it
// alone knows whole bag lengths).
embedding::TableSpec ShardSpec(const ModelConfig& config,
                               const embedding::ShardingPlan& plan,
                               const ShardRef& ref);

// One rank's stores, in the order of the refs it was made with (Model's:
// table then shard order). Its databases, one directory each under
// <config.rocksdb.path>/rank_<r> (unique per process and call: a restore
// beside the live one never shares it), are scratch: durability comes
// from checkpoints. Stores whose checkpoint form is kDatabase share the
// checkpointed database (database()); the others that need one (a device
// cache backed by RocksDB, saved as tensors) share a second. Not
// thread-safe: its owner's caller only, as the stores.
class ShardSet {
 public:
  // A shard and its store.
  struct Shard {
    // The plan's table and shard index.
    int table = 0;
    int shard = 0;
    std::unique_ptr<embedding::EmbeddingStore> store;
  };

  // The stores of `refs`, shards of `plan` on `rank`, each from its
  // table's tier. `config` and `plan` are borrowed and must outlive the
  // set (stores staged later take config's sparse optimizer as it is
  // then); `cuda_stream` (a cudaStream_t, borrowed) for the tiers
  // in device memory. The factory's errors (FailedPrecondition for the
  // device tier without CUDA); Internal naming the path when a database
  // directory cannot be made, else RocksDB's open errors.
  static absl::StatusOr<std::unique_ptr<ShardSet>> Create(
      const ModelConfig& config, const embedding::ShardingPlan& plan, int rank,
      const std::vector<ShardRef>& refs, void* cuda_stream);

  // Closes the stores, then the databases, and removes their directories
  // (and rank_<r>, unless another database is still in it).
  ~ShardSet();
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  int size() const { return static_cast<int>(shards_.size()); }
  const Shard& operator[](int j) const { return shards_[j]; }
  embedding::EmbeddingStore* store(int j) const {
    return shards_[j].store.get();
  }
  // Table `k`'s rows in host memory when this rank holds the table whole
  // in a HostStore, else null.
  embedding::EmbeddingTable* WholeHostTable(int k) const;
  // The store of table `k` when this rank holds it whole (a table-wise
  // shard or a replica), else null.
  embedding::EmbeddingStore* WholeStore(int k) const;

  // Whether some store keeps its rows in the checkpointed database (a
  // checkpoint copies it: CheckpointDatabase).
  bool has_database() const { return db_.db != nullptr; }
  // Counters summed over the stores with a cache in host memory (the row
  // caches on RocksDB).
  embedding::StoreMetrics HostCacheMetrics() const;
  // Bytes of every store, by place.
  embedding::StoreBytes MemoryBytes() const;

  // A database of this rank and its directory.
  struct Database {
    std::unique_ptr<embedding::RowDatabase> db;
    std::string dir;
  };

  // The restore of the database form, in two steps so that ranks can agree
  // in between: Stage opens a copy of a checkpoint of the database
  // (made by a sink's Database: RowDatabase::Checkpoint) in `dir`, or a
  // fresh empty database when `dir` is empty, with a new store on it for
  // every shard of the database form, changing nothing in use; Swap puts
  // them in place of the live ones, whose database is then removed.
  struct Staged {
    Staged() = default;
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;
    ~Staged();

    // Declared before the stores so that it outlives them.
    Database database;
    // By shard index; null for shards of the tensor form.
    std::vector<std::unique_ptr<embedding::EmbeddingStore>> stores;
  };
  // NotFound when `dir` is not a directory; FailedPrecondition without a
  // database; RocksDB's errors.
  absl::StatusOr<std::unique_ptr<Staged>> Stage(const std::string& dir) const;
  // Cannot fail. Store pointers taken before it are stale for the shards
  // of the database form.
  void Swap(std::unique_ptr<Staged> staged);

 private:
  ShardSet(const ModelConfig& config, const embedding::ShardingPlan& plan,
           int rank, void* cuda_stream)
      : config_(config), plan_(plan), rank_(rank), cuda_stream_(cuda_stream) {}
  // The store of shard j's ref on the tier its table names, in `checkpointed`
  // when its form is kDatabase, else in `scratch` (either opened on first
  // use).
  absl::StatusOr<std::unique_ptr<embedding::EmbeddingStore>> MakeStore(
      const ShardRef& ref, Database* checkpointed, Database* scratch) const;
  // Opens a fresh database in a new directory (or the checkpoint `from`
  // copied there when not empty) into *out.
  absl::Status OpenDatabase(const std::string& from, Database* out) const;
  // Whether shard j's store keeps its rows in the checkpointed database.
  bool InDatabase(int j) const;
  // The local shard holding table `k` whole, or -1.
  int WholeLocal(int k) const;

  const ModelConfig& config_;
  const embedding::ShardingPlan& plan_;
  const int rank_;
  void* const cuda_stream_;
  // Declared before shards_ so that they outlive the stores.
  Database db_;
  Database scratch_db_;
  std::vector<Shard> shards_;
};

}  // namespace dlrm::model
