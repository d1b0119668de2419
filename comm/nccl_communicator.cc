// NCCL collectives on device buffers through a non-blocking communicator.
// A call orders its collective after the caller's stream (an event the
// communicator's stream waits on), queues it (polling while NCCL answers
// ncclInProgress), records a completion event the caller's stream waits on,
// and hands that event to a watchdog thread, which aborts the communicator
// when the collective is late or NCCL reports an error: a peer that died
// (NCCL would wait for it forever) becomes an error, not a hang.
#include "comm/nccl_communicator.h"

#include "absl/strings/str_cat.h"
#include "comm/collective_args.h"
#include "core/status.h"

#if defined(DLRM_WITH_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/coordinator_client.h"
#include "comm/cuda_args.h"
#include "core/cuda/cuda_raii.h"
#include "core/cuda_status.h"

// Returns from the enclosing function when `expr` (an ncclResult_t) is not
// ncclSuccess: Unavailable for errors that come from the network or a peer
// (ncclSystemError, ncclRemoteError), Internal otherwise; the message names
// the call, NCCL's error string and the place.
#define NCCL_RETURN_IF_ERROR(expr)                                    \
  do {                                                                \
    const ncclResult_t _dlrm_nccl_res = (expr);                       \
    if (_dlrm_nccl_res != ncclSuccess) {                              \
      return ::dlrm::comm::NcclError(_dlrm_nccl_res, #expr, __FILE__, \
                                     __LINE__);                       \
    }                                                                 \
  } while (0)

// As NCCL_RETURN_IF_ERROR, but ncclInProgress is no error: a non-blocking
// communicator answers it while it is still queueing the call, which the
// caller then awaits (ncclCommGetAsyncError until ncclSuccess).
#define NCCL_RETURN_IF_FAILED_TO_QUEUE(expr)                                 \
  do {                                                                       \
    const ncclResult_t _dlrm_nccl_res = (expr);                              \
    if (_dlrm_nccl_res != ncclSuccess && _dlrm_nccl_res != ncclInProgress) { \
      return ::dlrm::comm::NcclError(_dlrm_nccl_res, #expr, __FILE__,        \
                                     __LINE__);                              \
    }                                                                        \
  } while (0)
#endif  // DLRM_WITH_NCCL

namespace dlrm::comm {

absl::Status NcclOptions::Validate() const {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclOptions: rank ", rank, " of world_size ", world_size));
  }
  if (world_size > 1 && coordinator_address.empty()) {
    return absl::InvalidArgumentError(
        "NcclOptions: coordinator_address is required for world_size > 1");
  }
  if (job_id.empty()) {
    return absl::InvalidArgumentError("NcclOptions: job_id is empty");
  }
  if (const absl::Status bad = coordinator_client.Validate(); !bad.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclOptions: coordinator_client: ", bad.message()));
  }
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclOptions: device must be >= 0, got ", device));
  }
  if (!(connect_timeout_seconds > 0) || !(op_timeout_seconds > 0)) {
    return absl::InvalidArgumentError("NcclOptions: timeouts must be > 0");
  }
  return absl::OkStatus();
}

