// Exact AUC (sort by score, mid-ranks for ties), log loss and accuracy.
#include "model/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace dlrm::model {

double RocAuc(std::span<const float> scores, std::span<const float> labels) {
  const size_t n = scores.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney U: sum of the positives' ranks, ties given their mean rank.
  double positive_rank_sum = 0;
  int64_t positives = 0;
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    int64_t group_positives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      if (labels[order[j]] > 0.5f) ++group_positives;
      ++j;
    }
    const double mean_rank = 0.5 * (static_cast<double>(i + 1) + j);
    positive_rank_sum += mean_rank * group_positives;
    positives += group_positives;
    i = j;
  }
  const int64_t negatives = static_cast<int64_t>(n) - positives;
  if (positives == 0 || negatives == 0) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const double u = positive_rank_sum -
                   0.5 * static_cast<double>(positives) * (positives + 1);
  return u / (static_cast<double>(positives) * negatives);
}

double LogLoss(std::span<const float> probs, std::span<const float> labels) {
  if (probs.empty()) return std::numeric_limits<double>::quiet_NaN();
  constexpr double kEps = 1e-7;
  double sum = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp<double>(probs[i], kEps, 1 - kEps);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return sum / static_cast<double>(probs.size());
}

double Accuracy(std::span<const float> probs, std::span<const float> labels) {
  if (probs.empty()) return std::numeric_limits<double>::quiet_NaN();
  int64_t correct = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    correct += (probs[i] > 0.5f) == (labels[i] > 0.5f);
  }
  return static_cast<double>(correct) / static_cast<double>(probs.size());
}

void MetricsAccumulator::Add(std::span<const float> probs,
                             std::span<const float> labels) {
  probs_.insert(probs_.end(), probs.begin(), probs.end());
  labels_.insert(labels_.end(), labels.begin(), labels.end());
}

EvalMetrics MetricsAccumulator::Compute() const {
  EvalMetrics m;
  m.samples = size();
  m.auc = RocAuc(probs_, labels_);
  m.log_loss = LogLoss(probs_, labels_);
  m.accuracy = Accuracy(probs_, labels_);
  double positives = 0;
  for (float l : labels_) positives += l > 0.5f;
  m.ctr = labels_.empty() ? 0 : positives / static_cast<double>(labels_.size());
  return m;
}

void MetricsAccumulator::Clear() {
  probs_.clear();
  labels_.clear();
}

}  // namespace dlrm::model
