// The saved blocks of a checkpoint (model/checkpoint_layout.h): their
// names and files, the layouts of a plan or of one process, and the
// restore that assembles each of this rank's shards from the blocks it
// overlaps (its JSON form: checkpoint_layout_json.cc).
#include "model/checkpoint_layout.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <span>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "embedding/rocksdb_store.h"
#include "embedding/row_precision.h"
#include "model/safetensors.h"
#include "optim/optimizer.h"
#include "spdlog/spdlog.h"

namespace dlrm::model {

namespace fs = std::filesystem;

namespace {

// Rows a restore assembles at a time (bounds its scratch memory).
constexpr int64_t kChunkRows = 4096;

// The rows and columns of the table that a shard of `plan` holds.
struct Block {
  int64_t row_begin, row_end;
  int col_begin, col_end;
};

bool Overlaps(const Block& a, const SavedShard& b) {
  return a.row_begin < b.row_end && b.row_begin < a.row_end &&
         a.col_begin < b.col_end && b.col_begin < a.col_end;
}

Block BlockOf(const embedding::Shard& s) {
  return {s.row_begin, s.row_begin + s.row_count, s.col_begin,
          s.col_begin + s.col_count};
}

// A directory for a copy of a saved database: under the model's RocksDB
// path when it has one, else the system's temporary directory.
std::string ScratchDatabaseDir(const ModelConfig& config) {
  static std::atomic<int64_t> counter{0};
  const fs::path base = config.rocksdb().path().empty()
                            ? fs::temp_directory_path()
                            : fs::path(config.rocksdb().path());
  while (true) {
    const fs::path dir =
        base / absl::StrCat("restore-source-", ::getpid(), "-", counter++);
    if (!fs::exists(dir)) return dir.string();
  }
}

}  // namespace

std::string StateTensorName(const std::string& base,
                            const optim::StateArray& array) {
  return absl::StrCat(base, ".", array.name);
}

std::vector<int64_t> StateTensorShape(const optim::StateArray& array,
                                      int64_t rows, int64_t cols) {
  if (array.extent == optim::Extent::kRow) return {rows};
  return {rows, cols};
}

int64_t MetadataStep(const std::map<std::string, std::string>& meta,
                     const std::string& key) {
  auto it = meta.find(key);
  int64_t step = 0;
  if (it == meta.end() || !absl::SimpleAtoi(it->second, &step)) return 0;
  return step;
}

std::string RankFileName(int rank) {
  return absl::StrCat("rank-", rank, ".safetensors");
}

std::string RankRocksDbDir(int rank) {
  return absl::StrCat("rank-", rank, ".rocksdb");
}

std::string ShardBase(const ModelConfig& config, int table, int shard) {
  return absl::StrCat("embedding_bags.", config.tables(table).name(), ".shard",
                      shard);
}

absl::Status SavedLayout::Validate(const ModelConfig& config) const {
  if (static_cast<int>(tables.size()) != config.tables_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layout has ", tables.size(), " tables, the config ",
                     config.tables_size()));
  }
  for (int k = 0; k < config.tables_size(); ++k) {
    const TableConfig& t = config.tables(k);
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("the layout of table ", t.name(), ": ", what));
    };
    int64_t area = 0;
    const std::vector<SavedShard>& blocks = tables[k];
    for (size_t i = 0; i < blocks.size(); ++i) {
      const SavedShard& b = blocks[i];
      if (b.row_begin < 0 || b.row_end > t.rows() || b.rows() <= 0 ||
          b.col_begin < 0 || b.col_end > t.dim() || b.cols() <= 0 ||
          b.rank < 0 || b.rank >= world_size) {
        return bad(absl::StrCat("block ", i, " lies outside the table"));
      }
      for (size_t j = 0; j < i; ++j) {
        const SavedShard& o = blocks[j];
        if (Overlaps({b.row_begin, b.row_end, b.col_begin, b.col_end}, o)) {
          return bad(absl::StrCat("blocks ", j, " and ", i, " overlap"));
        }
      }
      area += b.rows() * b.cols();
    }
    if (area != t.rows() * t.dim()) {
      return bad("its blocks do not cover the table");
    }
  }
  return absl::OkStatus();
}