#if defined(DLRM_WITH_NCCL)
namespace {

// The Status of NCCL call `call` that answered `result` (see
// NCCL_RETURN_IF_ERROR).
absl::Status NcclError(ncclResult_t result, absl::string_view call,
                       absl::string_view file, int line) {
  const std::string message = absl::StrCat(
      call, " failed: ", ncclGetErrorString(result), " at ", file, ":", line);
  if (result == ncclSystemError || result == ncclRemoteError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at the oldest unfinished collective.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(2);

Clock::duration Seconds(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(seconds));
}

// Between two polls: yield at first (NCCL usually answers within
// microseconds), then sleep so that a long wait does not burn a core.
void Backoff(int polls) {
  if (polls < 100) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Polls `comm` until the call that last answered ncclInProgress (or
// ncclSuccess) on it has finished: for a collective, until it is queued on
// its stream. Returns ncclSuccess, the error NCCL reports, or
// ncclInProgress when `deadline` passed first.
ncclResult_t AwaitReady(ncclComm_t comm, Clock::time_point deadline) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t call = ncclCommGetAsyncError(comm, &state);
    if (call != ncclSuccess) return call;
    if (state != ncclInProgress) return state;
    if (Clock::now() > deadline) return ncclInProgress;
    Backoff(polls);
  }
}

ncclDataType_t NcclType(DataType t) {
  switch (t) {
    case DataType::kUint8:
      return ncclUint8;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kInt64:
      return ncclInt64;
  }
  return ncclUint8;
}

// Owns an ncclComm_t: aborted when destroyed unless Finalize ended it in
// order. Move-only.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t comm) : comm_(comm) {}
  NcclComm(NcclComm&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)) {}
  NcclComm& operator=(NcclComm&& other) noexcept {
    if (this != &other) {
      Abort();
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() { Abort(); }

  ncclComm_t get() const { return comm_; }

  // Stops whatever the communicator still runs on the device and frees it.
  void Abort() {
    if (comm_ != nullptr) ncclCommAbort(std::exchange(comm_, nullptr));
  }

  // Flushes and frees the communicator in order (ncclCommFinalize, polled
  // until `deadline`, then ncclCommDestroy); aborts it instead when that
  // fails or does not finish in time (a peer that is gone).
  absl::Status Finalize(Clock::time_point deadline) {
    if (comm_ == nullptr) return absl::OkStatus();
    const ncclResult_t started = ncclCommFinalize(comm_);
    const ncclResult_t state =
        started == ncclSuccess || started == ncclInProgress
            ? AwaitReady(comm_, deadline)
            : started;
    if (state != ncclSuccess) {
      Abort();
      return state == ncclInProgress
                 ? absl::DeadlineExceededError(
                       "ncclCommFinalize did not finish in time; aborted")
                 : NcclError(state, "ncclCommFinalize", __FILE__, __LINE__);
    }
    NCCL_RETURN_IF_ERROR(ncclCommDestroy(std::exchange(comm_, nullptr)));
    return absl::OkStatus();
  }

 private:
  ncclComm_t comm_ = nullptr;
};

struct NcclParts {
  NcclComm comm;
  cuda::CudaStream stream;
  cuda::CudaEvent ready;
  cuda::CudaEvent handoff;
  cuda::RawDeviceBuffer scratch;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclParts parts, const NcclOptions& options)
      : comm_(std::move(parts.comm)),
        stream_(std::move(parts.stream)),
        ready_(std::move(parts.ready)),
        handoff_(std::move(parts.handoff)),
        scratch_(std::move(parts.scratch)),
        rank_(options.rank),
        world_(options.world_size),
        device_(options.device),
        op_timeout_(Seconds(options.op_timeout_seconds)),
        shutdown_timeout_(Seconds(options.connect_timeout_seconds)) {
    watchdog_ = std::thread([this] { Watch(); });
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ~NcclCommunicator() override {
    internal::ScopedDevice scoped;
    (void)scoped.Set(device_);
    // Let the collectives issued finish (the watchdog bounds the wait by
    // the op timeout) before the communicator goes.
    uint64_t last = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = issued_;
    }
    (void)WaitFor(last);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    const absl::Status finalized =
        comm_.Finalize(Clock::now() + shutdown_timeout_);
    if (!finalized.ok()) {
      spdlog::warn("comm: NCCL rank {} of {}: {}", rank_, world_,
                   finalized.ToString());
    }
    // Freed here, with the device current, rather than after the body.
    pending_.clear();
    free_events_.clear();
    scratch_ = cuda::RawDeviceBuffer();
    ready_ = cuda::CudaEvent();
    handoff_ = cuda::CudaEvent();
    stream_ = cuda::CudaStream();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }

  absl::Status SetStream(void* stream) override {
    internal::ScopedDevice scoped;
    ASSIGN_OR_RETURN(cudaStream_t next, scoped.SetForStream(device_, stream));
    std::lock_guard<std::mutex> lock(mu_);
    if (next != nullptr && issued_ > 0 && error_.ok()) {
      // The new stream must also wait for the collectives queued so far
      // (the old one already does).
      CUDA_RETURN_IF_ERROR(cudaEventRecord(handoff_.get(), stream_.get()));
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(next, handoff_.get()));
    }
    caller_ = next;
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    uint64_t last = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = issued_;
    }
    return WaitFor(last);
  }

  absl::Status AllReduceSum(void* data, int64_t count, DataType type) override {
    RETURN_IF_ERROR(
        internal::CheckAllReduceSumArgs(data, count, type, device_).status());
    // Every rank passes the same count, so all of them skip together.
    if (count == 0) return UsableOrError();
    return Issue("AllReduceSum", /*wait=*/false, [&]() -> absl::Status {
      NCCL_RETURN_IF_FAILED_TO_QUEUE(
          ncclAllReduce(data, data, static_cast<size_t>(count), NcclType(type),
                        ncclSum, comm_.get(), stream_.get()));
      return absl::OkStatus();
    });
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    ASSIGN_OR_RETURN(
        const internal::AllToAllVBytes bytes,
        internal::CheckAllToAllVArgs(send, send_counts, recv, recv_counts,
                                     world_, rank_, type, device_));
    const size_t send_bytes = bytes.send, recv_bytes = bytes.recv;
    RETURN_IF_ERROR(internal::CheckDisjoint(send, send_bytes, recv, recv_bytes,
                                            "AllToAllV"));
    const size_t element = ElementSize(type);
    return Issue("AllToAllV", /*wait=*/false, [&]() -> absl::Status {
      // NCCL has no all-to-all-v: grouped point-to-point sends and
      // receives, one pair per peer with something to move.
      NCCL_RETURN_IF_FAILED_TO_QUEUE(ncclGroupStart());
      absl::Status posted = [&]() -> absl::Status {
        const char* s = static_cast<const char*>(send);
        char* r = static_cast<char*>(recv);
        for (int peer = 0; peer < world_; ++peer) {
          if (send_counts[peer] > 0) {
            NCCL_RETURN_IF_FAILED_TO_QUEUE(
                ncclSend(s, static_cast<size_t>(send_counts[peer]),
                         NcclType(type), peer, comm_.get(), stream_.get()));
          }
          if (recv_counts[peer] > 0) {
            NCCL_RETURN_IF_FAILED_TO_QUEUE(
                ncclRecv(r, static_cast<size_t>(recv_counts[peer]),
                         NcclType(type), peer, comm_.get(), stream_.get()));
          }
          s += send_counts[peer] * element;
          r += recv_counts[peer] * element;
        }
        return absl::OkStatus();
      }();
      // The group is closed whatever happened inside it: NCCL keeps the
      // group per thread, and an open one would swallow later calls.
      const ncclResult_t ended = ncclGroupEnd();
      RETURN_IF_ERROR(posted);
      NCCL_RETURN_IF_FAILED_TO_QUEUE(ended);
      return absl::OkStatus();
    });
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    RETURN_IF_ERROR(
        internal::CheckAllGatherArgs(send, count, recv, world_, type, device_)
            .status());
    if (count == 0) return UsableOrError();
    return Issue("AllGather", /*wait=*/false, [&]() -> absl::Status {
      NCCL_RETURN_IF_FAILED_TO_QUEUE(
          ncclAllGather(send, recv, static_cast<size_t>(count), NcclType(type),
                        comm_.get(), stream_.get()));
      return absl::OkStatus();
    });
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    RETURN_IF_ERROR(
        internal::CheckBroadcastArgs(data, count, type, root, world_, device_)
            .status());
    if (count == 0) return UsableOrError();
    return Issue("Broadcast", /*wait=*/false, [&]() -> absl::Status {
      NCCL_RETURN_IF_FAILED_TO_QUEUE(
          ncclBroadcast(data, data, static_cast<size_t>(count), NcclType(type),
                        root, comm_.get(), stream_.get()));
      return absl::OkStatus();
    });
  }

  absl::Status Barrier() override {
    return Issue("Barrier", /*wait=*/true, [&]() -> absl::Status {
      NCCL_RETURN_IF_FAILED_TO_QUEUE(
          ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclInt64, ncclSum,
                        comm_.get(), stream_.get()));
      return absl::OkStatus();
    });
  }

 private:
  // A collective queued on stream_ and not yet seen finished.
  struct Pending {
    cuda::CudaEvent done;  // recorded on stream_ right after it
    uint64_t seq;          // 1 for the first collective issued
    const char* op;
    Clock::time_point oldest_since;  // when it became the oldest pending
  };

  // Issues one collective: `enqueue` makes its NCCL calls on stream_. With
  // a caller's stream and !wait, returns once it is queued; otherwise when
  // it is done.
  absl::Status Issue(const char* op, bool wait,
                     const std::function<absl::Status()>& enqueue) {
    internal::ScopedDevice scoped;
    RETURN_IF_ERROR(scoped.Set(device_));
    uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return TakeErrorLocked();
      if (caller_ != nullptr) {
        // The caller's stream produced the input: the collective starts
        // after the work queued there so far.
        CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_.get(), caller_));
        CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), ready_.get()));
      }
      // Queued means: the call answered ncclSuccess, or ncclInProgress and
      // then the communicator's state became ncclSuccess. Nothing else may
      // go on stream_ before that, the completion event included.
      absl::Status queued = enqueue();
      if (queued.ok()) queued = AwaitQueuedLocked(op);
      if (queued.ok()) queued = TrackLocked(op, &seq);
      if (!queued.ok()) {
        AbortLocked(queued);
        return TakeErrorLocked();
      }
    }
    cv_.notify_all();
    if (caller_ != nullptr && !wait) return absl::OkStatus();
    return WaitFor(seq);
  }

  absl::Status AwaitQueuedLocked(const char* op) {
    const ncclResult_t state =
        AwaitReady(comm_.get(), Clock::now() + op_timeout_);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state == ncclInProgress) {
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL ", op, " on rank ", rank_, " of ", world_,
          " was not queued within the op timeout (a peer stopped answering?)"));
    }
    return NcclError(state, absl::StrCat("queueing NCCL ", op), __FILE__,
                     __LINE__);
  }

  // Records the completion event of the collective just queued, makes the
  // caller's stream wait for it, and hands it to the watchdog.
  absl::Status TrackLocked(const char* op, uint64_t* seq) {
    cuda::CudaEvent done;
    if (free_events_.empty()) {
      ASSIGN_OR_RETURN(done, cuda::CudaEvent::Create());
    } else {
      done = std::move(free_events_.back());
      free_events_.pop_back();
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(done.get(), stream_.get()));
    if (caller_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(caller_, done.get()));
    }
    *seq = ++issued_;
    pending_.push_back(Pending{std::move(done), *seq, op, Clock::now()});
    return absl::OkStatus();
  }

  // Waits until collective `seq` (and every one before it) is done, or the
  // communicator failed.
  absl::Status WaitFor(uint64_t seq) {
    for (int polls = 0;; ++polls) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        PollLocked();
        if (!error_.ok()) return TakeErrorLocked();
        if (retired_ >= seq) return absl::OkStatus();
      }
      Backoff(polls);
    }
  }

  // Retires the finished collectives at the front of pending_; aborts the
  // communicator when the oldest unfinished one failed, NCCL reports an
  // asynchronous error, or the op timeout passed.
  void PollLocked() {
    while (!pending_.empty() && error_.ok()) {
      Pending& front = pending_.front();
      const cudaError_t done = cudaEventQuery(front.done.get());
      if (done == cudaSuccess) {
        retired_ = front.seq;
        free_events_.push_back(std::move(front.done));
        pending_.pop_front();
        if (!pending_.empty()) {
          pending_.front().oldest_since =
              std::max(pending_.front().oldest_since, Clock::now());
        }
        continue;
      }
      if (done != cudaErrorNotReady) {
        AbortLocked(absl::InternalError(absl::StrCat(
            "NCCL ", front.op, " on rank ", rank_, " of ", world_,
            ": cudaEventQuery failed: ", cudaGetErrorString(done))));
        return;
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t call = ncclCommGetAsyncError(comm_.get(), &state);
      if (call != ncclSuccess) state = call;
      if (state != ncclSuccess && state != ncclInProgress) {
        AbortLocked(NcclError(
            state,
            absl::StrCat("NCCL ", front.op, " on rank ", rank_, " of ", world_,
                         " (", ncclGetLastError(comm_.get()), ")"),
            __FILE__, __LINE__));
        return;
      }
      if (Clock::now() - front.oldest_since > op_timeout_) {
        AbortLocked(absl::DeadlineExceededError(absl::StrCat(
            "NCCL ", front.op, " on rank ", rank_, " of ", world_,
            " did not finish within the op timeout of ",
            std::chrono::duration<double>(op_timeout_).count(),
            " s (a peer stopped answering?); communicator aborted")));
      }
      return;
    }
  }

  // Aborts the communicator, which ends its kernels on the device (so the
  // streams waiting on them go on, and later CUDA calls such as cudaFree do
  // not hang), and keeps `why` for the calls that follow.
  void AbortLocked(const absl::Status& why) {
    comm_.Abort();
    if (error_.ok()) error_ = why;
    // The events go with the collectives; a stream waiting on one still
    // passes it once the aborted kernels have ended.
    pending_.clear();
    spdlog::error("comm: NCCL rank {} of {} aborted: {}", rank_, world_,
                  why.ToString());
  }

  // The error, the first time it is reported; FailedPrecondition after.
  absl::Status TakeErrorLocked() {
    if (!error_reported_) {
      error_reported_ = true;
      return error_;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL communicator unusable after an earlier error: ",
                     error_.message()));
  }

  absl::Status UsableOrError() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.ok() ? absl::OkStatus() : TakeErrorLocked();
  }

  // The watchdog: between calls (and while the caller's stream runs ahead)
  // it is what notices a late or failed collective and aborts.
  void Watch() {
    internal::ScopedDevice scoped;
    (void)scoped.Set(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      PollLocked();
      if (pending_.empty() || !error_.ok()) {
        cv_.wait(lock);
      } else {
        cv_.wait_for(lock, kWatchdogPeriod);
      }
    }
  }

  std::mutex mu_;  // guards what follows and every NCCL call on comm_
  std::condition_variable cv_;  // wakes the watchdog
  NcclComm comm_;
  cuda::CudaStream stream_;        // the collectives' stream
  cuda::CudaEvent ready_;          // recorded on caller_ before a collective
  cuda::CudaEvent handoff_;        // orders a new caller stream (SetStream)
  cuda::RawDeviceBuffer scratch_;  // one int64 for Barrier
  std::deque<Pending> pending_;
  std::vector<cuda::CudaEvent> free_events_;
  cudaStream_t caller_ = nullptr;  // borrowed (SetStream); the caller's thread
  uint64_t issued_ = 0;            // collectives queued so far
  uint64_t retired_ = 0;           // the latest seen done
  absl::Status error_;             // set when the communicator was aborted
  bool error_reported_ = false;
  bool stop_ = false;
  const int rank_;
  const int world_;
  const int device_;
  const Clock::duration op_timeout_;
  const Clock::duration shutdown_timeout_;
  std::thread watchdog_;
};

