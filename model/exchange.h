// The all-to-all exchanges of the hybrid step (docs/architecture.md "One
// step"), between the model-parallel embedding shards and the data-parallel
// dense part:
//   - input dist: each rank sends every shard the bag lengths, then the
//     ids, of its local samples (a row-wise shard gets only the ids in its
//     rows, made shard-local);
//   - output dist: each shard's pooled vectors of the global batch go back
//     to the samples' ranks, which assemble their interaction input;
//   - backward dist: the interaction input's gradient goes the other way,
//     to every shard (data-parallel replicas included).
// Every exchange has one layout: what rank a sends rank b is, for each
// shard b holds (table then shard order), a's local samples in order.
// The input dist moves host buffers (ids start in the host batch and every
// store prepares them on the host); the output and backward dists move
// buffers of an ExchangeMemory (host or CUDA device memory,
// model/exchange_memory.h), the same layout code for both.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/aligned.h"
#include "data/batch.h"
#include "dlrm/config.pb.h"
#include "embedding/sharding.h"
#include "model/exchange_memory.h"
#include "model/stage_times.h"

namespace dlrm::model {

// A shard as every rank sees it: which table, which shard of it.
struct ShardRef {
  int table;
  int shard;
};

// layout[r]: shards rank r holds, in table then shard order.
using ShardLayout = std::vector<std::vector<ShardRef>>;

// The exchanges of one rank. Every rank calls the same methods in the same
// order (they are collective); on one rank each exchange is the identity and
// its send buffer is handed through. Not thread-safe.
class ShardExchange {
 public:
  // `plan` valid for `config`, with plan.world_size == comm->world_size()
  // (both copied); `comm` (host memory, borrowed, must outlive the
  // exchange) carries the input dist. `vectors` (borrowed likewise, over the
  // same ranks) carries the output and backward dists in `memory`'s
  // buffers; null: `comm`, in host memory. A device communicator takes
  // CUDA exchange memory, or host exchange memory when it is host-staged
  // over the CPU Device. A row of the interaction input is `t_width`
  // floats, table k's pooled vector from column table_column[k].
  ShardExchange(const ModelConfig& config, const embedding::ShardingPlan& plan,
                comm::Communicator* comm, std::vector<int> table_column,
                int t_width, comm::Communicator* vectors = nullptr,
                std::unique_ptr<ExchangeMemory> memory = nullptr);

  // The memory space of the output and backward dists' communicator: a
  // store in this space pools into PooledBuffer and updates from
  // ScatterGradients' result directly, any other through host copies
  // (HostPooledBuffer, UploadPooled, memory().Download).
  MemorySpace memory_space() const { return vectors_->memory_space(); }
  // Where PooledBuffer, GatherPooled's `t`, ScatterGradients' `dt` and its
  // result live.
  ExchangeMemory& memory() { return *memory_; }

  // Every shard of every rank (data-parallel replicas included): the layout
  // of the step's exchanges. This rank's shards are owned()[rank], its
  // local shards in that order.
  const ShardLayout& owned() const { return owned_; }
  // The same restricted to tables `keep` accepts (e.g. those on RocksDB).
  template <typename Keep>
  ShardLayout Restricted(Keep keep) const {
    ShardLayout out(owned_.size());
    for (size_t r = 0; r < owned_.size(); ++r) {
      for (const ShardRef& ref : owned_[r]) {
        if (keep(ref.table)) out[r].push_back(ref);
      }
    }
    return out;
  }

  // The step's local batch sizes, every rank's (rank order, agreed by all
  // ranks), before the output and backward dists.
  void SetBatchSizes(const std::vector<int64_t>& sizes);
  const std::vector<int64_t>& sizes() const { return sizes_; }
  int64_t global_size() const { return starts_.back(); }
  // Where rank r's samples start in the global batch.
  int64_t start(int r) const { return starts_[r]; }

  // Input dist of `batch` when the ranks' local sizes are `sizes`, over
  // `layout` (layout[r] a subsequence of owned()[r]): *out[i] receives
  // the global batch's bags of this rank's shard layout[rank][i]. Adds the
  // bytes sent to times->bytes_sent. Communicator errors as is.
  absl::Status DistributeIds(const data::Batch& batch,
                             const std::vector<int64_t>& sizes,
                             const ShardLayout& layout,
                             std::span<data::SparseFeature* const> out,
                             StageTimes* times);