namespace {

// Whether table k's stores save their rows as a database checkpoint
// (embedding::CheckpointForm::kDatabase), not as tensors.
bool InDatabase(const ModelConfig& config, int k) {
  const TableConfig& t = config.tables(k);
  return embedding::TableCapabilities(t, config.rocksdb(), t.rows())
             .checkpoint == embedding::CheckpointForm::kDatabase;
}

// Copies columns [c0, c1) of the saved record `src` (of block `b`, its
// columns from b.col_begin) into the record `dst` of target block `t`:
// the weights, and unless `weights_only` each state array of `arrays`. A
// per-row array of a block that is part of the target's columns counts by
// its share of them: a row-wise Adagrad accumulator of several column
// blocks becomes their column-weighted mean, one of a whole row is copied
// to each of its blocks.
void CopyColumns(const float* src, const SavedShard& b, float* dst,
                 const Block& t, int c0, int c1,
                 std::span<const optim::StateArray> arrays, bool weights_only) {
  const int scols = b.cols(), tcols = t.col_end - t.col_begin;
  std::memcpy(dst + (c0 - t.col_begin), src + (c0 - b.col_begin),
              sizeof(float) * (c1 - c0));
  if (weights_only) return;
  const float share = static_cast<float>(c1 - c0) / static_cast<float>(tcols);
  int sat = scols, tat = tcols;
  for (const optim::StateArray& a : arrays) {
    if (a.extent == optim::Extent::kRow) {
      dst[tat] += src[sat] * share;
      ++sat;
      ++tat;
    } else {
      std::memcpy(dst + tat + (c0 - t.col_begin),
                  src + sat + (c0 - b.col_begin), sizeof(float) * (c1 - c0));
      sat += scols;
      tat += tcols;
    }
  }
}

}  // namespace

SavedLayout MultiRankLayout(const ModelConfig& config,
                            const embedding::ShardingPlan& plan) {
  SavedLayout layout;
  layout.world_size = plan.world_size;
  layout.dense_weights_file = layout.dense_state_file = kDenseFile;
  for (int k = 0; k < config.tables_size(); ++k) {
    const embedding::TablePlacement& p = plan.tables[k];
    const bool rocksdb = InDatabase(config, k);
    std::vector<SavedShard>& blocks = layout.tables.emplace_back();
    // A data-parallel table's copies are equal: rank 0's is saved.
    const size_t count = p.kind == SHARDING_DATA_PARALLEL ? 1 : p.shards.size();
    for (size_t s = 0; s < count; ++s) {
      const embedding::Shard& shard = p.shards[s];
      SavedShard b;
      b.rank = shard.rank;
      const Block g = BlockOf(shard);
      b.row_begin = g.row_begin;
      b.row_end = g.row_end;
      b.col_begin = g.col_begin;
      b.col_end = g.col_end;
      if (rocksdb) {
        b.rocksdb_dir = RankRocksDbDir(shard.rank);
      } else {
        b.weights_file = b.state_file = RankFileName(shard.rank);
        b.base = ShardBase(config, k, static_cast<int>(s));
        b.step_key = "table_step." + b.base;
      }
      blocks.push_back(std::move(b));
    }
  }
  return layout;
}

SavedLayout LayoutOf(const Model& model) {
  return MultiRankLayout(model.config(), model.plan());
}

SavedLayout OneProcessLayout(const ModelConfig& config) {
  SavedLayout layout;
  layout.world_size = 1;
  layout.dense_weights_file = "model.safetensors";
  layout.dense_state_file = "optimizer.safetensors";
  for (const TableConfig& t : config.tables()) {
    SavedShard b;
    b.row_end = t.rows();
    b.col_end = t.dim();
    if (InDatabase(config, static_cast<int>(layout.tables.size()))) {
      b.rocksdb_dir = "rocksdb";
    } else {
      b.weights_file = layout.dense_weights_file;
      b.state_file = layout.dense_state_file;
      b.base = absl::StrCat("embedding_bags.", t.name());
      b.step_key = absl::StrCat("table_step.", t.name());
    }
    layout.tables.push_back({b});
  }
  return layout;
}

// ------------------------------------------------------------------ restore

