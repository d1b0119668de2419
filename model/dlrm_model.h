// The single-process DLRM: bottom MLP, embedding bags, interaction, top MLP
// and BCE loss, with one call per training step (forward, loss, backward,
// sparse and dense updates) and a separate inference path.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/aligned.h"
#include "data/batch.h"
#include "dense/linear.h"
#include "dense/optimizer.h"
#include "dlrm/config.pb.h"
#include "embedding/embedding_table.h"

namespace dlrm::model {

// Wall time of each stage of the last training step, in seconds.
struct StageTimes {
  enum Stage {
    kBottomForward,
    kEmbeddingForward,
    kInteractionForward,
    kTopForward,
    kLoss,
    kTopBackward,
    kInteractionBackward,
    kBottomBackward,
    kEmbeddingBackwardUpdate,
    kDenseUpdate,
    kNumStages
  };
  static const char* Name(int stage);
  std::array<double, kNumStages> seconds{};
};

struct StepResult {
  // Mean BCE loss of the batch before the update.
  double loss = 0;
  int64_t samples = 0;
  StageTimes times;
};

// Owns all parameters and optimizer state. Not thread-safe: TrainStep and
// Predict must not run concurrently (the server serialises them).
class DlrmModel {
 public:
  // `config` must be normalised (core/config.h). Initialises weights from
  // config.seed the way the DLRM reference does.
  static absl::StatusOr<std::unique_ptr<DlrmModel>> Create(
      const ModelConfig& config);

  // One step of SGD-style training on `batch`. InvalidArgument (naming the
  // field and sample) for a batch that does not fit the model; a rejected
  // batch leaves the model unchanged.
  absl::StatusOr<StepResult> TrainStep(const data::Batch& batch);

  // Click probabilities for every sample of `batch` (labels are ignored but
  // must be 0/1 if present). Does not change the model.
  absl::Status Predict(const data::Batch& batch, std::vector<float>* probs);

  const ModelConfig& config() const { return config_; }
  // Rows of each table, in config order.
  const std::vector<int64_t>& table_rows() const { return table_rows_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

  dense::Mlp& bottom() { return bottom_; }
  dense::Mlp& top() { return top_; }
  std::vector<std::unique_ptr<embedding::EmbeddingTable>>& tables() {
    return tables_;
  }
  dense::DenseOptimizer& dense_optimizer() { return *dense_optimizer_; }

  // An order-independent checksum of every weight (dense and embedding),
  // for tests that a rejected batch changes nothing.
  uint64_t WeightChecksum() const;

 private:
  explicit DlrmModel(const ModelConfig& config);

  absl::Status ValidateBatch(const data::Batch& batch) const;
  // Fills the interaction input `t` ([batch x t_width_]): the bottom MLP
  // output first, then each table's pooled embedding at table_offset_[k].
  void Embed(const data::Batch& batch, const float* bottom_out, float* t) const;

  ModelConfig config_;
  std::vector<int64_t> table_rows_;
  std::vector<int> table_offset_;  // where table k starts in a row of t_
  int num_vectors_;                // tables + 1
  int vector_dim_;                 // d (the bottom MLP's output width)
  int interaction_dim_;            // top MLP input width
  int t_width_;                    // floats per sample in the interaction input
  bool dot_;
  dense::Mlp bottom_, top_;
  std::vector<std::unique_ptr<embedding::EmbeddingTable>> tables_;
  std::unique_ptr<dense::DenseOptimizer> dense_optimizer_;
  int64_t steps_ = 0;

  // Training buffers (grown on demand, reused across steps).
  AlignedVector<float> t_, z_, dz_, dt_, dlogits_, dbottom_;
  // Inference buffers.
  AlignedVector<float> infer_bottom_, infer_t_, infer_z_, infer_logits_,
      infer_scratch_;
};

}  // namespace dlrm::model
