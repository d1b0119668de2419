// Building one rank's Model: the checks of the plan and communicators,
// the dense backend, the exchanges, the cache counters' layout, the shard
// set (model/shard_set.h) and the device columns; the live optimizer
// change and a restore's swap of stores. The step is model.cc's.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/config_change.h"
#include "core/status.h"
#include "model/model.h"
#include "optim/optimizer.h"

namespace dlrm::model {

absl::Status ValidateBatch(const ModelConfig& config,
                           const data::Batch& batch) {
  if (batch.size > 0) {
    return batch.Validate(config.num_dense_features(),
                          data::TableIdLimits(config));
  }
  if (batch.size < 0 ||
      static_cast<int>(batch.sparse.size()) != config.tables_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: size ", batch.size, " with ", batch.sparse.size(),
        " sparse features (the model has ", config.tables_size(), ")"));
  }
  return absl::OkStatus();
}

Model::Model(const ModelConfig& config, const embedding::ShardingPlan& plan,
             comm::Communicator* comm,
             std::unique_ptr<dense::DenseBackend> dense)
    : config_(config),
      plan_(plan),
      comm_(comm),
      rank_(comm->rank()),
      world_(comm->world_size()),
      dense_(std::move(dense)),
      dense_bytes_(4 * (DenseParameterCount(config) + 1)),
      t_width_(dense_->interaction().dim) {
  for (const auto& t : config.tables()) {
    table_offset_.push_back(t_width_);
    t_width_ += t.dim();
  }
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const ModelConfig& config) {
  std::unique_ptr<comm::Communicator> comm = comm::MakeSingleRankCommunicator();
  ASSIGN_OR_RETURN(
      std::unique_ptr<Model> m,
      Create(config, embedding::WholeTablesPlan(config), comm.get()));
  m->owned_comm_ = std::move(comm);
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const ModelConfig& requested, const embedding::ShardingPlan& plan,
    comm::Communicator* comm, comm::Communicator* dense_comm,
    comm::Communicator* device_comm) {
  RETURN_IF_ERROR(plan.Validate(requested));
  // Tiers from device_budget_bytes and rocksdb.host_budget_bytes (per
  // rank), when set: every rank plans the same from the same config and
  // plan.
  ASSIGN_OR_RETURN(const ModelConfig config,
                   embedding::ApplyMemoryBudgets(requested, &plan));
  if (plan.world_size != comm->world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding plan is for ", plan.world_size,
                     " ranks, the communicator has ", comm->world_size()));
  }
  for (const comm::Communicator* c : {dense_comm, device_comm}) {
    if (c != nullptr &&
        (c->world_size() != comm->world_size() || c->rank() != comm->rank())) {
      return absl::InvalidArgumentError(
          "the dense and device communicators must join the same ranks as "
          "the main one");
    }
  }
  // Control traffic, ids and the dense all-reduce move host buffers; only
  // the pooled vectors and their gradients may move device ones.
  for (const comm::Communicator* c : {comm, dense_comm}) {
    if (c != nullptr && c->memory_space() != comm::MemorySpace::kHost) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the model's main and dense communicators take host memory; this "
          "one takes ",
          comm::MemorySpaceName(c->memory_space()),
          " buffers (pass a device communicator as device_comm)"));
    }
  }
  if (device_comm != nullptr &&
      device_comm->memory_space() != comm::MemorySpace::kDevice) {
    return absl::FailedPreconditionError(
        "device_comm takes host memory; it must be a device communicator");
  }
  // A table in device memory pools into, and updates from, device memory:
  // in place where the step exchanges nothing (one rank, no row-wise
  // table), else through the exchanges over a device communicator.
  const bool exchanges = plan.world_size > 1 ||
                         std::any_of(plan.tables.begin(), plan.tables.end(),
                                     [](const embedding::TablePlacement& p) {
                                       return p.kind == SHARDING_ROW_WISE;
                                     });
  for (int k = 0; k < config.tables_size(); ++k) {
    if (config.tables(k).storage() == STORAGE_DEVICE && exchanges &&
        device_comm == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", config.tables(k).name(),
          ": storage STORAGE_DEVICE where the step exchanges pooled vectors "
          "(this plan has ",
          plan.world_size,
          " ranks or a row-wise table) needs a device communicator for the "
          "exchanges (NCCL, or host-staged for ranks sharing a GPU); without "
          "one use STORAGE_HOST or STORAGE_ROCKSDB (the dense part still "
          "runs on CUDA)"));
    }
  }
  // The dense part on config.device; FailedPrecondition here, before any
  // store is made, when that device is not usable.
  ASSIGN_OR_RETURN(std::unique_ptr<dense::DenseBackend> dense,
                   dense::CreateDenseBackend(config));
  std::unique_ptr<Model> m(new Model(config, plan, comm, std::move(dense)));
  m->dense_comm_ = dense_comm;
  m->device_comm_ = device_comm;

  // The output and backward dists: over device_comm in the CUDA backend's
  // memory, on its stream (or host memory on the CPU backend: a host-staged
  // communicator over the CPU Device), else over comm in host memory.
  std::unique_ptr<ExchangeMemory> memory;
  if (device_comm != nullptr && m->dense_->cuda_stream() != nullptr) {
    ASSIGN_OR_RETURN(memory, MakeCudaExchangeMemory(m->dense_->cuda_stream()));
    RETURN_IF_ERROR(device_comm->SetStream(m->dense_->cuda_stream()));
    m->exchange_on_device_ = true;
  }
  m->exchange_ = std::make_unique<ShardExchange>(
      config, plan, comm, m->table_offset_, m->t_width_, device_comm,
      std::move(memory));
  m->replica_.assign(config.tables_size(), -1);
  m->owned_prefetch_ = m->exchange_->Restricted(
      [&m](int k) { return m->TableCapabilities(k).prefetch; });
  // Stores whose counters every step gathers: caches, and dynamic tables'
  // maps (their admissions, evictions and occupancy).
  auto counted = [&m, &config](int k) {
    return m->TableCapabilities(k).cache_rows > 0 || config.tables(k).dynamic();
  };
  const ShardLayout owned_cached = m->exchange_->Restricted(counted);
  for (int k = 0; k < config.tables_size(); ++k) {
    m->any_cache_ = m->any_cache_ || counted(k);
  }
  // Every rank's counted stores, by table, for the counters PrepareShards
  // gathers.
  m->store_tables_.resize(m->world_);
  size_t most_tables = 0;
  for (int r = 0; r < m->world_; ++r) {
    for (const ShardRef& ref : owned_cached[r]) {
      std::vector<int>& tables = m->store_tables_[r];
      if (std::find(tables.begin(), tables.end(), ref.table) == tables.end()) {
        tables.push_back(ref.table);
      }
    }
    most_tables = std::max(most_tables, m->store_tables_[r].size());
  }
  m->store_words_ =
      static_cast<int64_t>(most_tables) * embedding::StoreMetrics::kNumFields;
  for (int k = 0; k < config.tables_size(); ++k) {
    for (int r = 0; r < m->world_; ++r) {
      RankTableStore s;
      s.rank = r;
      s.table = k;
      s.device = m->TableCapabilities(k).device_cache;
      s.dynamic = config.tables(k).dynamic();
      bool owns = false;
      for (const ShardRef& ref : owned_cached[r]) {
        if (ref.table != k) continue;
        owns = true;
        s.cache_rows += embedding::TableCapabilities(
                            config.tables(k), config.rocksdb(),
                            plan.tables[k].shards[ref.shard].row_count)
                            .cache_rows;
      }
      if (s.cache_rows > 0 || (s.dynamic && owns)) {
        m->store_stats_.push_back(s);
      }
    }
  }
  const std::vector<ShardRef>& mine = m->exchange_->owned()[m->rank_];
  ASSIGN_OR_RETURN(m->shards_,
                   ShardSet::Create(m->config_, m->plan_, m->rank_, mine,
                                    m->dense_->cuda_stream()));
  m->local_.resize(mine.size());
  for (size_t j = 0; j < mine.size(); ++j) {
    LocalShard& ls = m->local_[j];
    ls.table = mine[j].table;
    ls.shard = mine[j].shard;
    if (plan.tables[ls.table].kind == SHARDING_DATA_PARALLEL) {
      m->replica_[ls.table] = static_cast<int>(j);
    }
    const embedding::StoreCapabilities c = m->TableCapabilities(ls.table);
    if (c.prefetch) m->prefetch_locals_.push_back(static_cast<int>(j));
    if (counted(ls.table)) m->cache_locals_.push_back(static_cast<int>(j));
  }
  m->BindStores();
  m->in_place_ = !exchanges;
  // The columns of the interaction input written on the device: in place,
  // the device tables' shards'; through device exchanges, every
  // model-parallel table's and the device replicas'.
  std::vector<dense::ColumnRange> device_columns;
  for (const LocalShard& ls : m->local_) {
    if (ls.store->memory_space() != MemorySpace::kDevice) continue;
    m->any_device_ = true;
    if (!m->in_place_) continue;
    const int begin = static_cast<int>(m->TColumn(ls));
    device_columns.push_back({begin, begin + ls.store->spec().dim});
  }
  if (!m->in_place_ && m->exchange_on_device_) {
    for (int k = 0; k < config.tables_size(); ++k) {
      const int replica = m->replica_[k];
      if (m->IsDataParallel(k) &&
          (replica < 0 ||
           m->local_[replica].store->memory_space() != MemorySpace::kDevice)) {
        continue;
      }
      const int begin = static_cast<int>(m->table_offset_[k]);
      device_columns.push_back({begin, begin + config.tables(k).dim()});
    }
  }
  std::sort(device_columns.begin(), device_columns.end(),
            [](const dense::ColumnRange& a, const dense::ColumnRange& b) {
              return a.begin < b.begin;
            });
  RETURN_IF_ERROR(m->dense_->SetDeviceColumns(std::move(device_columns)));
  return m;
}

