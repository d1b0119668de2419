// The DLRM step on R >= 1 ranks: input dist (lengths, then ids), shard
// lookups for the global batch, output dist, data-parallel dense
// forward/backward, backward dist, fused sparse updates, dense all-reduce.
// The exchanges themselves are model/exchange.h's.
#include "model/model.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "comm/agree.h"
#include "core/config.h"
#include "core/config_change.h"
#include "core/random.h"
#include "core/status.h"
#include "embedding/store_update.h"
#include "model/step_util.h"
#include "optim/optimizer.h"

namespace dlrm::model {
namespace {

using comm::DataType;

using internal::Sized;
using StageClock = internal::StageClock<StageTimes>;

// Runs up to two all-reduce buckets, one after the other, on a background
// thread; Finish() waits for both and returns the first error. The
// destructor waits too, so an early return never leaves the thread running
// on buffers that are going away.
class OverlappedReduce {
 public:
  OverlappedReduce() = default;
  OverlappedReduce(const OverlappedReduce&) = delete;
  OverlappedReduce& operator=(const OverlappedReduce&) = delete;
  ~OverlappedReduce() { Finish().IgnoreError(); }

  void Start(std::function<absl::Status()> first) {
    worker_ = std::async(std::launch::async, [this, first = std::move(first)] {
      absl::Status s = first();
      std::function<absl::Status()> second = next_.get_future().get();
      if (s.ok() && second) s = second();
      return s;
    });
  }
  // Queues the second bucket (call once after Start).
  void Then(std::function<absl::Status()> second) {
    next_.set_value(std::move(second));
    queued_ = true;
  }
  absl::Status Finish() {
    if (!worker_.valid()) return absl::OkStatus();
    if (!queued_) Then(nullptr);
    return worker_.get();
  }

