// Prometheus text rendering of the server's metrics.
#include "server/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "core/version.h"

namespace dlrm::server {
namespace {

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.15g", v);
}

void Header(std::string* out, absl::string_view name, absl::string_view type,
            absl::string_view help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type,
                  "\n");
}

void Sample(std::string* out, absl::string_view name, double value,
            absl::string_view labels = "") {
  absl::StrAppend(out, name, labels.empty() ? "" : "{", labels,
                  labels.empty() ? "" : "}", " ", Number(value), "\n");
}

// Exponential bucket bounds: start, start*factor, ... (n bounds).
std::vector<double> Exponential(double start, double factor, int n) {
  std::vector<double> b;
  for (int i = 0; i < n; ++i) b.push_back(start * std::pow(factor, i));
  return b;
}

// The labels of one table's caches on one rank (device caches marked
// cache="device").
std::string StoreLabels(const TableStoreStats& t) {
  return absl::StrCat("table=\"", t.table, "\",rank=\"", t.rank, "\"",
                      t.device ? ",cache=\"device\"" : "");
}

// Label value `v` escaped as the exposition format asks.
std::string LabelValue(absl::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// This process's /proc/self/stat fields after the command name: utime is
// [11], stime [12], starttime [19], rss [21] (0-based, proc(5)'s 14, 15,
// 22 and 24). Empty when unreadable.
std::vector<std::string> ProcStatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  // The command name is in parentheses and may hold spaces.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::vector<std::string> fields;
  std::istringstream rest(line.substr(close + 1));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

// Seconds since the epoch the system booted at (/proc/stat's btime); 0
// when unreadable.
double BootTime() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double t = 0;
      in >> t;
      return t;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace

void RenderProcessMetrics(std::string* out) {
  const std::vector<std::string> stat = ProcStatFields();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (stat.size() > 21 && ticks > 0) {
    const double cpu = (std::stod(stat[11]) + std::stod(stat[12])) / ticks;
    Header(out, "process_cpu_seconds_total", "counter",
           "Total user and system CPU time spent in seconds.");
    Sample(out, "process_cpu_seconds_total", cpu);
    Header(out, "process_resident_memory_bytes", "gauge",
           "Resident memory size in bytes.");
    Sample(out, "process_resident_memory_bytes",
           std::stod(stat[21]) * static_cast<double>(sysconf(_SC_PAGESIZE)));
    if (const double boot = BootTime(); boot > 0) {
      Header(out, "process_start_time_seconds", "gauge",
             "Start time of the process since unix epoch in seconds.");
      Sample(out, "process_start_time_seconds",
             boot + std::stod(stat[19]) / ticks);
    }
  }
  std::error_code ec;
  int64_t fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  if (!ec) {
    Header(out, "process_open_fds", "gauge",
           "Number of open file descriptors.");
    Sample(out, "process_open_fds", static_cast<double>(fds));
  }
  Header(out, "dlrm_build_info", "gauge",
         "Always 1; the labels say which build this is (--version).");
  Sample(out, "dlrm_build_info", 1,
         absl::StrCat("version=\"", LabelValue(kVersion), "\",git=\"",
                      LabelValue(kGitDescribe), "\""));
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t i =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[i];
  ++count_;
  sum_ += value;
}

void Histogram::Render(absl::string_view name, std::string* out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(out, name, "_bucket{le=\"", Number(bounds_[i]), "\"} ",
                    cumulative, "\n");
  }
  absl::StrAppend(out, name, "_bucket{le=\"+Inf\"} ", count_, "\n");
  absl::StrAppend(out, name, "_sum ", Number(sum_), "\n");
  absl::StrAppend(out, name, "_count ", count_, "\n");
}

ServerMetrics::ServerMetrics()
    // 50 us .. ~3.3 s by factors of 2.
    : predict_latency_(Exponential(50e-6, 2.0, 17)),
      // 1 .. 65536 samples by factors of 2.
      predict_batch_samples_(Exponential(1, 2.0, 17)),
      predict_batch_requests_({1, 2, 4, 8, 16, 32, 64, 128}) {}

void ServerMetrics::RecordTrainStep(const TrainStepOutcome& step) {
  std::lock_guard<std::mutex> lock(mu_);
  ++train_steps_;
  train_samples_ += step.samples;
  train_seconds_ += step.seconds;
  last_loss_ = step.loss;
  last_samples_per_second_ =
      step.seconds > 0 ? static_cast<double>(step.samples) / step.seconds : 0;
  last_stage_seconds_ = step.stage_seconds;
  for (const auto& [stage, seconds] : step.stage_seconds) {
    total_stage_seconds_[stage] += seconds;
  }
  for (const auto& [exchange, bytes] : step.exchange_bytes) {
    exchange_bytes_total_[exchange] += bytes;
  }
  if (!step.stores.empty()) stores_ = step.stores;
  RecordCheckpointLocked(step.checkpoint, step.step, step.checkpoint_failed);
}

