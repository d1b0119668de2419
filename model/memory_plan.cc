// The memory plan of a model: its parts counted from the config the way the
// model allocates them, the machine's memory, and the check between them.
#include "model/memory_plan.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/config.h"
#include "core/status.h"
#include "dense/cpu_isa.h"
#include "dense/interaction.h"
#include "dense/interaction_layer.h"
#include "embedding/planned_bytes.h"
#include "optim/optimizer.h"

namespace dlrm::model {
namespace {

constexpr int64_t kFloat = sizeof(float);

// A row cache's bookkeeping per slot besides the record (SlotManager): the
// slot (row, dirty bit, use count, batch, list links: 48 bytes), its entry
// in the row -> slot map (16 bytes at a load near 0.6) and in the free list.
constexpr int64_t kCacheSlotBytes = 48 + 28 + 8;
// And a 16-bit slot array's row of each slot (EmbeddingTable::set_slot_row).
constexpr int64_t kSlotRowBytes = 8;
// Per id of a batch a table (or shard) pools: its backward's scratch
// (EmbeddingTable::Deduplicate: the id -> unique map at twice the ids, the
// occurrence order, the unique index of every occurrence, the unique ids
// and their starts, the counting sort's cursors).
constexpr int64_t kScratchBytesPerId = 2 * 16 + 5 * 8;
// The process besides the model: what it holds when it plans (the code
// and data of its libraries: gRPC, RocksDB, oneDNN, CUDA's, protobuf),
// plus what starts later (the OpenMP threads' stacks and the allocator's
// arenas, oneDNN's kernels), measured (docs/storage.md "Memory plan").
constexpr int64_t kRuntimeBytes = int64_t{16} << 20;
constexpr int64_t kRuntimeBytesPerThread = int64_t{4} << 20;

// This process's resident set now (VmRSS in /proc/self/status), 0 when
// unknown.
int64_t ResidentBytesNow() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("VmRSS:")) continue;
    std::istringstream fields(line.substr(6));
    int64_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / 1048576.0);
}

// Where table `t` keeps its rows in a model of `config`: a CPU model holds
// a STORAGE_DEVICE table as a checkpoint load places it.
StorageTier EffectiveStorage(const ModelConfig& config, const TableConfig& t) {
  if (t.storage() == STORAGE_DEVICE && config.device() != DEVICE_CUDA) {
    return RowsOnRocksDb(t) ? STORAGE_ROCKSDB : STORAGE_HOST;
  }
  return t.storage();
}

// Bytes of a row cache of `rows` rows of a shard `cols` wide with weights
// of `precision`, for batches with `ids` ids of the table: the slots' rows
// (2 bytes a weight in 16 bits), their bookkeeping, and the records of a
// batch's misses staged twice (the prefetch's and the prepare's: fp32
// records whatever the precision).
int64_t RowCacheBytes(int64_t rows, int cols, int64_t ids,
                      const OptimizerConfig& optimizer,
                      RowPrecision precision) {
  const int64_t slot =
      embedding::ShardBytes({0, 0, 1, 0, cols}, optimizer, precision) +
      kCacheSlotBytes + (precision == ROW_FP32 ? 0 : kSlotRowBytes);
  const int64_t record = embedding::ShardBytes({0, 0, 1, 0, cols}, optimizer);
  return rows * slot + 2 * std::min(ids, rows) * record;
}

// Floats per sample of the dense part's training buffers (the CPU
// backend's; the CUDA one keeps the same in device memory): each MLP's
// activations and its two gradient buffers, the interaction's input and
// output with their gradients, and the interaction layer's
// (dense::InteractionLayerFloatsPerSample: DCN's x_l, p_l, q_l, h, dp and
// two gradient buffers).
int64_t TrainFloatsPerSample(const ModelConfig& config,
                             const dense::InteractionShape& shape) {
  auto mlp = [](int in, const google::protobuf::RepeatedField<int32_t>& w) {
    int64_t sum = 0, widest = in;
    for (int width : w) {
      sum += width;
      widest = std::max<int64_t>(widest, width);
    }
    return sum + 2 * widest;
  };
  int64_t floats = mlp(config.num_dense_features(), config.bottom_mlp()) +
                   mlp(shape.output_width, config.top_mlp());
  // t, dt and the bottom MLP's gradient columns; z and dz.
  floats += 2 * shape.input_width + shape.dim + 2 * shape.output_width;
  return floats + dense::InteractionLayerFloatsPerSample(config).train;
}