 private:
  std::future<absl::Status> worker_;
  std::promise<std::function<absl::Status()>> next_;
  bool queued_ = false;
};

}  // namespace

absl::Status Model::AgreeOnBatch(const data::Batch& batch,
                                 const data::Batch* next) {
  auto validate = [this](const data::Batch& b) {
    return ValidateBatch(config_, b);
  };
  const absl::Status status = validate(batch);
  // The next batch only steers a prefetch: a bad one is simply left out
  // (its own step rejects it).
  const int64_t next_size =
      next != nullptr && any_cache_ && validate(*next).ok() ? next->size : 0;
  // One exchange settles the sizes, the verdict and the prefetch.
  const int64_t mine[3] = {status.ok() ? batch.size : 0, status.ok() ? 0 : 1,
                           next_size};
  std::vector<int64_t> all(3 * world_);
  RETURN_IF_ERROR(comm_->AllGather(mine, 3, all.data(), DataType::kInt64));
  std::vector<int64_t> sizes(world_, 0);
  next_sizes_.assign(world_, 0);
  int bad_rank = -1;
  for (int r = 0; r < world_; ++r) {
    sizes[r] = all[3 * r];
    next_sizes_[r] = all[3 * r + 2];
    if (all[3 * r + 1] != 0 && bad_rank < 0) bad_rank = r;
  }
  RETURN_IF_ERROR(status);
  if (bad_rank >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch rejected: rank ", bad_rank, "'s local batch is invalid"));
  }
  exchange_->SetBatchSizes(sizes);
  if (exchange_->global_size() == 0) {
    return absl::InvalidArgumentError("batch: the global batch is empty");
  }
  return absl::OkStatus();
}

absl::Status Model::PrepareShards(bool predict) {
  // Predictions prepare without changing what the stores hold: a dynamic
  // table admits no id (EmbeddingStore::PrepareLookup). A training step
  // stages each shard's prepare and commits them (a dynamic table's
  // admissions) only once every shard on every rank is ready, so a
  // refused step changes no map.
  auto prepare = [predict](LocalShard& ls) {
    return predict ? ls.store->PrepareLookup(*ls.ids)
                   : ls.store->PrepareStaged(*ls.ids);
  };
  auto commit = [this, predict]() -> absl::Status {
    if (predict) return absl::OkStatus();
    // Each shard's admitted rows get their initial records: in parallel,
    // as the prepares (each store has one caller). On the host and RocksDB
    // tiers this writes resident rows, which cannot fail
    // (DynamicStore::CommitPrepared).
    const int num_local = static_cast<int>(local_.size());
#pragma omp parallel for schedule(dynamic, 1) if (num_local > 1)
    for (int j = 0; j < num_local; ++j) {
      local_[j].status = local_[j].store->CommitPrepared();
    }
    for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
    return absl::OkStatus();
  };
  if (!any_cache_) {
    // Host stores return the ids themselves, device stores without a cache
    // only check and upload them: nothing to agree on, no collective.
    for (LocalShard& ls : local_) {
      ASSIGN_OR_RETURN(ls.prepared, prepare(ls));
    }
    return commit();
  }
  // Cached shards load independently (the database is thread-safe, each
  // store has one caller).
  const int num_local = static_cast<int>(local_.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < num_local; ++j) {
    LocalShard& ls = local_[j];
    absl::StatusOr<const data::SparseFeature*> p = prepare(ls);
    ls.prepared = p.ok() ? *p : nullptr;
    ls.status = p.status();
  }
  absl::Status local;
  for (const LocalShard& ls : local_) {
    if (!ls.status.ok()) {
      const embedding::Shard& s = plan_.tables[ls.table].shards[ls.shard];
      local = absl::Status(
          ls.status.code(),
          absl::StrCat("rank ", rank_, ", table ",
                       config_.tables(ls.table).name(), " shard ", ls.shard,
                       " (rows ", s.row_begin, "-", s.row_begin + s.row_count,
                       ", cols ", s.col_begin, "-", s.col_begin + s.col_count,
                       "): ", ls.status.message()));
      break;
    }
  }
  // The ids reach a shard only through the input dist, so no rank can
  // refuse before the exchange; every rank learns here, before anything
  // changes, whether all shards are ready. The caches' counters ride
  // along: every rank learns every rank's (store_stats_).
  constexpr int kFields = embedding::StoreMetrics::kNumFields;
  std::vector<int64_t> mine(store_words_, 0), all;
  const std::vector<int>& tables = store_tables_[rank_];
  for (const int j : cache_locals_) {
    const size_t at = std::find(tables.begin(), tables.end(), local_[j].table) -
                      tables.begin();
    const embedding::StoreMetrics m = local_[j].store->metrics();
    for (int f = 0; f < kFields; ++f) {
      mine[at * kFields + f] += m.*embedding::StoreMetrics::kFields[f];
    }
  }
  const absl::Status agreed = AgreeOnStatus(local, mine, &all);
  if (agreed.ok()) {
    RETURN_IF_ERROR(commit());
  } else {
    for (LocalShard& ls : local_) ls.store->AbandonPrepared();
  }
  if (all.empty()) return agreed;
  for (RankTableStore& s : store_stats_) {
    const std::vector<int>& theirs = store_tables_[s.rank];
    const size_t at =
        std::find(theirs.begin(), theirs.end(), s.table) - theirs.begin();
    const int64_t* words = &all[s.rank * store_words_ + at * kFields];
    for (int f = 0; f < kFields; ++f) {
      s.metrics.*embedding::StoreMetrics::kFields[f] = words[f];
    }
  }
  return agreed;
}

absl::Status Model::AgreeOnStatus(const absl::Status& local,
                                  const std::vector<int64_t>& extra,
                                  std::vector<int64_t>* all_extra,
                                  const char* what) {
  comm::Agreement agreed =
      comm::AgreeOnStatus(*comm_, local, extra, all_extra, what);
  if (!agreed.communicator.ok()) {
    communicator_failed_ = true;
    communicator_error_ = agreed.communicator;
    return agreed.communicator;
  }
  return agreed.verdict;
}

absl::Status Model::EmbedForward(const data::Batch& batch, bool predict,
                                 StageTimes* times) {
  StageClock clock(times);
  const int64_t n = batch.size;

  if (in_place_) {
    for (LocalShard& ls : local_) ls.ids = &batch.sparse[ls.table];
  } else {
    std::vector<data::SparseFeature*> out;
    for (LocalShard& ls : local_) {
      out.push_back(&ls.global_ids);
      ls.ids = &ls.global_ids;
    }
    RETURN_IF_ERROR(exchange_->DistributeIds(batch, exchange_->sizes(),
                                             exchange_->owned(), out, times));
  }
  clock.Mark(StageTimes::kInputDist);

  // Before anything changes: a batch that does not fit a shard's cache on
  // any rank is refused on every rank.
  RETURN_IF_ERROR(PrepareShards(predict));
  OrderShardsByWork();
  clock.Mark(StageTimes::kPrepare);

  const int num_local = static_cast<int>(local_.size());
  if (in_place_) {
    // Every shard's columns of the interaction input, for this rank's (the
    // whole) batch: in host memory, or on the device for stores there
    // (queued on the dense backend's stream, ahead of the interaction).
    ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
    float* device_t = nullptr;
    if (any_device_) {
      ASSIGN_OR_RETURN(device_t, dense_->DeviceInteractionInput(n, predict));
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < num_local; ++i) {
      LocalShard& ls = local_[by_work_[i]];
      float* out =
          ls.store->memory_space() == MemorySpace::kDevice ? device_t : t;
      // (An empty batch may have no buffer at all.)
      ls.status = ls.store->Forward(
          *ls.prepared, out == nullptr ? nullptr : out + TColumn(ls), t_width_);
    }
    for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
    clock.Mark(StageTimes::kLookup);
    return absl::OkStatus();
  }

  // Lookup: each model-parallel shard pools the global batch into the
  // output dist's send buffer: straight there when its store is in the
  // exchange's memory space, else into the host copy, uploaded after.
  ASSIGN_OR_RETURN(float* send, exchange_->PooledBuffer());
  std::vector<int> uploads;
  for (int j = 0; j < num_local; ++j) {
    if (!IsDataParallel(local_[j].table) && !InExchangeSpace(local_[j])) {
      uploads.push_back(j);
    }
  }
  float* host_send = uploads.empty() ? nullptr : exchange_->HostPooledBuffer();
  const int64_t stride = exchange_->pooled_stride();
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < num_local; ++i) {
    const int j = by_work_[i];
    LocalShard& ls = local_[j];
    float* out = InExchangeSpace(ls) ? send : host_send;
    ls.status =
        IsDataParallel(ls.table)
            ? absl::OkStatus()
            : ls.store->Forward(*ls.prepared, out + exchange_->PooledColumn(j),
                                stride);
  }
  for (const LocalShard& ls : local_) RETURN_IF_ERROR(ls.status);
  RETURN_IF_ERROR(exchange_->UploadPooled(uploads));
  clock.Mark(StageTimes::kLookup);