// A saved block being read: its tensors (mapped) or a store over a copy of
// its database.
struct TableRestore::Source {
  SavedShard saved;
  int table;
  // Host: weights [rows, cols] as the file holds them (little-endian words
  // of weight_dtype, F32, F16 or BF16; maybe unaligned), then each state
  // array (empty spans when the restore reads weights only).
  std::span<const char> weight;
  Dtype weight_dtype = Dtype::kF32;
  std::vector<std::span<const float>> state;
  // RocksDB: the block's store.
  std::unique_ptr<embedding::EmbeddingStore> store;
  int64_t step = 0;
  // Floats of one of its records (weights then state).
  int floats;

  // Records of its local rows [begin, begin + count) into `out`.
  absl::Status Read(int64_t begin, int64_t count, float* out,
                    const OptimizerConfig& optimizer) const {
    if (store != nullptr) return store->ReadRows(begin, count, out);
    const int cols = saved.cols();
    const std::span<const optim::StateArray> arrays =
        optim::SparseState(optimizer);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = begin + i;
      float* rec = out + i * floats;
      // Widened to floats (exact); the target's WriteRows narrows them to
      // its precision.
      const char* w = weight.data() + row * cols * DtypeBytes(weight_dtype);
      if (weight_dtype == Dtype::kF32) {
        std::memcpy(rec, w, sizeof(float) * cols);
      } else {
        for (int c = 0; c < cols; ++c) {
          uint16_t word;
          std::memcpy(&word, w + 2 * c, sizeof(word));
          rec[c] = weight_dtype == Dtype::kF16 ? embedding::HalfToFloat(word)
                                               : embedding::Bf16ToFloat(word);
        }
      }
      int at = cols;
      for (size_t a = 0; a < arrays.size(); ++a) {
        const int f = optim::FloatsPerRow(arrays[a], cols);
        if (!state.empty()) {
          std::memcpy(rec + at, state[a].data() + row * f, sizeof(float) * f);
        }
        at += f;
      }
    }
    return absl::OkStatus();
  }
};

// One of this rank's shards being restored.
struct TableRestore::Target {
  int table;
  Block block;
  // The block's columns, and the floats of one record: those weights and
  // their optimizer state.
  int cols = 0;
  int floats = 0;
  embedding::EmbeddingStore* store;
  std::vector<const Source*> sources;
  int64_t step = 0;
  // Host- and device-memory shards: written by Apply, from `buffer` when a
  // source is on RocksDB (read by Stage, as such reads can fail), else
  // straight from the mapped tensors.
  bool host = false;
  std::vector<float> buffer;
  // A shard of RoutedRows: per local row, the saved table row it takes (or
  // -1); empty for a shard restored by row range.
  std::vector<int64_t> routed;
};

