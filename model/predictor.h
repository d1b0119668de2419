// Predictor: the one interface of a prediction. SnapshotPredictor: one
// from a one-process model on another thread while it trains, from the
// weights of its last completed step (docs/server.md "Predictions beside
// training"); model::RanksPredictor is its counterpart on several ranks.
// FallbackPredictor: beside the step when it can, else between steps.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "dense/backend.h"
#include "model/model.h"

namespace dlrm::model {

// Click probabilities of a batch from a model, with the step whose weights
// gave them. Implementations say whether they are thread-safe.
class Predictor {
 public:
  virtual ~Predictor() = default;
  // The probability of every sample of `batch` into `probs` (resized), and
  // into *step (not null) the number of the step whose weights gave them.
  // InvalidArgument naming the field and the sample for a batch the model
  // does not take.
  virtual absl::Status Predict(const data::Batch& batch,
                               std::vector<float>* probs, int64_t* step) = 0;
};

// Predicts with `beside` (beside the step; may be null) and, where it
// cannot answer now (Aborted: the ranks kept reporting different steps;
// Unavailable: its communicator failed or it was stopped), with `between`
// (between two steps). Thread-safe when both are. Borrows both.
class FallbackPredictor final : public Predictor {
 public:
  FallbackPredictor(Predictor* beside, Predictor* between)
      : beside_(beside), between_(between) {}
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs,
                       int64_t* step) override;

 private:
  Predictor* const beside_;
  Predictor* const between_;
};

// The model's probabilities for a batch, computed beside its training step
// rather than between two steps: the embedding rows are pooled straight
// from the model's stores with EmbeddingStore::PoolReadOnly (a table in
// host memory in place; a table on RocksDB from its cache slots, its
// write-back buffer or the database, without changing the cache), and the
// dense part runs on a copy of the model's dense parameters in a backend of
// its own, made like the model's (on DEVICE_CUDA a second CUDA backend with
// its own stream, buffers and cuBLAS handles), refreshed when the model's
// weights have changed (Model::CopyDenseParamsTo; on CUDA a device copy
// ordered after the model's queued dense update). Both are read under the
// model's weights_mutex() held shared, so a prediction sees the weights of
// exactly one completed step (or restore), and waits at most for the
// weight writes in progress (a step's sparse and dense updates, a
// restore's copy; on CUDA also the dense update's kernels when the weights
// have changed), never for a step's forward, backward, exchanges or cache
// loads; the step trains bitwise as without it.
//
// Thread-safe; predictions run one at a time (the dense copy is their
// workspace). Borrows the model, which must outlive the predictor.
class SnapshotPredictor final : public Predictor {
 public:
  // FailedPrecondition naming why when the model's weights cannot be read
  // beside its step: several ranks (model::RanksPredictor's case), a
  // table in GPU memory (STORAGE_DEVICE or a device cache: read through the
  // step's stream), or CUDA graphs (gpu_cuda_graphs: another thread's device
  // work beside their captures has not run on a device). Other errors as
  // dense::CreateDenseBackend (e.g. out of device memory for the copy).
  static absl::StatusOr<std::unique_ptr<SnapshotPredictor>> Create(
      Model* model);

  // Click probabilities of every sample of `batch` into `probs` (resized),
  // and into *step (not null) the number of the step whose weights gave
  // them (Model::steps() then). InvalidArgument naming the field and the
  // sample for a batch the model does not take, or an empty one (nothing
  // is read then); a RocksDB read's error as EmbeddingStore::PoolReadOnly.
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs,
                       int64_t* step) override;

 private:
  SnapshotPredictor(Model* model, std::unique_ptr<dense::DenseBackend> dense);

  Model* const model_;

  std::mutex mu_;  // one prediction at a time
  // The dense part's copy and workspace, and each table's pooling status;
  // guarded by mu_.
  std::unique_ptr<dense::DenseBackend> dense_;
  std::vector<absl::Status> pooled_;
  // The model's weights_generation() dense_'s parameters were copied at,
  // kNeverCopied before the first copy; guarded by mu_.
  static constexpr uint64_t kNeverCopied = ~uint64_t{0};
  uint64_t generation_ = kNeverCopied;
};

}  // namespace dlrm::model
