// SnapshotPredictor: pooling and the dense part beside the training step;
// FallbackPredictor's choice.
#include "model/predictor.h"

#include <shared_mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "core/status.h"
#include "embedding/embedding_store.h"
#include "spdlog/spdlog.h"

namespace dlrm::model {

absl::Status FallbackPredictor::Predict(const data::Batch& batch,
                                        std::vector<float>* probs,
                                        int64_t* step) {
  if (beside_ != nullptr) {
    const absl::Status beside = beside_->Predict(batch, probs, step);
    if (beside.ok() ||
        !(absl::IsAborted(beside) || absl::IsUnavailable(beside))) {
      return beside;
    }
    spdlog::debug("prediction between steps: {}",
                  std::string(beside.message()));
  }
  return between_->Predict(batch, probs, step);
}

absl::StatusOr<std::unique_ptr<SnapshotPredictor>> SnapshotPredictor::Create(
    Model* model) {
  const ModelConfig& config = model->config();
  if (model->world_size() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("the model runs on ", model->world_size(),
                     " ranks: model::RanksPredictor predicts beside its step"));
  }
  if (config.device() == DEVICE_CUDA && config.gpu_cuda_graphs()) {
    return absl::FailedPreconditionError(
        "the dense part replays CUDA graphs (gpu_cuda_graphs): a second "
        "thread's device work beside their captures has not run on a device");
  }
  // One rank holds every table whole; the host tiers (memory, RocksDB)
  // pool beside the step, the device tier (a table or a cache in GPU
  // memory) does not.
  for (int k = 0; k < config.tables_size(); ++k) {
    const embedding::EmbeddingStore* store = model->shards().WholeStore(k);
    if (store == nullptr || store->memory_space() != MemorySpace::kHost) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", config.tables(k).name(),
          " is in GPU memory (a device table or a device cache): its rows are "
          "read through the step's stream, so predictions run between steps"));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<dense::DenseBackend> dense,
                   dense::CreateDenseBackend(config));
  return std::unique_ptr<SnapshotPredictor>(
      new SnapshotPredictor(model, std::move(dense)));
}

SnapshotPredictor::SnapshotPredictor(Model* model,
                                     std::unique_ptr<dense::DenseBackend> dense)
    : model_(model),
      dense_(std::move(dense)),
      pooled_(model->config().tables_size()) {}

absl::Status SnapshotPredictor::Predict(const data::Batch& batch,
                                        std::vector<float>* probs,
                                        int64_t* step) {
  RETURN_IF_ERROR(ValidateBatch(model_->config(), batch));
  const int64_t n = batch.size;
  if (n == 0) return absl::InvalidArgumentError("batch: the batch is empty");
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
  const int64_t width = dense_->interaction().input_width;
  const int num_tables = static_cast<int>(pooled_.size());
  {
    std::shared_lock<std::shared_mutex> reading(model_->weights_mutex());
    const uint64_t generation = model_->weights_generation();
    if (generation != generation_) {
      RETURN_IF_ERROR(model_->CopyDenseParamsTo(*dense_));
      generation_ = generation;
    }
    *step = model_->steps();
    // The stores are asked for under the lock: a restore replaces those of
    // tables on RocksDB.
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < num_tables; ++k) {
      pooled_[k] = model_->shards().WholeStore(k)->PoolReadOnly(
          batch.sparse[k], t + model_->table_column(k), width);
    }
  }
  for (int k = 0; k < num_tables; ++k) {
    if (!pooled_[k].ok()) {
      return absl::Status(
          pooled_[k].code(),
          absl::StrCat("table ", model_->config().tables(k).name(), ": ",
                       pooled_[k].message()));
    }
  }
  // The rest reads only this predictor's copy.
  probs->resize(n);
  return dense_->Predict(batch.dense.data(), n, probs->data());
}

}  // namespace dlrm::model
