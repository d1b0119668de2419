// Optimizer configs for the embedding tests.
#ifndef DLRM_TESTS_SUPPORT_OPTIMIZER_H_
#define DLRM_TESTS_SUPPORT_OPTIMIZER_H_

#include "dlrm/config.pb.h"

namespace dlrm::test {

// An optimizer of `type` with the tests' rates: SGD 0.1, Adagrad and
// row-wise Adagrad 0.05 (initial accumulator 0.1), every other type 0.01;
// eps 1e-8, beta1 0.9, beta2 0.999.
OptimizerConfig MakeOptimizer(OptimizerConfig::Type type);

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_OPTIMIZER_H_