void ServerMetrics::RecordCheckpoint(const std::string& dir, int64_t step,
                                     bool failed) {
  std::lock_guard<std::mutex> lock(mu_);
  RecordCheckpointLocked(dir, step, failed);
}

void ServerMetrics::RecordCheckpointLocked(const std::string& dir, int64_t step,
                                           bool failed) {
  if (!dir.empty()) {
    ++checkpoints_saved_;
    last_checkpoint_step_ = step;
  }
  if (failed) ++checkpoints_failed_;
}

void ServerMetrics::SetTrainQueueDepth(int64_t depth) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_depth_ = depth;
  queue_depth_max_ = std::max(queue_depth_max_, depth);
}

void ServerMetrics::SetTrainQueueCapacity(int64_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_capacity_ = capacity;
}

void ServerMetrics::RecordTrainReadStall() {
  std::lock_guard<std::mutex> lock(mu_);
  ++read_stalls_;
}

void ServerMetrics::RecordEval(const model::EvalMetrics& metrics) {
  std::lock_guard<std::mutex> lock(mu_);
  has_eval_ = true;
  last_eval_ = metrics;
  ++evals_;
}

void ServerMetrics::RecordPredictLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  predict_latency_.Observe(seconds);
}

void ServerMetrics::RecordPredictBatch(int64_t samples, int64_t requests) {
  std::lock_guard<std::mutex> lock(mu_);
  predict_batch_samples_.Observe(static_cast<double>(samples));
  predict_batch_requests_.Observe(static_cast<double>(requests));
}

void ServerMetrics::RecordRpc(absl::string_view method, absl::StatusCode code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rpcs_[{std::string(method), absl::StatusCodeToString(code)}];
}

void ServerMetrics::RecordCheckpointSwap() {
  std::lock_guard<std::mutex> lock(mu_);
  ++checkpoint_swaps_;
}

void ServerMetrics::RecordCheckpointSwapFailure() {
  std::lock_guard<std::mutex> lock(mu_);
  ++checkpoint_swap_failures_;
}

void ServerMetrics::SetRankHealthSource(
    std::function<std::vector<RankHealth>()> source) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_health_ = std::move(source);
}

void ServerMetrics::SetDenseInfo(DensePrecision precision, std::string isa,
                                 std::string cpu) {
  std::lock_guard<std::mutex> lock(mu_);
  dense_precision_ = precision;
  dense_isa_ = std::move(isa);
  cpu_model_ = std::move(cpu);
}

