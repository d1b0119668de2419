// Evaluation metrics for click-through-rate models: exact ROC AUC, log loss
// and accuracy, accumulated over batches.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dlrm::model {

// Exact ROC AUC of `scores` against 0/1 `labels` (the probability that a
// random positive outscores a random negative; ties count one half).
// Returns NaN when either class is absent.
double RocAuc(std::span<const float> scores, std::span<const float> labels);

// Mean binary cross-entropy of probabilities (clipped to [1e-7, 1 - 1e-7]).
double LogLoss(std::span<const float> probs, std::span<const float> labels);

// Fraction of samples where (prob > 0.5) equals the label.
double Accuracy(std::span<const float> probs, std::span<const float> labels);

struct EvalMetrics {
  int64_t samples = 0;
  double auc = 0;
  double log_loss = 0;
  double accuracy = 0;
  // Fraction of positive labels.
  double ctr = 0;
};

// Collects (probability, label) pairs over many batches; exact AUC needs
// them all. Not thread-safe.
class MetricsAccumulator {
 public:
  void Add(std::span<const float> probs, std::span<const float> labels);
  EvalMetrics Compute() const;
  void Clear();
  int64_t size() const { return static_cast<int64_t>(probs_.size()); }

 private:
  std::vector<float> probs_, labels_;
};

}  // namespace dlrm::model
