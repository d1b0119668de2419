// Tests for comm/: the single-rank communicators, the factory, the
// coordinator service, the Gloo communicator with real rank processes on
// loopback, the host-staged communicator (over the CPU Device everywhere,
// against Gloo), and the NCCL and CUDA host-staged communicators (GPU tests:
// they skip without a device, or fail with DLRM_REQUIRE_CUDA=1). The binary
// re-executes itself as a child rank (kChildFlag; see main at the bottom).
#include <gloo/common/error.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/collective_args.h"
#include "comm/communicator.h"
#include "comm/coordinator.h"
#include "comm/factory.h"
#include "comm/gloo_communicator.h"
#include "comm/host_staged_communicator.h"
#include "comm/launcher_env.h"
#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "core/random.h"
#include "core/status.h"
#include "tests/support/files.h"
#include "tests/support/process.h"
#include "tests/support/test_certs.h"
#if defined(DLRM_WITH_NCCL)
#include <cuda_runtime_api.h>

#include "core/cuda/cuda_raii.h"
#include "tests/comm/nccl_fault_injection.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/expect.h"
#endif

namespace dlrm::comm {
namespace {

using test::ReadFile;

constexpr char kChildFlag[] = "--comm_test_child";
constexpr uint64_t kDefaultSeed = 20261122;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

uint64_t TestSeed() {
  const char* env = std::getenv("DLRM_TEST_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : kDefaultSeed;
}

// `check(comm, n, TestSeed())` (CheckCollectives, CheckDeviceCollectives)
// at the element counts a one-rank communicator is tried with (none, one,
// odd, large); each failure names its count.
template <typename Check>
void ExpectOkAtEveryCount(Communicator& comm, Check check) {
  for (int64_t n : {0, 1, 5, 1031, 300007}) {
    const absl::Status status = check(comm, n, TestSeed());
    EXPECT_TRUE(status.ok()) << "n " << n << ": " << status;
  }
}

// Sets `job` to rank `rank` of `world` meeting at `coordinator` under
// `job_id`, waiting `connect_timeout_seconds` for the other ranks.
void Join(JobOptions& job, int rank, int world, const std::string& coordinator,
          const std::string& job_id, double connect_timeout_seconds) {
  job.rank = rank;
  job.world_size = world;
  job.coordinator_address = coordinator;
  job.job_id = job_id;
  job.connect_timeout_seconds = connect_timeout_seconds;
}

// The name of a (world size, element count) case, e.g. "world2_count5", for
// INSTANTIATE_TEST_SUITE_P.
std::string WorldAndCountName(
    const ::testing::TestParamInfo<std::tuple<int, int64_t>>& info) {
  return absl::StrCat("world", std::get<0>(info.param), "_count",
                      std::get<1>(info.param));
}

// The statuses of `body(r)` for r in [0, ranks), each run on a thread of
// its own (ranks of one job in one process).
std::vector<absl::Status> OnRankThreads(
    int ranks, const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { results[r] = body(r); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// ------------------------------------------------ deterministic test data

enum class Op : uint64_t { kAllReduce = 1, kAllToAll, kAllGather, kBroadcast };

constexpr DataType kAllTypes[] = {DataType::kUint8, DataType::kFloat32,
                                  DataType::kInt64};

// The DataType values' names, in their order.
constexpr const char* kTypeNames[] = {"uint8", "float32", "int64"};
static_assert(std::size(kTypeNames) ==
              static_cast<size_t>(DataType::kInt64) + 1);

const char* TypeName(DataType type) {
  return kTypeNames[static_cast<int>(type)];
}

uint64_t Stream(Op op, DataType type, int src, int dst = 0) {
  return (static_cast<uint64_t>(op) << 48) ^
         (static_cast<uint64_t>(type) << 40) ^
         (static_cast<uint64_t>(src) << 20) ^ static_cast<uint64_t>(dst);
}

// `count` elements of `type` that a pure function of (seed, stream) makes,
// so every rank can compute what every other rank sends. Floats lie in
// [-1, 1) and int64s below 2^40 in magnitude, so sums are exact or close.
std::vector<uint8_t> Pattern(DataType type, uint64_t seed, uint64_t stream,
                             int64_t count) {
  std::vector<uint8_t> out(count * ElementSize(type));
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t bits = HashKey(seed, stream, i);
    if (type == DataType::kUint8) {
      out[i] = static_cast<uint8_t>(bits);
    } else if (type == DataType::kFloat32) {
      const float v = BitsToUnitFloat(bits) * 2.0f - 1.0f;
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const int64_t v = static_cast<int64_t>(bits >> 24) - (int64_t{1} << 39);
      std::memcpy(out.data() + 8 * i, &v, 8);
    }
  }
  return out;
}

// Elements rank `src` sends rank `dst` in the AllToAllV check, from a base
// count n: uneven (n/2, n, 3n/2) and, for some pairs, nothing.
int64_t SplitCount(int src, int dst, int64_t n) {
  if ((src + dst) % 3 == 1) return 0;
  return n * (1 + (src + 2 * dst) % 3) / 2;
}

absl::Status CompareBytes(const std::vector<uint8_t>& got,
                          const std::vector<uint8_t>& want,
                          const std::string& what) {
  if (got.size() != want.size()) {
    return absl::InternalError(
        absl::StrCat(what, ": ", got.size(), " bytes, want ", want.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return absl::InternalError(
          absl::StrCat(what, ": byte ", i, " is ", got[i], ", want ", want[i]));
    }
  }
  return absl::OkStatus();
}

// Runs every collective on `comm` with base element count n and checks the
// results; every rank of the job calls it with the same n and seed.
absl::Status CheckCollectives(Communicator& comm, int64_t n, uint64_t seed) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  const std::string where =
      absl::StrCat("rank ", rank, " of ", world, ", n ", n);

  for (DataType type : {DataType::kFloat32, DataType::kInt64}) {
    std::vector<uint8_t> data =
        Pattern(type, seed, Stream(Op::kAllReduce, type, rank), n);
    RETURN_IF_ERROR(comm.AllReduceSum(data.data(), n, type));
    std::vector<std::vector<uint8_t>> inputs;
    for (int r = 0; r < world; ++r) {
      inputs.push_back(Pattern(type, seed, Stream(Op::kAllReduce, type, r), n));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (type == DataType::kFloat32) {
        double want = 0;
        for (const auto& in : inputs) {
          want += reinterpret_cast<const float*>(in.data())[i];
        }
        const float got = reinterpret_cast<const float*>(data.data())[i];
        // The ring sums in another order than this loop: a few ulps of the
        // partial sums, which stay below `world` in magnitude.
        if (std::fabs(got - want) > 1e-5 * world) {
          return absl::InternalError(
              absl::StrCat(where, ": AllReduceSum float32 [", i, "] = ", got,
                           ", want ", want));
        }
      } else {
        int64_t want = 0;
        for (const auto& in : inputs) {
          want += reinterpret_cast<const int64_t*>(in.data())[i];
        }
        const int64_t got = reinterpret_cast<const int64_t*>(data.data())[i];
        if (got != want) {
          return absl::InternalError(
              absl::StrCat(where, ": AllReduceSum int64 [", i, "] = ", got,
                           ", want ", want));
        }
      }
    }
  }
  // A refused argument leaves the communicator usable (checked by the
  // collectives that follow).
  uint8_t byte = 0;
  if (comm.AllReduceSum(&byte, 1, DataType::kUint8).code() !=
      absl::StatusCode::kInvalidArgument) {
    return absl::InternalError(where + ": AllReduceSum accepted kUint8");
  }

  for (DataType type : kAllTypes) {
    const std::string what = absl::StrCat(where, ", ", TypeName(type));
    std::vector<int64_t> send_counts(world), recv_counts(world);
    std::vector<uint8_t> send, want;
    for (int r = 0; r < world; ++r) {
      send_counts[r] = SplitCount(rank, r, n);
      recv_counts[r] = SplitCount(r, rank, n);
      const auto out = Pattern(type, seed, Stream(Op::kAllToAll, type, rank, r),
                               send_counts[r]);
      send.insert(send.end(), out.begin(), out.end());
      const auto in = Pattern(type, seed, Stream(Op::kAllToAll, type, r, rank),
                              recv_counts[r]);
      want.insert(want.end(), in.begin(), in.end());
    }
    std::vector<uint8_t> recv(want.size(), 0xab);
    RETURN_IF_ERROR(comm.AllToAllV(send.data(), send_counts, recv.data(),
                                   recv_counts, type));
    RETURN_IF_ERROR(CompareBytes(recv, want, what + ": AllToAllV"));

    const auto mine =
        Pattern(type, seed, Stream(Op::kAllGather, type, rank), n);
    std::vector<uint8_t> gathered(mine.size() * world, 0xab), all;
    for (int r = 0; r < world; ++r) {
      const auto in = Pattern(type, seed, Stream(Op::kAllGather, type, r), n);
      all.insert(all.end(), in.begin(), in.end());
    }
    RETURN_IF_ERROR(comm.AllGather(mine.data(), n, gathered.data(), type));
    RETURN_IF_ERROR(CompareBytes(gathered, all, what + ": AllGather"));

    for (int root = 0; root < world; ++root) {
      const auto root_data =
          Pattern(type, seed, Stream(Op::kBroadcast, type, root), n);
      std::vector<uint8_t> data =
          rank == root ? root_data
                       : std::vector<uint8_t>(root_data.size(), 0xab);
      RETURN_IF_ERROR(comm.Broadcast(data.data(), n, type, root));
      RETURN_IF_ERROR(CompareBytes(
          data, root_data, absl::StrCat(what, ": Broadcast from ", root)));
    }
  }
  return comm.Barrier();
}

// Runs every collective on `plain` (a Gloo communicator) and on `staged` (a
// host-staged one, seen through host buffers) with the same inputs, each
// output poisoned first, and requires bitwise equal results: AllReduceSum
// of both summable types, AllToAllV of every type with two uneven splits
// (SplitCount's, with empty pairs, and everything to rank 0), AllGather and
// Broadcast from every root. With `in_place` (staged takes host buffers
// directly) it also gathers in place (send inside recv) on `staged`.
absl::Status CompareWithGloo(Communicator& plain, Communicator& staged,
                             int64_t n, uint64_t seed, bool in_place) {
  const int rank = plain.rank();
  const int world = plain.world_size();
  if (staged.rank() != rank || staged.world_size() != world) {
    return absl::InternalError(
        absl::StrCat("staged is rank ", staged.rank(), " of ",
                     staged.world_size(), ", Gloo rank ", rank, " of ", world));
  }
  const std::string where =
      absl::StrCat("rank ", rank, " of ", world, ", n ", n, ", staged vs Gloo");
  // Streams apart from CheckCollectives' (same seed, other data).
  const auto stream = [](Op op, DataType type, int src, int dst = 0) {
    return Stream(op, type, src, dst) ^ (uint64_t{1} << 62);
  };
  using Call = std::function<absl::Status(Communicator&, std::vector<uint8_t>&,
                                          std::vector<uint8_t>&)>;
  // `call(comm, data, out)` on each communicator with its own copy of
  // `data` and an `out` of `out_bytes`; both must come out the same.
  const auto both = [&](const std::string& what,
                        const std::vector<uint8_t>& data, size_t out_bytes,
                        const Call& call) -> absl::Status {
    std::vector<uint8_t> plain_data = data, plain_out(out_bytes, 0xab);
    std::vector<uint8_t> staged_data = data, staged_out(out_bytes, 0xcd);
    RETURN_IF_ERROR(call(plain, plain_data, plain_out));
    RETURN_IF_ERROR(call(staged, staged_data, staged_out));
    RETURN_IF_ERROR(CompareBytes(staged_data, plain_data,
                                 absl::StrCat(where, ": ", what, " data")));
    return CompareBytes(staged_out, plain_out,
                        absl::StrCat(where, ": ", what, " output"));
  };

  for (DataType type : {DataType::kFloat32, DataType::kInt64}) {
    RETURN_IF_ERROR(
        both(absl::StrCat("AllReduceSum ", TypeName(type)),
             Pattern(type, seed, stream(Op::kAllReduce, type, rank), n), 0,
             [&](Communicator& comm, std::vector<uint8_t>& data,
                 std::vector<uint8_t>&) {
               return comm.AllReduceSum(data.data(), n, type);
             }));
  }

  const auto to_rank0 = [](int src, int dst, int64_t n) -> int64_t {
    return dst == 0 ? n + src : 0;
  };
  for (DataType type : kAllTypes) {
    const size_t element = ElementSize(type);
    for (int split = 0; split < 2; ++split) {
      const auto count = [&](int src, int dst) {
        return split == 0 ? SplitCount(src, dst, n) : to_rank0(src, dst, n);
      };
      std::vector<int64_t> send_counts(world), recv_counts(world);
      std::vector<uint8_t> send;
      int64_t recv_total = 0;
      for (int r = 0; r < world; ++r) {
        send_counts[r] = count(rank, r);
        recv_counts[r] = count(r, rank);
        recv_total += recv_counts[r];
        const auto out = Pattern(
            type, seed, stream(Op::kAllToAll, type, rank, r), send_counts[r]);
        send.insert(send.end(), out.begin(), out.end());
      }
      RETURN_IF_ERROR(
          both(absl::StrCat("AllToAllV ", TypeName(type), " split ", split),
               send, recv_total * element,
               [&](Communicator& comm, std::vector<uint8_t>& data,
                   std::vector<uint8_t>& out) {
                 return comm.AllToAllV(data.data(), send_counts, out.data(),
                                       recv_counts, type);
               }));
    }

    const auto mine =
        Pattern(type, seed, stream(Op::kAllGather, type, rank), n);
    RETURN_IF_ERROR(both(
        absl::StrCat("AllGather ", TypeName(type)), mine, mine.size() * world,
        [&](Communicator& comm, std::vector<uint8_t>& data,
            std::vector<uint8_t>& out) {
          return comm.AllGather(data.data(), n, out.data(), type);
        }));
    if (in_place) {
      // This rank's input already at its place in the output.
      std::vector<uint8_t> plain_out(mine.size() * world, 0xab);
      RETURN_IF_ERROR(plain.AllGather(mine.data(), n, plain_out.data(), type));
      std::vector<uint8_t> staged_out(mine.size() * world, 0xcd);
      std::copy(mine.begin(), mine.end(),
                staged_out.begin() + mine.size() * rank);
      RETURN_IF_ERROR(staged.AllGather(staged_out.data() + mine.size() * rank,
                                       n, staged_out.data(), type));
      RETURN_IF_ERROR(CompareBytes(
          staged_out, plain_out,
          absl::StrCat(where, ": AllGather in place ", TypeName(type))));
    }

    for (int root = 0; root < world; ++root) {
      const auto data =
          rank == root
              ? Pattern(type, seed, stream(Op::kBroadcast, type, root), n)
              : std::vector<uint8_t>(n * element, 0xef);
      RETURN_IF_ERROR(both(
          absl::StrCat("Broadcast ", TypeName(type), " from ", root), data, 0,
          [&](Communicator& comm, std::vector<uint8_t>& d,
              std::vector<uint8_t>&) {
            return comm.Broadcast(d.data(), n, type, root);
          }));
    }
  }
  RETURN_IF_ERROR(plain.Barrier());
  return staged.Barrier();
}

#if defined(DLRM_WITH_NCCL)
// Holds a stream back for a moment from the host, so that a collective that
// is not ordered after the stream's work reads its input too early.
void CUDART_CB HoldStream(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

// Host buffers in, a device communicator underneath: each call copies its
// inputs to device buffers, runs the collective there and copies the
// outputs back, so CheckCollectives checks device communicators against
// the same reference. With a stream (given to the device communicator's
// SetStream by the caller) every copy is queued on it after HoldStream, and
// the stream is synchronised before returning: a collective not ordered
// after the stream, or a stream not waiting for the collective, gives wrong
// bytes. Arguments the device communicator must refuse are passed through
// as they are.
class HostBufferAdapter final : public Communicator {
 public:
  HostBufferAdapter(Communicator* device, cudaStream_t stream)
      : device_(device), stream_(stream) {}

  int rank() const override { return device_->rank(); }
  int world_size() const override { return device_->world_size(); }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }

  absl::Status AllReduceSum(void* data, int64_t count, DataType type) override {
    auto bytes = internal::BytesOf(count, type, "AllReduceSum");
    if (!bytes.ok() || type == DataType::kUint8) {
      return device_->AllReduceSum(data, count, type);
    }
    ASSIGN_OR_RETURN(void* d, In(0, data, *bytes));
    RETURN_IF_ERROR(device_->AllReduceSum(d, count, type));
    return Out(data, 0, *bytes);
  }

  absl::Status AllToAllV(const void* send, std::span<const int64_t> send_counts,
                         void* recv, std::span<const int64_t> recv_counts,
                         DataType type) override {
    auto send_bytes =
        internal::BytesOfCounts(send_counts, world_size(), type, "send");
    auto recv_bytes =
        internal::BytesOfCounts(recv_counts, world_size(), type, "recv");
    if (!send_bytes.ok() || !recv_bytes.ok()) {
      return device_->AllToAllV(send, send_counts, recv, recv_counts, type);
    }
    ASSIGN_OR_RETURN(void* s, In(0, send, *send_bytes));
    ASSIGN_OR_RETURN(void* r, In(1, nullptr, *recv_bytes));
    RETURN_IF_ERROR(device_->AllToAllV(s, send_counts, r, recv_counts, type));
    return Out(recv, 1, *recv_bytes);
  }

  absl::Status AllGather(const void* send, int64_t count, void* recv,
                         DataType type) override {
    auto bytes = internal::BytesOf(count, type, "AllGather");
    if (!bytes.ok()) return device_->AllGather(send, count, recv, type);
    ASSIGN_OR_RETURN(void* s, In(0, send, *bytes));
    ASSIGN_OR_RETURN(void* r, In(1, nullptr, *bytes * world_size()));
    RETURN_IF_ERROR(device_->AllGather(s, count, r, type));
    return Out(recv, 1, *bytes * world_size());
  }

  absl::Status Broadcast(void* data, int64_t count, DataType type,
                         int root) override {
    auto bytes = internal::BytesOf(count, type, "Broadcast");
    if (!bytes.ok() || root < 0 || root >= world_size()) {
      return device_->Broadcast(data, count, type, root);
    }
    ASSIGN_OR_RETURN(void* d, In(0, data, *bytes));
    RETURN_IF_ERROR(device_->Broadcast(d, count, type, root));
    return Out(data, 0, *bytes);
  }

  absl::Status Barrier() override { return device_->Barrier(); }

 private:
  // Device buffer `slot` holding `bytes` copied from `host`, or poisoned
  // (0xab) when `host` is null.
  absl::StatusOr<void*> In(int slot, const void* host, size_t bytes) {
    RETURN_IF_ERROR(slots_[slot].Reserve(std::max<size_t>(bytes, 1)));
    void* d = slots_[slot].data();
    if (stream_ == nullptr) {
      CUDA_RETURN_IF_ERROR(cudaMemset(d, 0xab, bytes));
      if (host != nullptr && bytes > 0) {
        CUDA_RETURN_IF_ERROR(
            cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
      }
      // Without a stream the communicator takes finished inputs (a
      // pageable copy may still be in flight when cudaMemcpy returns).
      CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      return d;
    }
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d, 0xab, bytes, stream_));
    CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream_, HoldStream, nullptr));
    if (host != nullptr && bytes > 0) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream_));
    }
    return d;
  }

  absl::Status Out(void* host, int slot, size_t bytes) {
    if (stream_ == nullptr) {
      if (bytes > 0) {
        CUDA_RETURN_IF_ERROR(cudaMemcpy(host, slots_[slot].data(), bytes,
                                        cudaMemcpyDeviceToHost));
      }
      return absl::OkStatus();
    }
    if (bytes > 0) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, slots_[slot].data(), bytes,
                                           cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return device_->Synchronize();
  }

  Communicator* device_;
  cudaStream_t stream_;
  cuda::RawDeviceBuffer slots_[2];
};

