// Picks the Communicator implementation from CommOptions and connects it.
#include "comm/factory.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/collective_args.h"
#include "comm/gloo_communicator.h"
#include "comm/host_staged_communicator.h"
#include "comm/nccl_communicator.h"
#include "core/status.h"

namespace dlrm::comm {

const char* CommBackendName(CommBackend backend) {
  switch (backend) {
    case CommBackend::kAuto:
      return "auto";
    case CommBackend::kSingleRank:
      return "single-rank";
    case CommBackend::kGloo:
      return "gloo";
    case CommBackend::kNccl:
      return "nccl";
    case CommBackend::kHostStaged:
      return "host-staged";
  }
  return "?";
}

namespace {

// Every backend, in CommBackendNames' order.
constexpr CommBackend kBackends[] = {
    CommBackend::kAuto, CommBackend::kSingleRank, CommBackend::kGloo,
    CommBackend::kNccl, CommBackend::kHostStaged};

// Whether `backend` may be named for buffers in `space` (auto and
// single-rank take either).
bool TakesBuffersIn(CommBackend backend, MemorySpace space) {
  switch (backend) {
    case CommBackend::kGloo:
      return space == MemorySpace::kHost;
    case CommBackend::kNccl:
    case CommBackend::kHostStaged:
      return space == MemorySpace::kDevice;
    case CommBackend::kSingleRank:
      return true;
    case CommBackend::kAuto:
      return true;
  }
  return false;
}

// The backends a flag of `space` may name (kSingleRank is chosen, never
// named there).
std::vector<CommBackend> Choices(MemorySpace space) {
  std::vector<CommBackend> out;
  for (CommBackend b : kBackends) {
    if (b != CommBackend::kSingleRank && TakesBuffersIn(b, space)) {
      out.push_back(b);
    }
  }
  return out;
}

}  // namespace

std::string CommBackendNames(MemorySpace space) {
  const std::vector<CommBackend> choices = Choices(space);
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) out += i + 1 == choices.size() ? " or " : ", ";
    out += CommBackendName(choices[i]);
  }
  return out;
}

absl::StatusOr<CommBackend> ParseCommBackend(absl::string_view flag,
                                             absl::string_view name,
                                             MemorySpace space) {
  for (CommBackend b : Choices(space)) {
    if (name == CommBackendName(b)) return b;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", name, ": expected ", CommBackendNames(space)));
}

absl::Status CommOptions::Validate() const {
  return ResolveBackend(*this).status();
}

absl::StatusOr<CommBackend> ResolveBackend(const CommOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommOptions: world_size ", options.world_size, " must be >= 1"));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions: rank ", options.rank,
                     " is not in [0, world_size = ", options.world_size, ")"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions: device must be >= 0, got ", options.device));
  }
  if (!(options.connect_timeout_seconds > 0) ||
      !(options.op_timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        "CommOptions: connect_timeout_seconds and op_timeout_seconds must be "
        "> 0");
  }
  const bool host = options.memory_space == MemorySpace::kHost;
  CommBackend backend = options.backend;
  if (backend == CommBackend::kAuto) {
    backend = options.world_size == 1 ? CommBackend::kSingleRank
              : host                  ? CommBackend::kGloo
                                      : CommBackend::kNccl;
  }
  if (backend == CommBackend::kSingleRank && options.world_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions: the single-rank communicator needs "
                     "world_size 1, got ",
                     options.world_size));
  }
  if ((backend == CommBackend::kGloo && !host) ||
      ((backend == CommBackend::kNccl || backend == CommBackend::kHostStaged) &&
       host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions: ", CommBackendName(backend), " takes ",
                     host ? "device" : "host", " buffers, not ",
                     MemorySpaceName(options.memory_space), " buffers"));
  }
  if (backend != CommBackend::kSingleRank) {
    if (options.coordinator_address.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CommOptions: coordinator_address is required for ",
                       CommBackendName(backend)));
    }
    if (options.job_id.empty()) {
      return absl::InvalidArgumentError("CommOptions: job_id is empty");
    }
    if (const absl::Status bad = options.coordinator_client.Validate();
        !bad.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CommOptions: coordinator_client: ", bad.message()));
    }
  }
  return backend;
}

namespace {

// GlooOptions or NcclOptions with the job (JobOptions) of `options`.
template <typename T>
T JobOptionsFrom(const CommOptions& options) {
  T t;
  static_cast<JobOptions&>(t) = options;
  return t;
}

// The Gloo communicator's options (Gloo itself, or under host-staged).
GlooOptions GlooOptionsFrom(const CommOptions& options) {
  GlooOptions gloo = JobOptionsFrom<GlooOptions>(options);
  gloo.bind_address = options.bind_address;
  return gloo;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommOptions& options) {
  ASSIGN_OR_RETURN(const CommBackend backend, ResolveBackend(options));
  if (options.memory_space == MemorySpace::kDevice) {
    RETURN_IF_ERROR(internal::CheckCudaDevice(
        options.device,
        absl::StrCat("CreateCommunicator (", CommBackendName(backend),
                     ", device buffers)")));
  }
  switch (backend) {
    case CommBackend::kSingleRank:
      if (options.memory_space == MemorySpace::kHost) {
        return MakeSingleRankCommunicator();
      }
      return MakeSingleRankDeviceCommunicator(options.device);
    case CommBackend::kGloo:
      return ConnectGloo(GlooOptionsFrom(options));
    case CommBackend::kHostStaged: {
      ASSIGN_OR_RETURN(std::unique_ptr<Communicator> host,
                       ConnectGloo(GlooOptionsFrom(options)));
      return MakeHostStagedCommunicator(std::move(host), DeviceKind::kCuda,
                                        options.device);
    }
    case CommBackend::kNccl: {
      NcclOptions nccl = JobOptionsFrom<NcclOptions>(options);
      nccl.device = options.device;
      return ConnectNccl(nccl);
    }
    case CommBackend::kAuto:
      break;
  }
  return absl::InternalError("CreateCommunicator: unresolved backend");
}

}  // namespace dlrm::comm
