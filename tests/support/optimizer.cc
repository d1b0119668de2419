#include "tests/support/optimizer.h"

namespace dlrm::test {

OptimizerConfig MakeOptimizer(OptimizerConfig::Type type) {
  OptimizerConfig o;
  o.set_type(type);
  switch (type) {
    case OptimizerConfig::SGD:
      o.set_learning_rate(0.1f);
      break;
    case OptimizerConfig::ADAGRAD:
    case OptimizerConfig::ROWWISE_ADAGRAD:
      o.set_learning_rate(0.05f);
      o.set_initial_accumulator(0.1f);
      break;
    default:
      o.set_learning_rate(0.01f);
      break;
  }
  o.set_eps(1e-8f);
  o.set_beta1(0.9f);
  o.set_beta2(0.999f);
  return o;
}

}  // namespace dlrm::test