struct TableRestore::SourceDatabase {
  std::unique_ptr<embedding::RowDatabase> db;
  std::string dir;
  ~SourceDatabase() {
    db.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

TableRestore::~TableRestore() = default;

std::set<std::string> TableRestore::FilesNeeded(const Model& model,
                                                const SavedLayout& layout,
                                                bool weights_only) {
  std::set<std::string> needed = {layout.dense_weights_file};
  if (!weights_only) needed.insert(layout.dense_state_file);
  const embedding::ShardingPlan& plan = model.plan();
  for (int k = 0; k < static_cast<int>(plan.tables.size()); ++k) {
    for (const embedding::Shard& s : plan.tables[k].shards) {
      if (s.rank != model.rank()) continue;
      for (const SavedShard& b : layout.tables[k]) {
        if (!Overlaps(BlockOf(s), b)) continue;
        if (!b.rocksdb_dir.empty()) {
          needed.insert(b.rocksdb_dir + "/");
        } else {
          needed.insert(b.weights_file);
          if (!weights_only) needed.insert(b.state_file);
        }
      }
    }
  }
  return needed;
}

bool TableRestore::Needed(const std::set<std::string>& needed,
                          const std::string& path) {
  if (needed.contains(path)) return true;
  for (const std::string& n : needed) {
    if (n.ends_with('/') && path.starts_with(n)) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<TableRestore>> TableRestore::Stage(
    Model& model, const fs::path& dir, const ModelConfig& saved,
    const SavedLayout& layout, bool weights_only, const RoutedRows& routed) {
  std::unique_ptr<TableRestore> r(new TableRestore());
  r->model_ = &model;
  r->weights_only_ = weights_only;
  r->arrays_ = optim::SparseState(model.config().sparse_optimizer());
  const ModelConfig& config = model.config();
  const OptimizerConfig& optimizer = config.sparse_optimizer();
  const std::span<const optim::StateArray> arrays =
      optim::SparseState(optimizer);
  auto mismatch = [](const absl::Status& s) {
    if (s.ok() || absl::IsNotFound(s)) return s;
    return absl::FailedPreconditionError(s.message());
  };

  std::map<std::string, SafetensorsFile*> files;
  auto open_file =
      [&](const std::string& name) -> absl::StatusOr<SafetensorsFile*> {
    if (auto it = files.find(name); it != files.end()) return it->second;
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                     SafetensorsFile::Open((dir / name).string()));
    r->files_.push_back(std::move(f));
    files[name] = r->files_.back().get();
    return r->files_.back().get();
  };
  std::map<std::string, embedding::RowDatabase*> databases;
  auto open_database =
      [&](const std::string& name) -> absl::StatusOr<embedding::RowDatabase*> {
    if (auto it = databases.find(name); it != databases.end()) {
      return it->second;
    }
    auto copy = std::make_unique<SourceDatabase>();
    embedding::RocksDbStoreOptions o;
    o.path = copy->dir = ScratchDatabaseDir(config);
    o.cache_rows = 1;
    o.block_cache_bytes = int64_t{16} << 20;
    o.write_buffer_bytes = int64_t{4} << 20;
    absl::StatusOr<std::unique_ptr<embedding::RowDatabase>> db =
        embedding::RowDatabase::RestoreCheckpoint((dir / name).string(), o);
    if (!db.ok()) {
      std::error_code ec;
      fs::remove_all(copy->dir, ec);
      return db.status();
    }
    copy->db = *std::move(db);
    r->databases_.push_back(std::move(copy));
    databases[name] = r->databases_.back()->db.get();
    return databases[name];
  };
  std::map<const SavedShard*, Source*> sources;
  auto source_of = [&](int k, const SavedShard& b) -> absl::StatusOr<Source*> {
    if (auto it = sources.find(&b); it != sources.end()) return it->second;
    auto s = std::make_unique<Source>();
    s->saved = b;
    s->table = k;
    s->floats = b.cols() + optim::SparseStateFloatsPerRow(optimizer, b.cols());
    if (!b.rocksdb_dir.empty()) {
      ASSIGN_OR_RETURN(embedding::RowDatabase * db,
                       open_database(b.rocksdb_dir));
      embedding::TableSpec spec;
      spec.table_index = k;
      spec.rows = b.rows();
      spec.dim = b.cols();
      spec.optimizer = saved.sparse_optimizer();
      spec.seed = saved.seed();
      spec.slice = {saved.tables(k).rows(), b.row_begin, b.col_begin};
      // The saved values' precision; ReadRows widens them (exact).
      spec.precision = saved.tables(k).weight_precision();
      embedding::StoreOptions o;
      o.kind = embedding::StoreKind::kRocksDbCache;
      o.rocksdb = db->options();
      ASSIGN_OR_RETURN(s->store, embedding::CreateEmbeddingStore(spec, o, db));
      s->step = s->store->step();
    } else {
      ASSIGN_OR_RETURN(SafetensorsFile * w, open_file(b.weights_file));
      // Rows of any precision (a table's weight_precision may change on
      // resume: the restore converts).
      const std::string name = b.base + ".weight";
      absl::StatusOr<Dtype> dtype = w->DtypeOf(name);
      if (!dtype.ok()) return mismatch(dtype.status());
      if (*dtype != Dtype::kF32 && *dtype != Dtype::kF16 &&
          *dtype != Dtype::kBF16) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint tensor ", name, " is ", DtypeName(*dtype),
                         ", not F32, F16 or BF16"));
      }
      absl::StatusOr<std::span<const char>> weight =
          w->GetBytes(name, *dtype, {b.rows(), b.cols()});
      if (!weight.ok()) return mismatch(weight.status());
      s->weight = *weight;
      s->weight_dtype = *dtype;
      if (!weights_only) {
        ASSIGN_OR_RETURN(SafetensorsFile * f, open_file(b.state_file));
        for (const optim::StateArray& a : arrays) {
          absl::StatusOr<std::span<const float>> t =
              f->Get(StateTensorName(b.base, a),
                     StateTensorShape(a, b.rows(), b.cols()));
          if (!t.ok()) return mismatch(t.status());
          s->state.push_back(*t);
        }
        s->step = MetadataStep(f->metadata(), b.step_key);
      }
    }
    r->sources_.push_back(std::move(s));
    sources[&b] = r->sources_.back().get();
    return r->sources_.back().get();
  };