  // Output dist, first half: the buffer (in memory()) this rank's
  // model-parallel shards pool the global batch into, shard i (of
  // owned()[rank]) from column PooledColumn(i) at row stride
  // pooled_stride(); valid until the next PooledBuffer. Data-parallel
  // replicas have no columns there (they pool this rank's samples into the
  // interaction input themselves). ResourceExhausted when memory() cannot
  // hold it.
  absl::StatusOr<float*> PooledBuffer();
  // The same layout in host memory, for shards whose store is not in
  // memory_space(); UploadPooled(shards) then copies their columns into
  // PooledBuffer's. Valid until the next HostPooledBuffer.
  float* HostPooledBuffer();
  absl::Status UploadPooled(std::span<const int> shards);
  int64_t PooledColumn(int i) const { return pooled_col_[i]; }
  int64_t pooled_stride() const { return pooled_col_.back(); }

  // Output dist, second half: sends the pooled vectors to their samples'
  // ranks and writes this rank's into the interaction input `t` (in
  // memory(), batch.size rows): every model-parallel table's columns,
  // row-wise shards' partial sums added and divided by the bag length for
  // mean pooling. Columns of data-parallel tables are left as they are.
  absl::Status GatherPooled(const data::Batch& batch, float* t,
                            StageTimes* times);

  // Backward dist of `dt`, the interaction input's gradient for this
  // rank's samples (in memory(), rows of t_width): returns (in memory())
  // this rank's shards' gradients for the global batch, shard i's from
  // GradientOffset(i), one row of its columns per sample in global order
  // (a row-wise shard of a mean table: already divided by the bag length).
  // Valid until the next call.
  absl::StatusOr<const float*> ScatterGradients(const data::Batch& batch,
                                                const float* dt,
                                                StageTimes* times);
  int64_t GradientOffset(int i) const { return grad_at_[i]; }

 private:
  const embedding::Shard& ShardOf(const ShardRef& s) const {
    return plan_.tables[s.table].shards[s.shard];
  }
  bool IsDataParallel(int table) const {
    return plan_.tables[table].kind == SHARDING_DATA_PARALLEL;
  }
  bool IsRowWise(int table) const {
    return plan_.tables[table].kind == SHARDING_ROW_WISE;
  }
  // The output or backward dist's all-to-all over vectors_: the blocks
  // received, rank after rank, in memory()'s kRecv buffer; on one rank the
  // block this rank sends itself (no copy).
  absl::StatusOr<const float*> AllToAllVectors(
      const float* send, const std::vector<int64_t>& send_counts,
      const std::vector<int64_t>& recv_counts);
  // Copies factors_ (`tables` rows of n per-sample factors) into
  // memory()'s kScale buffer and returns it.
  absl::StatusOr<const float*> UploadFactors(int64_t n, size_t tables);

  ModelConfig config_;
  embedding::ShardingPlan plan_;
  comm::Communicator* comm_;
  comm::Communicator* vectors_;
  std::unique_ptr<ExchangeMemory> memory_;
  int rank_, world_;
  std::vector<int> table_column_;
  int t_width_;
  ShardLayout owned_;
  // pooled_col_[i]: shard i's first column in the output-dist send buffer
  // (its last entry: the row stride); model_stride_[r]: the columns rank
  // r's model-parallel shards pool, side by side.
  std::vector<int64_t> pooled_col_, model_stride_;

  // Per step.
  std::vector<int64_t> sizes_, starts_{0};
  std::vector<int64_t> grad_at_;
  // Host buffers, grown on demand (the rest are memory_'s).
  std::vector<int64_t> send_i64_, recv_i64_, send_ids_, recv_ids_;
  AlignedVector<float> host_pooled_;
  std::vector<float> factors_;
  std::vector<ColumnBlock> blocks_;
};

// docs/hybrid.md's formula: the bytes `rank` sends to other ranks in one
// training step, per exchange, for its `local` batch when the ranks' local
// sizes are `sizes`; with `next` (this rank's next batch, passed to
// TrainStep while some rank passed one), the prefetch's lengths and ids
// too. The step's StageTimes::bytes_sent must equal it.
std::array<int64_t, StageTimes::kNumExchanges> PredictedExchangeBytes(
    const ModelConfig& config, const embedding::ShardingPlan& plan,
    const data::Batch& local, const std::vector<int64_t>& sizes, int rank,
    const data::Batch* next = nullptr);

}  // namespace dlrm::model