std::string ServerMetrics::Render(int64_t model_steps,
                                  const ServedCheckpoint& served) const {
  std::function<std::vector<RankHealth>()> source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    source = rank_health_;
  }
  // Read outside mu_: it asks the ranks' group.
  const std::vector<RankHealth> ranks =
      source ? source() : std::vector<RankHealth>();
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  RenderProcessMetrics(&out);
  if (!dense_isa_.empty()) {
    Header(&out, "dlrm_dense_info", "gauge",
           "Always 1; the labels say the precision the dense part runs at, "
           "the oneDNN matmul implementation (cuda on a GPU) and the CPU.");
    Sample(&out, "dlrm_dense_info", 1,
           absl::StrCat("precision=\"", PrecisionName(dense_precision_),
                        "\",isa=\"", LabelValue(dense_isa_), "\",cpu=\"",
                        LabelValue(cpu_model_), "\""));
  }
  Header(&out, "dlrm_model_steps", "gauge",
         "Training steps the served model has taken (restored ones included).");
  Sample(&out, "dlrm_model_steps", static_cast<double>(model_steps));
  if (!served.dir.empty()) {
    // One series whatever the checkpoint: its directory is in the log and
    // in Admin.GetModelInfo, not a label that makes a new series per swap.
    Header(&out, "dlrm_served_step", "gauge",
           "Step of the checkpoint whose weights are served.");
    Sample(&out, "dlrm_served_step", static_cast<double>(served.step));
  }
  Header(&out, "dlrm_checkpoint_swaps_total", "counter",
         "Newer checkpoints a follower (--follow) swapped in.");
  Sample(&out, "dlrm_checkpoint_swaps_total",
         static_cast<double>(checkpoint_swaps_));
  Header(&out, "dlrm_checkpoint_swap_failures_total", "counter",
         "Checkpoints a follower (--follow) skipped with a warning: damaged, "
         "half-written or of another architecture.");
  Sample(&out, "dlrm_checkpoint_swap_failures_total",
         static_cast<double>(checkpoint_swap_failures_));

  Header(&out, "dlrm_train_steps_total", "counter",
         "Training steps run by this process.");
  Sample(&out, "dlrm_train_steps_total", static_cast<double>(train_steps_));
  Header(&out, "dlrm_train_samples_total", "counter",
         "Samples trained on by this process.");
  Sample(&out, "dlrm_train_samples_total", static_cast<double>(train_samples_));
  Header(&out, "dlrm_train_step_seconds_total", "counter",
         "Seconds spent inside training steps.");
  Sample(&out, "dlrm_train_step_seconds_total", train_seconds_);
  Header(&out, "dlrm_train_samples_per_second", "gauge",
         "Samples/s of the last training step (model time only).");
  Sample(&out, "dlrm_train_samples_per_second", last_samples_per_second_);
  Header(&out, "dlrm_train_loss", "gauge",
         "Mean BCE loss of the last training batch.");
  Sample(&out, "dlrm_train_loss", last_loss_);
  Header(&out, "dlrm_train_stage_seconds", "gauge",
         "Seconds of each stage of the last training step.");
  for (const auto& [stage, seconds] : last_stage_seconds_) {
    Sample(&out, "dlrm_train_stage_seconds", seconds,
           absl::StrCat("stage=\"", stage, "\""));
  }
  Header(&out, "dlrm_train_stage_seconds_total", "counter",
         "Seconds spent in each stage of all training steps.");
  for (const auto& [stage, seconds] : total_stage_seconds_) {
    Sample(&out, "dlrm_train_stage_seconds_total", seconds,
           absl::StrCat("stage=\"", stage, "\""));
  }
  if (!exchange_bytes_total_.empty()) {
    Header(&out, "dlrm_exchange_bytes_total", "counter",
           "Bytes rank 0 sent to other ranks, by exchange of the "
           "hybrid-parallel step (docs/hybrid.md).");
    for (const auto& [exchange, bytes] : exchange_bytes_total_) {
      Sample(&out, "dlrm_exchange_bytes_total", static_cast<double>(bytes),
             absl::StrCat("exchange=\"", exchange, "\""));
    }
  }

  // The stores with a cache, and the dynamic tables (either or both).
  std::vector<const TableStoreStats*> caches, dynamics;
  for (const TableStoreStats& t : stores_) {
    if (t.cache_rows > 0) caches.push_back(&t);
    if (t.dynamic) dynamics.push_back(&t);
  }
  if (!caches.empty()) {
    // Counters of the model's stores (they restart with a checkpoint
    // restore, which Prometheus' rate() takes as a counter reset).
    struct Counter {
      const char* name;
      const char* help;
      int64_t embedding::StoreMetrics::*field;
      // Only for the row caches of tables on RocksDB (a device cache's
      // reads and writes go to the tier behind it: the two counters
      // above count them).
      bool rocksdb_only;
    };
    static const Counter kCounters[] = {
        {"dlrm_embedding_cache_hits_total",
         "Unique rows of prepared batches already in the table's row cache.",
         &embedding::StoreMetrics::hits, false},
        {"dlrm_embedding_cache_misses_total",
         "Unique rows of prepared batches loaded into the row cache.",
         &embedding::StoreMetrics::misses, false},
        {"dlrm_embedding_cache_prefetch_hits_total",
         "Misses served from the prefetch of the step before.",
         &embedding::StoreMetrics::prefetch_hits, false},
        {"dlrm_embedding_cache_evictions_total",
         "Rows dropped from the row cache to make room.",
         &embedding::StoreMetrics::evictions, false},
        {"dlrm_embedding_cache_written_back_rows_total",
         "Dirty rows a cache wrote to the tier behind it (evictions and "
         "flushes).",
         &embedding::StoreMetrics::rows_written, false},
        {"dlrm_embedding_cache_loaded_rows_total",
         "Rows a cache read from the tier behind it (misses and prefetches; "
         "RocksDB row caches: rows found in RocksDB).",
         &embedding::StoreMetrics::rows_read, false},
        {"dlrm_rocksdb_read_rows_total", "Rows read from RocksDB.",
         &embedding::StoreMetrics::rows_read, true},
        {"dlrm_rocksdb_read_bytes_total", "Value bytes read from RocksDB.",
         &embedding::StoreMetrics::bytes_read, true},
        {"dlrm_rocksdb_written_rows_total",
         "Rows written back to RocksDB (dirty evictions and flushes).",
         &embedding::StoreMetrics::rows_written, true},
        {"dlrm_rocksdb_written_bytes_total", "Value bytes written to RocksDB.",
         &embedding::StoreMetrics::bytes_written, true},
        {"dlrm_rocksdb_write_retries_total",
         "Writes of rows retried after RocksDB failed them (a failed flush).",
         &embedding::StoreMetrics::write_retries, true},
    };
    Header(
        &out, "dlrm_embedding_cache_rows", "gauge",
        "Rows the row cache of a RocksDB-tier table, or the device cache of a "
        "device-tier table, holds.");
    for (const TableStoreStats* c : caches) {
      const TableStoreStats& t = *c;
      Sample(&out, "dlrm_embedding_cache_rows",
             static_cast<double>(t.cache_rows), StoreLabels(t));
    }
    for (const Counter& c : kCounters) {
      Header(&out, c.name, "counter", c.help);
      for (const TableStoreStats* cached : caches) {
        const TableStoreStats& t = *cached;
        if (c.rocksdb_only && t.device) continue;
        Sample(&out, c.name, static_cast<double>(t.metrics.*c.field),
               StoreLabels(t));
      }
    }
    Header(&out, "dlrm_embedding_cache_hit_ratio", "gauge",
           "hits / (hits + misses) of the row cache since it was created.");
    for (const TableStoreStats* c : caches) {
      const TableStoreStats& t = *c;
      const int64_t lookups = t.metrics.hits + t.metrics.misses;
      Sample(&out, "dlrm_embedding_cache_hit_ratio",
             lookups > 0 ? static_cast<double>(t.metrics.hits) / lookups : 0.0,
             StoreLabels(t));
    }
    Header(&out, "dlrm_embedding_cache_prefetch_hit_ratio", "gauge",
           "prefetch_hits / misses of the row cache since it was created.");
    for (const TableStoreStats* c : caches) {
      const TableStoreStats& t = *c;
      Sample(
          &out, "dlrm_embedding_cache_prefetch_hit_ratio",
          t.metrics.misses > 0
              ? static_cast<double>(t.metrics.prefetch_hits) / t.metrics.misses
              : 0.0,
          StoreLabels(t));
    }
  }

  if (!dynamics.empty()) {
    // A dynamic table's id maps (docs/dynamic.md), per table and rank.
    struct Series {
      const char* name;
      const char* type;
      const char* help;
      int64_t embedding::StoreMetrics::*field;
    };
    static const Series kSeries[] = {
        {"dlrm_dynamic_occupied_rows", "gauge",
         "Rows of a dynamic table that hold an id (out of its capacity "
         "less the kept row).",
         &embedding::StoreMetrics::ids_occupied},
        {"dlrm_dynamic_ids_admitted_total", "counter",
         "New ids a dynamic table gave a row.",
         &embedding::StoreMetrics::ids_admitted},
        {"dlrm_dynamic_ids_evicted_total", "counter",
         "Ids that lost their row to a new id (expired ones included).",
         &embedding::StoreMetrics::ids_evicted},
        {"dlrm_dynamic_ids_refused_total", "counter",
         "New ids the admission policy let in that found no row (their "
         "bucket held only ids of the same batch).",
         &embedding::StoreMetrics::ids_refused},
        {"dlrm_dynamic_unknown_lookups_total", "counter",
         "Ids without a row that predictions pooled (the kept row).",
         &embedding::StoreMetrics::unknown_lookups},
    };
    Header(&out, "dlrm_dynamic_capacity_rows", "gauge",
           "Rows of a dynamic table (its capacity, one kept for ids without "
           "a row).");
    for (const TableStoreStats* t : dynamics) {
      Sample(&out, "dlrm_dynamic_capacity_rows", static_cast<double>(t->rows),
             StoreLabels(*t));
    }
    for (const Series& series : kSeries) {
      Header(&out, series.name, series.type, series.help);
      for (const TableStoreStats* t : dynamics) {
        Sample(&out, series.name, static_cast<double>(t->metrics.*series.field),
               StoreLabels(*t));
      }
    }
  }

  Header(&out, "dlrm_checkpoints_saved_total", "counter",
         "Periodic checkpoints saved (--checkpoint-every-steps/-seconds).");
  Sample(&out, "dlrm_checkpoints_saved_total",
         static_cast<double>(checkpoints_saved_));
  Header(&out, "dlrm_checkpoints_failed_total", "counter",
         "Periodic checkpoints that were due and could not be saved "
         "(training went on; the server log has the error).");
  Sample(&out, "dlrm_checkpoints_failed_total",
         static_cast<double>(checkpoints_failed_));
  if (last_checkpoint_step_ >= 0) {
    Header(&out, "dlrm_checkpoint_last_step", "gauge",
           "Model step of the newest periodic checkpoint saved.");
    Sample(&out, "dlrm_checkpoint_last_step",
           static_cast<double>(last_checkpoint_step_));
  }

  Header(&out, "dlrm_train_queue_depth", "gauge",
         "Batches the Train stream has read and not yet trained on.");
  Sample(&out, "dlrm_train_queue_depth", static_cast<double>(queue_depth_));
  Header(&out, "dlrm_train_queue_depth_max", "gauge",
         "Highest dlrm_train_queue_depth since the server started.");
  Sample(&out, "dlrm_train_queue_depth_max",
         static_cast<double>(queue_depth_max_));
  Header(&out, "dlrm_train_queue_capacity", "gauge",
         "Bound of the Train stream's queue (--train-queue).");
  Sample(&out, "dlrm_train_queue_capacity",
         static_cast<double>(queue_capacity_));
  Header(&out, "dlrm_train_read_stalls_total", "counter",
         "Times the Train stream waited for queue room before reading.");
  Sample(&out, "dlrm_train_read_stalls_total",
         static_cast<double>(read_stalls_));

  Header(&out, "dlrm_eval_runs_total", "counter", "Evaluations run.");
  Sample(&out, "dlrm_eval_runs_total", static_cast<double>(evals_));
  if (has_eval_) {
    Header(&out, "dlrm_eval_auc", "gauge", "ROC AUC of the last evaluation.");
    Sample(&out, "dlrm_eval_auc", last_eval_.auc);
    Header(&out, "dlrm_eval_log_loss", "gauge",
           "Log loss of the last evaluation.");
    Sample(&out, "dlrm_eval_log_loss", last_eval_.log_loss);
    Header(&out, "dlrm_eval_accuracy", "gauge",
           "Accuracy of the last evaluation.");
    Sample(&out, "dlrm_eval_accuracy", last_eval_.accuracy);
  }

  Header(&out, "dlrm_predict_latency_seconds", "histogram",
         "Predict requests from arrival to reply, queueing included.");
  predict_latency_.Render("dlrm_predict_latency_seconds", &out);
  Header(&out, "dlrm_predict_batch_samples", "histogram",
         "Samples per model call of the prediction micro-batcher.");
  predict_batch_samples_.Render("dlrm_predict_batch_samples", &out);
  Header(&out, "dlrm_predict_batch_requests", "histogram",
         "Predict requests joined into one model call.");
  predict_batch_requests_.Render("dlrm_predict_batch_requests", &out);

  Header(&out, "dlrm_grpc_requests_total", "counter",
         "Finished RPCs by method and status code.");
  for (const auto& [key, count] : rpcs_) {
    Sample(
        &out, "dlrm_grpc_requests_total", static_cast<double>(count),
        absl::StrCat("method=\"", key.first, "\",code=\"", key.second, "\""));
  }

  if (!ranks.empty()) {
    Header(&out, "dlrm_rank_heartbeat_age_seconds", "gauge",
           "Seconds since each rank > 0 was last heard of (its heartbeat to "
           "rank 0's coordinator), labelled with the host it reports.");
    for (const RankHealth& r : ranks) {
      if (r.heartbeat_age_seconds < 0) continue;
      std::string host;
      for (const char c : r.host) {
        if (c == '"' || c == '\\') host += '\\';
        host += c == '\n' ? ' ' : c;
      }
      Sample(&out, "dlrm_rank_heartbeat_age_seconds", r.heartbeat_age_seconds,
             absl::StrCat("rank=\"", r.rank, "\",host=\"", host, "\""));
    }
    Header(&out, "dlrm_rank_failures_total", "counter",
           "Times the job's ranks broke with this rank named as silent (dead "
           "or frozen: no heartbeat for a few seconds).");
    for (const RankHealth& r : ranks) {
      Sample(&out, "dlrm_rank_failures_total", static_cast<double>(r.failures),
             absl::StrCat("rank=\"", r.rank, "\""));
    }
  }
  return out;
}

}  // namespace dlrm::server