  // This rank's pooled vectors from every shard (into the device
  // interaction input when the exchanges run on the device), then
  // data-parallel tables pooled locally.
  ASSIGN_OR_RETURN(float* t, dense_->InteractionInput(n));
  float* exchange_t = t;
  if (exchange_on_device_) {
    ASSIGN_OR_RETURN(exchange_t, dense_->DeviceInteractionInput(n, predict));
  }
  RETURN_IF_ERROR(exchange_->GatherPooled(batch, exchange_t, times));
  for (int k = 0; k < config_.tables_size(); ++k) {
    if (replica_[k] < 0 || n == 0) continue;
    LocalShard& ls = local_[replica_[k]];
    if (ls.host != nullptr) {
      // In host memory: pool the local bags straight from the batch.
      ls.host->Forward(batch.sparse[k], t + table_offset_[k], t_width_);
      continue;
    }
    const int dim = config_.tables(k).dim();
    const int64_t start = exchange_->start(rank_);
    if (ls.store->memory_space() == MemorySpace::kDevice) {
      // In device memory (the exchanges are there too): pool the global
      // batch it prepared into scratch, keep this rank's rows.
      ASSIGN_OR_RETURN(float* all, exchange_->memory().Buffer(
                                       ExchangeMemory::kScratch,
                                       exchange_->global_size() * dim));
      RETURN_IF_ERROR(ls.store->Forward(*ls.prepared, all, dim));
      ColumnBlock mine;
      mine.src = all + start * dim;
      mine.src_stride = dim;
      mine.dst = exchange_t + table_offset_[k];
      mine.dst_stride = t_width_;
      mine.rows = n;
      mine.cols = dim;
      RETURN_IF_ERROR(exchange_->memory().Columns({&mine, 1}));
      continue;
    }
    // On RocksDB the store pools only the batch it prepared (the global
    // one, which the update needs): pool it all, keep this rank's rows.
    float* all = Sized(replica_out_, exchange_->global_size() * dim);
    RETURN_IF_ERROR(ls.store->Forward(*ls.prepared, all, dim));
    for (int64_t l = 0; l < n; ++l) {
      std::memcpy(t + l * t_width_ + table_offset_[k], all + (start + l) * dim,
                  sizeof(float) * dim);
    }
  }
  clock.Mark(StageTimes::kOutputDist);
  return absl::OkStatus();
}

