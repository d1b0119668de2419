// SnapshotPredictor: pooling and the dense part beside the training step.
#include "model/predictor.h"

#include <algorithm>
#include <shared_mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::model {

absl::StatusOr<std::unique_ptr<SnapshotPredictor>> SnapshotPredictor::Create(
    Model* model) {
  const ModelConfig& config = model->config();
  if (model->world_size() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("the model runs on ", model->world_size(),
                     " ranks: model::RanksPredictor predicts beside its step"));
  }
  if (config.device() != DEVICE_CPU) {
    return absl::FailedPreconditionError(
        "the dense part is not on the CPU: its weights are not read beside "
        "the step");
  }
  std::vector<const embedding::EmbeddingTable*> tables;
  for (int k = 0; k < config.tables_size(); ++k) {
    const embedding::EmbeddingTable* table = model->WholeHostTable(k);
    if (table == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", config.tables(k).name(),
          " is not whole in host memory: its store changes as it is read"));
    }
    tables.push_back(table);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<dense::DenseBackend> dense,
                   dense::CreateDenseBackend(config));
  return std::unique_ptr<SnapshotPredictor>(
      new SnapshotPredictor(model, std::move(dense), std::move(tables)));
}

SnapshotPredictor::SnapshotPredictor(
    Model* model, std::unique_ptr<dense::DenseBackend> dense,
    std::vector<const embedding::EmbeddingTable*> tables)
    : model_(model),
      model_params_(model->dense_params()),
      tables_(std::move(tables)),
      dense_(std::move(dense)) {}

absl::Status SnapshotPredictor::Predict(const data::Batch& batch,
                                        std::vector<float>* probs,
                                        int64_t* step) {
  RETURN_IF_ERROR(ValidateBatch(model_->config(), batch));
  const int64_t n = batch.size;
  if (n == 0) return absl::InvalidArgumentError("batch: the batch is empty");
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
  const int64_t width = dense_->interaction().input_width;
  const int num_tables = static_cast<int>(tables_.size());
  {
    std::shared_lock<std::shared_mutex> reading(model_->weights_mutex());
    const uint64_t generation = model_->weights_generation();
    if (generation != generation_) {
      const std::vector<dense::ParamRef>& from = model_params_;
      const std::vector<dense::ParamRef>& to = dense_->params();
      for (size_t i = 0; i < from.size(); ++i) {
        std::copy_n(from[i].value, from[i].size, to[i].value);
      }
      generation_ = generation;
    }
    *step = model_->steps();
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < num_tables; ++k) {
      tables_[k]->Forward(batch.sparse[k], t + model_->table_column(k), width);
    }
  }
  // The rest reads only this predictor's copy.
  probs->resize(n);
  return dense_->Predict(batch.dense.data(), n, probs->data());
}

}  // namespace dlrm::model
