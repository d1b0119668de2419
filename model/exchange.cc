// The input, output and backward dists of the hybrid step.
#include "model/exchange.h"

#include <algorithm>
#include <cstring>

#include "core/config.h"
#include "core/status.h"
#include "embedding/dynamic_route.h"
#include "embedding/embedding_store.h"
#include "model/step_util.h"

namespace dlrm::model {
namespace {

using comm::DataType;
using internal::Sized;

// Bytes of `counts` elements of `size` bytes, leaving out this rank's own.
int64_t BytesToOthers(const std::vector<int64_t>& counts, int self,
                      size_t size) {
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) != self) total += counts[r];
  }
  return total * static_cast<int64_t>(size);
}

std::vector<int64_t> Prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> starts(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) {
    starts[r + 1] = starts[r] + counts[r];
  }
  return starts;
}

// One all-to-all of the input dist (host memory): the blocks this rank
// received, rank after rank (recv_counts), in `recv` (grown as needed). On
// one rank the block it sends itself is the one it receives: no copy.
absl::StatusOr<const int64_t*> AllToAll(
    comm::Communicator* comm, const int64_t* send,
    const std::vector<int64_t>& send_counts, std::vector<int64_t>& recv,
    const std::vector<int64_t>& recv_counts) {
  if (comm->world_size() == 1) return send;
  int64_t total = 0;
  for (const int64_t c : recv_counts) total += c;
  int64_t* out = Sized(recv, total);
  RETURN_IF_ERROR(
      comm->AllToAllV(send, send_counts, out, recv_counts, DataType::kInt64));
  return out;
}

}  // namespace

ShardExchange::ShardExchange(const ModelConfig& config,
                             const embedding::ShardingPlan& plan,
                             comm::Communicator* comm,
                             std::vector<int> table_column, int t_width,
                             comm::Communicator* vectors,
                             std::unique_ptr<ExchangeMemory> memory)
    : config_(config),
      plan_(plan),
      comm_(comm),
      vectors_(vectors != nullptr ? vectors : comm),
      memory_(memory != nullptr ? std::move(memory) : MakeHostExchangeMemory()),
      rank_(comm->rank()),
      world_(comm->world_size()),
      table_column_(std::move(table_column)),
      t_width_(t_width),
      owned_(world_),
      model_stride_(world_, 0),
      sizes_(world_, 0),
      starts_(world_ + 1, 0) {
  for (int k = 0; k < config_.tables_size(); ++k) {
    const auto& shards = plan_.tables[k].shards;
    for (int i = 0; i < static_cast<int>(shards.size()); ++i) {
      owned_[shards[i].rank].push_back({k, i});
      if (!IsDataParallel(k)) {
        model_stride_[shards[i].rank] += shards[i].col_count;
      }
    }
  }
  pooled_col_.assign(owned_[rank_].size() + 1, 0);
  for (size_t i = 0; i < owned_[rank_].size(); ++i) {
    const ShardRef& ref = owned_[rank_][i];
    pooled_col_[i + 1] =
        pooled_col_[i] +
        (IsDataParallel(ref.table) ? 0 : ShardOf(ref).col_count);
  }
}

void ShardExchange::SetBatchSizes(const std::vector<int64_t>& sizes) {
  sizes_ = sizes;
  starts_ = Prefix(sizes_);
  // Every local shard's gradients for the global batch, shard after shard.
  const std::vector<ShardRef>& mine = owned_[rank_];
  grad_at_.assign(mine.size() + 1, 0);
  for (size_t i = 0; i < mine.size(); ++i) {
    grad_at_[i + 1] = grad_at_[i] + global_size() * ShardOf(mine[i]).col_count;
  }
}