  // The plan is the saved one when every shard of every table is a saved
  // block of the same rank, rows, columns, tier and weight precision (a
  // database's values are in its table's precision): then this rank's
  // database is a copy of its saved one, as is.
  const SavedLayout mine = LayoutOf(model);
  bool same_plan = mine.world_size == layout.world_size;
  for (int k = 0; same_plan && k < config.tables_size(); ++k) {
    const auto& a = mine.tables[k];
    const auto& b = layout.tables[k];
    same_plan =
        a.size() == b.size() &&
        (k >= saved.tables_size() || config.tables(k).weight_precision() ==
                                         saved.tables(k).weight_precision());
    for (size_t i = 0; same_plan && i < a.size(); ++i) {
      same_plan = a[i].rank == b[i].rank && a[i].row_begin == b[i].row_begin &&
                  a[i].row_end == b[i].row_end &&
                  a[i].col_begin == b[i].col_begin &&
                  a[i].col_end == b[i].col_end &&
                  a[i].rocksdb_dir.empty() == b[i].rocksdb_dir.empty();
    }
  }
  const ShardSet& shards = model.shards();
  std::string own_database;
  if (same_plan && shards.has_database()) {
    for (int k = 0; k < config.tables_size(); ++k) {
      for (const SavedShard& b : layout.tables[k]) {
        if (b.rank == model.rank() && !b.rocksdb_dir.empty()) {
          own_database = b.rocksdb_dir;
        }
      }
    }
    // A rank whose only database shards are a data-parallel table's copy
    // has no saved block (rank 0's copy is the table's), but saved its
    // database all the same.
    if (own_database.empty()) own_database = RankRocksDbDir(model.rank());
    // Without it, the rows are assembled from the saved blocks instead.
    same_plan = fs::is_directory(dir / own_database);
  }

  if (shards.has_database()) {
    ASSIGN_OR_RETURN(r->staged_rows_,
                     shards.Stage(same_plan ? (dir / own_database).string()
                                            : std::string()));
  }
  for (int j = 0; j < shards.size(); ++j) {
    const ShardSet::Shard& st = shards[j];
    const int k = st.table;
    auto t = std::make_unique<Target>();
    t->table = k;
    t->block = BlockOf(model.plan().tables[k].shards[st.shard]);
    t->cols = t->block.col_end - t->block.col_begin;
    t->floats = t->cols + optim::SparseStateFloatsPerRow(optimizer, t->cols);
    // Stores of the tensor form take the rows in place at Apply (through
    // WriteRows); those of the database form get fresh staged stores.
    t->host = st.store->capabilities().checkpoint ==
              embedding::CheckpointForm::kTensors;
    if (!t->host && same_plan) continue;  // the database copy holds it
    t->store = t->host ? st.store.get() : r->staged_rows_->stores[j].get();
    bool from_rocksdb = false;
    const auto route = routed.find(j);
    if (route != routed.end()) t->routed = route->second;
    for (const SavedShard& b : layout.tables[k]) {
      // A routed shard's rows come from anywhere in the table.
      const bool overlaps = t->routed.empty()
                                ? Overlaps(t->block, b)
                                : t->block.col_begin < b.col_end &&
                                      b.col_begin < t->block.col_end;
      if (!overlaps) continue;
      ASSIGN_OR_RETURN(Source * s, source_of(k, b));
      t->sources.push_back(s);
      t->step = std::max(t->step, s->step);
      from_rocksdb |= s->store != nullptr;
    }
    auto assemble = [&](int64_t begin, int64_t count, float* records) {
      return t->routed.empty() ? r->Assemble(*t, begin, count, records)
                               : r->AssembleRouted(*t, begin, count, records);
    };
    if (!t->host) {
      // Into the fresh store, a chunk at a time.
      const int64_t rows = t->block.row_end - t->block.row_begin;
      std::vector<float> chunk;
      for (int64_t begin = 0; begin < rows; begin += kChunkRows) {
        const int64_t count = std::min(kChunkRows, rows - begin);
        chunk.resize(count * t->floats);
        RETURN_IF_ERROR(assemble(begin, count, chunk.data()));
        RETURN_IF_ERROR(t->store->WriteRows(begin, count, chunk.data()));
      }
      if (!weights_only) t->store->set_step(t->step);
      RETURN_IF_ERROR(t->store->Flush());
    } else if (from_rocksdb || !t->routed.empty()) {
      const int64_t rows = t->block.row_end - t->block.row_begin;
      t->buffer.resize(rows * t->floats);
      RETURN_IF_ERROR(assemble(0, rows, t->buffer.data()));
    }
    r->targets_.push_back(std::move(t));
  }
  return r;
}