// CheckCollectives on a device communicator: without a stream, then with
// one (set on `comm` for the second pass and cleared after).
absl::Status CheckDeviceCollectives(Communicator& comm, int64_t n,
                                    uint64_t seed) {
  {
    HostBufferAdapter host_view(&comm, nullptr);
    RETURN_IF_ERROR(CheckCollectives(host_view, n, seed));
  }
  ASSIGN_OR_RETURN(cuda::CudaStream stream, cuda::CudaStream::Create());
  RETURN_IF_ERROR(comm.SetStream(stream.get()));
  {
    HostBufferAdapter host_view(&comm, stream.get());
    RETURN_IF_ERROR(CheckCollectives(host_view, n, seed));
  }
  RETURN_IF_ERROR(comm.SetStream(nullptr));
  return comm.Synchronize();
}
#endif  // DLRM_WITH_NCCL

// ------------------------------------------------------------ child ranks

std::string WriteFileAtomically(const std::string& path,
                                const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::filesystem::rename(tmp, path);
  return path;
}

// A rank's result: its status code on the first line, the message after.
void WriteResult(const std::string& path, const absl::Status& status) {
  WriteFileAtomically(path, absl::StrCat(static_cast<int>(status.code()), "\n",
                                         status.message()));
}

absl::Status ReadResult(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    return absl::DataLossError(absl::StrCat("no result file ", path));
  }
  const std::string text = ReadFile(path);
  const size_t newline = text.find('\n');
  const int code = std::atoi(text.substr(0, newline).c_str());
  return absl::Status(
      static_cast<absl::StatusCode>(code),
      newline == std::string::npos ? "" : text.substr(newline + 1));
}