absl::Status ShardExchange::DistributeIds(
    const data::Batch& batch, const std::vector<int64_t>& sizes,
    const ShardLayout& layout, std::span<data::SparseFeature* const> out,
    StageTimes* times) {
  const int64_t n = batch.size;
  const std::vector<ShardRef>& mine = layout[rank_];

  // Part 1: bag lengths (row-wise: the ids in the shard's rows).
  std::vector<int64_t> len_send(world_), len_recv(world_);
  for (int o = 0; o < world_; ++o) {
    len_send[o] = static_cast<int64_t>(layout[o].size()) * n;
  }
  for (int r = 0; r < world_; ++r) {
    len_recv[r] = static_cast<int64_t>(mine.size()) * sizes[r];
  }
  const std::vector<int64_t> len_send_at = Prefix(len_send);
  int64_t* lengths = Sized(send_i64_, len_send_at[world_]);
  std::vector<int64_t> id_send(world_, 0);
  for (int o = 0; o < world_; ++o) {
    int64_t* dst = lengths + len_send_at[o];
    for (const ShardRef& ref : layout[o]) {
      const data::SparseFeature& f = batch.sparse[ref.table];
      const embedding::TablePlacement& placement = plan_.tables[ref.table];
      const bool dynamic = config_.tables(ref.table).dynamic();
      const bool row_wise = IsRowWise(ref.table);
      for (int64_t l = 0; l < n; ++l) {
        int64_t len = f.bag_size(l);
        if (row_wise) {
          len = 0;
          for (int64_t p = f.offsets[l]; p < f.offsets[l + 1]; ++p) {
            len += embedding::ShardTakes(placement, ref.shard, dynamic,
                                         f.ids[p]) >= 0;
          }
        }
        *dst++ = len;
        id_send[o] += len;
      }
    }
  }
  const std::vector<int64_t> len_recv_at = Prefix(len_recv);
  ASSIGN_OR_RETURN(const int64_t* rlengths,
                   AllToAll(comm_, lengths, len_send, recv_i64_, len_recv));
  times->bytes_sent[StageTimes::kLengths] += BytesToOthers(len_send, rank_, 8);

  // Part 2: the ids (row-wise: shard-local).
  std::vector<int64_t> id_recv(world_, 0);
  for (int r = 0; r < world_; ++r) {
    for (int64_t i = 0; i < len_recv[r]; ++i) {
      id_recv[r] += rlengths[len_recv_at[r] + i];
    }
  }
  const std::vector<int64_t> id_send_at = Prefix(id_send);
  const std::vector<int64_t> id_recv_at = Prefix(id_recv);
  int64_t* ids = Sized(send_ids_, id_send_at[world_]);
  for (int o = 0; o < world_; ++o) {
    int64_t* dst = ids + id_send_at[o];
    for (const ShardRef& ref : layout[o]) {
      const data::SparseFeature& f = batch.sparse[ref.table];
      if (IsRowWise(ref.table)) {
        const embedding::TablePlacement& placement = plan_.tables[ref.table];
        const bool dynamic = config_.tables(ref.table).dynamic();
        for (int64_t p = 0; p < (n > 0 ? f.offsets[n] : 0); ++p) {
          const int64_t id =
              embedding::ShardTakes(placement, ref.shard, dynamic, f.ids[p]);
          if (id >= 0) *dst++ = id;
        }
      } else if (n > 0) {
        dst = std::copy(f.ids.begin(), f.ids.begin() + f.offsets[n], dst);
      }
    }
  }
  ASSIGN_OR_RETURN(const int64_t* rids,
                   AllToAll(comm_, ids, id_send, recv_ids_, id_recv));
  times->bytes_sent[StageTimes::kIds] += BytesToOthers(id_send, rank_, 8);

  // Each local shard's bags for the whole global batch, in global order.
  for (data::SparseFeature* g : out) {
    g->offsets.assign(1, 0);
    g->ids.clear();
  }
  for (int r = 0; r < world_; ++r) {
    const int64_t* rl = rlengths + len_recv_at[r];
    const int64_t* ri = rids + id_recv_at[r];
    for (data::SparseFeature* g : out) {
      int64_t count = 0;
      for (int64_t l = 0; l < sizes[r]; ++l) {
        count += rl[l];
        g->offsets.push_back(g->offsets.back() + rl[l]);
      }
      g->ids.insert(g->ids.end(), ri, ri + count);
      rl += sizes[r];
      ri += count;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<float*> ShardExchange::PooledBuffer() {
  // Rank r's block is [its samples x all model-parallel columns] and starts
  // at start(r) x stride, so pooling the global batch at that stride puts
  // every sample's vector in its rank's block.
  return memory_->Buffer(ExchangeMemory::kSend,
                         global_size() * pooled_stride());
}

float* ShardExchange::HostPooledBuffer() {
  return Sized(host_pooled_, global_size() * pooled_stride());
}

absl::Status ShardExchange::UploadPooled(std::span<const int> shards) {
  if (shards.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(float* send, PooledBuffer());
  const int64_t stride = pooled_stride();
  for (const int i : shards) {
    const int64_t col = pooled_col_[i];
    RETURN_IF_ERROR(memory_->Upload(host_pooled_.data() + col, stride,
                                    send + col, stride, global_size(),
                                    pooled_col_[i + 1] - col));
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> ShardExchange::AllToAllVectors(
    const float* send, const std::vector<int64_t>& send_counts,
    const std::vector<int64_t>& recv_counts) {
  if (world_ == 1) return send;
  int64_t total = 0;
  for (const int64_t c : recv_counts) total += c;
  ASSIGN_OR_RETURN(float* out, memory_->Buffer(ExchangeMemory::kRecv, total));
  RETURN_IF_ERROR(vectors_->AllToAllV(send, send_counts, out, recv_counts,
                                      DataType::kFloat32));
  return out;
}

absl::StatusOr<const float*> ShardExchange::UploadFactors(int64_t n,
                                                          size_t tables) {
  const int64_t count = n * static_cast<int64_t>(tables);
  ASSIGN_OR_RETURN(float* out, memory_->Buffer(ExchangeMemory::kScale, count));
  RETURN_IF_ERROR(memory_->Upload(factors_.data(), count, out, count,
                                  count > 0 ? 1 : 0, count));
  return out;
}

absl::Status ShardExchange::GatherPooled(const data::Batch& batch, float* t,
                                         StageTimes* times) {
  const int64_t n = batch.size;
  std::vector<int64_t> out_send(world_), out_recv(world_);
  for (int r = 0; r < world_; ++r) {
    out_send[r] = sizes_[r] * pooled_stride();
    out_recv[r] = n * model_stride_[r];
  }
  const std::vector<int64_t> out_recv_at = Prefix(out_recv);
  ASSIGN_OR_RETURN(float* send, PooledBuffer());
  ASSIGN_OR_RETURN(const float* recv,
                   AllToAllVectors(send, out_send, out_recv));
  times->bytes_sent[StageTimes::kPooled] += BytesToOthers(out_send, rank_, 4);

  // Only the sample's rank knows a whole bag's length: it applies the mean
  // of row-wise tables (a factor of 1 leaves an empty bag's zeros as they
  // are).
  std::vector<int> mean_tables;
  factors_.clear();
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (!IsRowWise(k) || config_.tables(k).pooling() != POOLING_MEAN) continue;
    mean_tables.push_back(k);
    for (int64_t l = 0; l < n; ++l) {
      const int64_t len = batch.sparse[k].bag_size(l);
      factors_.push_back(len == 0 ? 1.0f : 1.0f / static_cast<float>(len));
    }
  }
  ASSIGN_OR_RETURN(const float* factors, UploadFactors(n, mean_tables.size()));

  // Row-wise tables' columns zeroed, every shard's column block in place
  // (row-wise partial sums added), then the means.
  blocks_.clear();
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (!IsRowWise(k)) continue;
    ColumnBlock b;
    b.dst = t + table_column_[k];
    b.dst_stride = t_width_;
    b.rows = n;
    b.cols = config_.tables(k).dim();
    blocks_.push_back(b);
  }
  for (int o = 0; o < world_; ++o) {
    const float* block = recv + out_recv_at[o];
    int64_t col = 0;
    for (const ShardRef& ref : owned_[o]) {
      if (IsDataParallel(ref.table)) continue;
      const embedding::Shard& s = ShardOf(ref);
      ColumnBlock b;
      b.src = block + col;
      b.src_stride = model_stride_[o];
      b.dst = t + table_column_[ref.table] + s.col_begin;
      b.dst_stride = t_width_;
      b.rows = n;
      b.cols = s.col_count;
      b.accumulate = IsRowWise(ref.table);
      blocks_.push_back(b);
      col += s.col_count;
    }
  }
  for (size_t i = 0; i < mean_tables.size(); ++i) {
    const int k = mean_tables[i];
    ColumnBlock b;
    b.src = t + table_column_[k];
    b.src_stride = t_width_;
    b.dst = t + table_column_[k];
    b.dst_stride = t_width_;
    b.rows = n;
    b.cols = config_.tables(k).dim();
    b.row_scale = factors + static_cast<int64_t>(i) * n;
    blocks_.push_back(b);
  }
  return memory_->Columns(blocks_);
}

absl::StatusOr<const float*> ShardExchange::ScatterGradients(
    const data::Batch& batch, const float* dt, StageTimes* times) {
  const int64_t n = batch.size;
  const std::vector<ShardRef>& mine = owned_[rank_];
  // Every shard (replicas included) gets the gradients of its pooled
  // vectors for this rank's samples; row-wise shards of a mean table get
  // them already divided by the bag length.
  std::vector<int64_t> g_send(world_, 0), g_recv(world_, 0);
  for (int o = 0; o < world_; ++o) {
    for (const ShardRef& ref : owned_[o]) {
      g_send[o] += n * ShardOf(ref).col_count;
    }
  }
  for (int r = 0; r < world_; ++r) {
    for (const ShardRef& ref : mine) {
      g_recv[r] += sizes_[r] * ShardOf(ref).col_count;
    }
  }
  const std::vector<int64_t> g_send_at = Prefix(g_send);
  const std::vector<int64_t> g_recv_at = Prefix(g_recv);
  // The same factors the single-rank backward multiplies by, per row-wise
  // mean table: row i of `factors` is table mean_row[k]'s.
  std::vector<int> mean_row(config_.tables_size(), -1);
  int mean_tables = 0;
  factors_.clear();
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (!IsRowWise(k) || config_.tables(k).pooling() != POOLING_MEAN) continue;
    mean_row[k] = mean_tables++;
    for (int64_t l = 0; l < n; ++l) {
      const int64_t len = batch.sparse[k].bag_size(l);
      factors_.push_back(len > 0 ? 1.0f / static_cast<float>(len) : 0.0f);
    }
  }
  ASSIGN_OR_RETURN(const float* factors, UploadFactors(n, mean_tables));
  ASSIGN_OR_RETURN(float* send,
                   memory_->Buffer(ExchangeMemory::kSend, g_send_at[world_]));
  blocks_.clear();
  for (int o = 0; o < world_; ++o) {
    float* dst = send + g_send_at[o];
    for (const ShardRef& ref : owned_[o]) {
      const embedding::Shard& s = ShardOf(ref);
      ColumnBlock b;
      b.src = dt + table_column_[ref.table] + s.col_begin;
      b.src_stride = t_width_;
      b.dst = dst;
      b.dst_stride = s.col_count;
      b.rows = n;
      b.cols = s.col_count;
      if (mean_row[ref.table] >= 0) {
        b.row_scale = factors + static_cast<int64_t>(mean_row[ref.table]) * n;
      }
      blocks_.push_back(b);
      dst += n * s.col_count;
    }
  }
  RETURN_IF_ERROR(memory_->Columns(blocks_));
  ASSIGN_OR_RETURN(const float* recv, AllToAllVectors(send, g_send, g_recv));
  times->bytes_sent[StageTimes::kGradients] += BytesToOthers(g_send, rank_, 4);
  // On one rank the received block is already in the shards' layout (shard
  // after shard, every sample).
  if (world_ == 1) return recv;
  ASSIGN_OR_RETURN(float* regrouped, memory_->Buffer(ExchangeMemory::kRegrouped,
                                                     grad_at_.back()));
  blocks_.clear();
  for (int r = 0; r < world_; ++r) {
    const float* in = recv + g_recv_at[r];
    for (size_t i = 0; i < mine.size(); ++i) {
      const int dim = ShardOf(mine[i]).col_count;
      ColumnBlock b;
      b.src = in;
      b.src_stride = dim;
      b.dst = regrouped + grad_at_[i] + starts_[r] * dim;
      b.dst_stride = dim;
      b.rows = sizes_[r];
      b.cols = dim;
      blocks_.push_back(b);
      in += sizes_[r] * dim;
    }
  }
  RETURN_IF_ERROR(memory_->Columns(blocks_));
  return regrouped;
}

std::array<int64_t, StageTimes::kNumExchanges> PredictedExchangeBytes(
    const ModelConfig& c, const embedding::ShardingPlan& plan,
    const data::Batch& local, const std::vector<int64_t>& sizes, int rank,
    const data::Batch* next) {
  std::array<int64_t, StageTimes::kNumExchanges> b{};
  const int world = plan.world_size;
  const int64_t n = local.size;
  for (int k = 0; k < c.tables_size(); ++k) {
    const auto& p = plan.tables[k];
    // The id bytes of `ids` shard i takes.
    const auto id_bytes = [&](int i, const std::vector<int64_t>& ids) {
      int64_t bytes = 0;
      for (int64_t id : ids) {
        bytes +=
            embedding::ShardTakes(p, i, c.tables(k).dynamic(), id) >= 0 ? 8 : 0;
      }
      return bytes;
    };
    for (int i = 0; i < static_cast<int>(p.shards.size()); ++i) {
      const embedding::Shard& s = p.shards[i];
      const bool mp = p.kind != SHARDING_DATA_PARALLEL;
      if (s.rank != rank && next != nullptr &&
          embedding::TableCapabilities(c.tables(k), c.rocksdb(), s.row_count)
              .prefetch) {
        // The prefetch: the next batch's lengths and ids, to the shards
        // whose stores take it.
        b[StageTimes::kLengths] += 8 * next->size;
        b[StageTimes::kIds] += id_bytes(i, next->sparse[k].ids);
      }
      if (s.rank != rank) {
        b[StageTimes::kLengths] += 8 * n;
        b[StageTimes::kIds] += id_bytes(i, local.sparse[k].ids);
        b[StageTimes::kGradients] += 4 * n * s.col_count;
      } else if (mp) {
        for (int o = 0; o < world; ++o) {
          if (o != rank) {
            b[StageTimes::kPooled] += 4 * sizes[o] * s.col_count;
          }
        }
      }
    }
  }
  if (world > 1) {
    b[StageTimes::kDense] = 4 * (DenseParameterCount(c) + 1);
  }
  return b;
}

}  // namespace dlrm::model