// Floats per sample Predict needs besides the training buffers: the
// interaction layer's and the MLPs' inference scratch, the bottom MLP's
// output and the logits.
int64_t PredictFloatsPerSample(const ModelConfig& config,
                               const dense::InteractionShape& shape) {
  int64_t widest = 0;
  for (int w : config.bottom_mlp()) widest = std::max<int64_t>(widest, w);
  for (int w : config.top_mlp()) widest = std::max<int64_t>(widest, w);
  const int64_t floats = 2 * widest + shape.dim + 1;
  return floats + dense::InteractionLayerFloatsPerSample(config).predict;
}

// Bytes of one batch of `samples` samples: dense features, labels, and per
// table the ids and bag offsets.
int64_t BatchBytes(const ModelConfig& config, int64_t samples) {
  int64_t ids = 0;
  for (const TableConfig& t : config.tables()) {
    ids += std::max(1, t.multi_hot_size());
  }
  return samples * ((config.num_dense_features() + 1) * kFloat + ids * 8 +
                    config.tables_size() * 8);
}

}  // namespace

absl::Status MemoryPlanOptions::Validate() const {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: batch_size must be >= 1, got ", batch_size));
  }
  if (eval_batch_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory plan: eval_batch_size must be >= 0, got ", eval_batch_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<MemoryPlan> PlanMemory(const ModelConfig& config,
                                      const embedding::ShardingPlan* plan,
                                      const MemoryPlanOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  const embedding::ShardingPlan whole = embedding::WholeTablesPlan(config);
  const embedding::ShardingPlan& p = plan != nullptr ? *plan : whole;
  if (options.rank < 0 || options.rank >= p.world_size ||
      static_cast<int>(p.tables.size()) != config.tables_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: rank ", options.rank,
                     " is not in a plan of ", p.world_size, " ranks"));
  }
  const OptimizerConfig& sparse = config.sparse_optimizer();
  const bool cuda = config.device() == DEVICE_CUDA;
  MemoryPlan m;
  m.rank = options.rank;
  m.batch_size = options.batch_size;
  // Every shard sees the ids of the global batch routed to it.
  const int64_t global_batch = options.batch_size * p.world_size;
  int64_t scratch_ids = 0, rocksdb_shards = 0;
  for (int k = 0; k < config.tables_size(); ++k) {
    const TableConfig& t = config.tables(k);
    const StorageTier storage = EffectiveStorage(config, t);
    const int64_t ids = global_batch * std::max(1, t.multi_hot_size());
    MemoryPlan::Table entry;
    entry.name = t.name();
    entry.storage = storage;
    bool here = false;
    // The tier's bytes by place, as the factory plans them for the table
    // as this model holds it.
    TableConfig held = t;
    held.set_storage(storage);
    for (const embedding::Shard& s : p.tables[k].shards) {
      if (s.rank != options.rank) continue;
      here = true;
      const embedding::StoreBytes planned =
          embedding::PlannedShardBytes(held, config.rocksdb(), s, sparse);
      entry.device_bytes += planned.device;
      if (embedding::NeedsDatabase(embedding::StoreOptionsFor(
              held, config.rocksdb(), s.row_count))) {
        // A RocksDB tier: its row cache in host memory, with the slots'
        // bookkeeping and a batch's misses staged twice.
        const int64_t rows = CachedRows(config.rocksdb(), s.row_count);
        const int64_t cache =
            RowCacheBytes(rows, s.col_count, std::min(ids, s.row_count), sparse,
                          t.weight_precision());
        entry.cache_rows += rows;
        entry.host_bytes += cache;
        entry.rocksdb_bytes += planned.disk;
        m.row_caches += cache;
        m.rocksdb_disk += planned.disk;
        ++rocksdb_shards;
      } else {
        entry.host_bytes += planned.host;
        m.host_tables += planned.host;
      }
      if (storage != STORAGE_DEVICE) scratch_ids += ids;
    }
    if (!here) continue;
    m.device += entry.device_bytes;
    m.tables.push_back(std::move(entry));
  }
  if (rocksdb_shards > 0) {
    const int64_t write_buffer = config.rocksdb().write_buffer_bytes() > 0
                                     ? config.rocksdb().write_buffer_bytes()
                                     : int64_t{64} << 20;
    m.rocksdb_buffers =
        config.rocksdb().block_cache_bytes() + rocksdb_shards * write_buffer;
  }

  // The dense part: weights, gradients and optimizer state in host memory
  // (on CUDA its host view; the device holds its own), the bf16 copies of
  // the weights, and the flat gradient buffers of the all-reduce.
  const int64_t params = DenseParameterCount(config);
  const int64_t state =
      optim::DenseStateFloatsPerElement(config.dense_optimizer());
  const DensePrecision precision =
      dense::ResolvePrecision(config.device(), config.dense_precision());
  m.dense = params * (2 + state) * kFloat;
  if (precision == PRECISION_BF16 && !cuda) m.dense += params * 2;
  if (p.world_size > 1) m.dense += params * kFloat;
  if (cuda) m.device += params * (2 + state) * kFloat;

  // The step's buffers: the current and the next batch, each table's
  // backward scratch, the activations (on CUDA in device memory), and an
  // evaluation batch with Predict's scratch (t and z grow to its size).
  const dense::InteractionShape shape = dense::MakeInteractionShape(config);
  const int64_t b = options.batch_size, e = options.eval_batch_size;
  int64_t activations = b * TrainFloatsPerSample(config, shape) * kFloat;
  if (precision == PRECISION_BF16) activations += activations / 2;
  int64_t predict = e * PredictFloatsPerSample(config, shape) * kFloat +
                    std::max<int64_t>(0, e - b) *
                        (shape.input_width + shape.output_width) * kFloat;
  if (precision == PRECISION_BF16) predict += predict / 2;
  m.batch_buffers = 2 * BatchBytes(config, b) + BatchBytes(config, e) +
                    scratch_ids * kScratchBytesPerId;
  if (cuda) {
    m.device += activations + predict;
    // The host stages the interaction input's embedding columns.
    m.batch_buffers += std::max(b, e) * shape.input_width * kFloat;
  } else {
    m.batch_buffers += activations + predict;
  }
  m.runtime = ResidentBytesNow() + kRuntimeBytes +
              omp_get_max_threads() * kRuntimeBytesPerThread;
  return m;
}