// The unique id of the job: made by rank 0 and published through the
// coordinator, read by the others.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(const NcclOptions& options,
                                              Clock::time_point deadline) {
  ncclUniqueId id;
  if (options.world_size == 1) {
    NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    return id;
  }
  const auto left = [&] {
    return std::max(
        1e-3, std::chrono::duration<double>(deadline - Clock::now()).count());
  };
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                   CoordinatorClient::Create(options.coordinator_address,
                                             options.coordinator_client));
  ASSIGN_OR_RETURN(
      uint64_t session,
      client->RegisterRank(options.job_id, options.generation, options.rank,
                           options.world_size, left()));
  constexpr char kKey[] = "nccl-unique-id";
  if (options.rank == 0) {
    NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    RETURN_IF_ERROR(client->StoreSet(
        session, kKey,
        std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)),
        left()));
    return id;
  }
  ASSIGN_OR_RETURN(std::string value, client->StoreGet(session, kKey, left()));
  if (value.size() != sizeof(id)) {
    return absl::InternalError(
        absl::StrCat("ConnectNccl: the coordinator's unique id has ",
                     value.size(), " bytes, expected ", sizeof(id)));
  }
  std::memcpy(&id, value.data(), sizeof(id));
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    const NcclOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  RETURN_IF_ERROR(internal::CheckCudaDevice(options.device, "ConnectNccl"));
  const Clock::time_point deadline =
      Clock::now() + Seconds(options.connect_timeout_seconds);
  internal::ScopedDevice scoped;
  RETURN_IF_ERROR(scoped.Set(options.device));

  NcclParts parts;
  ASSIGN_OR_RETURN(parts.stream, cuda::CudaStream::Create());
  ASSIGN_OR_RETURN(parts.ready, cuda::CudaEvent::Create());
  ASSIGN_OR_RETURN(parts.handoff, cuda::CudaEvent::Create());
  ASSIGN_OR_RETURN(parts.scratch,
                   cuda::RawDeviceBuffer::Allocate(sizeof(int64_t)));
  ASSIGN_OR_RETURN(ncclUniqueId id, ExchangeUniqueId(options, deadline));

  // Non-blocking, so that a rank that never arrives cannot hang this one:
  // polled until done or the connect timeout, then aborted.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t raw = nullptr;
  const ncclResult_t init = ncclCommInitRankConfig(&raw, options.world_size, id,
                                                   options.rank, &config);
  parts.comm = NcclComm(raw);  // aborted on every early return below
  NCCL_RETURN_IF_FAILED_TO_QUEUE(init);
  const ncclResult_t state = AwaitReady(raw, deadline);
  if (state == ncclInProgress) {
    return absl::DeadlineExceededError(absl::StrCat(
        "ConnectNccl: rank ", options.rank, " of ", options.world_size,
        ": the other ranks did not join within ",
        options.connect_timeout_seconds, " s"));
  }
  if (state != ncclSuccess) {
    return NcclError(state, "ncclCommInitRankConfig (awaited)", __FILE__,
                     __LINE__);
  }
  spdlog::info("comm: rank {} of {} connected over NCCL on CUDA device {}",
               options.rank, options.world_size, options.device);
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(std::move(parts), options));
}

#else  // !DLRM_WITH_NCCL

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    const NcclOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return absl::FailedPreconditionError(
      "ConnectNccl: this binary was built without CUDA (no NCCL)");
}

#endif  // DLRM_WITH_NCCL

}  // namespace dlrm::comm
