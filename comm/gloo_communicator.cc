// The Gloo Communicator: rendezvous through the coordinator, then every
// collective as one Gloo call on the TCP transport, with Gloo's exceptions
// turned into Status.
#include "comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/collective_args.h"
#include "comm/coordinator_store.h"
#include "core/status.h"

namespace dlrm::comm {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Gloo takes millisecond timeouts and reads 0 as "none".
std::chrono::milliseconds ToMillis(double seconds) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::duration<double>(seconds)));
}

absl::Status WithContext(const absl::Status& status, absl::string_view where) {
  return absl::Status(status.code(),
                      absl::StrCat(where, ": ", status.message()));
}

// The exception in flight, thrown by Gloo, as a Status.
absl::Status CurrentExceptionToStatus() {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    // Gloo reports its timeouts ("Timed out waiting ...", "Read timeout",
    // "Application timeout caused pair closure") as IoExceptions too.
    const std::string text = absl::AsciiStrToLower(e.what());
    if (absl::StrContains(text, "timed out") ||
        absl::StrContains(text, "timeout")) {
      return absl::DeadlineExceededError(e.what());
    }
    return absl::UnavailableError(e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(
        absl::StrCat("gloo check failed (collective calls that differ across "
                     "ranks?): ",
                     e.what()));
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(e.what());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  } catch (...) {
    return absl::InternalError("unknown exception from gloo");
  }
}

// Sum reduction for gloo::allreduce. gloo::sum<T> indexes with an int, which
// would overflow on a segment of more than 2^31 elements.
template <typename T>
void SumInto(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

// Gloo builds its buffers from raw pointers and never writes through an
// input; a zero-length buffer still needs a pointer, so null becomes a
// pointer to nothing in particular.
uint8_t* Bytes(const void* ptr) {
  static uint8_t nothing = 0;
  return ptr == nullptr ? &nothing
                        : static_cast<uint8_t*>(const_cast<void*>(ptr));
}

void IgnoreSigpipeIfDefault() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context,
                   std::chrono::milliseconds op_timeout)
      : context_(std::move(context)), op_timeout_(op_timeout) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }

  absl::Status AllReduceSum(void* data, int64_t count, DataType type) override {
    RETURN_IF_ERROR(
        internal::CheckAllReduceSumArgs(data, count, type, internal::kHost)
            .status());
    RETURN_IF_ERROR(CheckUsable());
    // Every rank passes the same count, so all of them skip together.
    if (count == 0) return absl::OkStatus();
    return RunWith<gloo::AllreduceOptions>("AllReduceSum", [&](auto& opts) {
      if (type == DataType::kFloat32) {
        opts.setOutput(static_cast<float*>(data), static_cast<size_t>(count));
        opts.setReduceFunction(&SumInto<float>);
      } else {
        opts.setOutput(static_cast<int64_t*>(data), static_cast<size_t>(count));
        opts.setReduceFunction(&SumInto<int64_t>);
      }
      gloo::allreduce(opts);
    });
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    RETURN_IF_ERROR(internal::CheckAllToAllVArgs(send, send_counts, recv,
                                                 recv_counts, world_size(),
                                                 rank(), type, internal::kHost)
                        .status());
    RETURN_IF_ERROR(CheckUsable());
    // The exchange only moves bytes, so it runs on bytes for every type
    // (the checks above keep every byte count within int64).
    const int64_t element = static_cast<int64_t>(ElementSize(type));
    const int world = world_size();
    std::vector<int64_t> send_sizes(world), recv_sizes(world);
    for (int r = 0; r < world; ++r) {
      send_sizes[r] = send_counts[r] * element;
      recv_sizes[r] = recv_counts[r] * element;
    }
    return RunWith<gloo::AlltoallvOptions>("AllToAllV", [&](auto& opts) {
      opts.setInput(Bytes(send), std::move(send_sizes));
      opts.setOutput(Bytes(recv), std::move(recv_sizes));
      gloo::alltoallv(opts);
    });
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    ASSIGN_OR_RETURN(const size_t bytes, internal::CheckAllGatherArgs(
                                             send, count, recv, world_size(),
                                             type, internal::kHost));
    RETURN_IF_ERROR(CheckUsable());
    if (count == 0) return absl::OkStatus();
    return RunWith<gloo::AllgatherOptions>("AllGather", [&](auto& opts) {
      opts.setInput(Bytes(send), bytes);
      opts.setOutput(Bytes(recv), bytes * world_size());
      gloo::allgather(opts);
    });
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    ASSIGN_OR_RETURN(const size_t bytes, internal::CheckBroadcastArgs(
                                             data, count, type, root,
                                             world_size(), internal::kHost));
    RETURN_IF_ERROR(CheckUsable());
    if (count == 0) return absl::OkStatus();
    return RunWith<gloo::BroadcastOptions>("Broadcast", [&](auto& opts) {
      // With no input buffer, the root sends from its output buffer.
      opts.setOutput(Bytes(data), bytes);
      opts.setRoot(root);
      gloo::broadcast(opts);
    });
  }

  absl::Status Barrier() override {
    RETURN_IF_ERROR(CheckUsable());
    return RunWith<gloo::BarrierOptions>(
        "Barrier", [&](auto& opts) { gloo::barrier(opts); });
  }

 private:
  // After a failed collective the pairs are in an unknown state (Gloo's
  // error contract), so the communicator refuses further work.
  absl::Status CheckUsable() const {
    if (broken_.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "communicator unusable after an earlier error: ", broken_.message()));
  }

  // Run of `call` on Options for this context with the op timeout, the
  // one every collective takes.
  template <typename Options, typename Call>
  absl::Status RunWith(absl::string_view op, Call call) {
    return Run(op, [&] {
      Options opts(context_);
      opts.setTimeout(op_timeout_);
      call(opts);
    });
  }

  absl::Status Run(absl::string_view op, const std::function<void()>& call) {
    try {
      call();
      return absl::OkStatus();
    } catch (...) {
      broken_ = WithContext(
          CurrentExceptionToStatus(),
          absl::StrCat(op, " on rank ", rank(), " of ", world_size()));
      return broken_;
    }
  }

  std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds op_timeout_;
  absl::Status broken_;
};

}  // namespace