std::string MemoryPlan::ToString() const {
  std::vector<std::string> on_host, on_rocksdb, on_device;
  int64_t cached_rows = 0;
  for (const Table& t : tables) {
    switch (t.storage) {
      case STORAGE_ROCKSDB:
        on_rocksdb.push_back(t.name);
        cached_rows += t.cache_rows;
        break;
      case STORAGE_DEVICE:
        on_device.push_back(t.name);
        break;
      default:
        on_host.push_back(t.name);
    }
  }
  auto names = [](const std::vector<std::string>& v) {
    if (v.empty()) return std::string("none");
    if (v.size() <= 8) return absl::StrJoin(v, ",");
    return absl::StrCat(v.size(), " tables");
  };
  std::string out =
      absl::StrCat("memory plan of rank ", rank, " (batch ", batch_size,
                   "): ", Mib(host_total()), " of host memory\n");
  absl::StrAppend(&out, "  tables in host memory  ", Mib(host_tables), " (",
                  names(on_host), ")\n");
  if (!on_rocksdb.empty()) {
    absl::StrAppend(&out, "  rocksdb row caches     ", Mib(row_caches), " (",
                    names(on_rocksdb), ": ", cached_rows,
                    " rows; their tables ", Mib(rocksdb_disk), " on disk)\n");
    absl::StrAppend(&out, "  rocksdb buffers        ", Mib(rocksdb_buffers),
                    " (block cache and write buffers, at most)\n");
  }
  absl::StrAppend(&out, "  dense part             ", Mib(dense), "\n");
  absl::StrAppend(&out, "  batch buffers          ", Mib(batch_buffers), "\n");
  absl::StrAppend(&out, "  runtime                ", Mib(runtime), "\n");
  if (device > 0) {
    absl::StrAppend(&out, "  device memory          ", Mib(device), " (",
                    names(on_device), " and the dense part)\n");
  }
  return out;
}

