// Synthetic batches for the tests (data::MakeSyntheticSource cut into
// data::Batch values).
#ifndef DLRM_TESTS_SUPPORT_SYNTHETIC_H_
#define DLRM_TESTS_SUPPORT_SYNTHETIC_H_

#include <cstdint>
#include <vector>

#include "data/batch.h"
#include "data/synthetic.h"
#include "dlrm/config.pb.h"

namespace dlrm::test {

// The first `n` samples of the synthetic stream `options` describe for
// `config` (a gtest failure when the source cannot be made or ends first).
data::Batch SyntheticBatch(const ModelConfig& config, int64_t n,
                           const data::SyntheticOptions& options);

// The same with the teacher of `config`'s seed and the sample stream of
// `sample_seed`.
data::Batch SyntheticBatch(const ModelConfig& config, int64_t n,
                           uint64_t sample_seed);

// The first `n` samples of sample stream `sample_seed`, labelled by the
// default teacher (data::SyntheticOptions' teacher_seed) whatever `config`'s
// seed.
data::Batch SyntheticSamples(const ModelConfig& config, int64_t n,
                             uint64_t sample_seed);

// `count` batches of `size` samples, the stream `options` describe cut in
// order; empty when the source cannot be made.
std::vector<data::Batch> SyntheticBatches(
    const ModelConfig& config, int count, int64_t size,
    const data::SyntheticOptions& options);

// The same with the teacher of `config`'s seed and the sample stream of
// `sample_seed`.
std::vector<data::Batch> SyntheticBatches(const ModelConfig& config, int count,
                                          int64_t size, uint64_t sample_seed);

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_SYNTHETIC_H_