void Model::OrderShardsByWork() {
  const int num_local = static_cast<int>(local_.size());
  by_work_.resize(num_local);
  for (int j = 0; j < num_local; ++j) by_work_[j] = j;
  auto work = [this](int j) {
    const LocalShard& ls = local_[j];
    const int64_t ids = ls.prepared == nullptr
                            ? 0
                            : static_cast<int64_t>(ls.prepared->ids.size());
    return ids * ls.store->spec().dim;
  };
  std::stable_sort(by_work_.begin(), by_work_.end(),
                   [&](int a, int b) { return work(a) > work(b); });
}

absl::Status Model::PrefetchNext(const data::Batch* next, StageTimes* times) {
  if (in_place_) {
    // Every store (those without a cache return at once): the device
    // tier's cache stages its next misses while the queued kernels run.
    for (LocalShard& ls : local_) {
      RETURN_IF_ERROR(ls.store->Prefetch(next->sparse[ls.table]));
    }
    return absl::OkStatus();
  }
  std::vector<data::SparseFeature*> out;
  for (const int j : prefetch_locals_) out.push_back(&local_[j].next_ids);
  // A rank whose next batch was left out contributes no samples.
  data::Batch none;
  const data::Batch* mine = next;
  if (next_sizes_[rank_] == 0) {
    none.Reset(config_.num_dense_features(), config_.tables_size());
    mine = &none;
  }
  RETURN_IF_ERROR(exchange_->DistributeIds(*mine, next_sizes_, owned_prefetch_,
                                           out, times));
  for (const int j : prefetch_locals_) {
    RETURN_IF_ERROR(local_[j].store->Prefetch(local_[j].next_ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Model::TrainStep(const data::Batch& batch,
                                            const data::Batch* next,
                                            bool read_loss) {
  RETURN_IF_ERROR(AgreeOnBatch(batch, next));
  StepResult result;
  result.samples = exchange_->global_size();
  StageTimes& times = result.times;
  const int64_t n = batch.size;

  // A dynamic table's prepare admits this batch's new ids (their rows and
  // map entries change before the update): with one, readers on other
  // threads wait from here to the end of the step, so that a prediction
  // never sees a step's admissions without its update.
  std::optional<WeightsWriter> writing;
  if (std::any_of(config_.tables().begin(), config_.tables().end(),
                  [](const TableConfig& t) { return t.dynamic(); })) {
    writing.emplace(*this);
  }
  RETURN_IF_ERROR(EmbedForward(batch, /*predict=*/false, &times));
  StageClock clock(&times);
  // The next batch's rows load in the background while this step computes
  // (every rank takes this branch or none: next_sizes_ is agreed).
  int64_t next_total = 0;
  for (const int64_t s : next_sizes_) next_total += s;
  if (next_total > 0) {
    RETURN_IF_ERROR(PrefetchNext(next, &times));
    clock.Mark(StageTimes::kPrepare);
  }
  // The dense forward and backward on the interaction input EmbedForward
  // filled.
  const float* x = batch.dense.data();
  RETURN_IF_ERROR(dense_->BottomForward(x, n));
  clock.Mark(StageTimes::kBottomForward);
  RETURN_IF_ERROR(dense_->InteractionForward(n));
  clock.Mark(StageTimes::kInteractionForward);
  RETURN_IF_ERROR(dense_->TopForward(n));
  clock.Mark(StageTimes::kTopForward);
  // Every rank scales by the global batch, so the all-reduced gradient is
  // the global mean's. The loss is read later (ReadLoss): with the
  // gradients on several ranks, at the end of the step on one.
  RETURN_IF_ERROR(
      dense_->QueueLoss(batch.labels.data(), n,
                        1.0f / static_cast<float>(exchange_->global_size())));
  clock.Mark(StageTimes::kLoss);
  RETURN_IF_ERROR(dense_->TopBackward(n));
  clock.Mark(StageTimes::kTopBackward);
  // With a dense communicator, the top MLP's gradients (and the loss) are
  // all-reduced while the rest of the backward runs, then the bottom MLP's
  // once they exist. Nothing below touches the top MLP's gradients.
  double loss_sum = std::numeric_limits<double>::quiet_NaN();
  const bool overlapped = dense_comm_ != nullptr;
  OverlappedReduce overlap;
  if (overlapped) {
    overlap.Start([this, n, &loss_sum] {
      return ReduceBucket(dense_comm_, dense::GradBucket::kTop, n, &loss_sum);
    });
  }
  ASSIGN_OR_RETURN(const float* dt, dense_->InteractionBackward(n));
  clock.Mark(StageTimes::kInteractionBackward);
  RETURN_IF_ERROR(dense_->BottomBackward(x, n));
  clock.Mark(StageTimes::kBottomBackward);
  if (overlapped) {
    overlap.Then([this, n] {
      return ReduceBucket(dense_comm_, dense::GradBucket::kBottom, n, nullptr);
    });
  }

  // From here to the dense update the step writes weights: readers on
  // other threads wait (weights_mutex()).
  if (!writing) writing.emplace(*this);
  RETURN_IF_ERROR(UpdateShards(batch, dt, &clock));
  clock.Mark(StageTimes::kEmbeddingUpdate);

  // Dense gradients and the loss sum: the top bucket (and the loss) may
  // already be in flight on the dense communicator.
  RETURN_IF_ERROR(overlap.Finish());
  if (!overlapped && device_comm_ != nullptr) {
    RETURN_IF_ERROR(ReduceOnDevice(n, &loss_sum));
  } else if (!overlapped) {
    RETURN_IF_ERROR(ReduceBucket(comm_, dense::GradBucket::kAll, n, &loss_sum));
  }
  times.bytes_sent[StageTimes::kDense] += world_ > 1 ? dense_bytes_ : 0;
  clock.Mark(StageTimes::kAllReduce);
  RETURN_IF_ERROR(dense_->Update());
  clock.Mark(StageTimes::kDenseUpdate);
  if (world_ == 1 && read_loss) {
    // After the whole step is queued: on CUDA this waits for the forward
    // and the loss's copy only, while the backward and update run on.
    ASSIGN_OR_RETURN(const double local_mean, dense_->ReadLoss());
    loss_sum = local_mean * static_cast<double>(n);
    clock.Mark(StageTimes::kLoss);
  }
  result.loss = loss_sum / static_cast<double>(exchange_->global_size());
  ++steps_;
  writing.reset();
  result.stores = store_stats_;
  return result;
}

absl::Status Model::UpdateShards(const data::Batch& batch, const float* dt,
                                 internal::StageClock<StageTimes>* clock) {
  const int num_local = static_cast<int>(local_.size());
  std::vector<embedding::StoreUpdate> updates(num_local);
  if (in_place_) {
    // Each shard reads its columns of the interaction gradient in place: the
    // host copy, or for stores on the device the backend's device gradient
    // (their updates queue on its stream, after the gradient).
    const float* device_dt = dense_->DeviceInteractionGradient();
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      const float* grad =
          ls.store->memory_space() == MemorySpace::kDevice ? device_dt : dt;
      updates[j] = {ls.store, ls.prepared,
                    grad == nullptr ? nullptr : grad + TColumn(ls), t_width_,
                    absl::OkStatus()};
    }
  } else {
    // From the device interaction gradient when the exchanges run on the
    // device.
    const float* exchange_dt =
        exchange_on_device_ ? dense_->DeviceInteractionGradient() : dt;
    ASSIGN_OR_RETURN(
        const float* grads,
        exchange_->ScatterGradients(batch, exchange_dt, clock->times()));
    // Shards outside the exchange's memory space take theirs to host memory.
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      if (InExchangeSpace(ls)) continue;
      const int64_t count = exchange_->global_size() * ls.store->spec().dim;
      RETURN_IF_ERROR(exchange_->memory().Download(
          Sized(ls.host_grads, count), grads + exchange_->GradientOffset(j),
          count));
    }
    clock->Mark(StageTimes::kBackwardDist);
    for (int j = 0; j < num_local; ++j) {
      LocalShard& ls = local_[j];
      const float* g = InExchangeSpace(ls)
                           ? grads + exchange_->GradientOffset(j)
                           : ls.host_grads.data();
      updates[j] = {ls.store, ls.prepared, g, ls.store->spec().dim,
                    absl::OkStatus()};
    }
  }
  // A big shard's rows shared among the threads, the biggest work first
  // (embedding/store_update.h).
  embedding::UpdateStores(updates);
  for (const embedding::StoreUpdate& u : updates) RETURN_IF_ERROR(u.status);
  return absl::OkStatus();
}

absl::Status Model::ReduceBucket(comm::Communicator* comm,
                                 dense::GradBucket bucket, int64_t samples,
                                 double* loss_sum) {
  // A sum over one rank is what it holds.
  if (comm->world_size() == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::span<float> flat,
                   dense_->PackGradients(bucket, loss_sum != nullptr ? 1 : 0));
  if (loss_sum != nullptr) {
    // The loss was queued before this bucket's backward, whose gradients
    // are packed: no wait in practice.
    ASSIGN_OR_RETURN(const double local_mean, dense_->ReadLoss());
    flat.back() = static_cast<float>(local_mean * static_cast<double>(samples));
  }
  RETURN_IF_ERROR(comm->AllReduceSum(
      flat.data(), static_cast<int64_t>(flat.size()), DataType::kFloat32));
  if (loss_sum != nullptr) *loss_sum = flat.back();
  return dense_->UnpackGradients(bucket);
}

absl::Status Model::ReduceOnDevice(int64_t samples, double* loss_sum) {
  if (world_ == 1) return absl::OkStatus();
  // The flat buffer is in the exchange's memory (the backend's device
  // memory on CUDA, host memory on the CPU backend): the loss goes in and
  // out of its last float through the exchange memory's copies.
  ASSIGN_OR_RETURN(const std::span<float> flat,
                   dense_->PackDeviceGradients(dense::GradBucket::kAll, 1));
  const int64_t count = static_cast<int64_t>(flat.size());
  float* loss_at = flat.data() + count - 1;
  ASSIGN_OR_RETURN(const double local_mean, dense_->ReadLoss());
  const float loss =
      static_cast<float>(local_mean * static_cast<double>(samples));
  ExchangeMemory& memory = exchange_->memory();
  RETURN_IF_ERROR(memory.Upload(&loss, 1, loss_at, 1, 1, 1));
  RETURN_IF_ERROR(
      device_comm_->AllReduceSum(flat.data(), count, DataType::kFloat32));
  float summed = 0;
  RETURN_IF_ERROR(memory.Download(&summed, loss_at, 1));
  *loss_sum = summed;
  return dense_->UnpackDeviceGradients(dense::GradBucket::kAll);
}

absl::Status Model::Predict(const data::Batch& batch,
                            std::vector<float>* probs) {
  RETURN_IF_ERROR(AgreeOnBatch(batch, nullptr));
  StageTimes times;
  RETURN_IF_ERROR(EmbedForward(batch, /*predict=*/true, &times));
  probs->resize(batch.size);
  return dense_->Predict(batch.dense.data(), batch.size, probs->data());
}

}  // namespace dlrm::model
