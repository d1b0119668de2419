// RankGroup's batch operations: the leader's TrainStep and Predict (split
// the batch, send the command, scatter the slices, gather the
// probabilities) as every rank runs them, and SetOptimizers.
#include <utility>

#include "core/status.h"
#include "server/rank_group.h"
#include "spdlog/spdlog.h"

namespace dlrm::server {

absl::Status RankGroup::ScatterBatch(const std::vector<std::string>& parts,
                                     const std::vector<int64_t>& bytes,
                                     bool labels, data::Batch* slice) {
  std::vector<int64_t> send_counts(world_, 0), recv_counts(world_, 0);
  std::string send, recv;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) {
      send_counts[r] = bytes[r];
      send += parts[r];
    }
  } else {
    recv_counts[0] = bytes[rank_];
    recv.resize(bytes[rank_]);
  }
  const absl::Status s = comm_->AllToAllV(send.data(), send_counts, recv.data(),
                                          recv_counts, comm::DataType::kUint8);
  if (!s.ok()) return Broke(s, "the batch scatter");
  if (rank_ == 0) return absl::OkStatus();  // the leader sliced its own part
  const int num_dense = model_->config().num_dense_features();
  const absl::Status decoded = data::DecodeColumns(
      recv, num_dense, static_cast<int>(id_limits_.size()), slice);
  if (!decoded.ok()) {
    // The leader encoded what it validated, so this is a bug; a slice
    // without sparse features makes every rank refuse the step together
    // instead of leaving this one out of the collectives.
    spdlog::error("rank {}: bad batch slice from the leader: {}", rank_,
                  std::string(decoded.message()));
    slice->Reset(num_dense, 0);
    slice->size = 0;
  }
  return absl::OkStatus();
}

absl::Status RankGroup::GatherProbs(const std::vector<float>& local,
                                    const std::vector<int64_t>& sizes,
                                    std::vector<float>* all) {
  std::vector<int64_t> send_counts(world_, 0), recv_counts(world_, 0);
  send_counts[0] = static_cast<int64_t>(local.size());
  if (rank_ == 0) {
    recv_counts = sizes;
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    all->resize(total);
  }
  const absl::Status s = comm_->AllToAllV(
      local.data(), send_counts, rank_ == 0 ? all->data() : nullptr,
      recv_counts, comm::DataType::kFloat32);
  if (!s.ok()) return Broke(s, "the prediction gather");
  return absl::OkStatus();
}

absl::Status RankGroup::RunStep(const data::Batch& local,
                                const data::Batch* next, bool train,
                                const std::vector<int64_t>& sizes,
                                std::vector<float>* probs,
                                model::StepResult* result) {
  if (train) {
    absl::StatusOr<model::StepResult> r = model_->TrainStep(local, next);
    if (!r.ok()) {
      // Refusals every rank agreed on (a bad batch, a batch over a shard's
      // cache) change nothing and leave the group usable.
      if (absl::IsInvalidArgument(r.status()) ||
          absl::IsResourceExhausted(r.status())) {
        return r.status();
      }
      return Broke(r.status(), "Train");
    }
    steps_.store(model_->steps());
    if (result != nullptr) *result = *std::move(r);
    return absl::OkStatus();
  }
  std::vector<float> mine;
  absl::Status s = model_->Predict(local, &mine);
  if (!s.ok()) {
    if (absl::IsInvalidArgument(s) || absl::IsResourceExhausted(s)) return s;
    return Broke(s, "Predict");
  }
  return GatherProbs(mine, sizes, probs);
}

void RankGroup::Split(const data::Batch& batch, bool labels, data::Batch* local,
                      std::vector<std::string>* parts,
                      std::vector<int64_t>* bytes) {
  const std::vector<int64_t> sizes = SplitSamples(batch.size, world_);
  parts->assign(world_, "");
  bytes->assign(world_, 0);
  batch.Slice(0, sizes[0], local);
  for (int64_t r = 1, start = sizes[0]; r < world_; start += sizes[r], ++r) {
    data::EncodeColumns(batch, start, start + sizes[r], labels, &(*parts)[r]);
    (*bytes)[r] = static_cast<int64_t>((*parts)[r].size());
  }
}

