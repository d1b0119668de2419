// Launcher variables into a rank's identity.
#include "comm/launcher_env.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dlrm::comm {
namespace {

// One launcher's reading, with the names of the variables it came from
// (for errors).
struct Reading {
  LauncherRank values;
  std::string rank_var, size_var, local_var;
};

// The integer in variable `name`, nullopt when unset. InvalidArgument
// naming it when it is not an integer in [min, 2^31).
absl::StatusOr<std::optional<int>> IntVar(const EnvLookup& env,
                                          const char* name, int min) {
  const std::optional<std::string> text = env(name);
  if (!text.has_value()) return std::optional<int>();
  int value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher variable ", name, "='", *text,
                     "' is not an integer >= ", min));
  }
  return std::optional<int>(value);
}

// The first of `names` that is set, as an integer (see IntVar); *used
// receives its name.
absl::StatusOr<std::optional<int>> FirstIntVar(
    const EnvLookup& env, std::initializer_list<const char*> names, int min,
    std::string* used) {
  for (const char* name : names) {
    ASSIGN_OR_RETURN(std::optional<int> v, IntVar(env, name, min));
    if (v.has_value()) {
      *used = name;
      return v;
    }
  }
  return std::optional<int>();
}

// MASTER_PORT, or `fallback`.
absl::StatusOr<int> Port(const EnvLookup& env, int fallback) {
  ASSIGN_OR_RETURN(std::optional<int> port, IntVar(env, "MASTER_PORT", 1));
  if (port.has_value() && *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launcher variable MASTER_PORT=", *port, " is not a port (1-65535)"));
  }
  return port.value_or(fallback);
}

absl::StatusOr<std::optional<Reading>> ReadSlurm(const EnvLookup& env) {
  Reading r;
  ASSIGN_OR_RETURN(r.values.rank,
                   FirstIntVar(env, {"SLURM_PROCID"}, 0, &r.rank_var));
  if (!r.values.rank.has_value()) return std::optional<Reading>();
  r.values.source = "slurm";
  ASSIGN_OR_RETURN(
      r.values.world_size,
      FirstIntVar(env, {"SLURM_NTASKS", "SLURM_NPROCS"}, 1, &r.size_var));
  ASSIGN_OR_RETURN(r.values.local_rank,
                   FirstIntVar(env, {"SLURM_LOCALID"}, 0, &r.local_var));
  std::string nodes_var;
  ASSIGN_OR_RETURN(const std::optional<int> nodes,
                   FirstIntVar(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, 1,
                               &nodes_var));
  if (nodes.has_value()) r.values.single_host = *nodes == 1;
  // Every task of a job derives the same port from the job id, and two
  // jobs sharing a node get different ones (MASTER_PORT overrides).
  ASSIGN_OR_RETURN(const std::optional<int> job,
                   IntVar(env, "SLURM_JOB_ID", 0));
  ASSIGN_OR_RETURN(
      const int port,
      Port(env, kDefaultCoordinatorPort + (job.has_value() ? *job % 1000 : 0)));
  std::optional<std::string> list = env("SLURM_STEP_NODELIST");
  if (!list.has_value()) list = env("SLURM_JOB_NODELIST");
  if (r.values.single_host.value_or(false)) {
    r.values.coordinator = absl::StrCat("127.0.0.1:", port);
  } else if (list.has_value()) {
    ASSIGN_OR_RETURN(const std::string host, FirstSlurmHost(*list));
    r.values.coordinator = absl::StrCat(host, ":", port);
  }
  return std::optional<Reading>(std::move(r));
}

absl::StatusOr<std::optional<Reading>> ReadMpi(const EnvLookup& env) {
  Reading r;
  ASSIGN_OR_RETURN(
      r.values.rank,
      FirstIntVar(env, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}, 0, &r.rank_var));
  if (!r.values.rank.has_value()) return std::optional<Reading>();
  r.values.source = "mpi";
  ASSIGN_OR_RETURN(r.values.world_size,
                   FirstIntVar(env, {"OMPI_COMM_WORLD_SIZE"}, 1, &r.size_var));
  ASSIGN_OR_RETURN(
      r.values.local_rank,
      FirstIntVar(env, {"OMPI_COMM_WORLD_LOCAL_RANK"}, 0, &r.local_var));
  std::string unused;
  ASSIGN_OR_RETURN(
      const std::optional<int> local_size,
      FirstIntVar(env, {"OMPI_COMM_WORLD_LOCAL_SIZE"}, 1, &unused));
  if (local_size.has_value() && r.values.world_size.has_value()) {
    r.values.single_host = *local_size == *r.values.world_size;
  }
  // MPI names no rendezvous host: on one host it is this one; across
  // hosts MASTER_ADDR (or --coordinator) must say.
  if (r.values.single_host.value_or(false)) {
    ASSIGN_OR_RETURN(const int port, Port(env, kDefaultCoordinatorPort));
    r.values.coordinator = absl::StrCat("127.0.0.1:", port);
  }
  return std::optional<Reading>(std::move(r));
}