// Polls for `path` to exist; false after `timeout_seconds`.
bool WaitForFile(const std::string& path, double timeout_seconds) {
  const Clock::time_point start = Clock::now();
  while (!std::filesystem::exists(path)) {
    if (SecondsSince(start) > timeout_seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// --key=value flags of a child rank.
class ChildFlags {
 public:
  ChildFlags(int argc, char** argv) {
    for (int i = 2; i < argc; ++i) {
      std::string arg = argv[i];
      const size_t eq = arg.find('=');
      if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
        values_[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
      }
    }
  }
  std::string Str(const std::string& key) const {
    auto it = values_.find(key);
    return it == values_.end() ? "" : it->second;
  }
  int64_t Int(const std::string& key) const {
    return std::strtoll(Str(key).c_str(), nullptr, 10);
  }
  double Double(const std::string& key) const {
    return std::strtod(Str(key).c_str(), nullptr);
  }

 private:
  std::map<std::string, std::string> values_;
};

// Collectives in a loop until one fails (a peer was killed or stopped);
// writes `ready_path` after the first good round.
absl::Status LoopUntilError(Communicator& comm, const std::string& ready_path) {
  const int world = comm.world_size();
  std::vector<float> values(256, 1.0f);
  std::vector<int64_t> counts(world, 8);
  std::vector<int64_t> send(8 * world, comm.rank()), recv(8 * world);
  const Clock::time_point start = Clock::now();
  bool ready = false;
  while (SecondsSince(start) < 60) {
    RETURN_IF_ERROR(
        comm.AllReduceSum(values.data(), values.size(), DataType::kFloat32));
    std::fill(values.begin(), values.end(), 1.0f);
    RETURN_IF_ERROR(comm.AllToAllV(send.data(), counts, recv.data(), counts,
                                   DataType::kInt64));
    if (!ready) {
      WriteFileAtomically(ready_path, "ready");
      ready = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::InternalError("no collective failed within 60 s");
}

// Connects a plain Gloo communicator and a host-staged one of the same
// ranks, then checks the staged one against Gloo (bitwise) and against the
// reference. --staged=cpu stages through the CPU Device (straight to
// MakeHostStagedCommunicator), --staged=cuda through CUDA device 0 for
// every rank (the factory's kHostStaged), without and with a stream.
absl::Status RunStagedVsGloo(const ChildFlags& flags, GlooOptions options) {
  const int64_t n = flags.Int("count");
  const uint64_t seed = flags.Int("seed");
  const bool cuda = flags.Str("staged") == "cuda";
  const std::string job = options.job_id;
  options.job_id = job + "-plain";
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> plain, ConnectGloo(options));
  options.job_id = job + "-staged";
  std::unique_ptr<Communicator> staged;
  if (cuda) {
    CommOptions co;
    co.memory_space = MemorySpace::kDevice;
    co.backend = CommBackend::kHostStaged;
    co.rank = options.rank;
    co.world_size = options.world_size;
    co.coordinator_address = options.coordinator_address;
    co.job_id = options.job_id;
    co.generation = options.generation;
    co.device = 0;  // every rank on one GPU
    co.connect_timeout_seconds = options.connect_timeout_seconds;
    co.op_timeout_seconds = options.op_timeout_seconds;
    ASSIGN_OR_RETURN(staged, CreateCommunicator(co));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> host, ConnectGloo(options));
    ASSIGN_OR_RETURN(
        staged, MakeHostStagedCommunicator(std::move(host), DeviceKind::kCpu));
  }
  if (staged->memory_space() != MemorySpace::kDevice) {
    return absl::InternalError("the host-staged communicator is not kDevice");
  }
  if (!cuda) {
    RETURN_IF_ERROR(CompareWithGloo(*plain, *staged, n, seed, true));
    RETURN_IF_ERROR(CheckCollectives(*staged, n, seed));
    return staged->Synchronize();
  }
#if defined(DLRM_WITH_NCCL)
  {
    HostBufferAdapter host_view(staged.get(), nullptr);
    RETURN_IF_ERROR(CompareWithGloo(*plain, host_view, n, seed, false));
  }
  ASSIGN_OR_RETURN(cuda::CudaStream stream, cuda::CudaStream::Create());
  RETURN_IF_ERROR(staged->SetStream(stream.get()));
  {
    HostBufferAdapter host_view(staged.get(), stream.get());
    RETURN_IF_ERROR(CompareWithGloo(*plain, host_view, n, seed, false));
  }
  RETURN_IF_ERROR(staged->SetStream(nullptr));
  return CheckDeviceCollectives(*staged, n, seed);
#else
  return absl::InternalError("--staged=cuda in a binary without CUDA");
#endif
}

absl::Status RunChildScenario(const ChildFlags& flags) {
  const std::string scenario = flags.Str("scenario");
  GlooOptions options;
  options.rank = static_cast<int>(flags.Int("rank"));
  options.world_size = static_cast<int>(flags.Int("world"));
  options.coordinator_address = flags.Str("coordinator");
  options.job_id = flags.Str("job");
  options.generation = flags.Int("generation");
  options.connect_timeout_seconds = flags.Double("connect_timeout");
  options.op_timeout_seconds = flags.Double("op_timeout");

  // Rank 0 hosts the coordinator, as in a real job, and publishes the port
  // it got through a file.
  std::unique_ptr<CoordinatorServer> server;
  if (scenario == "rank0_hosts") {
    const std::string address_file = flags.Str("address_file");
    if (options.rank == 0) {
      ASSIGN_OR_RETURN(server, CoordinatorServer::Start({}));
      WriteFileAtomically(address_file, server->address());
    } else if (!WaitForFile(address_file, options.connect_timeout_seconds)) {
      return absl::DeadlineExceededError("rank 0 never published its address");
    }
    options.coordinator_address = ReadFile(address_file);
  }
  if (scenario == "staged_vs_gloo") return RunStagedVsGloo(flags, options);

  // --space=host|device goes through the factory, no --space straight to
  // ConnectGloo.
  const std::string space = flags.Str("space");
  std::unique_ptr<Communicator> comm;
  if (space.empty()) {
    ASSIGN_OR_RETURN(comm, ConnectGloo(options));
  } else {
    CommOptions co;
    co.memory_space =
        space == "device" ? MemorySpace::kDevice : MemorySpace::kHost;
    co.rank = options.rank;
    co.world_size = options.world_size;
    co.coordinator_address = options.coordinator_address;
    co.job_id = options.job_id;
    co.generation = options.generation;
    co.device = options.rank % std::max(1, CudaDeviceCount());
    co.connect_timeout_seconds = options.connect_timeout_seconds;
    co.op_timeout_seconds = options.op_timeout_seconds;
    ASSIGN_OR_RETURN(comm, CreateCommunicator(co));
    if (comm->memory_space() != co.memory_space) {
      return absl::InternalError("the factory made the wrong memory space");
    }
  }
  if (scenario == "loop" && flags.Str("staged") == "cpu") {
    // The host-staged communicator passes the host's failure on, then
    // refuses further work.
    ASSIGN_OR_RETURN(
        std::unique_ptr<Communicator> staged,
        MakeHostStagedCommunicator(std::move(comm), DeviceKind::kCpu));
    const absl::Status status = LoopUntilError(*staged, flags.Str("ready"));
    for (const absl::Status& after :
         {staged->Barrier(), staged->Synchronize()}) {
      if (after.code() != absl::StatusCode::kFailedPrecondition) {
        return absl::InternalError(
            absl::StrCat("after ", status.ToString(), ": ", after.ToString()));
      }
    }
    return status;
  }
  if (comm->memory_space() == MemorySpace::kDevice) {
#if defined(DLRM_WITH_NCCL)
    if (scenario == "loop") {
      // Memory taken while healthy and freed after the failure: with the
      // communicator aborted, cudaFree and a device synchronisation return
      // (a hang here makes the parent report this rank as hung).
      void* probe = nullptr;
      CUDA_RETURN_IF_ERROR(cudaMalloc(&probe, 1 << 20));
      HostBufferAdapter host_view(comm.get(), nullptr);
      const absl::Status status = LoopUntilError(host_view, flags.Str("ready"));
      CUDA_RETURN_IF_ERROR(cudaFree(probe));
      CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      return status;
    }
    return CheckDeviceCollectives(*comm, flags.Int("count"), flags.Int("seed"));
#else
    return absl::InternalError("a device communicator without CUDA");
#endif
  }
  if (scenario == "loop") {
    return LoopUntilError(*comm, flags.Str("ready"));
  }
  return CheckCollectives(*comm, flags.Int("count"), flags.Int("seed"));
}

int ChildMain(int argc, char** argv) {
  const ChildFlags flags(argc, argv);
  const absl::Status status = RunChildScenario(flags);
  WriteResult(flags.Str("result"), status);
  return 0;
}

// ------------------------------------------------------- parent helpers

// A port nothing listens on (bound, read back, closed again).
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::unique_ptr<CoordinatorServer> StartCoordinator() {
  auto server = CoordinatorServer::Start({});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(server).value() : nullptr;
}

// Spawns and reaps child rank processes; kills leftovers when destroyed.
class RankProcesses {
 public:
  explicit RankProcesses(std::string dir) : dir_(std::move(dir)) {}
  ~RankProcesses() {
    for (auto& [rank, pid] : pids_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  std::string ResultPath(int rank) const {
    return absl::StrCat(dir_, "/rank", rank, ".result");
  }
  std::string ReadyPath(int rank) const {
    return absl::StrCat(dir_, "/rank", rank, ".ready");
  }

  // Starts `rank` running `scenario`; `flags` are passed as --key=value.
  void Start(int rank, const std::map<std::string, std::string>& flags) {
    std::vector<std::string> args = {kChildFlag};
    for (const auto& [key, value] : flags) {
      args.push_back(absl::StrCat("--", key, "=", value));
    }
    args.push_back(absl::StrCat("--rank=", rank));
    args.push_back(absl::StrCat("--result=", ResultPath(rank)));
    args.push_back(absl::StrCat("--ready=", ReadyPath(rank)));
    const pid_t pid = test::SpawnSelf(args);
    ASSERT_NE(pid, -1);
    pids_[rank] = pid;
  }

  void Signal(int rank, int signal) { kill(pids_.at(rank), signal); }

  // Waits for every started rank to exit; a rank still running after
  // `timeout_seconds` is killed and reported. Returns an error naming the
  // ranks that did not exit cleanly.
  absl::Status WaitAll(double timeout_seconds) {
    const Clock::time_point start = Clock::now();
    std::vector<std::string> problems;
    while (!pids_.empty()) {
      for (auto it = pids_.begin(); it != pids_.end();) {
        int wstatus = 0;
        if (waitpid(it->second, &wstatus, WNOHANG) == it->second) {
          if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
            problems.push_back(absl::StrCat(
                "rank ", it->first, " exited with wait status ", wstatus));
          }
          it = pids_.erase(it);
        } else {
          ++it;
        }
      }
      if (!pids_.empty() && SecondsSince(start) > timeout_seconds) {
        for (auto& [rank, pid] : pids_) {
          kill(pid, SIGKILL);
          waitpid(pid, nullptr, 0);
          problems.push_back(absl::StrCat("rank ", rank, " hung; killed"));
        }
        pids_.clear();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (problems.empty()) return absl::OkStatus();
    std::string text;
    for (const auto& p : problems) absl::StrAppend(&text, p, "; ");
    return absl::InternalError(text);
  }

 private:
  std::string dir_;
  std::map<int, pid_t> pids_;
};

class CommProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed();
    std::printf("[   seed   ] %llu (DLRM_TEST_SEED overrides)\n",
                static_cast<unsigned long long>(seed_));
    std::string pattern =
        (std::filesystem::temp_directory_path() / "comm_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Flags every child needs.
  std::map<std::string, std::string> BaseFlags(const std::string& scenario,
                                               int world,
                                               const std::string& coordinator,
                                               const std::string& job) const {
    return {{"scenario", scenario},       {"world", std::to_string(world)},
            {"coordinator", coordinator}, {"job", job},
            {"generation", "1"},          {"seed", std::to_string(seed_)},
            {"connect_timeout", "20"},    {"op_timeout", "20"}};
  }

  // Runs the collectives check on `world` rank processes against the
  // coordinator at `coordinator`, expecting every rank to pass; `space`
  // "host" or "device" connects through the factory; `extra` flags are
  // added (and may name another scenario).
  void RunCollectives(int world, int64_t count, const std::string& coordinator,
                      const std::string& job, const std::string& space = "",
                      const std::map<std::string, std::string>& extra = {}) {
    RankProcesses ranks(dir_);
    auto flags = BaseFlags("collectives", world, coordinator, job);
    flags["count"] = std::to_string(count);
    if (!space.empty()) flags["space"] = space;
    for (const auto& [key, value] : extra) flags[key] = value;
    for (int r = 0; r < world; ++r) ranks.Start(r, flags);
    ASSERT_TRUE(ranks.WaitAll(40).ok());
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(ReadResult(ranks.ResultPath(r)).ok())
          << "rank " << r << ": " << ReadResult(ranks.ResultPath(r));
    }
  }

  uint64_t seed_ = 0;
  std::string dir_;
};

// ------------------------------------------------------------- single rank

TEST(CommSingleRankTest, CollectivesAreCopies) {
  auto comm = MakeSingleRankCommunicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  for (int64_t n : {0, 1, 5, 1031}) {
    EXPECT_TRUE(CheckCollectives(*comm, n, TestSeed()).ok())
        << CheckCollectives(*comm, n, TestSeed());
  }
}

TEST(CommSingleRankTest, RefusesBadArguments) {
  auto comm = MakeSingleRankCommunicator();
  float f[4] = {};
  const int64_t one[] = {1};
  const int64_t two[] = {1, 1};
  const int64_t other[] = {2};
  const int64_t negative[] = {-1};
  EXPECT_EQ(comm->AllReduceSum(f, 4, DataType::kUint8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->AllReduceSum(f, -1, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->AllReduceSum(nullptr, 4, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->AllToAllV(f, two, f, two, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->AllToAllV(f, one, f, other, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      comm->AllToAllV(f, negative, f, negative, DataType::kFloat32).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->AllGather(f, int64_t{1} << 62, f, DataType::kInt64).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Broadcast(f, 4, DataType::kFloat32, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm->AllToAllV(f, one, f + 1, one, DataType::kFloat32).ok());
  EXPECT_TRUE(comm->Barrier().ok());
}

// A CommProcessTest over (world size, base element count); the AllToAllV
// check splits unevenly around the count and leaves some pairs empty.
class CommRanksTest
    : public CommProcessTest,
      public ::testing::WithParamInterface<std::tuple<int, int64_t>> {
 protected:
  // RunCollectives on GetParam()'s ranks and count, against a coordinator
  // of its own.
  void RunCollectivesOfParam(
      const std::string& job, const std::string& space = "",
      const std::map<std::string, std::string>& extra = {}) {
    const auto [world, count] = GetParam();
    auto server = StartCoordinator();
    ASSERT_NE(server, nullptr);
    RunCollectives(world, count, server->address(), job, space, extra);
  }
};

// ------------------------------------------------------------- coordinator

class CommCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartCoordinator();
    ASSERT_NE(server_, nullptr);
    auto client = CoordinatorClient::Create(server_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(client).value();
  }

  uint64_t Register(const std::string& job, int64_t generation, int rank,
                    int world) {
    auto session = client_->RegisterRank(job, generation, rank, world, 5);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.value_or(0);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<CoordinatorClient> client_;
};

TEST_F(CommCoordinatorTest, PicksAFreePort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), absl::StrCat("127.0.0.1:", server_->port()));
  CoordinatorServerOptions options;
  options.listen_address = "no-port";
  auto bad = CoordinatorServer::Start(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// The port is the coordinator's alone (no SO_REUSEPORT): a second one on
// it fails naming the flag, the address and the reason.
TEST_F(CommCoordinatorTest, SecondCoordinatorOnATakenPortFailsNamingIt) {
  CoordinatorServerOptions options;
  options.listen_address = server_->address();
  auto second = CoordinatorServer::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            absl::StrCat("--coordinator ", server_->address(),
                         ": address already in use"));
}

TEST_F(CommCoordinatorTest, SetGetAndWait) {
  const uint64_t session = Register("job", 0, 0, 1);
  ASSERT_NE(session, 0u);
  ASSERT_TRUE(client_->StoreSet(session, "a", "alpha", 5).ok());
  ASSERT_TRUE(client_->StoreSet(session, "b", std::string("\0b", 2), 5).ok());
  EXPECT_EQ(client_->StoreGet(session, "a", 5).value_or(""), "alpha");
  EXPECT_EQ(client_->StoreGet(session, "b", 5).value_or(""),
            std::string("\0b", 2));
  EXPECT_TRUE(client_->StoreWait(session, {"a", "b"}, 5).ok());
  EXPECT_EQ(client_->StoreSet(session, "", "x", 5).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CommCoordinatorTest, GetWaitsUntilTheKeyIsSet) {
  const uint64_t session = Register("job", 0, 0, 1);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(client_->StoreSet(session, "late", "value", 5).ok());
  });
  const Clock::time_point start = Clock::now();
  auto value = client_->StoreGet(session, "late", 5);
  const double waited = SecondsSince(start);
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "value");
  EXPECT_GE(waited, 0.2);
}

TEST_F(CommCoordinatorTest, WaitTimesOutNamingTheMissingKeys) {
  const uint64_t session = Register("job", 0, 0, 1);
  ASSERT_TRUE(client_->StoreSet(session, "here", "x", 5).ok());
  absl::Status status = client_->StoreWait(session, {"here", "gone"}, 0.6);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_HAS_SUBSTR(status.message(), "['gone']") << status;
}

TEST_F(CommCoordinatorTest, RegisterWaitsForTheRoundAndNamesMissingRanks) {
  std::vector<absl::StatusOr<uint64_t>> results(2, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = client_->RegisterRank("job", 0, r, 3, 1.0); });
  }
  for (auto& t : threads) t.join();
  for (const auto& result : results) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_HAS_SUBSTR(result.status().message(), "ranks [2] of 3")
        << result.status();
  }
  // Timed-out ranks left the round: a full round now succeeds.
  std::vector<uint64_t> sessions(3);
  threads.clear();
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { sessions[r] = Register("job", 0, r, 3); });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(sessions[0], 0u);
  EXPECT_EQ(sessions[0], sessions[1]);
  EXPECT_EQ(sessions[0], sessions[2]);
}

TEST_F(CommCoordinatorTest, EveryRoundGetsAFreshSession) {
  const uint64_t first = Register("job", 0, 0, 1);
  const uint64_t second = Register("job", 0, 0, 1);
  EXPECT_NE(first, second);
  EXPECT_EQ(client_->StoreSet(first, "k", "v", 5).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->StoreSet(second, "k", "v", 5).ok());
  // Another job's rounds leave this one alone.
  EXPECT_NE(Register("other", 0, 0, 1), 0u);
  EXPECT_TRUE(client_->StoreSet(second, "k", "v", 5).ok());
}

TEST_F(CommCoordinatorTest, RefusesAStaleGeneration) {
  Register("job", 5, 0, 1);
  auto stale = client_->RegisterRank("job", 4, 0, 1, 5);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition)
      << stale.status();
  EXPECT_NE(Register("job", 6, 0, 1), 0u);
}

TEST_F(CommCoordinatorTest, NewerGenerationAbortsTheWaitingRound) {
  absl::StatusOr<uint64_t> old_round = absl::UnknownError("");
  std::thread waiting(
      [&] { old_round = client_->RegisterRank("job", 1, 0, 2, 5); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_NE(Register("job", 2, 0, 1), 0u);
  waiting.join();
  EXPECT_EQ(old_round.status().code(), absl::StatusCode::kAborted)
      << old_round.status();
}

TEST_F(CommCoordinatorTest, RefusesDisagreeingWorldSizesAndDuplicateRanks) {
  absl::StatusOr<uint64_t> first = absl::UnknownError("");
  std::thread waiting(
      [&] { first = client_->RegisterRank("job", 0, 0, 2, 1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(client_->RegisterRank("job", 0, 1, 3, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->RegisterRank("job", 0, 0, 2, 1).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client_->RegisterRank("job", 0, 2, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->RegisterRank("", 0, 0, 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  waiting.join();
  EXPECT_EQ(first.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CommCoordinatorTest, ShutdownAnswersWaitingCalls) {
  const uint64_t session = Register("job", 0, 0, 1);
  absl::StatusOr<std::string> value = absl::UnknownError("");
  std::thread waiting([&] { value = client_->StoreGet(session, "never", 30); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server_.reset();
  waiting.join();
  EXPECT_EQ(value.status().code(), absl::StatusCode::kUnavailable)
      << value.status();
}

TEST(CommCoordinatorClientTest, UnreachableCoordinatorGivesDeadlineExceeded) {
  auto client =
      CoordinatorClient::Create(absl::StrCat("127.0.0.1:", UnusedPort()));
  ASSERT_TRUE(client.ok());
  auto session = (*client)->RegisterRank("job", 0, 0, 1, 0.5);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_HAS_SUBSTR(session.status().message(), "could not reach")
      << session.status();
}

TEST_F(CommCoordinatorTest, GlooStoreThrowsAndKeepsTheStatus) {
  const uint64_t session = Register("job", 0, 0, 1);
  CoordinatorStore store(client_.get(), session, 0.5);
  store.set("k", {'v'});
  EXPECT_EQ(store.get("k"), std::vector<char>{'v'});
  EXPECT_TRUE(store.last_error().ok());
  EXPECT_THROW(store.wait({"missing"}), gloo::IoException);
  EXPECT_EQ(store.last_error().code(), absl::StatusCode::kDeadlineExceeded);
}

// Coordinator.Heartbeat: each rank's last heartbeat with its host, per
// job, its age growing; a bad request is INVALID_ARGUMENT and records
// nothing; without the join token it is refused.
TEST(CommCoordinatorHeartbeatTest, RecordedPerJobAndRankWithTheHost) {
  CoordinatorServerOptions options;
  options.coordinator.join_token = "0123456789abcdef";
  auto server = CoordinatorServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  CoordinatorClientOptions co;
  co.join_token = "0123456789abcdef";
  auto client = CoordinatorClient::Create((*server)->address(), co);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*server)->Heartbeats("job").empty());
  ASSERT_TRUE((*client)->Heartbeat("job", 2, "host-b", 10).ok());
  ASSERT_TRUE((*client)->Heartbeat("job", 1, "host-a", 10).ok());
  ASSERT_TRUE((*client)->Heartbeat("other", 1, "host-c", 10).ok());
  EXPECT_EQ((*client)->Heartbeat("job", -1, "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->Heartbeat("", 1, "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
  auto outsider = CoordinatorClient::Create((*server)->address());
  ASSERT_TRUE(outsider.ok());
  EXPECT_EQ((*outsider)->Heartbeat("job", 1, "intruder", 10).code(),
            absl::StatusCode::kUnauthenticated);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<RankHeartbeat> beats = (*server)->Heartbeats("job");
  ASSERT_EQ(beats.size(), 2u);
  EXPECT_EQ(beats[0].rank, 1);
  EXPECT_EQ(beats[0].host, "host-a");
  EXPECT_EQ(beats[1].rank, 2);
  EXPECT_EQ(beats[1].host, "host-b");
  EXPECT_GT(beats[0].age_seconds, 0.04);
  EXPECT_EQ((*server)->Heartbeats("other").size(), 1u);
}

// ---------------------------------------------- control-plane security

TEST(CommCoordinatorOptionsTest, TokensAndTlsFilesAreValidated) {
  CoordinatorServerOptions server;
  EXPECT_TRUE(server.Validate().ok());
  server.coordinator.join_token = "short";
  EXPECT_EQ(server.Validate().code(), absl::StatusCode::kInvalidArgument);
  server.coordinator.join_token = "0123456789abcdef 0123";  // a space
  EXPECT_EQ(server.Validate().code(), absl::StatusCode::kInvalidArgument);
  server.coordinator.join_token = "0123456789abcdef";
  EXPECT_TRUE(server.Validate().ok());
  server.tls.cert_file = "server.pem";
  EXPECT_EQ(server.Validate().code(), absl::StatusCode::kInvalidArgument);
  server.tls.key_file = "missing.key";
  EXPECT_EQ(CoordinatorServer::Start(server).status().code(),
            absl::StatusCode::kNotFound);

  CoordinatorClientOptions client;
  EXPECT_TRUE(client.Validate().ok());
  client.join_token = "short";
  EXPECT_EQ(CoordinatorClient::Create("127.0.0.1:1", client).status().code(),
            absl::StatusCode::kInvalidArgument);
  client.join_token = "";
  client.tls.ca_file = "ca.pem";  // without tls.enabled
  EXPECT_EQ(client.Validate().code(), absl::StatusCode::kInvalidArgument);
  client.tls.enabled = true;
  client.tls.ca_file = "missing.pem";
  EXPECT_EQ(CoordinatorClient::Create("127.0.0.1:1", client).status().code(),
            absl::StatusCode::kNotFound);
  GlooOptions gloo;
  gloo.coordinator_address = "127.0.0.1:1";
  gloo.coordinator_client.join_token = "short";
  EXPECT_EQ(gloo.Validate().code(), absl::StatusCode::kInvalidArgument);
}

constexpr char kJoinToken[] = "join-0123456789abcdef0123456789";
constexpr char kWrongJoinToken[] = "join-0123456789abcdef012345678X";

// A coordinator over TLS (the certificates of tests/support/test_certs.h,
// made once per suite) and clients that dial it.
class CommCoordinatorSecurityTest : public test::TestCertificatesTest {
 protected:
  // Starts the coordinator over TLS; `mutual` requires client
  // certificates, `token` a join token.
  void Start(bool mutual, const std::string& token = "") {
    CoordinatorServerOptions o;
    o.tls.cert_file = File("server.pem");
    o.tls.key_file = File("server.key");
    if (mutual) o.tls.client_ca_file = File("ca.pem");
    o.coordinator.join_token = token;
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Client options trusting the test CA, with `token`.
  static CoordinatorClientOptions Trusting(const std::string& token = "") {
    CoordinatorClientOptions o;
    o.tls.enabled = true;
    o.tls.ca_file = File("ca.pem");
    o.join_token = token;
    return o;
  }

  std::unique_ptr<CoordinatorClient> Client(
      const CoordinatorClientOptions& options) {
    auto client = CoordinatorClient::Create(server_->address(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // RegisterRank of a one-rank job through a client with `options`.
  absl::Status JoinAlone(const CoordinatorClientOptions& options,
                         double timeout_seconds = 1) {
    std::unique_ptr<CoordinatorClient> client = Client(options);
    if (client == nullptr) return absl::InternalError("no client");
    return client->RegisterRank("alone", 0, 0, 1, timeout_seconds).status();
  }

  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(CommCoordinatorSecurityTest, TlsRendezvousWorks) {
  Start(/*mutual=*/false);
  std::unique_ptr<CoordinatorClient> a = Client(Trusting());
  std::unique_ptr<CoordinatorClient> b = Client(Trusting());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  absl::StatusOr<uint64_t> first = absl::UnknownError("");
  std::thread waiting([&] { first = a->RegisterRank("job", 0, 0, 2, 10); });
  absl::StatusOr<uint64_t> second = b->RegisterRank("job", 0, 1, 2, 10);
  waiting.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
  ASSERT_TRUE(a->StoreSet(*first, "k", "v", 5).ok());
  EXPECT_EQ(b->StoreGet(*first, "k", 5).value_or(""), "v");
  // By name, when the address holds one the certificate does not carry.
  CoordinatorClientOptions by_name = Trusting();
  by_name.tls.server_name = "localhost";
  EXPECT_TRUE(JoinAlone(by_name, 10).ok());
}

TEST_F(CommCoordinatorSecurityTest, ClientWithoutTheCaFailsNamingWhy) {
  Start(/*mutual=*/false);
  // Plaintext to a TLS port.
  absl::Status plain = JoinAlone(CoordinatorClientOptions());
  EXPECT_EQ(plain.code(), absl::StatusCode::kDeadlineExceeded) << plain;
  EXPECT_HAS_SUBSTR(plain.message(), "could not reach the coordinator")
      << plain;
  EXPECT_HAS_SUBSTR(plain.message(), "without TLS like this rank") << plain;
  // TLS trusting another CA: the handshake fails, and the message says so.
  CoordinatorClientOptions other = Trusting();
  other.tls.ca_file = File("other-ca.pem");
  absl::Status untrusted = JoinAlone(other);
  EXPECT_EQ(untrusted.code(), absl::StatusCode::kDeadlineExceeded) << untrusted;
  EXPECT_HAS_SUBSTR(untrusted.message(), "chain to this rank's CA")
      << untrusted;
  EXPECT_HAS_SUBSTR(untrusted.message(), "last connection error") << untrusted;
}

TEST_F(CommCoordinatorSecurityTest, WrongServerNameFailsNamingIt) {
  Start(/*mutual=*/false);
  CoordinatorClientOptions o = Trusting();
  o.tls.server_name = "not-the-coordinator.example";
  absl::Status status = JoinAlone(o);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_HAS_SUBSTR(status.message(), "not-the-coordinator.example") << status;
}

TEST_F(CommCoordinatorSecurityTest, MutualTlsNeedsACertificateFromTheCa) {
  Start(/*mutual=*/true);
  EXPECT_EQ(JoinAlone(Trusting()).code(), absl::StatusCode::kDeadlineExceeded);
  CoordinatorClientOptions stranger = Trusting();
  stranger.tls.cert_file = File("stranger.pem");
  stranger.tls.key_file = File("client.key");
  EXPECT_EQ(JoinAlone(stranger).code(), absl::StatusCode::kDeadlineExceeded);
  CoordinatorClientOptions client = Trusting();
  client.tls.cert_file = File("client.pem");
  client.tls.key_file = File("client.key");
  EXPECT_TRUE(JoinAlone(client, 10).ok());
  // dlrm_server's ranks present the coordinator's own certificate.
  client.tls.cert_file = File("server.pem");
  client.tls.key_file = File("server.key");
  EXPECT_TRUE(JoinAlone(client, 10).ok());
}

TEST_F(CommCoordinatorSecurityTest, WrongOrMissingTokenIsUnauthenticated) {
  Start(/*mutual=*/false, kJoinToken);
  std::unique_ptr<CoordinatorClient> good = Client(Trusting(kJoinToken));
  ASSERT_NE(good, nullptr);
  absl::StatusOr<uint64_t> session = good->RegisterRank("job", 0, 0, 1, 10);
  ASSERT_TRUE(session.ok()) << session.status();
  for (const std::string& token : {std::string(), std::string(kWrongJoinToken),
                                   std::string(kJoinToken) + "0"}) {
    SCOPED_TRACE(token.empty() ? "no token" : token);
    std::unique_ptr<CoordinatorClient> bad = Client(Trusting(token));
    ASSERT_NE(bad, nullptr);
    const absl::Status refused = bad->RegisterRank("job", 0, 0, 1, 10).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
    EXPECT_HAS_SUBSTR(refused.message(),
                      absl::StrCat("the coordinator at ", server_->address(),
                                   " refused this rank's join token"))
        << refused;
    EXPECT_HAS_SUBSTR(refused.message(), "join token rejected") << refused;
    // No secret in the answer.
    EXPECT_NO_SUBSTR(refused.message(), "0123456789abcdef") << refused;
    // The store refuses it too, and the refused calls touch nothing.
    EXPECT_EQ(bad->StoreSet(*session, "k", "forged", 10).code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(bad->StoreGet(*session, "k", 10).status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(bad->StoreWait(*session, {"k"}, 10).code(),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(good->StoreWait(*session, {"k"}, 0.5).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(good->StoreSet(*session, "k", "real", 5).ok());
  EXPECT_EQ(good->StoreGet(*session, "k", 5).value_or(""), "real");
}

// Two good ranks join while a third, with a wrong token, tries everything
// that would disturb their round if it were accepted: taking rank 1, another
// world size, a newer generation (which aborts a waiting round). The good
// ranks complete, in one session.
TEST_F(CommCoordinatorSecurityTest, RefusedCallsDoNotDisturbAConcurrentJoin) {
  Start(/*mutual=*/false, kJoinToken);
  std::unique_ptr<CoordinatorClient> rank0 = Client(Trusting(kJoinToken));
  std::unique_ptr<CoordinatorClient> rank1 = Client(Trusting(kJoinToken));
  std::unique_ptr<CoordinatorClient> intruder =
      Client(Trusting(kWrongJoinToken));
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  ASSERT_NE(intruder, nullptr);
  absl::StatusOr<uint64_t> first = absl::UnknownError("");
  std::thread waiting([&] { first = rank0->RegisterRank("job", 1, 0, 2, 20); });
  std::vector<absl::Status> intrusions;
  std::thread intruding([&] {
    intrusions.push_back(intruder->RegisterRank("job", 1, 1, 2, 5).status());
    intrusions.push_back(intruder->RegisterRank("job", 1, 1, 3, 5).status());
    intrusions.push_back(intruder->RegisterRank("job", 9, 0, 2, 5).status());
  });
  intruding.join();
  absl::StatusOr<uint64_t> second = rank1->RegisterRank("job", 1, 1, 2, 20);
  waiting.join();
  for (const absl::Status& status : intrusions) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  }
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
  ASSERT_TRUE(rank0->StoreSet(*first, "addr", "0", 5).ok());
  EXPECT_EQ(rank1->StoreGet(*first, "addr", 5).value_or(""), "0");
}

// Gloo connects through a TLS coordinator that wants the token, and a rank
// without it is named as refused.
TEST_F(CommCoordinatorSecurityTest, GlooConnectsThroughASecuredCoordinator) {
  Start(/*mutual=*/false, kJoinToken);
  const std::vector<absl::Status> results = OnRankThreads(2, [&](int r) {
    GlooOptions o;
    Join(o, r, 2, server_->address(), "secured", 30);
    o.coordinator_client = Trusting(kJoinToken);
    absl::StatusOr<std::unique_ptr<Communicator>> comm = ConnectGloo(o);
    if (!comm.ok()) return comm.status();
    int64_t value = r + 1;
    RETURN_IF_ERROR((*comm)->AllReduceSum(&value, 1, DataType::kInt64));
    return value == 3 ? absl::OkStatus()
                      : absl::InternalError(absl::StrCat("sum ", value));
  });
  for (const absl::Status& status : results) {
    EXPECT_TRUE(status.ok()) << status;
  }
  GlooOptions o;
  o.coordinator_address = server_->address();
  o.coordinator_client = Trusting(kWrongJoinToken);
  o.job_id = "refused";
  const absl::Status refused = ConnectGloo(o).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_HAS_SUBSTR(refused.message(), "refused this rank's join token")
      << refused;
}

// The addresses this process listens on over TCP (IPv4 as a.b.c.d, IPv6
// as [hex]), from /proc/net/tcp{,6} and this process's socket inodes.
std::vector<std::string> ListeningAddresses() {
  std::set<std::string> inodes;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target =
        std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> addresses;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid,
          timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >>
          retransmits >> uid >> timeout >> inode;
      if (state != "0A" || inodes.count(inode) == 0) continue;  // LISTEN
      const std::string ip = local.substr(0, local.find(':'));
      // IPv4, also mapped into IPv6 (::ffff:a.b.c.d), is little-endian.
      constexpr char kMapped[] = "0000000000000000FFFF0000";
      if (ip.size() == 8 || (ip.size() == 32 && ip.rfind(kMapped, 0) == 0)) {
        const unsigned long v =
            std::stoul(ip.substr(ip.size() - 8), nullptr, 16);
        addresses.push_back(absl::StrCat(v & 0xff, ".", (v >> 8) & 0xff, ".",
                                         (v >> 16) & 0xff, ".", v >> 24));
      } else {
        addresses.push_back(absl::StrCat("[", ip, "]"));
      }
    }
  }
  return addresses;
}

// Gloo's links are plaintext and unauthenticated (docs/security.md
// "Security"), so they must listen on the bind address only, never on
// every interface. Gloo 0.5 listens only while a rank connects, so rank 0
// is looked at while it waits for a rank 1 that registered but never
// publishes its address.
TEST(CommGlooConnectTest, ListensOnTheBindAddressOnly) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  const size_t before = ListeningAddresses().size();
  std::thread registrar([&] {
    auto client = CoordinatorClient::Create(server->address());
    ASSERT_TRUE(client.ok());
    EXPECT_TRUE((*client)->RegisterRank("bind", 0, 1, 2, 10).ok());
  });
  absl::Status connected;
  std::thread rank0([&] {
    GlooOptions o;
    o.world_size = 2;
    o.coordinator_address = server->address();
    o.job_id = "bind";
    o.bind_address = "127.0.0.1";
    o.connect_timeout_seconds = 2;
    connected = ConnectGloo(o).status();
  });
  std::vector<std::string> listening = ListeningAddresses();
  for (int i = 0; i < 150 && listening.size() <= before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    listening = ListeningAddresses();
  }
  registrar.join();
  rank0.join();
  EXPECT_EQ(connected.code(), absl::StatusCode::kDeadlineExceeded) << connected;
  // The coordinator's port and Gloo's listener, both on loopback.
  EXPECT_GT(listening.size(), before);
  for (const std::string& address : listening) {
    EXPECT_EQ(address, "127.0.0.1");
  }
}

// ------------------------------------------------------------ gloo ranks

TEST(CommGlooOptionsTest, Validate) {
  GlooOptions o;
  o.coordinator_address = "127.0.0.1:1";
  EXPECT_TRUE(o.Validate().ok());
  o.rank = 1;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.op_timeout_seconds = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.op_timeout_seconds = 1;
  o.coordinator_address = "";
  EXPECT_EQ(ConnectGloo(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CommGlooConnectTest, MissingRankGivesDeadlineExceededNamingIt) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  // Ranks 0 and 1 of 3 join; rank 2 never does.
  const std::vector<absl::Status> results = OnRankThreads(2, [&](int r) {
    GlooOptions o;
    Join(o, r, 3, server->address(), "missing", 1.5);
    return ConnectGloo(o).status();
  });
  for (const auto& status : results) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_HAS_SUBSTR(status.message(), "ranks [2] of 3") << status;
  }
}

TEST(CommGlooConnectTest, RankThatRegistersButNeverConnectsIsNamed) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  // Rank 1 registers (so the round completes) and then dies before it
  // publishes its transport address.
  std::thread registrar([&] {
    auto client = CoordinatorClient::Create(server->address());
    ASSERT_TRUE(client.ok());
    EXPECT_TRUE((*client)->RegisterRank("silent", 0, 1, 2, 5).ok());
  });
  GlooOptions o;
  Join(o, 0, 2, server->address(), "silent", 1.5);
  const absl::Status status = ConnectGloo(o).status();
  registrar.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_HAS_SUBSTR(status.message(), "keys ['1']") << status;
}

TEST(CommGlooConnectTest, StaleGenerationIsRefused) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  GlooOptions o;
  o.coordinator_address = server->address();
  o.generation = 7;
  o.connect_timeout_seconds = 5;
  ASSERT_TRUE(ConnectGloo(o).ok());
  o.generation = 6;
  EXPECT_EQ(ConnectGloo(o).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

class CommGlooCollectivesTest : public CommRanksTest {};

TEST_P(CommGlooCollectivesTest, MatchReference) {
  RunCollectivesOfParam("collectives");
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndCounts, CommGlooCollectivesTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values<int64_t>(0, 1, 5, 1031, 300007)),
    WorldAndCountName);

TEST_F(CommProcessTest, ReRunsAgainstALivingCoordinator) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  // Same job id twice (each run gets a fresh session), then another world
  // size of the same job.
  RunCollectives(3, 7, server->address(), "rerun");
  RunCollectives(3, 7, server->address(), "rerun");
  RunCollectives(2, 7, server->address(), "rerun");
}

TEST_F(CommProcessTest, RankZeroHostsTheCoordinator) {
  RankProcesses ranks(dir_);
  auto flags = BaseFlags("rank0_hosts", 3, "", "hosted");
  flags["count"] = "33";
  flags["address_file"] = dir_ + "/coordinator_address";
  for (int r = 0; r < 3; ++r) ranks.Start(r, flags);
  ASSERT_TRUE(ranks.WaitAll(40).ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(ReadResult(ranks.ResultPath(r)).ok())
        << "rank " << r << ": " << ReadResult(ranks.ResultPath(r));
  }
}

// Starts `world` ranks looping over collectives, waits until all of them
// have completed a round, then sends `signal` to the last rank; the others
// must fail by themselves with Unavailable or DeadlineExceeded: none may
// still be running after a generous deadline (three times `bound_seconds`,
// what their op timeout lets them take, plus start-up slack). A stopped rank
// must make at least one survivor time out (the others may see that
// survivor's connections close first).
void ExpectPeerFailureDetected(const std::string& dir,
                               std::map<std::string, std::string> flags,
                               int world, int signal, double bound_seconds) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  flags["coordinator"] = server->address();
  RankProcesses ranks(dir);
  for (int r = 0; r < world; ++r) ranks.Start(r, flags);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(WaitForFile(ranks.ReadyPath(r), 20)) << "rank " << r;
  }
  const int victim = world - 1;
  const double deadline_seconds = 3 * bound_seconds + 10;
  ranks.Signal(victim, signal);
  if (signal == SIGSTOP) {
    // Wait for the survivors' results, then let the stopped rank die.
    for (int r = 0; r < victim; ++r) {
      EXPECT_TRUE(WaitForFile(ranks.ResultPath(r), deadline_seconds));
    }
    ranks.Signal(victim, SIGKILL);
  }
  absl::Status exits = ranks.WaitAll(deadline_seconds);
  EXPECT_NO_SUBSTR(exits.message(), "hung")
      << "a survivor never failed: " << exits;
  EXPECT_HAS_SUBSTR(exits.message(), "rank " + std::to_string(victim)) << exits;
  int timed_out = 0;
  for (int r = 0; r < victim; ++r) {
    const absl::Status result = ReadResult(ranks.ResultPath(r));
    EXPECT_TRUE(result.code() == absl::StatusCode::kUnavailable ||
                result.code() == absl::StatusCode::kDeadlineExceeded)
        << "rank " << r << ": " << result;
    std::printf("rank %d: %s\n", r, result.ToString().c_str());
    if (result.code() == absl::StatusCode::kDeadlineExceeded) ++timed_out;
  }
  if (signal == SIGSTOP) {
    EXPECT_GT(timed_out, 0);
  }
}

TEST_F(CommProcessTest, KilledRankMakesTheOthersFail) {
  // Most survivors see the broken connections at once; one whose send was
  // already queued to a dead peer waits for the op timeout (a Gloo 0.5
  // limitation), so they get the op timeout plus slack.
  auto flags = BaseFlags("loop", 3, "", "killed");
  flags["op_timeout"] = "3";
  ExpectPeerFailureDetected(dir_, flags, 3, SIGKILL, 6);
}

TEST_F(CommProcessTest, StoppedRankMakesTheOthersTimeOut) {
  auto flags = BaseFlags("loop", 3, "", "stopped");
  flags["op_timeout"] = "1.5";
  ExpectPeerFailureDetected(dir_, flags, 3, SIGSTOP, 5);
}

// ------------------------------------------------------------- factory

CommOptions HostOptions(int world, const std::string& coordinator = "") {
  CommOptions o;
  o.world_size = world;
  o.coordinator_address = coordinator;
  return o;
}

TEST(CommFactoryTest, ResolvesTheBackendFromSpaceAndWorldSize) {
  struct Case {
    MemorySpace space;
    CommBackend backend;
    int world;
    CommBackend want;
  };
  const Case cases[] = {
      {MemorySpace::kHost, CommBackend::kAuto, 1, CommBackend::kSingleRank},
      {MemorySpace::kHost, CommBackend::kAuto, 2, CommBackend::kGloo},
      {MemorySpace::kHost, CommBackend::kAuto, 4, CommBackend::kGloo},
      {MemorySpace::kDevice, CommBackend::kAuto, 1, CommBackend::kSingleRank},
      {MemorySpace::kDevice, CommBackend::kAuto, 3, CommBackend::kNccl},
      {MemorySpace::kHost, CommBackend::kGloo, 1, CommBackend::kGloo},
      {MemorySpace::kDevice, CommBackend::kNccl, 1, CommBackend::kNccl},
      {MemorySpace::kDevice, CommBackend::kSingleRank, 1,
       CommBackend::kSingleRank},
      {MemorySpace::kDevice, CommBackend::kHostStaged, 1,
       CommBackend::kHostStaged},
      {MemorySpace::kDevice, CommBackend::kHostStaged, 4,
       CommBackend::kHostStaged},
  };
  for (const Case& c : cases) {
    CommOptions o = HostOptions(c.world, "127.0.0.1:1");
    o.memory_space = c.space;
    o.backend = c.backend;
    o.rank = c.world - 1;
    const auto got = ResolveBackend(o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, c.want)
        << MemorySpaceName(c.space) << " " << CommBackendName(c.backend)
        << " world " << c.world;
    EXPECT_TRUE(o.Validate().ok());
  }
}

// The names a flag may give, per buffer space, parse to their backends;
// another name, or one of the other space, names the flag and the choices.
TEST(CommFactoryTest, ParsesTheNamesOfEachSpace) {
  EXPECT_EQ(CommBackendNames(MemorySpace::kDevice),
            "auto, nccl or host-staged");
  EXPECT_EQ(CommBackendNames(MemorySpace::kHost), "auto or gloo");
  for (MemorySpace space : {MemorySpace::kHost, MemorySpace::kDevice}) {
    for (CommBackend b : {CommBackend::kAuto, CommBackend::kGloo,
                          CommBackend::kNccl, CommBackend::kHostStaged}) {
      const auto got = ParseCommBackend("--x", CommBackendName(b), space);
      const bool fits =
          b == CommBackend::kAuto ||
          (b == CommBackend::kGloo) == (space == MemorySpace::kHost);
      ASSERT_EQ(got.ok(), fits) << CommBackendName(b) << " "
                                << MemorySpaceName(space) << got.status();
      if (fits) EXPECT_EQ(*got, b);
    }
  }
  const auto bad =
      ParseCommBackend("--device-comm", "mpi", MemorySpace::kDevice);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "--device-comm mpi: expected auto, nccl or host-staged");
  EXPECT_FALSE(ParseCommBackend("--x", "single-rank", MemorySpace::kHost).ok());
}

TEST(CommFactoryTest, RefusesOptionsThatDoNotFit) {
  const auto code = [](const CommOptions& o) {
    return CreateCommunicator(o).status().code();
  };
  CommOptions o = HostOptions(2, "127.0.0.1:1");
  o.backend = CommBackend::kSingleRank;  // needs world_size 1
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o.backend = CommBackend::kNccl;  // device buffers only
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o.backend = CommBackend::kGloo;
  o.memory_space = MemorySpace::kDevice;  // host buffers only
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(CreateCommunicator(o).status().message(), "gloo takes host")
      << CreateCommunicator(o).status();
  o.backend = CommBackend::kHostStaged;
  o.memory_space = MemorySpace::kHost;  // device buffers only
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(CreateCommunicator(o).status().message(),
                    "host-staged takes device")
      << CreateCommunicator(o).status();
  o = HostOptions(2);  // Gloo without a coordinator
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o.memory_space = MemorySpace::kDevice;  // NCCL without a coordinator
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o.backend = CommBackend::kHostStaged;  // Gloo underneath needs one too
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = HostOptions(2, "127.0.0.1:1");
  o.rank = 2;
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = HostOptions(0);
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = HostOptions(1);
  o.op_timeout_seconds = 0;
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = HostOptions(1);
  o.memory_space = MemorySpace::kDevice;
  o.device = -1;
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
  o = HostOptions(2, "127.0.0.1:1");
  o.job_id = "";
  EXPECT_EQ(code(o), absl::StatusCode::kInvalidArgument);
}

TEST(CommFactoryTest, HostWorldOfOneIsTheSingleRankCommunicator) {
  auto comm = CreateCommunicator(HostOptions(1));
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->memory_space(), MemorySpace::kHost);
  EXPECT_EQ((*comm)->world_size(), 1);
  for (int64_t n : {0, 5, 1031}) {
    EXPECT_TRUE(CheckCollectives(**comm, n, TestSeed()).ok());
  }
  // Host communicators take no stream and are done on return.
  int stream = 0;
  EXPECT_TRUE((*comm)->SetStream(nullptr).ok());
  EXPECT_EQ((*comm)->SetStream(&stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->Synchronize().ok());
}

TEST(CommFactoryTest, GlooIsAHostCommunicator) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  CommOptions o = HostOptions(1, server->address());
  o.backend = CommBackend::kGloo;
  o.connect_timeout_seconds = 10;
  auto comm = CreateCommunicator(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->memory_space(), MemorySpace::kHost);
  int stream = 0;
  EXPECT_EQ((*comm)->SetStream(&stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->Synchronize().ok());
  EXPECT_TRUE(CheckCollectives(**comm, 33, TestSeed()).ok());
}

// Without a usable device (this binary built without CUDA, no driver, no
// device) every way to a device communicator is a FailedPrecondition that
// says why, before any connection is tried.
TEST(CommFactoryTest, DeviceWithoutCudaIsFailedPreconditionNamingWhy) {
  if (CudaDeviceCount() > 0) {
    GTEST_SKIP() << "this process sees a CUDA device";
  }
  const std::string why = CudaUnavailableReason();
  ASSERT_FALSE(why.empty());
  for (CommBackend backend : {CommBackend::kAuto, CommBackend::kHostStaged}) {
    for (int world : {1, 2}) {
      CommOptions o =
          HostOptions(world, absl::StrCat("127.0.0.1:", UnusedPort()));
      o.memory_space = MemorySpace::kDevice;
      o.backend = backend;
      const absl::Status status = CreateCommunicator(o).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
      EXPECT_HAS_SUBSTR(status.message(), why) << status;
    }
  }
  const absl::Status single = MakeSingleRankDeviceCommunicator(0).status();
  EXPECT_EQ(single.code(), absl::StatusCode::kFailedPrecondition) << single;
  const absl::Status staged =
      MakeHostStagedCommunicator(MakeSingleRankCommunicator(),
                                 DeviceKind::kCuda, 0)
          .status();
  EXPECT_EQ(staged.code(), absl::StatusCode::kFailedPrecondition) << staged;
  EXPECT_HAS_SUBSTR(staged.message(), why) << staged;
  // A named object: GCC 12 warns (wrongly) that a temporary's strings may
  // be destroyed uninitialised.
  const NcclOptions defaults;
  const absl::Status nccl = ConnectNccl(defaults).status();
  EXPECT_EQ(nccl.code(), absl::StatusCode::kFailedPrecondition) << nccl;
}

TEST(CommFactoryTest, AbsentDeviceIsFailedPrecondition) {
  CommOptions o = HostOptions(1);
  o.memory_space = MemorySpace::kDevice;
  o.device = CudaDeviceCount();  // one past the last
  const absl::Status status = CreateCommunicator(o).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(MakeSingleRankDeviceCommunicator(o.device).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeHostStagedCommunicator(MakeSingleRankCommunicator(),
                                       DeviceKind::kCuda, o.device)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

// The factory's choice on real ranks: single-rank for 1, Gloo above.
class CommFactoryRanksTest : public CommProcessTest,
                             public ::testing::WithParamInterface<int> {};

TEST_P(CommFactoryRanksTest, HostCollectivesMatchReference) {
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  RunCollectives(GetParam(), 1031, server->address(), "factory", "host");
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommFactoryRanksTest,
                         ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

// ----------------------------------------------------------- host-staged

// Over the CPU Device "device memory" is host memory, and the staging runs
// through the same Device calls as on CUDA: these run on any machine.
std::unique_ptr<Communicator> StagedOverSingleRankOnCpu() {
  auto comm = MakeHostStagedCommunicator(MakeSingleRankCommunicator(),
                                         DeviceKind::kCpu);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(comm).value() : nullptr;
}

TEST(CommHostStagedTest, OverTheSingleRankCommunicatorMatchesReference) {
  std::unique_ptr<Communicator> comm = StagedOverSingleRankOnCpu();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->memory_space(), MemorySpace::kDevice);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  ExpectOkAtEveryCount(*comm, CheckCollectives);
  // Over the CPU there is no stream to follow; calls are done on return.
  EXPECT_TRUE(comm->SetStream(nullptr).ok());
  int not_a_stream = 0;
  const absl::Status stream = comm->SetStream(&not_a_stream);
  EXPECT_EQ(stream.code(), absl::StatusCode::kInvalidArgument) << stream;
  EXPECT_HAS_SUBSTR(stream.message(), "SetStream") << stream;
  EXPECT_TRUE(comm->Synchronize().ok());
}

// The whole input is staged before any output is written, so send and
// recv may overlap.
TEST(CommHostStagedTest, SendAndRecvMayOverlap) {
  std::unique_ptr<Communicator> comm = StagedOverSingleRankOnCpu();
  ASSERT_NE(comm, nullptr);
  std::vector<float> v = {0, 1, 2, 3, 4, 5, 6, 7};
  const int64_t four[] = {4};
  ASSERT_TRUE(
      comm->AllToAllV(v.data(), four, v.data() + 2, four, DataType::kFloat32)
          .ok());
  EXPECT_EQ(v, (std::vector<float>{0, 1, 0, 1, 2, 3, 6, 7}));
  ASSERT_TRUE(
      comm->AllGather(v.data() + 1, 4, v.data(), DataType::kFloat32).ok());
  EXPECT_EQ(v, (std::vector<float>{1, 0, 1, 2, 2, 3, 6, 7}));
}

TEST(CommHostStagedTest, RefusesBadArgumentsNamingThem) {
  const auto refused = [](const absl::Status& status,
                          const std::string& names) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_HAS_SUBSTR(status.message(), names)
        << status << " does not name " << names;
  };
  refused(MakeHostStagedCommunicator(nullptr, DeviceKind::kCpu).status(),
          "host is null");
  refused(MakeHostStagedCommunicator(MakeSingleRankCommunicator(),
                                     DeviceKind::kCuda, -1)
              .status(),
          "device must be >= 0");

  std::unique_ptr<Communicator> comm = StagedOverSingleRankOnCpu();
  ASSERT_NE(comm, nullptr);
  Communicator& c = *comm;
  std::vector<float> buf(16);
  float* b = buf.data();
  const int64_t four[] = {4};
  const int64_t five[] = {5};
  const int64_t minus_one[] = {-1};
  const int64_t two_ranks[] = {4, 4};
  const DataType f32 = DataType::kFloat32;
  refused(c.AllReduceSum(b, 4, DataType::kUint8), "AllReduceSum");
  refused(c.AllReduceSum(nullptr, 4, f32), "AllReduceSum: data");
  refused(c.AllReduceSum(b, -1, f32), "AllReduceSum: element count -1");
  refused(c.AllToAllV(b, two_ranks, b + 8, four, f32),
          "AllToAllV: send_counts");
  refused(c.AllToAllV(b, four, b + 8, minus_one, f32),
          "AllToAllV: recv_counts[0]");
  refused(c.AllToAllV(b, four, b + 8, five, f32), "sends itself 4");
  refused(c.AllToAllV(nullptr, four, b + 8, four, f32), "AllToAllV: send");
  refused(c.AllToAllV(b, four, nullptr, four, f32), "AllToAllV: recv");
  refused(c.AllGather(nullptr, 4, b, f32), "AllGather: send");
  refused(c.AllGather(b, 4, nullptr, f32), "AllGather: recv");
  refused(
      c.AllGather(b, std::numeric_limits<int64_t>::max(), b, DataType::kInt64),
      "AllGather");
  refused(c.Broadcast(b, 4, f32, 1), "root 1");
  refused(c.Broadcast(nullptr, 4, f32, 0), "Broadcast: data");
  // Refused arguments leave it usable.
  EXPECT_TRUE(c.Synchronize().ok());
  const absl::Status status = CheckCollectives(c, 33, TestSeed());
  EXPECT_TRUE(status.ok()) << status;
}

// A host-staged communicator over the CPU Device on rank processes, against
// a plain Gloo communicator of the same ranks (bitwise) and the reference;
// world size x base element count.
class CommHostStagedRanksTest : public CommRanksTest {};

TEST_P(CommHostStagedRanksTest, CpuDeviceMatchesGlooBitwise) {
  RunCollectivesOfParam("staged-cpu", "",
                        {{"scenario", "staged_vs_gloo"}, {"staged", "cpu"}});
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndCounts, CommHostStagedRanksTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values<int64_t>(0, 1, 1031, 100003)),
    WorldAndCountName);

// A killed peer: the survivors' staged collectives fail as Gloo's do, and
// their later calls are FailedPrecondition (checked in the child).
TEST_F(CommProcessTest, KilledRankMakesTheStagedOthersFail) {
  auto flags = BaseFlags("loop", 3, "", "staged-killed");
  flags["staged"] = "cpu";
  flags["op_timeout"] = "3";
  ExpectPeerFailureDetected(dir_, flags, 3, SIGKILL, 6);
}

#if defined(DLRM_WITH_NCCL)
// ------------------------------------------------- device communicators

namespace nccl_fault = ::dlrm::testing::nccl_fault;

// Device memory for a test; freed at scope exit.
struct DeviceBytes {
  explicit DeviceBytes(size_t bytes) {
    auto raw = cuda::RawDeviceBuffer::Allocate(bytes);
    EXPECT_TRUE(raw.ok()) << raw.status();
    if (raw.ok()) buffer = std::move(raw).value();
  }
  void* data() const { return buffer.data(); }
  cuda::RawDeviceBuffer buffer;
};

// The cases of the device communicators' rank tests: 2 to 4 ranks, empty,
// odd and large base counts.
auto DeviceWorldsAndCounts() {
  return ::testing::Combine(::testing::Values(2, 3, 4),
                            ::testing::Values<int64_t>(0, 5, 300007));
}

TEST(CommDeviceSingleRankTest, CollectivesMatchReference) {
  DLRM_SKIP_WITHOUT_CUDA();
  CommOptions o = HostOptions(1);
  o.memory_space = MemorySpace::kDevice;
  auto comm = CreateCommunicator(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->memory_space(), MemorySpace::kDevice);
  EXPECT_EQ((*comm)->world_size(), 1);
  ExpectOkAtEveryCount(**comm, CheckDeviceCollectives);
}

TEST(CommDeviceSingleRankTest, RefusesHostAndOverlappingBuffers) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto comm = MakeSingleRankDeviceCommunicator(0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> host(16);
  DeviceBytes device(64 * sizeof(float));
  float* d = static_cast<float*>(device.data());
  const int64_t four[] = {4};
  EXPECT_EQ((*comm)->AllReduceSum(host.data(), 4, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)->AllGather(host.data(), 4, d, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)->AllToAllV(d, four, d + 2, four, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->AllToAllV(d, four, d, four, DataType::kFloat32).ok());
  EXPECT_TRUE(
      (*comm)->AllToAllV(d, four, d + 4, four, DataType::kFloat32).ok());
  int not_a_stream = 0;
  EXPECT_EQ((*comm)->SetStream(&not_a_stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->Barrier().ok());
}

// ------------------------------------------- host-staged on a CUDA device

TEST(CommDeviceHostStagedTest, SingleRankCollectivesMatchReference) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto comm = MakeHostStagedCommunicator(MakeSingleRankCommunicator(),
                                         DeviceKind::kCuda, 0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->memory_space(), MemorySpace::kDevice);
  ExpectOkAtEveryCount(**comm, CheckDeviceCollectives);
}

TEST(CommDeviceHostStagedTest, RefusesHostBuffersAndStagesOverlaps) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto device_comm = MakeSingleRankDeviceCommunicator(0);
  ASSERT_TRUE(device_comm.ok()) << device_comm.status();
  const absl::Status nested =
      MakeHostStagedCommunicator(std::move(device_comm).value(),
                                 DeviceKind::kCuda, 0)
          .status();
  EXPECT_EQ(nested.code(), absl::StatusCode::kInvalidArgument) << nested;

  auto comm = MakeHostStagedCommunicator(MakeSingleRankCommunicator(),
                                         DeviceKind::kCuda, 0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> host(16);
  DeviceBytes device(64 * sizeof(float));
  float* d = static_cast<float*>(device.data());
  const absl::Status host_data =
      (*comm)->AllReduceSum(host.data(), 4, DataType::kFloat32);
  EXPECT_EQ(host_data.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(host_data.message(), "AllReduceSum: data") << host_data;
  EXPECT_EQ((*comm)->AllGather(host.data(), 4, d, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  // Overlapping device buffers are staged like any others.
  const std::vector<float> init = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSERT_EQ(cudaMemcpy(d, init.data(), init.size() * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  const int64_t four[] = {4};
  ASSERT_TRUE(
      (*comm)->AllToAllV(d, four, d + 2, four, DataType::kFloat32).ok());
  std::vector<float> got(init.size());
  ASSERT_EQ(cudaMemcpy(got.data(), d, got.size() * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, (std::vector<float>{0, 1, 0, 1, 2, 3, 6, 7}));
  int not_a_stream = 0;
  EXPECT_EQ((*comm)->SetStream(&not_a_stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->Barrier().ok());
}

// Rank processes sharing CUDA device 0 through the factory's kHostStaged,
// against plain Gloo (bitwise) and the reference, without and with a
// caller stream.
class CommDeviceHostStagedRanksTest : public CommRanksTest {};

TEST_P(CommDeviceHostStagedRanksTest, SharedGpuMatchesGlooBitwise) {
  DLRM_SKIP_WITHOUT_CUDA();
  RunCollectivesOfParam("staged-cuda", "",
                        {{"scenario", "staged_vs_gloo"}, {"staged", "cuda"}});
}

INSTANTIATE_TEST_SUITE_P(WorldsAndCounts, CommDeviceHostStagedRanksTest,
                         DeviceWorldsAndCounts(), WorldAndCountName);

// ------------------------------------------------------------------ NCCL

TEST(CommNcclTest, OptionsValidate) {
  NcclOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.world_size = 2;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.coordinator_address = "127.0.0.1:1";
  EXPECT_TRUE(o.Validate().ok());
  o.rank = 2;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CommNcclTest, SingleRankCollectivesMatchReference) {
  DLRM_SKIP_WITHOUT_CUDA();
  CommOptions o = HostOptions(1);
  o.memory_space = MemorySpace::kDevice;
  o.backend = CommBackend::kNccl;
  auto comm = CreateCommunicator(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->memory_space(), MemorySpace::kDevice);
  ExpectOkAtEveryCount(**comm, CheckDeviceCollectives);
  std::vector<float> host(4);
  EXPECT_EQ((*comm)->AllReduceSum(host.data(), 4, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  DeviceBytes device(64 * sizeof(float));
  float* d = static_cast<float*>(device.data());
  const int64_t four[] = {4};
  EXPECT_EQ((*comm)->AllToAllV(d, four, d, four, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      (*comm)->AllToAllV(d, four, d + 4, four, DataType::kFloat32).ok());
  EXPECT_TRUE((*comm)->Barrier().ok());
}

// The fault-injection tests drive a real one-rank NCCL communicator through
// tests/comm/nccl_fault_injection.h.
class CommNcclFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DLRM_SKIP_WITHOUT_CUDA();
    NcclOptions o;
    o.op_timeout_seconds = 0.5;
    auto comm = ConnectNccl(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = std::move(comm).value();
    auto stream = cuda::CudaStream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = std::move(stream).value();
  }
  void TearDown() override {
    nccl_fault::Arm(nccl_fault::Fault::kNone);
    comm_.reset();
  }

  // AllGather of `values` through device buffers, on `stream_` when
  // `with_stream`; the gathered values, or the collective's error.
  absl::StatusOr<std::vector<float>> Gather(const std::vector<float>& values,
                                            bool with_stream) {
    RETURN_IF_ERROR(comm_->SetStream(with_stream ? stream_.get() : nullptr));
    HostBufferAdapter host_view(comm_.get(),
                                with_stream ? stream_.get() : nullptr);
    std::vector<float> out(values.size(), -1.0f);
    RETURN_IF_ERROR(host_view.AllGather(values.data(), values.size(),
                                        out.data(), DataType::kFloat32));
    return out;
  }

  // Makes `stream_` the communicator's stream and queues on it a host
  // function that sleeps `millis`, so that a collective queued next waits.
  absl::Status HoldCallerStream(int millis) {
    RETURN_IF_ERROR(comm_->SetStream(stream_.get()));
    hold_millis_ = millis;
    const cudaError_t queued = cudaLaunchHostFunc(
        stream_.get(),
        [](void* ms) {
          std::this_thread::sleep_for(
              std::chrono::milliseconds(*static_cast<int*>(ms)));
        },
        &hold_millis_);
    if (queued != cudaSuccess) {
      return absl::InternalError(cudaGetErrorString(queued));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Communicator> comm_;
  cuda::CudaStream stream_;
  int hold_millis_ = 0;
};

// Frees `data` (cudaFree) and synchronises the device: both return even
// after the communicator was aborted.
void ExpectFreeAndSynchronize(DeviceBytes& data) {
  data.buffer = cuda::RawDeviceBuffer();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A non-blocking communicator may answer ncclInProgress and queue the call
// later: that is no error, and the call waits until it is queued (and,
// without a stream, done) before it returns.
TEST_F(CommNcclFaultTest, InProgressIsNotAnError) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 7.0f, 0.5f};
  for (bool with_stream : {false, true}) {
    nccl_fault::Arm(nccl_fault::Fault::kSlowQueue);
    const Clock::time_point start = Clock::now();
    auto got = Gather(values, with_stream);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, values) << "with_stream " << with_stream;
    EXPECT_GE(SecondsSince(start), 0.03) << "returned before it was queued";
  }
  EXPECT_TRUE(comm_->Barrier().ok());
}

// A collective that is never queued times out; the communicator is aborted,
// later calls are refused, and CUDA calls that synchronise still return.
TEST_F(CommNcclFaultTest, NeverQueuedTimesOutAndAborts) {
  const int aborts = nccl_fault::AbortCount();
  nccl_fault::Arm(nccl_fault::Fault::kNeverQueued);
  DeviceBytes data(1024);
  const absl::Status status =
      comm_->AllGather(data.data(), 4, data.data(), DataType::kUint8);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GT(nccl_fault::AbortCount(), aborts);
  nccl_fault::Arm(nccl_fault::Fault::kNone);
  EXPECT_EQ(comm_->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(comm_->Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  ExpectFreeAndSynchronize(data);
}

// An asynchronous error after the collective was queued (a peer failed
// while it waited on the device): the watchdog aborts, Synchronize says
// Unavailable, and the caller's stream, which waits for the collective,
// still drains.
TEST_F(CommNcclFaultTest, AsyncErrorAfterQueueingAborts) {
  const int aborts = nccl_fault::AbortCount();
  DeviceBytes data(1024);
  // Keeps the collective waiting behind the caller's stream.
  ASSERT_TRUE(HoldCallerStream(300).ok());
  nccl_fault::Arm(nccl_fault::Fault::kAsyncErrorAfterQueue);
  ASSERT_TRUE(comm_
                  ->AllGather(data.data(), 4,
                              static_cast<char*>(data.data()) + 512,
                              DataType::kUint8)
                  .ok());
  const absl::Status status = comm_->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_GT(nccl_fault::AbortCount(), aborts);
  EXPECT_EQ(
      comm_->AllGather(data.data(), 4, data.data(), DataType::kUint8).code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  ExpectFreeAndSynchronize(data);
}

// A collective still unfinished after the op timeout (here: stuck behind
// the caller's stream) makes the watchdog abort the communicator while the
// caller is not in any call; the next call reports DeadlineExceeded.
TEST_F(CommNcclFaultTest, WatchdogAbortsALateCollective) {
  const int aborts = nccl_fault::AbortCount();
  DeviceBytes data(1024);
  ASSERT_TRUE(HoldCallerStream(1500).ok());
  ASSERT_TRUE(comm_->AllReduceSum(data.data(), 16, DataType::kFloat32).ok());
  // The op timeout is 0.5 s; the watchdog acts on its own.
  const Clock::time_point start = Clock::now();
  while (nccl_fault::AbortCount() == aborts && SecondsSince(start) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(nccl_fault::AbortCount(), aborts);
  const absl::Status status =
      comm_->AllReduceSum(data.data(), 16, DataType::kFloat32);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
}

// A rank that registers (so rank 0 gets past the coordinator) but never
// initialises NCCL: rank 0's non-blocking init times out and is aborted.
TEST(CommNcclConnectTest, RankThatNeverInitialisesTimesOut) {
  DLRM_SKIP_WITHOUT_CUDA();
  auto server = StartCoordinator();
  ASSERT_NE(server, nullptr);
  std::thread silent([&] {
    auto client = CoordinatorClient::Create(server->address());
    ASSERT_TRUE(client.ok());
    auto session = (*client)->RegisterRank("silent", 0, 1, 2, 10);
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_TRUE((*client)->StoreGet(*session, "nccl-unique-id", 10).ok());
  });
  const int aborts = nccl_fault::AbortCount();
  NcclOptions o;
  Join(o, 0, 2, server->address(), "silent", 3);
  const absl::Status status = ConnectNccl(o).status();
  silent.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GT(nccl_fault::AbortCount(), aborts);
}

// NCCL between rank processes, one GPU each (skips below `world` GPUs).
class CommNcclRanksTest : public CommRanksTest {};

TEST_P(CommNcclRanksTest, CollectivesMatchReference) {
  DLRM_SKIP_WITHOUT_CUDA_DEVICES(std::get<0>(GetParam()));
  RunCollectivesOfParam("nccl", "device");
}

INSTANTIATE_TEST_SUITE_P(WorldsAndCounts, CommNcclRanksTest,
                         DeviceWorldsAndCounts(), WorldAndCountName);

TEST_F(CommProcessTest, StoppedNcclRankMakesTheOtherTimeOut) {
  DLRM_SKIP_WITHOUT_CUDA_DEVICES(2);
  auto flags = BaseFlags("loop", 2, "", "nccl-stopped");
  flags["space"] = "device";
  flags["op_timeout"] = "1.5";
  ExpectPeerFailureDetected(dir_, flags, 2, SIGSTOP, 8);
}
#endif  // DLRM_WITH_NCCL

// ---- Launcher environments (comm/launcher_env.h) ----

// The environment `assignments` names, "NAME=VALUE" separated by spaces
// (values hold no space), as DetectLauncher reads it.
EnvLookup EnvOf(const std::string& assignments) {
  std::map<std::string, std::string> vars;
  std::istringstream words(assignments);
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    vars[word.substr(0, eq)] =
        eq == std::string::npos ? "" : word.substr(eq + 1);
  }
  return
      [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
        const auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
      };
}

// What DetectLauncher makes of `assignments` (EnvOf), failing the test when
// it is an error.
LauncherRank Detected(const std::string& assignments) {
  absl::StatusOr<LauncherRank> l = DetectLauncher(EnvOf(assignments));
  EXPECT_TRUE(l.ok()) << assignments << ": " << l.status();
  return l.ok() ? *l : LauncherRank{};
}

// `l` came from launcher `source` and says rank, world size and local rank.
void ExpectRank(const LauncherRank& l, const std::string& source, int rank,
                int world_size, int local_rank) {
  EXPECT_EQ(l.source, source);
  EXPECT_EQ(l.rank, rank);
  EXPECT_EQ(l.world_size, world_size);
  EXPECT_EQ(l.local_rank, local_rank);
}

// DetectLauncher refuses `assignments` as InvalidArgument, naming `text`.
void ExpectRefused(const std::string& assignments, const std::string& text) {
  const absl::Status status = DetectLauncher(EnvOf(assignments)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << assignments;
  EXPECT_HAS_SUBSTR(status.message(), text) << status;
}

TEST(LauncherEnvTest, NoLauncherVariablesSayNothing) {
  const LauncherRank l = Detected("HOME=/root");
  EXPECT_EQ(l.source, "");
  EXPECT_FALSE(l.rank.has_value());
  EXPECT_FALSE(l.world_size.has_value());
  EXPECT_FALSE(l.coordinator.has_value());
}

TEST(LauncherEnvTest, SlurmAcrossNodesUsesTheFirstNodeAndAJobPort) {
  const LauncherRank l = Detected(
      "SLURM_PROCID=5 SLURM_NTASKS=8 SLURM_LOCALID=1 SLURM_NNODES=4 "
      "SLURM_JOB_ID=12345 SLURM_STEP_NODELIST=gpu[07-10],cpu3 "
      "SLURM_JOB_NODELIST=other[1-9]");
  ExpectRank(l, "slurm", 5, 8, 1);
  EXPECT_EQ(l.single_host, false);
  EXPECT_EQ(l.coordinator,
            "gpu07:" + std::to_string(kDefaultCoordinatorPort + 12345 % 1000));
}

TEST(LauncherEnvTest, SlurmOnOneNodeUsesLoopbackAndMasterPort) {
  const LauncherRank l = Detected(
      "SLURM_PROCID=0 SLURM_NPROCS=2 SLURM_STEP_NUM_NODES=1 "
      "SLURM_JOB_NODELIST=node1 MASTER_PORT=4000");
  EXPECT_EQ(l.world_size, 2);
  EXPECT_EQ(l.single_host, true);
  EXPECT_EQ(l.coordinator, "127.0.0.1:4000");
}

TEST(LauncherEnvTest, OpenMpiOnOneHostAndAcrossHosts) {
  const LauncherRank one = Detected(
      "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 "
      "OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2");
  ExpectRank(one, "mpi", 1, 2, 1);
  EXPECT_EQ(one.coordinator,
            "127.0.0.1:" + std::to_string(kDefaultCoordinatorPort));
  // Across hosts MPI names no rendezvous: MASTER_ADDR must.
  const LauncherRank many = Detected(
      "OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 "
      "OMPI_COMM_WORLD_LOCAL_SIZE=2");
  EXPECT_EQ(many.single_host, false);
  EXPECT_FALSE(many.coordinator.has_value());
  const LauncherRank named = Detected(
      "OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 "
      "MASTER_ADDR=head.cluster MASTER_PORT=7000");
  EXPECT_EQ(named.coordinator, "head.cluster:7000");
}

TEST(LauncherEnvTest, TorchrunConventionOfKubernetesJobs) {
  const LauncherRank l =
      Detected("RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=dlrm-0.dlrm");
  ExpectRank(l, "torchrun", 2, 4, 0);
  EXPECT_EQ(l.coordinator,
            "dlrm-0.dlrm:" + std::to_string(kDefaultCoordinatorPort));
  const LauncherRank v6 =
      Detected("RANK=0 WORLD_SIZE=2 MASTER_ADDR=fd00::1 MASTER_PORT=80");
  EXPECT_EQ(v6.coordinator, "[fd00::1]:80");
}

TEST(LauncherEnvTest, LaunchersThatAgreeMergeAndOnesThatDisagreeAreAnError) {
  // srun starting a torchrun-style script: both say the same.
  const LauncherRank agree = Detected(
      "SLURM_PROCID=1 SLURM_NTASKS=2 RANK=1 WORLD_SIZE=2 "
      "MASTER_ADDR=10.0.0.1");
  EXPECT_EQ(agree.source, "slurm");
  EXPECT_EQ(agree.coordinator,
            "10.0.0.1:" + std::to_string(kDefaultCoordinatorPort));

  ExpectRefused("SLURM_PROCID=1 RANK=0", "SLURM_PROCID=1 but RANK=0");
  ExpectRefused(
      "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 RANK=0 WORLD_SIZE=2",
      "OMPI_COMM_WORLD_SIZE=4 but WORLD_SIZE=2");
}

TEST(LauncherEnvTest, BadValuesNameTheVariable) {
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"RANK", "x"}, {"RANK", "-1"}, {"SLURM_PROCID", "1.5"}}) {
    ExpectRefused(name + "=" + value, name + "='" + value + "'");
  }
  EXPECT_EQ(DetectLauncher(EnvOf("RANK=0 WORLD_SIZE=0")).status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectRefused("RANK=0 MASTER_ADDR=h MASTER_PORT=70000", "MASTER_PORT");
}

TEST(LauncherEnvTest, FirstSlurmHostOfEveryListForm) {
  EXPECT_EQ(*FirstSlurmHost("node[01-04,07],gpu5"), "node01");
  EXPECT_EQ(*FirstSlurmHost("a,b"), "a");
  EXPECT_EQ(*FirstSlurmHost("gpu7"), "gpu7");
  EXPECT_EQ(*FirstSlurmHost("rack[3,5]-n[1-2]"), "rack3-n1");
  EXPECT_EQ(*FirstSlurmHost("x[9]"), "x9");
  for (const char* bad : {"", "[1-2]", "n[a-b]", "n[1-2", "n]1", "n[]"}) {
    EXPECT_EQ(FirstSlurmHost(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace dlrm::comm

// Our own main instead of gtest_main: the same binary is also a child rank
// when started with kChildFlag (a fresh exec, because gRPC does not survive
// fork in a process that already runs gRPC threads).
int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], dlrm::comm::kChildFlag) == 0) {
    return dlrm::comm::ChildMain(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