absl::Status RankGroup::ScatterNext(const data::Batch* next,
                                    data::Batch* slice) {
  std::vector<std::string> parts;
  std::vector<int64_t> bytes(world_, 0);
  if (rank_ == 0) Split(*next, /*labels=*/false, slice, &parts, &bytes);
  const absl::Status s =
      comm_->Broadcast(bytes.data(), world_, comm::DataType::kInt64, 0);
  if (!s.ok()) return Broke(s, "the next batch's sizes");
  return ScatterBatch(parts, bytes, /*labels=*/false, slice);
}

absl::Status RankGroup::Lead(const data::Batch& batch, const data::Batch* next,
                             bool train, std::vector<float>* probs,
                             model::StepResult* result) {
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  // Checked here so that the error names the sample of the whole batch.
  RETURN_IF_ERROR(
      batch.Validate(model_->config().num_dense_features(), id_limits_));
  // A next batch only steers the prefetch of tables on RocksDB: sent when
  // there are such tables and it is valid.
  const bool send_next =
      train && next != nullptr && next->size > 0 && any_prefetch_ &&
      next->Validate(model_->config().num_dense_features(), id_limits_).ok();
  const std::vector<int64_t> sizes = SplitSamples(batch.size, world_);
  if (world_ == 1) {
    // The whole batch is the leader's: no slice to cut or send.
    return RunStep(batch, send_next ? next : nullptr, train, sizes, probs,
                   result);
  }
  std::vector<std::string> parts;
  std::vector<int64_t> bytes;
  data::Batch local, next_local;
  Split(batch, /*labels=*/train, &local, &parts, &bytes);
  RETURN_IF_ERROR(
      SendCommand(train ? kTrain : kPredict, send_next ? 1 : 0, bytes));
  RETURN_IF_ERROR(ScatterBatch(parts, bytes, train, &local));
  if (send_next) RETURN_IF_ERROR(ScatterNext(next, &next_local));
  return RunStep(local, send_next ? &next_local : nullptr, train, sizes, probs,
                 result);
}

absl::StatusOr<model::StepResult> RankGroup::TrainStep(
    const data::Batch& batch, const data::Batch* next) {
  model::StepResult result;
  RETURN_IF_ERROR(Lead(batch, next, /*train=*/true, nullptr, &result));
  return result;
}

absl::Status RankGroup::Predict(const data::Batch& batch,
                                std::vector<float>* probs) {
  return Lead(batch, nullptr, /*train=*/false, probs, nullptr);
}

absl::Status RankGroup::SetOptimizers(const OptimizerConfig& dense,
                                      const OptimizerConfig& sparse) {
  ModelConfig both;
  *both.mutable_dense_optimizer() = dense;
  *both.mutable_sparse_optimizer() = sparse;
  std::string bytes;
  if (!both.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialise the optimizers");
  }
  const std::unique_lock<std::mutex> lock = channel_->Lock();
  RETURN_IF_ERROR(CheckUsable());
  if (world_ > 1) {
    const int64_t size = static_cast<int64_t>(bytes.size());
    RETURN_IF_ERROR(SendCommand(kSetOptimizers, size, {}));
    RETURN_IF_ERROR(BroadcastString(&bytes, size));
  }
  return ApplyOptimizers(bytes);
}

absl::Status RankGroup::ApplyOptimizers(const std::string& bytes) {
  ModelConfig both;
  const absl::Status local =
      both.ParseFromString(bytes)
          ? model_->SetOptimizers(both.dense_optimizer(),
                                  both.sparse_optimizer())
          : absl::InternalError("the optimizers from rank 0 are garbled");
  const absl::Status agreed = Verdict(local, "setting the optimizers");
  // A refusal (a bad value) changes no rank; anything else may have
  // changed some ranks and not others.
  if (!agreed.ok() && !absl::IsInvalidArgument(agreed) && usable()) {
    return Broke(agreed, "SetOptimizers");
  }
  return agreed;
}

}  // namespace dlrm::server
