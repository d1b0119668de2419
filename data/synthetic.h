// Synthetic Criteo-shaped data: Zipf-distributed ids per table and labels
// drawn from a planted teacher model, so a trained model's AUC can be set
// against the best achievable (the teacher's own AUC on the same samples).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "data/source.h"
#include "dlrm/config.pb.h"

namespace dlrm::data {

struct SyntheticOptions {
  // Zipf exponent of ids within each table (rank r drawn with weight
  // r^-alpha; id = r - 1, so id 0 is the hottest). Default: 1.05.
  double zipf_alpha = 1.05;
  // Seed of the teacher model: runs sharing it share the same ground truth.
  // Default: 1.
  uint64_t teacher_seed = 1;
  // Seed of the sample stream (use different ones for train and eval).
  // Default: 2.
  uint64_t sample_seed = 2;
  // Samples before the end of data; 0 = endless. Rewind() replays the same
  // samples. Default: 0.
  int64_t num_samples = 0;

  absl::Status Validate() const;
};

// The planted model that labels synthetic samples: a logistic model with a
// bias, dense weights, a per-id effect for every table, and low-rank
// interactions between pairs of tables; all parameters are pure functions
// of (teacher_seed, table, id), so tables of any size cost no memory.
class Teacher {
 public:
  Teacher(const ModelConfig& config, uint64_t teacher_seed);

  // Click probability of each sample of `batch` (batch.size values).
  void Probabilities(const Batch& batch, float* out) const;

 private:
  double Logit(const Batch& batch, int64_t s) const;

  std::vector<int> pooling_mean_;  // per table: 1 = mean pooling
  std::vector<double> dense_weight_;
  uint64_t seed_;
  int num_dense_;
};

// An endless (or num_samples long) synthetic stream for `config` (a
// normalised ModelConfig: tables, rows, multi_hot_size, pooling).
absl::StatusOr<std::unique_ptr<BatchSource>> MakeSyntheticSource(
    const ModelConfig& config, SyntheticOptions options);

}  // namespace dlrm::data
