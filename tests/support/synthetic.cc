#include "tests/support/synthetic.h"

#include <gtest/gtest.h>

#include <memory>

#include "absl/status/statusor.h"

namespace dlrm::test {

data::Batch SyntheticBatch(const ModelConfig& config, int64_t n,
                           const data::SyntheticOptions& options) {
  absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
      data::MakeSyntheticSource(config, options);
  EXPECT_TRUE(source.ok()) << source.status();
  data::Batch batch;
  if (!source.ok()) return batch;
  absl::StatusOr<bool> more = (*source)->Next(n, &batch);
  EXPECT_TRUE(more.ok() && *more);
  return batch;
}

data::Batch SyntheticBatch(const ModelConfig& config, int64_t n,
                           uint64_t sample_seed) {
  data::SyntheticOptions options;
  options.teacher_seed = config.seed();
  options.sample_seed = sample_seed;
  return SyntheticBatch(config, n, options);
}

data::Batch SyntheticSamples(const ModelConfig& config, int64_t n,
                             uint64_t sample_seed) {
  data::SyntheticOptions options;
  options.sample_seed = sample_seed;
  return SyntheticBatch(config, n, options);
}

std::vector<data::Batch> SyntheticBatches(
    const ModelConfig& config, int count, int64_t size,
    const data::SyntheticOptions& options) {
  std::vector<data::Batch> batches(count);
  absl::StatusOr<std::unique_ptr<data::BatchSource>> source =
      data::MakeSyntheticSource(config, options);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!source.ok()) return {};
  for (data::Batch& b : batches) {
    absl::StatusOr<bool> more = (*source)->Next(size, &b);
    EXPECT_TRUE(more.ok() && *more);
  }
  return batches;
}

std::vector<data::Batch> SyntheticBatches(const ModelConfig& config, int count,
                                          int64_t size, uint64_t sample_seed) {
  data::SyntheticOptions options;
  options.teacher_seed = config.seed();
  options.sample_seed = sample_seed;
  return SyntheticBatches(config, count, size, options);
}

}  // namespace dlrm::test
