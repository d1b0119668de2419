// Storage tiers for embedding rows (docs/storage.md): where the
// rows of one table or shard live, and the slot array the unchanged pooling
// and fused-optimizer kernels of EmbeddingTable run on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/status.h"
#include "data/batch.h"
#include "dlrm/config.pb.h"
#include "embedding/embedding_table.h"

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace dlrm::embedding {

class DynamicIdMap;
class HostStore;
class RowDatabase;

// What a table (or shard) is: EmbeddingTable's constructor arguments.
struct TableSpec {
  // Index of the table in the model (seeds its initial values). Default: 0.
  int table_index = 0;
  // Rows of this table or shard; ids are in [0, rows). Default: 0 (invalid).
  int64_t rows = 0;
  // Columns of this table or shard. Default: 0 (invalid).
  int dim = 0;
  // Sum or mean over a bag. Default: POOLING_SUM.
  Pooling pooling = POOLING_SUM;
  // Normalised optimizer (core/config.h); ADAGRAD means row-wise. Default:
  // an empty config (SGD with learning rate 0).
  OptimizerConfig optimizer;
  // Seed of InitialValue. Default: 0.
  uint64_t seed = 0;
  // Where a shard sits in its table. Default: the whole table.
  TableSlice slice;
  // Precision of the weights (TableConfig.weight_precision): 16-bit rows
  // on the host tier (HostStore), the RocksDB tier (RocksDbCachedStore: its
  // slots and its values) and host slots (HostSlots); not the device tier.
  // Default: ROW_FP32.
  RowPrecision precision = ROW_FP32;

  // Floats of one row's record (EmbeddingStore::ReadRows / WriteRows): dim
  // weights, then StateFloatsPerRow(optimizer, dim) state floats.
  int64_t RecordFloats() const;

  // InvalidArgument when rows or dim is not positive, the pooling is not sum
  // or mean, the optimizer type has no embedding-row rule (LAMB, LARS, an
  // unknown type), the slice lies outside a positive table_rows, or the
  // precision is not a RowPrecision.
  absl::Status Validate() const;
};

// Floats of optimizer state one row carries: optim::SparseStateFloatsPerRow
// (0 for SGD, 1 for row-wise Adagrad, 2 * dim for Adam), kept here for the
// callers that ask the embedding module.
int StateFloatsPerRow(const OptimizerConfig& optimizer, int dim);

// InvalidArgument naming the table unless rows [begin, begin + count) lie
// in [0, spec.rows) (count >= 0).
absl::Status CheckRowRange(const TableSpec& spec, int64_t begin, int64_t count);

// InvalidArgument naming table `table_index` unless the offsets of `ids`
// start at 0, never decrease and end at its id count (or are empty, with no
// ids).
absl::Status CheckBagOffsets(int table_index, const data::SparseFeature& ids);

// InvalidArgument naming table `table_index` and the position of the first
// id of `ids` outside [0, rows).
absl::Status CheckIdsInRange(int table_index, int64_t rows,
                             const data::SparseFeature& ids);

// Usage counters of a store since it was created. Row counts are unique
// rows of prepared batches.
struct StoreMetrics {
  // Rows of a prepared batch that were already resident.
  int64_t hits = 0;
  // Rows of a prepared batch that had to be loaded (read or initialised).
  int64_t misses = 0;
  // Misses served from the prefetch staging area instead of a read.
  int64_t prefetch_hits = 0;
  // Resident rows dropped to make room (clean or dirty).
  int64_t evictions = 0;
  // Rows found in RocksDB, and never-written rows initialised instead
  // (CachedStore: records read from its backing store, cached_store.h).
  int64_t rows_read = 0;
  int64_t rows_initialized = 0;
  // Rows written back to RocksDB (dirty evictions, counted when queued for
  // the background write, and flushes; CachedStore: to its backing store).
  int64_t rows_written = 0;
  // Value bytes read from and written to RocksDB.
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  // Writes of rows retried after RocksDB failed them (a failed flush) and
  // was asked to recover (RocksDbStoreOptions::write_retries).
  int64_t write_retries = 0;
  // Dynamic tables (DynamicStore): new ids given a row, ids that lost theirs
  // to a new id (expired ones included), new ids the policy admitted that
  // found no row (their bucket held only ids of the same batch), and ids
  // without a row that predictions and PrepareLookup pooled.
  int64_t ids_admitted = 0;
  int64_t ids_evicted = 0;
  int64_t ids_refused = 0;
  int64_t unknown_lookups = 0;
  // A gauge, not a counter: rows that hold an id now (summed over shards,
  // a column-wise table counts its rows once per shard).
  int64_t ids_occupied = 0;

  // Every field, in declaration order (for sums and for sending them).
  static constexpr int kNumFields = 15;
  static constexpr int64_t StoreMetrics::*kFields[kNumFields] = {
      &StoreMetrics::hits,          &StoreMetrics::misses,
      &StoreMetrics::prefetch_hits, &StoreMetrics::evictions,
      &StoreMetrics::rows_read,     &StoreMetrics::rows_initialized,
      &StoreMetrics::rows_written,  &StoreMetrics::bytes_read,
      &StoreMetrics::bytes_written, &StoreMetrics::write_retries,
      &StoreMetrics::ids_admitted,  &StoreMetrics::ids_evicted,
      &StoreMetrics::ids_refused,   &StoreMetrics::unknown_lookups,
      &StoreMetrics::ids_occupied};
  StoreMetrics& operator+=(const StoreMetrics& other) {
    for (const auto field : kFields) this->*field += other.*field;
    return *this;
  }
};

// Bytes a store holds now, by where they are.
struct StoreBytes {
  // Host memory: rows, optimizer state, cache slots, staging buffers.
  int64_t host = 0;
  // Memory of the store's CUDA device.
  int64_t device = 0;
  // Files on disk (RocksDB's live files for the store's rows; rows still
  // in its memtables count under host).
  int64_t disk = 0;

  StoreBytes& operator+=(const StoreBytes& other) {
    host += other.host;
    device += other.device;
    disk += other.disk;
    return *this;
  }
};

// How a checkpoint keeps a store's rows (EmbeddingStore::Save).
enum class CheckpointForm {
  // Tensors of the rank's safetensors file: the rows in host memory, in
  // place or copied there.
  kTensors,
  // A checkpoint of the RowDatabase that holds the rows, copied whole.
  kDatabase,
};

// What a tier does, for the callers that choose a path by it (the step,
// checkpoints, the predictors, metrics). TierCapabilities(options) is what
// a store made from `options` reports: decisions the ranks make together
// ask it of the config, a rank's own ask its store.
struct StoreCapabilities {
  // The step sends the store the next batch's ids (Prefetch stages reads
  // worth waiting for: RocksDB's).
  bool prefetch = false;
  // PoolReadOnly may run on another thread beside the store's caller
  // (predictions beside a training step).
  bool read_beside_step = false;
  // Rows kept resident in front of the whole table (a cache's slots, at
  // most the store's rows); 0 when every row is resident. The step gathers
  // the counters of stores with a cache.
  int64_t cache_rows = 0;
  // Whether the cache is in device memory (its counters count records
  // read from and written back to the tier behind it).
  bool device_cache = false;
  CheckpointForm checkpoint = CheckpointForm::kTensors;
};

// Where a checkpoint puts a store's rows: EmbeddingStore::Save calls one of
// these with the rows in the store's checkpoint form (model/checkpoint.cc
// writes them).
class RowsSink {
 public:
  virtual ~RowsSink() = default;
  // The store's rows, optimizer state and step counter in host memory:
  // the store's own table (`copy` null; valid while the store lives and
  // is not changed), or a copy, which `copy` owns and hands to the sink.
  virtual absl::Status Tensors(const EmbeddingTable& rows,
                               std::unique_ptr<HostStore> copy) = 0;
  // The store's rows are in `db`, flushed (step counter included): the
  // checkpoint copies the database, once however many stores it holds.
  virtual absl::Status Database(RowDatabase& db) = 0;
  // A dynamic table's id map (DynamicStore::Save, after its rows): valid
  // while the store lives and is not changed. A sink that keeps no maps
  // fails the save (Unimplemented) rather than lose it.
  virtual absl::Status IdMap(const DynamicIdMap& map) {
    return absl::UnimplementedError(
        "this checkpoint sink cannot keep a dynamic table's id map");
  }
};

// The rows of one table or shard with their optimizer state, and the
// kernels over them. A batch is first Prepare()d, which makes its rows
// resident and gives the ids the kernels take; Forward and BackwardUpdate
// then run on that prepared batch. Implementations: HostStore (every row
// resident, no remapping), RocksDbCachedStore (rocksdb_store.h),
// CachedStore (cached_store.h, slots in front of a backing store),
// DynamicStore (dynamic_store.h, raw ids mapped onto any of them) and, in
// builds with CUDA, cuda::CudaStore (cuda/cuda_store.h, rows in GPU memory).
// Not thread-safe: one caller at a time (a store may run its own
// background prefetch, which it synchronises itself), except PoolReadOnly,
// which other threads may call beside that caller (see there), and
// UpdateRange, which several threads may call at once for disjoint ranges
// between BeginUpdate and EndUpdate.
class EmbeddingStore {
 public:
  virtual ~EmbeddingStore() = default;

  virtual const TableSpec& spec() const = 0;

  // Where Forward's `out` and BackwardUpdate's `grad` live: host memory, or
  // the memory of the store's CUDA device. Every other pointer the store
  // takes (ids, ReadRows / WriteRows records) is host memory on every tier.
  virtual MemorySpace memory_space() const = 0;

  // Makes every row of `ids` resident and returns the batch the kernels
  // take: `&ids` itself where rows are their own slots, otherwise a
  // remapped copy owned by the store. The result stays valid, and its rows
  // resident, until the next Prepare. ResourceExhausted when the batch has
  // more unique ids than the store keeps resident; InvalidArgument for an id
  // outside [0, rows) (checked where remapping happens and on the device);
  // RocksDB failures as the closest code (Unavailable, DataLoss, Internal).
  // A failed Prepare leaves the stored rows unchanged.
  virtual absl::StatusOr<const data::SparseFeature*> Prepare(
      const data::SparseFeature& ids) = 0;

  // Prepare in two halves, for a step whose shards must all be ready before
  // any of them changes (Model's training step): PrepareStaged gives what
  // Prepare gives and makes the rows resident, but holds back what else
  // Prepare would change (a dynamic table's admissions) until
  // CommitPrepared, which must come before Forward. The next Prepare,
  // PrepareStaged or PrepareLookup, and AbandonPrepared (the step was
  // refused), drop an uncommitted one. On every tier but a dynamic table's
  // (DynamicStore) the first half is Prepare and the others do nothing.
  virtual absl::StatusOr<const data::SparseFeature*> PrepareStaged(
      const data::SparseFeature& ids) {
    return Prepare(ids);
  }
  virtual absl::Status CommitPrepared() { return absl::OkStatus(); }
  virtual void AbandonPrepared() {}

  // Prepare for a batch that is pooled and never updated (Model's
  // predictions): Prepare itself on every tier but a dynamic table's
  // (DynamicStore), which maps the ids it knows and admits none.
  virtual absl::StatusOr<const data::SparseFeature*> PrepareLookup(
      const data::SparseFeature& ids) {
    return Prepare(ids);
  }

  // EmbeddingTable::Forward on `prepared`, the result of the last Prepare:
  // bag s pooled into out + s * out_stride, `out` in memory_space().
  // FailedPrecondition when `prepared` is not that result (where it can
  // tell). Host tiers are done on return; the device tier may only have
  // queued the work (Synchronize).
  virtual absl::Status Forward(const data::SparseFeature& prepared, float* out,
                               int64_t out_stride) const = 0;

  // EmbeddingTable::BackwardUpdate on `prepared`, the result of the last
  // Prepare, with bag s's gradient at grad + s * grad_stride, `grad` in
  // memory_space(); the touched rows become dirty. FailedPrecondition as
  // Forward. Done on return, or queued, as Forward.
  virtual absl::Status BackwardUpdate(const data::SparseFeature& prepared,
                                      const float* grad,
                                      int64_t grad_stride) = 0;

  // BackwardUpdate in pieces, so that several threads share one big
  // table's update (UpdateStores, store_update.h). BeginUpdate takes
  // BackwardUpdate's arguments, does the serial part (deduplicates the
  // batch's ids, counts the step) and returns u, the batch's distinct rows;
  // UpdateRange(begin, end) then updates distinct rows [begin, end), and
  // calls for disjoint ranges may run at once on different threads (no row
  // is written by two, no atomics); once ranges covering [0, u) have each
  // run once, EndUpdate finishes (the touched rows become dirty). The rows
  // then hold BackwardUpdate's bits: a row's gradient is summed in bag
  // order whatever the ranges. `prepared` and `grad` must stay valid until
  // EndUpdate; no other call on the store in between. Errors as
  // BackwardUpdate. A tier that cannot split (the device tier, whose
  // update is queued kernels, and a cache of device slots) keeps the
  // default: BeginUpdate runs the whole BackwardUpdate and returns 0.
  virtual absl::StatusOr<int64_t> BeginUpdate(
      const data::SparseFeature& prepared, const float* grad,
      int64_t grad_stride) {
    RETURN_IF_ERROR(BackwardUpdate(prepared, grad, grad_stride));
    return 0;
  }
  virtual absl::Status UpdateRange(int64_t begin, int64_t end) {
    return absl::FailedPreconditionError(
        "UpdateRange: this store's BeginUpdate does the whole update");
  }
  virtual absl::Status EndUpdate() { return absl::OkStatus(); }

  // Waits until the work earlier Forward and BackwardUpdate calls queued is
  // done, so `out` may be read and `grad` reused; returns the first error
  // that work met. A no-op returning OK on tiers whose calls are done on
  // return (host memory, RocksDB).
  virtual absl::Status Synchronize() = 0;

  // Starts loading the rows of the next batch that are not resident in the
  // background (RocksDbCachedStore on its database's worker, CachedStore on
  // a thread of its own), so the next Prepare finds them staged. Only the
  // latest call's rows are staged. Optional: Prepare is correct without it.
  virtual absl::Status Prefetch(const data::SparseFeature& next_ids) = 0;

  // Pools each bag of `ids` (table row ids, not a prepared batch) into host
  // memory at out + s * out_stride from every row's current value, wherever
  // the row lives, bitwise as Forward on the prepared batch would; changes
  // nothing in the store (no row becomes resident, no eviction order,
  // staging or counter moves but a dynamic table's unknown_lookups), so the
  // caller's results are the same with or without it. Thread-safe beside every
  // other call on the store, its background jobs included, except the calls
  // that change a row's value (BackwardUpdate, WriteRows), which the callers
  // keep apart (Model's weights_mutex()). InvalidArgument naming the table for
  // an id outside [0, rows) where the tier checks ids (the host tier, like its
  // Prepare, does not); FailedPrecondition on tiers that cannot read beside
  // their caller (the device tier); RocksDB failures as Prepare.
  virtual absl::Status PoolReadOnly(const data::SparseFeature& ids, float* out,
                                    int64_t out_stride) const = 0;

  // Copies the records of rows [begin, begin + count) into `out`, one after
  // another: each row's dim weights then its StateFloatsPerRow state
  // floats, wherever the row lives; does not make rows resident.
  // InvalidArgument for a range outside [0, rows). (A checkpoint's restore
  // reads a table through it whatever its tier.)
  virtual absl::Status ReadRows(int64_t begin, int64_t count, float* out) = 0;
  absl::Status ReadRow(int64_t row, float* out) {
    return ReadRows(row, 1, out);
  }

  // Sets rows [begin, begin + count) from records laid out as ReadRows
  // writes them, wherever the rows live (a resident row changes in its slot
  // and becomes dirty; the others go to the backing tier). InvalidArgument
  // for a range outside [0, rows); the tier's write errors otherwise.
  virtual absl::Status WriteRows(int64_t begin, int64_t count,
                                 const float* records) = 0;

  // Writes every dirty row (and the step counter) to the backing tier, so a
  // checkpoint of that tier holds the table. No-op in host memory.
  virtual absl::Status Flush() = 0;

  // Updates applied so far (Adam's bias correction uses it): one counter
  // per table, as in EmbeddingTable. set_step is for restores (a tier that
  // keeps it stores it at the next Flush).
  virtual int64_t step() const = 0;
  virtual void set_step(int64_t step) = 0;

  // Replaces the optimizer's constants (learning rate, schedule, eps, ...)
  // in spec() and the kernels, from the next BackwardUpdate on (a live
  // change, Model::SetOptimizers). InvalidArgument naming the table when
  // `optimizer` has another type or initial_accumulator than spec()'s
  // (the state the rows carry would change meaning); a background job's
  // error where the tier waits for its jobs first.
  virtual absl::Status SetOptimizer(const OptimizerConfig& optimizer) = 0;

  virtual StoreMetrics metrics() const = 0;

  // What the tier does: TierCapabilities of the options it was made from.
  virtual StoreCapabilities capabilities() const = 0;

  // Bytes the store holds now, by place (for metrics and ModelInfo; the
  // plan before a model exists is model/memory_plan.h's).
  virtual StoreBytes MemoryBytes() const = 0;

  // The checkpoint hook: hands the rows to `sink` in the store's checkpoint
  // form (capabilities().checkpoint), after writing back what the form
  // needs (a database store flushes first). The sink's error, or the
  // tier's read or flush error.
  virtual absl::Status Save(RowsSink& sink) = 0;
};

// Bytes of `table`'s weights (2 per weight in 16 bits) and optimizer state
// arrays.
int64_t TableBytes(const EmbeddingTable& table);

// Save for stores whose rows are not a host EmbeddingTable of their own:
// copies them into host memory through ReadRows, a chunk at a time, with
// the step counter, and hands the copy to sink.Tensors.
absl::Status SaveHostCopy(EmbeddingStore& store, RowsSink& sink);

// OK when a store of `spec` may take `optimizer` in SetOptimizer (the same
// type and initial_accumulator); InvalidArgument naming the table and both
// values otherwise.
absl::Status CheckOptimizerChange(const TableSpec& spec,
                                  const OptimizerConfig& optimizer);

// Every row in host memory: an EmbeddingTable, today's behaviour. Prepare
// returns the ids unchanged (no remapping, no id check, no work).
class HostStore final : public EmbeddingStore {
 public:
  explicit HostStore(const TableSpec& spec);

  const TableSpec& spec() const override { return spec_; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  absl::StatusOr<const data::SparseFeature*> Prepare(
      const data::SparseFeature& ids) override {
    return &ids;
  }
  absl::Status Forward(const data::SparseFeature& prepared, float* out,
                       int64_t out_stride) const override;
  absl::Status BackwardUpdate(const data::SparseFeature& prepared,
                              const float* grad, int64_t grad_stride) override;
  // EmbeddingTable::BeginUpdate / UpdateRows on the table.
  absl::StatusOr<int64_t> BeginUpdate(const data::SparseFeature& prepared,
                                      const float* grad,
                                      int64_t grad_stride) override {
    return table_.BeginUpdate(prepared, grad, grad_stride);
  }
  absl::Status UpdateRange(int64_t begin, int64_t end) override {
    table_.UpdateRows(begin, end);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status Prefetch(const data::SparseFeature& next_ids) override {
    return absl::OkStatus();
  }
  // EmbeddingTable::Forward on the table itself (it only reads).
  absl::Status PoolReadOnly(const data::SparseFeature& ids, float* out,
                            int64_t out_stride) const override {
    table_.Forward(ids, out, out_stride);
    return absl::OkStatus();
  }
  absl::Status ReadRows(int64_t begin, int64_t count, float* out) override;
  absl::Status WriteRows(int64_t begin, int64_t count,
                         const float* records) override;
  absl::Status Flush() override { return absl::OkStatus(); }
  int64_t step() const override { return table_.step(); }
  void set_step(int64_t step) override { table_.set_step(step); }
  absl::Status SetOptimizer(const OptimizerConfig& optimizer) override;
  // All zero: nothing is ever missed, evicted or read.
  StoreMetrics metrics() const override { return {}; }
  StoreCapabilities capabilities() const override;
  // The table's arrays, in host memory.
  StoreBytes MemoryBytes() const override;
  // The table itself, as tensors (no copy).
  absl::Status Save(RowsSink& sink) override {
    return sink.Tensors(table_, nullptr);
  }

  EmbeddingTable& table() { return table_; }

 private:
  TableSpec spec_;
  EmbeddingTable table_;
};

// Which tier a store uses.
enum class StoreKind {
  // Every row in host memory (HostStore).
  kHost,
  // RocksDB behind a host cache of rows (RocksDbCachedStore).
  kRocksDbCache,
  // Every row in the memory of CUDA device 0 (cuda::CudaStore), or the hot
  // rows there in front of every row in host memory or RocksDB
  // (StoreOptions::device_cache); needs a build with CUDA and a device.
  kDevice,
};

// How replaced rows are chosen in a cache.
enum class EvictionPolicy {
  // Least recently used batch first.
  kLru,
  // Fewest batches that used the row since it became resident first; ties
  // by LRU.
  kLfu,
};

// Options of RocksDB-backed tiers: the database (RowDatabase) and the host
// cache in front of each table (RocksDbCachedStore). Spill writes never go
// through the write-ahead log: durability comes from checkpoints.
struct RocksDbStoreOptions {
  // Directory of the RocksDB database; created if missing. Default: "" (must
  // be set).
  std::string path;
  // Rows of one table kept resident (its slots); also the most unique ids one
  // batch may hold. Default: 1 << 20.
  int64_t cache_rows = int64_t{1} << 20;
  // Which resident row a miss replaces. Default: kLru.
  EvictionPolicy eviction = EvictionPolicy::kLru;
  // RocksDB block cache shared by all tables of the database; 0 uses
  // RocksDB's own default (8 MiB). Default: 256 MiB.
  int64_t block_cache_bytes = int64_t{256} << 20;
  // Bloom filter bits per key (about 1% false positives at 10), so reads of
  // never-written rows skip the disk; 0 disables it. Default: 10.
  int bloom_bits_per_key = 10;
  // Memtable bytes of one column family before RocksDB flushes it to a file
  // (up to two per family in memory): bigger means fewer flushes and
  // compactions, more memory. Default: 64 MiB.
  int64_t write_buffer_bytes = int64_t{64} << 20;
  // Times a write of rows that failed is retried, each after RocksDB was
  // asked to recover from the background error behind it (a flush that
  // failed stops its writes), before the step fails; the rows stay
  // buffered either way (docs/storage.md "Storage faults"). Default: 2.
  int write_retries = 2;
  // The file system RocksDB works through; null is RocksDB's default (the
  // OS). Tests put a fault-injecting one here
  // (embedding/rocksdb_fault_injection.h). Default: null.
  std::shared_ptr<rocksdb::FileSystem> file_system;

  // InvalidArgument naming the field when one is out of range.
  absl::Status Validate() const;
};

// Options of a cache of rows in slots (host or device memory) in front of
// a backing store (CachedStore, cached_store.h).
struct CacheOptions {
  // Slots: rows resident in the cache, and the most unique ids one batch
  // may hold. Default: 0 (invalid).
  int64_t cache_rows = 0;
  // Which resident row a miss replaces. Default: kLru.
  EvictionPolicy eviction = EvictionPolicy::kLru;
  // Whether Prefetch reads the backing store on the cache's own thread,
  // returning at once (the next call that needs the backing store waits for
  // it), or on the caller's before it returns. Default: true.
  bool background_prefetch = true;
  // Whether, over a HostStore, misses are copied straight from its arrays
  // into their slots and dirty victims straight back, queued on the slots
  // (SlotStorage::MapHostTable: the device pins and maps the arrays), with
  // no prefetch; false, or slots that cannot map them: records move
  // through host buffers of the cache's own and the prefetch staging.
  // Trains the same either way. Default: true.
  bool direct_host_access = true;

  // InvalidArgument naming the field when one is out of range.
  absl::Status Validate() const;
};

// Which tier, and its options.
struct StoreOptions {
  // Tier of the table's rows. Default: kHost.
  StoreKind kind = StoreKind::kHost;
  // Used when kind is kRocksDbCache. Default: see RocksDbStoreOptions.
  RocksDbStoreOptions rocksdb;
  // Used when kind is kDevice: the CUDA stream (a cudaStream_t, passed as
  // void* so that this header needs no CUDA) the store queues all its work
  // on, borrowed; it must outlive the store. Null: the store creates a
  // stream of its own. Default: null.
  void* cuda_stream = nullptr;
  // Used when kind is kDevice: with cache_rows > 0, only that many rows and
  // their optimizer state (slots) live in device memory, a cache in front
  // of the whole table in the device_cache_backing tier
  // (cuda::CreateDeviceCachedStore); cache_rows 0 keeps every row in
  // device memory (cuda::CudaStore). Default: cache_rows 0.
  CacheOptions device_cache;
  // Used when kind is kDevice with device_cache.cache_rows > 0: the tier of
  // the store behind the device cache, kHost (every row in host memory) or
  // kRocksDbCache (a RocksDbCachedStore with `rocksdb`'s options in the
  // factory's `db`). Default: kHost.
  StoreKind device_cache_backing = StoreKind::kHost;
  // Whether the table is dynamic (TableConfig.dynamic): the store is a
  // DynamicStore (dynamic_store.h) mapping raw ids onto a store of the
  // tier above, with the fields below and the spec's seed. Default: false.
  bool dynamic = false;
  // Used when dynamic: TableConfig's admission, eviction and unadmitted.
  // Default: their protos' defaults (every id, LRU, zero rows).
  Admission admission;
  Eviction eviction;
  UnadmittedIds unadmitted = UNADMITTED_ZERO;

  // InvalidArgument when the chosen tier's options are invalid.
  absl::Status Validate() const;
};

// What a store CreateEmbeddingStore(spec, options, db) makes reports as
// its capabilities(), for a spec of `rows` rows.
StoreCapabilities TierCapabilities(const StoreOptions& options, int64_t rows);

// The tier and options of a shard of `rows` rows of `table` (its storage,
// device_cache_rows and device_cache_backing) under `rocksdb`: the row
// cache's size (CachedRows) and eviction, the block cache. Leaves
// rocksdb.path and cuda_stream to the caller, which owns the database and
// the stream.
StoreOptions StoreOptionsFor(const TableConfig& table,
                             const RocksDbConfig& rocksdb, int64_t rows);

// TierCapabilities of StoreOptionsFor(table, rocksdb, rows): what the
// stores of a table's shards of `rows` rows do, known on every rank.
StoreCapabilities TableCapabilities(const TableConfig& table,
                                    const RocksDbConfig& rocksdb, int64_t rows);

// Whether a store of `options` keeps its rows in the RowDatabase the
// factory takes (kRocksDbCache, or a device cache backed by it).
bool NeedsDatabase(const StoreOptions& options);

// Creates the store `options.kind` names for `spec` (wrapped in a
// DynamicStore when options.dynamic). `db` is used (and must
// outlive the store) for kRocksDbCache, and for kDevice with a device cache
// backed by kRocksDbCache, where it must not be null; the table's rows go
// to its own column family there. InvalidArgument for bad
// spec or options (a 16-bit spec.precision on kDevice, which keeps fp32
// rows); FailedPrecondition naming CudaUnavailableReason() for
// kDevice in a binary without CUDA or a process without a device; else the
// tier's open errors.
absl::StatusOr<std::unique_ptr<EmbeddingStore>> CreateEmbeddingStore(
    const TableSpec& spec, const StoreOptions& options, RowDatabase* db);

}  // namespace dlrm::embedding
