// NCCL entry points defined by the test binary, in front of libnccl's (see
// nccl_fault_injection.h). Unarmed, each forwards to the real function.
#include "tests/comm/nccl_fault_injection.h"

#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>

namespace dlrm::testing::nccl_fault {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Function>
Function Real(const char* name) {
  void* symbol = dlsym(RTLD_NEXT, name);
  if (symbol == nullptr) {
    std::fprintf(stderr, "nccl_fault_injection: no real %s: %s\n", name,
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<Function>(symbol);
}

std::atomic<Fault> armed{Fault::kNone};
std::atomic<int> aborts{0};

// The collective held back by kSlowQueue or kNeverQueued, and for
// kAsyncErrorAfterQueue how many polls still answer ncclSuccess.
std::mutex mu;
std::function<ncclResult_t()> held;  // guarded by mu
Clock::time_point release_at;        // guarded by mu
int good_polls = 0;                  // guarded by mu

}  // namespace

void Arm(Fault fault) {
  std::lock_guard<std::mutex> lock(mu);
  held = nullptr;
  good_polls = 0;
  armed.store(fault);
}

int AbortCount() { return aborts.load(); }

}  // namespace dlrm::testing::nccl_fault

using dlrm::testing::nccl_fault::Fault;
namespace fault = dlrm::testing::nccl_fault;

extern "C" ncclResult_t ncclAllGather(const void* send, void* recv,
                                      size_t count, ncclDataType_t type,
                                      ncclComm_t comm, cudaStream_t stream) {
  static const auto real =
      fault::Real<decltype(&ncclAllGather)>("ncclAllGather");
  const Fault armed = fault::armed.load();
  if (armed == Fault::kSlowQueue || armed == Fault::kNeverQueued) {
    std::lock_guard<std::mutex> lock(fault::mu);
    fault::held = [=] { return real(send, recv, count, type, comm, stream); };
    fault::release_at =
        armed == Fault::kSlowQueue
            ? fault::Clock::now() + std::chrono::milliseconds(30)
            : fault::Clock::time_point::max();
    return ncclInProgress;
  }
  if (armed == Fault::kAsyncErrorAfterQueue) {
    std::lock_guard<std::mutex> lock(fault::mu);
    fault::good_polls = 1;
  }
  return real(send, recv, count, type, comm, stream);
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm,
                                              ncclResult_t* state) {
  static const auto real =
      fault::Real<decltype(&ncclCommGetAsyncError)>("ncclCommGetAsyncError");
  const Fault armed = fault::armed.load();
  if (armed == Fault::kSlowQueue || armed == Fault::kNeverQueued) {
    std::lock_guard<std::mutex> lock(fault::mu);
    if (fault::held) {
      if (fault::Clock::now() < fault::release_at) {
        *state = ncclInProgress;
        return ncclSuccess;
      }
      const ncclResult_t queued = fault::held();
      fault::held = nullptr;
      if (queued != ncclSuccess) {
        *state = queued;
        return ncclSuccess;
      }
    }
  }
  if (armed == Fault::kAsyncErrorAfterQueue) {
    std::lock_guard<std::mutex> lock(fault::mu);
    if (fault::good_polls == 0) {
      *state = ncclRemoteError;
      return ncclSuccess;
    }
    --fault::good_polls;
  }
  return real(comm, state);
}

extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) {
  static const auto real =
      fault::Real<decltype(&ncclCommAbort)>("ncclCommAbort");
  {
    // An aborted communicator's held collective is gone with it.
    std::lock_guard<std::mutex> lock(fault::mu);
    fault::held = nullptr;
  }
  fault::aborts.fetch_add(1);
  return real(comm);
}
