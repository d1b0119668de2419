// Where a checkpoint keeps each block of each embedding table, and the
// restore of those blocks into a model of any plan (docs/checkpoints.md
// "Resharding"): each rank of the restoring model reads the rows and columns
// of its own shards from every saved block that overlaps them, whichever
// rank saved it and on whichever tier. Internal to model/checkpoint.cc.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_system.h"
#include "dlrm/config.pb.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "optim/optimizer.h"
#include "optim/rules.h"

namespace dlrm::model {

// One saved block of a table: rows [row_begin, row_end) and columns
// [col_begin, col_end), and where its records are.
struct SavedShard {
  int rank = 0;
  int64_t row_begin = 0, row_end = 0;
  int col_begin = 0, col_end = 0;
  // In host memory when saved: tensors "<base>.weight" [rows, cols] in
  // `weights_file`, and the optimizer's state arrays "<base>.<array>" ([rows]
  // for a per-row array, [rows, cols] per element) in `state_file`, with the
  // table's step under metadata key `step_key` of `state_file`.
  std::string weights_file, state_file, base, step_key;
  // On RocksDB when saved: the column family of this block (its TableSpec's
  // ColumnFamilyName) in the RocksDB checkpoint in `rocksdb_dir`, rows and
  // step counter included. Empty for a block in host memory.
  std::string rocksdb_dir;

  int64_t rows() const { return row_end - row_begin; }
  int cols() const { return col_end - col_begin; }
};

// Every saved block of every table, and where the dense part is.
struct SavedLayout {
  int world_size = 1;
  // By table (the checkpoint config's order); the blocks of a table tile it
  // exactly once.
  std::vector<std::vector<SavedShard>> tables;
  // The MLPs' parameters (flat, or [out, in]) and their optimizer state
  // (flat), and the metadata keys of the step counts.
  std::string dense_weights_file, dense_state_file;

  // InvalidArgument unless the blocks of every table of `config` tile it
  // exactly.
  absl::Status Validate(const ModelConfig& config) const;
};

// The tensor of optimizer state array `array` (optim::SparseState) of a
// block or shard of `rows` x `cols` saved under `base`: named
// "<base>.<array.name>", shaped [rows] for a per-row array and [rows, cols]
// for one per element. What a save writes and a restore reads.
std::string StateTensorName(const std::string& base,
                            const optim::StateArray& array);
std::vector<int64_t> StateTensorShape(const optim::StateArray& array,
                                      int64_t rows, int64_t cols);

// A step count from safetensors metadata; 0 when absent or malformed.
int64_t MetadataStep(const std::map<std::string, std::string>& meta,
                     const std::string& key);

// ---- This version's format: rank r's host-memory shards in
// "rank-<r>.safetensors", its RocksDB shards' database checkpoint in
// "rank-<r>.rocksdb/", the dense part in "dense.safetensors", the blocks in
// "layout.json".

inline constexpr char kLayoutFile[] = "layout.json";
inline constexpr char kDenseFile[] = "dense.safetensors";
std::string RankFileName(int rank);
std::string RankRocksDbDir(int rank);
// "embedding_bags.<table>.shard<s>": the tensors' prefix of shard s.
std::string ShardBase(const ModelConfig& config, int table, int shard);

// The layout of a checkpoint `model`'s ranks write: every shard once (a
// data-parallel table's copy on rank 0 only).
SavedLayout LayoutOf(const Model& model);
std::string LayoutToJson(const SavedLayout& layout, const ModelConfig& config);
// InvalidArgument naming `path` when `text` is not such a layout of
// `config`'s tables.
absl::StatusOr<SavedLayout> LayoutFromJson(const std::string& text,
                                           const ModelConfig& config,
                                           const std::string& path);

// ---- The formats of earlier versions, read but no longer written.

// One process (format dlrm-server-checkpoint, version 1 or 2): every table
// whole on rank 0 in model.safetensors / optimizer.safetensors, or in the
// RocksDB checkpoint "rocksdb/".
SavedLayout OneProcessLayout(const ModelConfig& config);
// Several ranks (dlrm-server-multirank-checkpoint): the version format's
// files without layout.json; its blocks are those of `plan` (the caller
// checked that the checkpoint's plan.txt is this plan's).
SavedLayout MultiRankLayout(const ModelConfig& config,
                            const embedding::ShardingPlan& plan);

// A restore of the embedding tables of `model` (this rank's shards) from a
// checkpoint in two steps, so that ranks can agree in between: Stage reads
// and checks everything that can fail without changing the model; Apply
// then cannot fail.
class TableRestore {
 public:
  // The files (paths relative to the checkpoint directory, or directory
  // prefixes ending in '/') this rank reads: the caller verifies their
  // checksums before Stage. Without the optimizer state's files when
  // `weights_only`.
  static std::set<std::string> FilesNeeded(const Model& model,
                                           const SavedLayout& layout,
                                           bool weights_only);
  // Whether `path` (relative) is one of `needed` or lies under one of its
  // directories.
  static bool Needed(const std::set<std::string>& needed,
                     const std::string& path);

  // Per local shard index (ShardSet order), for shards whose rows are not
  // the saved rows of the same range (a dynamic table's shards whose ids
  // are re-routed by hash: model/checkpoint.cc): per local row, the saved
  // table row whose record it takes (from every saved block of the table
  // that holds that row and overlaps the shard's columns), or -1 for a
  // fresh record (zero weights, initial optimizer state).
  using RoutedRows = std::map<int, std::vector<int64_t>>;

  // `saved` is the checkpoint's config (same architecture as the model's,
  // checked by the caller). With `weights_only` no optimizer state is read:
  // the model's shards keep theirs (the shards of `routed`: fresh state).
  // The files of every saved block of a table in `routed` must have been
  // verified too. FailedPrecondition (naming the tensor or file) when a
  // tensor is missing or has another shape; RocksDB's errors for a
  // database that does not open.
  static absl::StatusOr<std::unique_ptr<TableRestore>> Stage(
      Model& model, const std::filesystem::path& dir, const ModelConfig& saved,
      const SavedLayout& layout, bool weights_only,
      const RoutedRows& routed = {});

  ~TableRestore();
  // Writes every shard's rows and step into the model.
  void Apply();

 private:
  struct Source;
  struct Target;
  TableRestore() = default;
  // Fills `records` with rows [begin, begin + count) of target `t` (local
  // rows), assembled from its sources.
  absl::Status Assemble(const Target& t, int64_t begin, int64_t count,
                        float* records);
  // The same for a target of RoutedRows: each row's record from the saved
  // row `t.routed` names.
  absl::Status AssembleRouted(const Target& t, int64_t begin, int64_t count,
                              float* records);

  Model* model_ = nullptr;
  bool weights_only_ = false;
  // The state arrays of the model's sparse optimizer (optim::SparseState).
  std::span<const optim::StateArray> arrays_;
  // Declared in the order they may be destroyed last: the databases the
  // RocksDB sources read (copies of the checkpoint's, removed with this
  // object), the mapped files, the sources over both, the targets.
  struct SourceDatabase;
  std::vector<std::unique_ptr<SourceDatabase>> databases_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::unique_ptr<Source>> sources_;
  std::vector<std::unique_ptr<Target>> targets_;
  // Fresh stores of this rank's RocksDB shards (filled by Stage), swapped in
  // by Apply; or a copy of the saved database when the plan is the same.
  std::unique_ptr<ShardSet::Staged> staged_rows_;
};

}  // namespace dlrm::model
