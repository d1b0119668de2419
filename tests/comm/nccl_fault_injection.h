// Test-only fault injection for the NCCL communicator on a real GPU: the
// test binary defines ncclAllGather, ncclCommGetAsyncError and
// ncclCommAbort itself (ELF interposition; nccl_fault_injection.cc), passing
// every call on to NCCL unless a fault is armed. So one GPU can show what
// only a cluster would otherwise: a call answering ncclInProgress, a
// collective that is never queued, an asynchronous error after queueing.
#pragma once

namespace dlrm::testing::nccl_fault {

enum class Fault {
  // Every call goes to NCCL unchanged.
  kNone,
  // ncclAllGather answers ncclInProgress and is queued for real only when
  // ncclCommGetAsyncError is polled 30 ms later (until then it says
  // ncclInProgress): a slow non-blocking enqueue.
  kSlowQueue,
  // ncclAllGather answers ncclInProgress and is never queued: the state
  // stays ncclInProgress until the communicator is aborted.
  kNeverQueued,
  // ncclAllGather is queued for real; the first state poll after it says
  // ncclSuccess, every later one ncclRemoteError: a peer failing while the
  // collective waits on the device.
  kAsyncErrorAfterQueue,
};

// Arms `fault` for the calls that follow (one armed at a time).
void Arm(Fault fault);

// How many times ncclCommAbort was called through this binary's entry point
// since the process started.
int AbortCount();

}  // namespace dlrm::testing::nccl_fault
