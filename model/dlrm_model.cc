// The DLRM training step and inference on one process (DESIGN.md "The
// model"; the R = 1 case of the hybrid-parallel step).
#include "model/dlrm_model.h"

#include <omp.h>

#include <chrono>
#include <cstring>

#include "core/config.h"
#include "core/random.h"
#include "core/status.h"
#include "dense/interaction.h"
#include "dense/loss.h"
#include "model/step_util.h"

namespace dlrm::model {
namespace {

using internal::Sized;
using internal::Widths;
using StageClock = internal::StageClock<StageTimes>;

}  // namespace

const char* StageTimes::Name(int stage) {
  static const char* const kNames[] = {
      "bottom_fwd",     "emb_fwd",     "inter_fwd", "top_fwd",
      "loss",           "top_bwd",     "inter_bwd", "bottom_bwd",
      "emb_bwd_update", "dense_update"};
  return kNames[stage];
}

DlrmModel::DlrmModel(const ModelConfig& config)
    : config_(config),
      num_vectors_(config.tables_size() + 1),
      vector_dim_(config.bottom_mlp(config.bottom_mlp_size() - 1)),
      interaction_dim_(0),
      t_width_(0),
      dot_(config.interaction() == INTERACTION_DOT),
      bottom_(config.num_dense_features(), Widths(config.bottom_mlp()),
              /*relu_last=*/true),
      top_(InteractionOutputDim(config), Widths(config.top_mlp()),
           /*relu_last=*/false) {
  t_width_ = vector_dim_;
  for (const auto& t : config.tables()) {
    table_rows_.push_back(t.rows());
    table_offset_.push_back(t_width_);
    t_width_ += t.dim();
  }
  interaction_dim_ = top_.in();
}

absl::StatusOr<std::unique_ptr<DlrmModel>> DlrmModel::Create(
    const ModelConfig& config) {
  std::unique_ptr<DlrmModel> m(new DlrmModel(config));
  // The reference draws the bottom MLP, then the top MLP, from one stream.
  Rng rng(config.seed());
  m->bottom_.Init(&rng);
  m->top_.Init(&rng);
  for (int k = 0; k < config.tables_size(); ++k) {
    const TableConfig& t = config.tables(k);
    m->tables_.push_back(std::make_unique<embedding::EmbeddingTable>(
        k, t.rows(), t.dim(), t.pooling(), config.sparse_optimizer(),
        config.seed()));
  }
  std::vector<dense::ParamRef> params = m->bottom_.Parameters("bottom_mlp");
  for (auto& p : m->top_.Parameters("top_mlp")) params.push_back(std::move(p));
  ASSIGN_OR_RETURN(m->dense_optimizer_,
                   dense::DenseOptimizer::Create(config.dense_optimizer(),
                                                 std::move(params)));
  return m;
}

absl::Status DlrmModel::ValidateBatch(const data::Batch& batch) const {
  return batch.Validate(config_.num_dense_features(), table_rows_);
}

void DlrmModel::Embed(const data::Batch& batch, const float* bottom_out,
                      float* t) const {
  const int d = vector_dim_;
  for (int64_t s = 0; s < batch.size; ++s) {
    std::memcpy(t + s * t_width_, bottom_out + s * d, sizeof(float) * d);
  }
  const int num_tables = static_cast<int>(tables_.size());
  // Tables are independent and each is small per batch: one table per
  // thread keeps every row update in a fixed order (deterministic).
#pragma omp parallel for schedule(dynamic, 1)
  for (int k = 0; k < num_tables; ++k) {
    tables_[k]->Forward(batch.sparse[k], t + table_offset_[k], t_width_);
  }
}

absl::StatusOr<StepResult> DlrmModel::TrainStep(const data::Batch& batch) {
  RETURN_IF_ERROR(ValidateBatch(batch));
  const int64_t n = batch.size;
  const int d = vector_dim_;
  StepResult result;
  result.samples = n;
  StageClock clock(&result.times);

  const float* bottom_out = bottom_.Forward(batch.dense.data(), n);
  clock.Mark(StageTimes::kBottomForward);

  float* t = Sized(t_, n * t_width_);
  float* z = dot_ ? Sized(z_, n * interaction_dim_) : t;
  Embed(batch, bottom_out, t);
  clock.Mark(StageTimes::kEmbeddingForward);
  if (dot_) dense::DotInteractionForward(t, n, num_vectors_, d, z);
  clock.Mark(StageTimes::kInteractionForward);

  const float* logits = top_.Forward(z, n);
  clock.Mark(StageTimes::kTopForward);

  float* dlogits = Sized(dlogits_, n);
  result.loss = dense::BceWithLogits(logits, batch.labels.data(), n,
                                     1.0f / static_cast<float>(n), dlogits);
  clock.Mark(StageTimes::kLoss);

  float* dz = Sized(dz_, n * interaction_dim_);
  top_.Backward(z, dlogits, n, dz);
  clock.Mark(StageTimes::kTopBackward);

  float* dt = dz;
  if (dot_) {
    dt = Sized(dt_, n * t_width_);
    dense::DotInteractionBackward(t, dz, n, num_vectors_, d, dt);
  }
  clock.Mark(StageTimes::kInteractionBackward);

  float* dbottom = Sized(dbottom_, n * d);
  for (int64_t s = 0; s < n; ++s) {
    std::memcpy(dbottom + s * d, dt + s * t_width_, sizeof(float) * d);
  }
  bottom_.Backward(batch.dense.data(), dbottom, n, /*dx=*/nullptr);
  clock.Mark(StageTimes::kBottomBackward);

  const int num_tables = static_cast<int>(tables_.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int k = 0; k < num_tables; ++k) {
    tables_[k]->BackwardUpdate(batch.sparse[k], dt + table_offset_[k],
                               t_width_);
  }
  clock.Mark(StageTimes::kEmbeddingBackwardUpdate);

  dense_optimizer_->Step();
  clock.Mark(StageTimes::kDenseUpdate);
  ++steps_;
  return result;
}

absl::Status DlrmModel::Predict(const data::Batch& batch,
                                std::vector<float>* probs) {
  RETURN_IF_ERROR(ValidateBatch(batch));
  const int64_t n = batch.size;
  float* bottom_out = Sized(infer_bottom_, n * vector_dim_);
  bottom_.Infer(batch.dense.data(), n, bottom_out, &infer_scratch_);
  float* t = Sized(infer_t_, n * t_width_);
  float* z = dot_ ? Sized(infer_z_, n * interaction_dim_) : t;
  Embed(batch, bottom_out, t);
  if (dot_) dense::DotInteractionForward(t, n, num_vectors_, vector_dim_, z);
  float* logits = Sized(infer_logits_, n);
  top_.Infer(z, n, logits, &infer_scratch_);
  probs->resize(n);
  for (int64_t s = 0; s < n; ++s) (*probs)[s] = dense::Sigmoid(logits[s]);
  return absl::OkStatus();
}

uint64_t DlrmModel::WeightChecksum() const {
  uint64_t h = 0;
  auto add = [&h](const float* p, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof(bits));
      h = Mix64(h ^ bits);
    }
  };
  for (const dense::Mlp* mlp : {&bottom_, &top_}) {
    for (const dense::Linear& l : mlp->layers()) {
      add(l.weight(), static_cast<int64_t>(l.in()) * l.out());
      add(l.bias(), l.out());
    }
  }
  for (const auto& t : tables_) add(t->weights(), t->rows() * t->dim());
  return h;
}

}  // namespace dlrm::model