void Model::BindStores() {
  for (int j = 0; j < shards_->size(); ++j) {
    LocalShard& ls = local_[j];
    ls.store = shards_->store(j);
    auto* host = dynamic_cast<embedding::HostStore*>(ls.store);
    ls.host = host == nullptr ? nullptr : &host->table();
    ls.prepared = nullptr;
  }
}

absl::Status Model::SetOptimizers(const OptimizerConfig& dense,
                                  const OptimizerConfig& sparse) {
  RETURN_IF_ERROR(optim::Validate(dense, "dense_optimizer"));
  RETURN_IF_ERROR(optim::ValidateSparse(sparse, "sparse_optimizer"));
  ModelConfig next = config_;
  *next.mutable_dense_optimizer() = dense;
  *next.mutable_sparse_optimizer() = sparse;
  for (const ConfigDifference& d : DiffConfigs(config_, next)) {
    if (d.mutability == FieldMutability::kImmutable) {
      return absl::InvalidArgumentError(
          absl::StrCat(d.field, " cannot change in a trained model (", d.before,
                       " -> ", d.after, ")"));
    }
  }
  WeightsWriter writer(*this);
  RETURN_IF_ERROR(dense_->SetOptimizerConfig(dense));
  for (LocalShard& ls : local_) {
    RETURN_IF_ERROR(ls.store->SetOptimizer(sparse));
  }
  // Only the two messages: readers on other threads may read the rest.
  *config_.mutable_dense_optimizer() = dense;
  *config_.mutable_sparse_optimizer() = sparse;
  return absl::OkStatus();
}

Model::~Model() = default;

void Model::SwapInRows(std::unique_ptr<ShardSet::Staged> staged) {
  shards_->Swap(std::move(staged));
  BindStores();
}

}  // namespace dlrm::model
