// What the rank processes of the multi-rank model tests set up alike: the
// sharding plan and the Gloo options of their communicators (header only:
// the binaries that include it link dlrm_model themselves).
#ifndef DLRM_TESTS_SUPPORT_RANKS_H_
#define DLRM_TESTS_SUPPORT_RANKS_H_

#include <string>

#include "absl/status/statusor.h"
#include "comm/gloo_communicator.h"
#include "dlrm/config.pb.h"
#include "embedding/sharding.h"

namespace dlrm::test {

// The planner's sharding of `config` over `world` ranks (its defaults).
inline absl::StatusOr<embedding::ShardingPlan> PlanOver(
    const ModelConfig& config, int world) {
  embedding::PlannerOptions po;
  po.world_size = world;
  return embedding::PlanSharding(config, po);
}

// Gloo options of rank `rank` of `world` meeting at `coordinator` under
// `job_id`, with these timeouts (seconds).
inline comm::GlooOptions RankGloo(int rank, int world,
                                  const std::string& coordinator,
                                  const std::string& job_id,
                                  double connect_timeout_seconds,
                                  double op_timeout_seconds) {
  comm::GlooOptions go;
  go.rank = rank;
  go.world_size = world;
  go.coordinator_address = coordinator;
  go.job_id = job_id;
  go.connect_timeout_seconds = connect_timeout_seconds;
  go.op_timeout_seconds = op_timeout_seconds;
  return go;
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_RANKS_H_