std::map<std::string, int64_t> StateBytesByTier(
    const ModelConfig& config, const embedding::ShardingPlan& plan) {
  // Every rank's embedding shards in host memory (a shard on RocksDB: its
  // cache; its rows count under "rocksdb") and one dense replica per rank
  // with its optimizer state.
  int64_t bytes = 0, rocksdb_bytes = 0, device_bytes = 0;
  for (const int64_t rank_bytes :
       embedding::HostBytesPerRank(config, plan, config.rocksdb())) {
    bytes += rank_bytes;
  }
  // As the factory plans them (PlannedShardBytes): shards whose rows are
  // on RocksDB (STORAGE_ROCKSDB, or behind a device cache) count them under
  // "rocksdb"; shards in GPU memory (STORAGE_DEVICE) count under "device"
  // their rows, or with device_cache_rows their slots (rows and optimizer
  // state).
  for (int k = 0; k < config.tables_size(); ++k) {
    for (const embedding::Shard& shard : plan.tables[k].shards) {
      const embedding::StoreBytes planned = embedding::PlannedShardBytes(
          config.tables(k), config.rocksdb(), shard, config.sparse_optimizer());
      rocksdb_bytes += planned.disk;
      device_bytes += planned.device;
    }
  }
  const int64_t dense_floats =
      1 + optim::DenseStateFloatsPerElement(config.dense_optimizer());
  const int64_t dense_bytes =
      plan.world_size * dense_floats * kFloat * DenseParameterCount(config);
  // The CUDA backend keeps the dense replica on the device and its host
  // view in host memory.
  bytes += dense_bytes;
  if (config.device() == DEVICE_CUDA) device_bytes += dense_bytes;
  return {
      {"host", bytes}, {"device", device_bytes}, {"rocksdb", rocksdb_bytes}};
}

namespace {

// The first number of the line of /proc/meminfo named `key` ("MemAvailable:
// 123 kB"), in bytes; -1 when absent.
int64_t MeminfoBytes(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(key + ":")) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kb = -1;
    fields >> kb;
    return kb < 0 ? -1 : kb * 1024;
  }
  return -1;
}

// The whole of a small file, or empty when it cannot be read.
std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A byte count in a cgroup file; -1 when absent, "max" or not a number.
int64_t CgroupBytes(const std::string& path) {
  std::string text = ReadSmallFile(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.pop_back();
  }
  int64_t value = -1;
  if (text.empty() || text == "max" || !absl::SimpleAtoi(text, &value)) {
    return -1;
  }
  return value;
}

}  // namespace

absl::StatusOr<MachineMemory> AvailableMemory() {
  if (const char* simulated = std::getenv("DLRM_MACHINE_MEMORY_BYTES");
      simulated != nullptr && simulated[0] != '\0') {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(simulated, &bytes) || bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("DLRM_MACHINE_MEMORY_BYTES must be a positive byte "
                       "count, got '",
                       simulated, "'"));
    }
    return MachineMemory{bytes, "DLRM_MACHINE_MEMORY_BYTES"};
  }
  const std::string meminfo = ReadSmallFile("/proc/meminfo");
  const int64_t available = MeminfoBytes(meminfo, "MemAvailable");
  if (available < 0) {
    return absl::UnavailableError(
        "cannot read MemAvailable from /proc/meminfo (set "
        "DLRM_MACHINE_MEMORY_BYTES to the bytes this process may use)");
  }
  MachineMemory m{available, "MemAvailable in /proc/meminfo"};
  // The cgroup of a container (its namespace root): v2, then v1, whose
  // "unlimited" is a huge number.
  struct Limit {
    const char* limit;
    const char* usage;
    const char* name;
  };
  for (const Limit& l :
       {Limit{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
              "the cgroup's memory.max less its usage"},
        Limit{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
              "/sys/fs/cgroup/memory/memory.usage_in_bytes",
              "the cgroup's memory.limit_in_bytes less its usage"}}) {
    const int64_t limit = CgroupBytes(l.limit);
    if (limit < 0) continue;
    const int64_t usage = std::max<int64_t>(0, CgroupBytes(l.usage));
    const int64_t left = std::max<int64_t>(0, limit - usage);
    if (left < m.bytes) m = MachineMemory{left, l.name};
    break;
  }
  return m;
}