absl::Status TableRestore::Assemble(const Target& t, int64_t begin,
                                    int64_t count, float* records) {
  const OptimizerConfig& optimizer = model_->config().sparse_optimizer();
  const int tfloats = t.floats;
  if (weights_only_) {
    // Every record starts as the shard's own (its state stays).
    RETURN_IF_ERROR(t.store->ReadRows(begin, count, records));
  } else {
    std::fill(records, records + count * tfloats, 0.0f);
  }
  const int64_t first = t.block.row_begin + begin, last = first + count;
  std::vector<float> scratch;
  for (const Source* s : t.sources) {
    const SavedShard& b = s->saved;
    const int64_t r0 = std::max(first, b.row_begin);
    const int64_t r1 = std::min(last, b.row_end);
    if (r0 >= r1) continue;
    const int c0 = std::max(t.block.col_begin, b.col_begin);
    const int c1 = std::min(t.block.col_end, b.col_end);
    scratch.resize((r1 - r0) * s->floats);
    RETURN_IF_ERROR(
        s->Read(r0 - b.row_begin, r1 - r0, scratch.data(), optimizer));
    for (int64_t row = r0; row < r1; ++row) {
      CopyColumns(scratch.data() + (row - r0) * s->floats, b,
                  records + (row - first) * tfloats, t.block, c0, c1, arrays_,
                  weights_only_);
    }
  }
  return absl::OkStatus();
}

absl::Status TableRestore::AssembleRouted(const Target& t, int64_t begin,
                                          int64_t count, float* records) {
  const OptimizerConfig& optimizer = model_->config().sparse_optimizer();
  const int tcols = t.cols, tfloats = t.floats;
  std::fill(records, records + count * tfloats, 0.0f);
  std::vector<float> scratch;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = t.routed[begin + i];
    float* dst = records + i * tfloats;
    if (row < 0 || weights_only_) {
      // No saved record, or none of its state: a fresh state.
      optim::InitialSparseState(optimizer, tcols, dst + tcols);
    }
    if (row < 0) continue;
    for (const Source* s : t.sources) {
      const SavedShard& b = s->saved;
      if (row < b.row_begin || row >= b.row_end) continue;
      const int c0 = std::max(t.block.col_begin, b.col_begin);
      const int c1 = std::min(t.block.col_end, b.col_end);
      scratch.resize(s->floats);
      RETURN_IF_ERROR(s->Read(row - b.row_begin, 1, scratch.data(), optimizer));
      CopyColumns(scratch.data(), b, dst, t.block, c0, c1, arrays_,
                  weights_only_);
    }
  }
  return absl::OkStatus();
}

void TableRestore::Apply() {
  for (const std::unique_ptr<Target>& t : targets_) {
    if (!t->host) continue;  // staged
    const int64_t rows = t->block.row_end - t->block.row_begin;
    absl::Status s;
    if (!t->buffer.empty()) {
      s = t->store->WriteRows(0, rows, t->buffer.data());
    } else {
      std::vector<float> chunk;
      for (int64_t begin = 0; s.ok() && begin < rows; begin += kChunkRows) {
        const int64_t count = std::min(kChunkRows, rows - begin);
        chunk.resize(count * t->floats);
        // Mapped tensors and a host store: nothing here can fail (a device
        // store only on a CUDA error, which is logged below).
        s = Assemble(*t, begin, count, chunk.data());
        if (s.ok()) s = t->store->WriteRows(begin, count, chunk.data());
      }
    }
    if (!s.ok()) {
      spdlog::error("restoring table {}: {}", t->table, s.ToString());
    }
    if (!weights_only_) t->store->set_step(t->step);
  }
  if (staged_rows_ != nullptr) model_->SwapInRows(std::move(staged_rows_));
}

}  // namespace dlrm::model
