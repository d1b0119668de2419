// The input, output and backward dists of the hybrid step.
#include "model/exchange.h"

#include <algorithm>
#include <cstring>

#include "core/config.h"
#include "core/status.h"
#include "model/step_util.h"

namespace dlrm::model {
namespace {

using comm::DataType;
using internal::Sized;

// Whether id `id` of a bag belongs to `shard` (rows only matter).
inline bool InRows(const embedding::Shard& shard, int64_t id) {
  return id >= shard.row_begin && id < shard.row_begin + shard.row_count;
}

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

DataType TypeOf(const float*) { return DataType::kFloat32; }
DataType TypeOf(const int64_t*) { return DataType::kInt64; }

// One all-to-all: the blocks this rank received, rank after rank
// (recv_counts), in `recv` (grown as needed). On one rank the block it
// sends itself is the one it receives: no copy.
template <typename Vec>
absl::StatusOr<const typename Vec::value_type*> AllToAll(
    comm::Communicator* comm, const typename Vec::value_type* send,
    const std::vector<int64_t>& send_counts, Vec& recv,
    const std::vector<int64_t>& recv_counts) {
  if (comm->world_size() == 1) return send;
  int64_t total = 0;
  for (const int64_t c : recv_counts) total += c;
  typename Vec::value_type* out = Sized(recv, total);
  RETURN_IF_ERROR(
      comm->AllToAllV(send, send_counts, out, recv_counts, TypeOf(send)));
  return out;
}

}  // namespace

ShardExchange::ShardExchange(const ModelConfig& config,
                             const embedding::ShardingPlan& plan,
                             comm::Communicator* comm,
                             std::vector<int> table_column, int t_width)
    : config_(config),
      plan_(plan),
      comm_(comm),
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
      const embedding::Shard& s = ShardOf(ref);
      const bool row_wise = IsRowWise(ref.table);
      for (int64_t l = 0; l < n; ++l) {
        int64_t len = f.bag_size(l);
        if (row_wise) {
          len = 0;
          for (int64_t p = f.offsets[l]; p < f.offsets[l + 1]; ++p) {
            len += InRows(s, f.ids[p]);
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
      const embedding::Shard& s = ShardOf(ref);
      if (IsRowWise(ref.table)) {
        for (int64_t p = 0; p < (n > 0 ? f.offsets[n] : 0); ++p) {
          if (InRows(s, f.ids[p])) *dst++ = f.ids[p] - s.row_begin;
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

float* ShardExchange::PooledBuffer() {
  // Rank r's block is [its samples x all model-parallel columns] and starts
  // at start(r) x stride, so pooling the global batch at that stride puts
  // every sample's vector in its rank's block.
  return Sized(send_f_, global_size() * pooled_stride());
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
  ASSIGN_OR_RETURN(const float* recv, AllToAll(comm_, send_f_.data(), out_send,
                                               recv_f_, out_recv));
  times->bytes_sent[StageTimes::kPooled] += BytesToOthers(out_send, rank_, 4);

  // Column blocks side by side, row-wise partial sums added.
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (!IsRowWise(k)) continue;
    const int dim = config_.tables(k).dim();
    for (int64_t l = 0; l < n; ++l) {
      std::fill_n(t + l * t_width_ + table_column_[k], dim, 0.0f);
    }
  }
  for (int o = 0; o < world_; ++o) {
    const float* block = recv + out_recv_at[o];
    int64_t col = 0;
    for (const ShardRef& ref : owned_[o]) {
      if (IsDataParallel(ref.table)) continue;
      const embedding::Shard& s = ShardOf(ref);
      const bool row_wise = IsRowWise(ref.table);
      for (int64_t l = 0; l < n; ++l) {
        const float* src = block + l * model_stride_[o] + col;
        float* dst = t + l * t_width_ + table_column_[ref.table] + s.col_begin;
        if (row_wise) {
          for (int c = 0; c < s.col_count; ++c) dst[c] += src[c];
        } else {
          std::memcpy(dst, src, sizeof(float) * s.col_count);
        }
      }
      col += s.col_count;
    }
  }
  // Only the sample's rank knows a whole bag's length: it applies the mean
  // of row-wise tables.
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (!IsRowWise(k) || config_.tables(k).pooling() != POOLING_MEAN) continue;
    const int dim = config_.tables(k).dim();
    for (int64_t l = 0; l < n; ++l) {
      const int64_t len = batch.sparse[k].bag_size(l);
      if (len == 0) continue;
      const float scale = 1.0f / static_cast<float>(len);
      float* v = t + l * t_width_ + table_column_[k];
      for (int c = 0; c < dim; ++c) v[c] *= scale;
    }
  }
  return absl::OkStatus();
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
  float* send = Sized(send_f_, g_send_at[world_]);
  for (int o = 0; o < world_; ++o) {
    float* dst = send + g_send_at[o];
    for (const ShardRef& ref : owned_[o]) {
      const embedding::Shard& s = ShardOf(ref);
      const bool scale = IsRowWise(ref.table) &&
                         config_.tables(ref.table).pooling() == POOLING_MEAN;
      for (int64_t l = 0; l < n; ++l) {
        const float* g =
            dt + l * t_width_ + table_column_[ref.table] + s.col_begin;
        if (scale) {
          const int64_t len = batch.sparse[ref.table].bag_size(l);
          // The same factor the single-rank backward multiplies by.
          const float f = len > 0 ? 1.0f / static_cast<float>(len) : 0.0f;
          for (int c = 0; c < s.col_count; ++c) dst[c] = g[c] * f;
        } else {
          std::memcpy(dst, g, sizeof(float) * s.col_count);
        }
        dst += s.col_count;
      }
    }
  }
  ASSIGN_OR_RETURN(const float* recv,
                   AllToAll(comm_, send, g_send, recv_f_, g_recv));
  times->bytes_sent[StageTimes::kGradients] += BytesToOthers(g_send, rank_, 4);
  // On one rank the received block is already in the shards' layout (shard
  // after shard, every sample).
  if (world_ == 1) return recv;
  float* regrouped = Sized(regrouped_, grad_at_.back());
  for (int r = 0; r < world_; ++r) {
    const float* in = recv + g_recv_at[r];
    for (size_t i = 0; i < mine.size(); ++i) {
      const int dim = ShardOf(mine[i]).col_count;
      const int64_t count = sizes_[r] * dim;
      std::memcpy(regrouped + grad_at_[i] + starts_[r] * dim, in,
                  sizeof(float) * count);
      in += count;
    }
  }
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
    for (const embedding::Shard& s : p.shards) {
      const bool mp = p.kind != SHARDING_DATA_PARALLEL;
      if (s.rank != rank && next != nullptr &&
          c.tables(k).storage() == STORAGE_ROCKSDB) {
        // The prefetch: the next batch's lengths and ids, RocksDB shards
        // only.
        b[StageTimes::kLengths] += 8 * next->size;
        for (int64_t id : next->sparse[k].ids) {
          b[StageTimes::kIds] += InRows(s, id) ? 8 : 0;
        }
      }
      if (s.rank != rank) {
        b[StageTimes::kLengths] += 8 * n;
        for (int64_t id : local.sparse[k].ids) {
          b[StageTimes::kIds] += InRows(s, id) ? 8 : 0;
        }
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