absl::Status CheckMemory(const ModelConfig& config, const MemoryPlan& plan,
                         const MachineMemory& machine,
                         const embedding::ShardingPlan* sharding) {
  const int64_t need = plan.host_total();
  if (need <= machine.bytes) return absl::OkStatus();
  std::string message = absl::StrCat(
      "the model needs ", Mib(need), " of host memory on rank ", plan.rank,
      " (tables ", Mib(plan.host_tables), ", row caches ", Mib(plan.row_caches),
      ", dense part ", Mib(plan.dense), ", batch buffers ",
      Mib(plan.batch_buffers), ", other ",
      Mib(plan.rocksdb_buffers + plan.runtime), ") but this machine has ",
      Mib(machine.bytes), " (", machine.source, "), ",
      Mib(need - machine.bytes), " short; ");
  // The largest host budget the tier planner fits in the machine with room
  // to spare (a tenth), by bisection (the moved tables bring RocksDB's
  // buffers and their row caches, so the fit is not the budget itself).
  const int64_t rows_now = plan.host_tables + plan.row_caches;
  int64_t budget_mb = 0;
  // Whether a budget was refused because the row caches alone exceed it.
  bool caches_too_big = false;
  const int64_t target = machine.bytes - machine.bytes / 10;
  if (rows_now > 0 && plan.host_without_tables() < target) {
    int64_t lo = 0, hi = target - plan.host_without_tables();
    ModelConfig trial = config;
    if (trial.rocksdb().path().empty()) trial.mutable_rocksdb()->set_path("/");
    while (hi - lo > (int64_t{1} << 20)) {
      const int64_t budget = lo + (hi - lo) / 2;
      trial.mutable_rocksdb()->set_host_budget_bytes(budget);
      absl::StatusOr<ModelConfig> tiers =
          embedding::ApplyMemoryBudgets(trial, sharding);
      if (!tiers.ok()) {
        if (!absl::IsResourceExhausted(tiers.status())) break;
        caches_too_big = true;  // a larger budget may leave room for them
        lo = budget;
        continue;
      }
      MemoryPlanOptions o;
      o.rank = plan.rank;
      o.batch_size = plan.batch_size;
      absl::StatusOr<MemoryPlan> fit = PlanMemory(*tiers, sharding, o);
      if (!fit.ok()) break;
      if (fit->host_total() <= target) {
        budget_mb = budget >> 20;
        lo = budget;
      } else {
        hi = budget;
      }
    }
  }
  if (budget_mb > 0) {
    absl::StrAppend(
        &message,
        config.rocksdb().host_budget_bytes() > 0
            ? absl::StrCat("lower --host-budget-mb (",
                           config.rocksdb().host_budget_bytes() >> 20,
                           " MiB now) to ", budget_mb,
                           " (rocksdb.host_budget_bytes)")
            : absl::StrCat("give --host-budget-mb ", budget_mb,
                           " --rocksdb-dir DIR to keep the largest tables "
                           "in RocksDB under DIR behind row caches"),
        " (docs/storage.md \"Memory plan\")");
  } else if (caches_too_big) {
    absl::StrAppend(
        &message,
        "even with every table on RocksDB its row caches do not fit: give "
        "a smaller --cache-fraction or --cache-rows (rocksdb.cache_fraction, "
        "cache_rows) with --host-budget-mb N --rocksdb-dir DIR");
  } else {
    absl::StrAppend(
        &message,
        "the embedding rows are not what is too big: train with a smaller "
        "batch or on a machine with more memory");
  }
  return absl::ResourceExhaustedError(message);
}

absl::StatusOr<embedding::ShardingPlan> ExplainShardingBudget(
    absl::StatusOr<embedding::ShardingPlan> planned, const std::string& flag) {
  if (planned.ok() || !absl::IsResourceExhausted(planned.status())) {
    return planned;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      planned.status().message(), ". ", flag,
      " is the sharding planner's limit on the embedding bytes (weights and "
      "optimizer state, wherever the rows live) one rank holds, by which it "
      "spreads tables over the ranks; moving tables to RocksDB does not "
      "meet it: raise it, give 0 (no limit) or add ranks. To bound the host "
      "memory the rows take, give --host-budget-mb N --rocksdb-dir DIR "
      "instead"));
}

absl::StatusOr<MemoryPlan> PlanAndCheckMemory(
    const ModelConfig& config, const embedding::ShardingPlan* plan,
    const MemoryPlanOptions& options) {
  ASSIGN_OR_RETURN(MemoryPlan m, PlanMemory(config, plan, options));
  ASSIGN_OR_RETURN(const MachineMemory machine, AvailableMemory());
  RETURN_IF_ERROR(CheckMemory(config, m, machine, plan));
  return m;
}

}  // namespace dlrm::model
