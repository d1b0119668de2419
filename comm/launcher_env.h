// Rank discovery from the launcher that started the process: Slurm (srun),
// Open MPI / PMIx (mpirun), and the torchrun convention Kubernetes
// operators follow (PyTorchJob, an Indexed Job setting RANK). A rank's
// identity comes from explicit flags first, then from the one launcher
// whose variables are present; launchers that disagree are an error naming
// both (docs/deployment.md "Launchers").
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace dlrm::comm {

// The port the coordinator listens on when no launcher variable
// (MASTER_PORT) or flag names one: torchrun's default.
inline constexpr int kDefaultCoordinatorPort = 29500;

// What one launcher's variables say about this process; unset fields are
// what it does not say.
struct LauncherRank {
  // "slurm", "mpi" or "torchrun": the launcher the values came from.
  std::string source;
  std::optional<int> rank;
  std::optional<int> world_size;
  // This process's index among the ranks on its host: it picks the GPU.
  std::optional<int> local_rank;
  // HOST:PORT every rank dials and rank 0 hosts the rendezvous on.
  std::optional<std::string> coordinator;
  // Whether every rank runs on this host (then loopback addresses do).
  std::optional<bool> single_host;
};

// Reads a variable: its value, or nullopt when unset. Tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
// The process environment (getenv).
EnvLookup ProcessEnv();

// The first host of a Slurm host list: "node[01-04,07],gpu5" -> "node01",
// "a,b" -> "a", "gpu7" -> "gpu7". InvalidArgument for an empty or
// malformed list.
absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

// What the launcher variables in `env` say, merged across launchers:
// - Slurm: SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID,
//   the coordinator on the first host of SLURM_STEP_NODELIST (else
//   SLURM_JOB_NODELIST), single host when SLURM_NNODES (or
//   SLURM_STEP_NUM_NODES) is 1;
// - Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, single host when
//   OMPI_COMM_WORLD_LOCAL_SIZE equals the size; PMIx alone: PMIX_RANK;
// - torchrun / Kubernetes: RANK, WORLD_SIZE, LOCAL_RANK, single host when
//   LOCAL_WORLD_SIZE equals WORLD_SIZE.
// The coordinator is MASTER_ADDR:MASTER_PORT when MASTER_ADDR is set,
// whichever the launcher; else Slurm's first host, or 127.0.0.1 when
// Slurm or MPI says every rank is on this host. Its port is MASTER_PORT,
// else kDefaultCoordinatorPort (plus SLURM_JOB_ID mod 1000 under Slurm, so
// jobs sharing a node differ). A launcher counts only when its rank
// variable is set. Source "" when none
// does. InvalidArgument naming the variable for a value that is not a
// number in range, and naming both launchers' variables when two disagree
// on the rank or the world size.
absl::StatusOr<LauncherRank> DetectLauncher(const EnvLookup& env);

}  // namespace dlrm::comm