absl::StatusOr<std::optional<Reading>> ReadTorchrun(const EnvLookup& env) {
  Reading r;
  ASSIGN_OR_RETURN(r.values.rank, FirstIntVar(env, {"RANK"}, 0, &r.rank_var));
  if (!r.values.rank.has_value()) return std::optional<Reading>();
  r.values.source = "torchrun";
  ASSIGN_OR_RETURN(r.values.world_size,
                   FirstIntVar(env, {"WORLD_SIZE"}, 1, &r.size_var));
  ASSIGN_OR_RETURN(r.values.local_rank,
                   FirstIntVar(env, {"LOCAL_RANK"}, 0, &r.local_var));
  std::string unused;
  ASSIGN_OR_RETURN(const std::optional<int> local_size,
                   FirstIntVar(env, {"LOCAL_WORLD_SIZE"}, 1, &unused));
  if (local_size.has_value() && r.values.world_size.has_value()) {
    r.values.single_host = *local_size == *r.values.world_size;
  }
  return std::optional<Reading>(std::move(r));
}

// Whether two readings contradict on a field: InvalidArgument naming both
// variables.
absl::Status Agree(const std::optional<int>& a, const std::string& a_var,
                   const std::optional<int>& b, const std::string& b_var) {
  if (!a.has_value() || !b.has_value() || *a == *b) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "launchers disagree: ", a_var, "=", *a, " but ", b_var, "=", *b,
      "; unset one, or pass --rank / --world-size explicitly"));
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    const char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) break;
    if (c == ',' && depth == 0) break;
  }
  const std::string entry = nodelist.substr(0, end);
  const size_t open = entry.find('[');
  auto bad = [&nodelist] {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot read a host from the Slurm node list '", nodelist, "'"));
  };
  if (entry.empty() || depth < 0 || depth > 1 || entry.front() == '[') {
    return bad();
  }
  if (open == std::string::npos) {
    if (entry.find(']') != std::string::npos) return bad();
    return entry;
  }
  // prefix[a-b,c]suffix: the first range's start keeps its zero padding.
  const size_t close = entry.find(']', open);
  if (close == std::string::npos) return bad();
  const std::string inside = entry.substr(open + 1, close - open - 1);
  const size_t stop = inside.find_first_of(",-");
  const std::string first = inside.substr(0, stop);
  if (first.empty() ||
      first.find_first_not_of("0123456789") != std::string::npos) {
    return bad();
  }
  // A later bracket (rack[1-2]-n[1-4]) takes its first value too.
  std::string rest = entry.substr(close + 1);
  if (!rest.empty()) {
    absl::StatusOr<std::string> first_rest = FirstSlurmHost("x" + rest);
    if (!first_rest.ok()) return bad();
    rest = first_rest->substr(1);
  }
  return absl::StrCat(entry.substr(0, open), first, rest);
}

absl::StatusOr<LauncherRank> DetectLauncher(const EnvLookup& env) {
  std::vector<Reading> readings;
  for (auto read : {ReadSlurm, ReadMpi, ReadTorchrun}) {
    ASSIGN_OR_RETURN(std::optional<Reading> r, read(env));
    if (r.has_value()) readings.push_back(*std::move(r));
  }
  LauncherRank merged;
  if (readings.empty()) return merged;
  for (size_t i = 0; i < readings.size(); ++i) {
    for (size_t j = i + 1; j < readings.size(); ++j) {
      const Reading& a = readings[i];
      const Reading& b = readings[j];
      RETURN_IF_ERROR(
          Agree(a.values.rank, a.rank_var, b.values.rank, b.rank_var));
      RETURN_IF_ERROR(Agree(a.values.world_size, a.size_var,
                            b.values.world_size, b.size_var));
      RETURN_IF_ERROR(Agree(a.values.local_rank, a.local_var,
                            b.values.local_rank, b.local_var));
    }
  }
  // The first launcher that says a thing says it; an explicit MASTER_ADDR
  // (torchrun's reading) names the coordinator before a derived one.
  merged.source = readings.front().values.source;
  for (const Reading& r : readings) {
    const LauncherRank& v = r.values;
    if (!merged.rank) merged.rank = v.rank;
    if (!merged.world_size) merged.world_size = v.world_size;
    if (!merged.local_rank) merged.local_rank = v.local_rank;
    if (!merged.single_host) merged.single_host = v.single_host;
  }
  // An explicit MASTER_ADDR names the coordinator, whichever launcher
  // started the process; else the first launcher that derives one.
  if (const std::optional<std::string> addr = env("MASTER_ADDR");
      addr.has_value() && !addr->empty()) {
    ASSIGN_OR_RETURN(const int port, Port(env, kDefaultCoordinatorPort));
    // An IPv6 literal needs brackets before the port.
    const bool v6 =
        addr->find(':') != std::string::npos && addr->front() != '[';
    merged.coordinator = v6 ? absl::StrCat("[", *addr, "]:", port)
                            : absl::StrCat(*addr, ":", port);
  }
  for (const Reading& r : readings) {
    if (!merged.coordinator) merged.coordinator = r.values.coordinator;
  }
  return merged;
}

}  // namespace dlrm::comm