absl::Status GlooOptions::Validate() const {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", world_size, " must be >= 1"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is not in [0, world_size = ", world_size, ")"));
  }
  if (coordinator_address.empty()) {
    return absl::InvalidArgumentError("coordinator_address is empty");
  }
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  RETURN_IF_ERROR(coordinator_client.Validate());
  if (bind_address.empty()) {
    return absl::InvalidArgumentError("bind_address is empty");
  }
  if (!(connect_timeout_seconds > 0) || !(op_timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        "connect_timeout_seconds and op_timeout_seconds must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const GlooOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  IgnoreSigpipeIfDefault();
  const Clock::time_point start = Clock::now();
  const std::string where =
      absl::StrCat("ConnectGloo (rank ", options.rank, " of ",
                   options.world_size, ", job '", options.job_id, "')");

  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                   CoordinatorClient::Create(options.coordinator_address,
                                             options.coordinator_client));
  absl::StatusOr<uint64_t> session =
      client->RegisterRank(options.job_id, options.generation, options.rank,
                           options.world_size, options.connect_timeout_seconds);
  if (!session.ok()) return WithContext(session.status(), where);

  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_address;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (...) {
    return WithContext(
        CurrentExceptionToStatus(),
        absl::StrCat(where, ": TCP device on '", options.bind_address, "'"));
  }

  const double left = options.connect_timeout_seconds - SecondsSince(start);
  if (left <= 0) {
    return absl::DeadlineExceededError(
        absl::StrCat(where, ": the connect timeout passed while registering"));
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(
      options.rank, options.world_size);
  CoordinatorStore store(client.get(), *session, left);
  try {
    context->setTimeout(ToMillis(left));
    context->connectFullMesh(store, device);
  } catch (...) {
    // The store's own error says which ranks' addresses never came.
    const absl::Status status = store.last_error().ok()
                                    ? CurrentExceptionToStatus()
                                    : store.last_error();
    return WithContext(
        status,
        absl::StrCat(where,
                     ": exchanging transport addresses (one key per rank)"));
  }
  context->setTimeout(ToMillis(options.op_timeout_seconds));
  spdlog::info("comm: rank {} of {} connected over gloo/tcp on {} in {:.2f} s",
               options.rank, options.world_size, options.bind_address,
               SecondsSince(start));
  return std::unique_ptr<Communicator>(new GlooCommunicator(
      std::move(context), ToMillis(options.op_timeout_seconds)));
}

}  // namespace dlrm::comm
