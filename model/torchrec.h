// Interop with TorchRec (docs/torchrec.md): the state_dict of
// torchrec.models.dlrm.DLRM (dot interaction) and DLRM_DCN mapped tensor by
// tensor onto this project's parameters, and conversions between such a
// state_dict saved as safetensors and a model or a checkpoint directory.
// Only weights cross over, and the id maps of dynamic tables as TorchRec's
// managed-collision modules keep them: a TorchRec state_dict holds no
// optimizer state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_system.h"
#include "dlrm/config.pb.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights_export.h"

namespace dlrm::model {

// The key prefix of the managed-collision state of a model's dynamic
// tables in a TorchRec export and import: the state_dict of a
// torchrec.modules.mc_modules.ManagedCollisionCollection holding one
// MCHManagedCollisionModule per dynamic table (docs/torchrec.md "Dynamic
// tables").
inline constexpr char kTorchRecMcPrefix[] = "managed_collision_collection.";

// Which buffer of an MCHManagedCollisionModule a TorchRecTensor is (kNone:
// a weight of the DLRM).
enum class McBuffer {
  kNone,
  // _output_segments_tensor [1025]: [0, rows, -1, ...].
  kOutputSegments,
  // _current_iter_tensor [1]: the map's step.
  kCurrentIter,
  // _mch_sorted_raw_ids [rows]: the ids holding a row, ascending, then
  // INT64_MAX for every row without one (the last always).
  kSortedRawIds,
  // _mch_remapped_ids_mapping [rows]: the row of each of them; the free
  // rows ascending after; the kept row last.
  kRemappedIdsMapping,
  // _mch_last_access_iter [rows] (EVICT_LRU): each id's last step seen.
  kLastAccessIter,
  // _mch_counts [rows] (EVICT_LFU): each id's sightings.
  kCounts,
};

// One tensor of a TorchRec DLRM state_dict and the parameter of ours that
// holds the same numbers.
struct TorchRecTensor {
  // Its key in TorchRec's state_dict, e.g.
  // "dense_arch.model._mlp.0._linear.weight".
  std::string torchrec_name;
  // Our parameter's name (WeightSpecs), e.g. "bottom_mlp.0.weight".
  std::string name;
  // The shape, the same on both sides ([out, in] for a Linear's weight).
  std::vector<int64_t> shape;
  // True only for the top MLP's first weight under INTERACTION_DOT: its
  // columns after the first d (one per pair of vectors) are ordered
  // differently by TorchRec (TorchRecDotPairOrder), so the import and the
  // export move them.
  bool pair_columns_permuted = false;
  // F32 for weights, I64 for the managed-collision buffers.
  Dtype dtype = Dtype::kF32;
  // A managed-collision buffer: which, and of which table.
  McBuffer mc = McBuffer::kNone;
  int table = -1;
};

// OK when a model of `config` (normalised) has a TorchRec counterpart:
// DLRM for INTERACTION_DOT, DLRM_DCN for INTERACTION_DCN. Otherwise
// FailedPrecondition naming the field: an INTERACTION_CAT model, a table
// whose dim differs from the bottom MLP's output (TorchRec's DLRM needs one
// embedding dim, equal to it), a top MLP of one layer (TorchRec's OverArch
// needs at least two).
absl::Status CheckTorchRecCompatible(const ModelConfig& config);

// The tensors of the TorchRec state_dict of a model of `config`
// (normalised), in the order TorchRec's state_dict() lists them: the
// tables, the bottom MLP (dense_arch), the cross network (DLRM_DCN), the
// top MLP (over_arch); then, under kTorchRecMcPrefix, each dynamic table's
// MCHManagedCollisionModule buffers (McBuffer, in their order).
// Errors as CheckTorchRecCompatible.
absl::StatusOr<std::vector<TorchRecTensor>> TorchRecTensors(
    const ModelConfig& config);

// The dot interaction of n vectors (v_0 = the bottom MLP's output, then the
// tables) emits the dot of each pair after the d values of v_0; we order
// the pairs (1,0), (2,0), (2,1), (3,0), ... (strict lower triangle, row by
// row), TorchRec (0,1), (0,2), ..., (0,n-1), (1,2), ... (triu_indices with
// offset 1). Entry p of the result is the TorchRec position of our pair p.
std::vector<int> TorchRecDotPairOrder(int n);

// Checks the tensors of `file` against the state_dict of a model of
// `config`: every expected key present with its shape and dtype, no other
// key.
// InvalidArgument naming each offending tensor (missing, wrong shape,
// unexpected), with the parameter of ours it maps to; the errors of
// CheckTorchRecCompatible.
absl::Status CheckTorchRecStateDict(const SafetensorsFile& file,
                                    const ModelConfig& config);

// What an import did with the managed-collision state of dynamic tables.
struct TorchRecImportReport {
  // Ids of the state_dicts' maps given a row of ours.
  int64_t ids = 0;
  // Ids that found no free row in their bucket of our map (the map is
  // set-associative, TorchRec's is not): they start without a row, as
  // ids our map evicted. The ids of most recent (LRU) or most frequent
  // (LFU) use are placed first.
  int64_t ids_dropped = 0;
};

// Sets every weight of `model` from the TorchRec state_dict in `file`
// (checked first with CheckTorchRecStateDict against model.config(): on
// those errors nothing changes). A dynamic table's map is rebuilt from its
// managed-collision buffers: each id in a row of its bucket, with that id's
// row of weights (TorchRec's default row becomes the kept row under
// UNADMITTED_SHARED_ROW; under UNADMITTED_ZERO it stays zero); `report`,
// if not null, counts the ids. The optimizer state and the step count are
// left as they are. InvalidArgument naming the tensor for buffers that are
// not a valid map (an id below 0 or out of order, a row used twice or out
// of range, segments without 0 and rows); FailedPrecondition when `model`
// is not one process holding every table whole (Model::Create(config)); a
// table store's read and write errors, after which the model holds a part
// of the weights.
absl::Status ImportTorchRecWeights(const SafetensorsFile& file, Model& model,
                                   TorchRecImportReport* report = nullptr);

// Writes the weights of `model` (one process, every table whole) as a
// TorchRec state_dict in safetensors to `path`, through a temporary file
// renamed into place (metadata "format": "pt", "source": "dlrm-server",
// "step"); a dynamic table's map as its MCHManagedCollisionModule's
// buffers, written first in the file (int64: aligned). Errors of
// CheckTorchRecCompatible; FailedPrecondition for a model of several
// ranks; the file system's, naming the path.
absl::StatusOr<ExportInfo> ExportTorchRec(
    Model& model, const std::string& path,
    FileSystem* file_system = DefaultFileSystem());

// Options of ImportTorchRecCheckpoint.
struct TorchRecImportOptions {
  // Replace a checkpoint already in the target directory. Default: false
  // (AlreadyExists when the directory exists).
  bool overwrite = false;
};

// Reads the TorchRec state_dict in the safetensors file `state_dict`,
// checks it against `config` (normalised), and writes a checkpoint of a
// model of `config` with those weights to `dir` (SaveCheckpoint: step 0,
// the optimizer state a new model of `config` starts with). NotFound for a
// missing file; InvalidArgument from SafetensorsFile::Open and
// CheckTorchRecStateDict; AlreadyExists when `dir` exists and not
// options.overwrite; Model::Create's and SaveCheckpoint's errors.
absl::StatusOr<CheckpointInfo> ImportTorchRecCheckpoint(
    const std::string& state_dict, const ModelConfig& config,
    const std::string& dir, const TorchRecImportOptions& options = {},
    TorchRecImportReport* report = nullptr);

// Loads the checkpoint in `dir` (weights only, dense part on the CPU) and
// writes its weights as a TorchRec state_dict to `path` (ExportTorchRec).
// LoadCheckpoint's errors, then ExportTorchRec's.
absl::StatusOr<ExportInfo> ExportTorchRecCheckpoint(const std::string& dir,
                                                    const std::string& path);

}  // namespace dlrm::model
