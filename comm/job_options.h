// The options every communicator of a job is made from: this process's
// rank, the job at the coordinator rank 0 hosts, and the timeouts.
// GlooOptions, NcclOptions and CommOptions extend it.
#pragma once

#include <cstdint>
#include <string>

#include "comm/coordinator_client.h"

namespace dlrm::comm {

struct JobOptions {
  // This process's rank, in [0, world_size). Default: 0.
  int rank = 0;
  // Number of ranks (processes) of the job. Default: 1.
  int world_size = 1;
  // host:port of the coordinator rank 0 hosts (comm/coordinator.h).
  // Required unless the communicator needs no peers. Default: "".
  std::string coordinator_address;
  // TLS and join token of the calls to the coordinator. Default:
  // plaintext, no token.
  CoordinatorClientOptions coordinator_client;
  // Names the job at the coordinator; two communicators sharing a
  // coordinator need different ids. Default: "dlrm".
  std::string job_id = "dlrm";
  // Grows with every (re)start of the job (e.g. the launch time), so that
  // the coordinator refuses a stale rank of an earlier run. Default: 0.
  int64_t generation = 0;
  // How long connecting waits for the coordinator and for every rank to
  // arrive and connect, in seconds. Default: 120.
  double connect_timeout_seconds = 120;
  // How long one collective waits for its peers before it fails (and the
  // communicator with it), in seconds. Default: 120.
  double op_timeout_seconds = 120;
};

}  // namespace dlrm::comm
