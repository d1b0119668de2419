// dlrm_train: trains a DLRM in-process on Criteo TSV, the binary format or
// synthetic data, evaluates it and prints loss, AUC and samples/s.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/dense_flags.h"
#include "core/status.h"
#include "data/criteo.h"
#include "data/synthetic.h"
#include "dense/cpu_isa.h"
#include "embedding/sharding.h"
#include "model/model.h"
#include "model/trainer.h"

namespace dlrm {
namespace {

struct Flags {
  std::string config = "kaggle";
  // --device, --precision, --tf32, --cuda-graphs.
  DenseFlags dense;
  std::vector<std::string> train_files, eval_files;
  int64_t train_samples = 0;
  int64_t eval_samples = 65536;
  double zipf_alpha = 1.05;
  uint64_t data_seed = 0;
  bool hash_ids = false;
  int64_t steps = 0;
  int epochs = 1;
  int64_t batch_size = 2048;
  int64_t eval_interval = 0;
  int64_t log_interval = 100;
  int threads = 0;
  std::string rocksdb_dir;
  std::vector<std::string> tables_on_rocksdb;
  int64_t host_budget_mb = 0;
  int64_t cache_rows = 0;
  double cache_fraction = 0.1;
  std::string eviction = "lru";
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

absl::StatusOr<std::unique_ptr<data::BatchSource>> OpenFiles(
    const std::vector<std::string>& files, const ModelConfig& config,
    bool hash_ids) {
  const data::CriteoOptions options =
      data::CriteoOptionsForModel(config, hash_ids);
  if (files.size() == 1 && EndsWith(files[0], ".bin")) {
    return data::OpenCriteoBinary(files[0], options);
  }
  return data::OpenCriteoTsv(files, options);
}

void PrintEval(int64_t step, const model::EvalResult& r) {
  std::printf(
      "eval step %lld: samples %lld  auc %.4f  logloss %.4f  accuracy %.4f  "
      "ctr %.3f",
      static_cast<long long>(step), static_cast<long long>(r.model.samples),
      r.model.auc, r.model.log_loss, r.model.accuracy, r.model.ctr);
  if (r.has_reference) {
    std::printf("  | teacher auc %.4f logloss %.4f (the ceiling)",
                r.reference.auc, r.reference.log_loss);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// Applies the RocksDB flags to `config` (no change without
// --tables-on-rocksdb or --host-budget-mb), then the tier planner when a
// budget is set (the model would plan the same when created).
absl::StatusOr<ModelConfig> ApplyStorageFlags(ModelConfig config,
                                              const Flags& f) {
  if (f.host_budget_mb < 0) {
    return absl::InvalidArgumentError("--host-budget-mb must be >= 0");
  }
  if (f.tables_on_rocksdb.empty() && f.host_budget_mb == 0) {
    return embedding::ApplyMemoryBudgets(config);
  }
  if (f.rocksdb_dir.empty()) {
    return absl::InvalidArgumentError(
        "--tables-on-rocksdb and --host-budget-mb need --rocksdb-dir");
  }
  RocksDbConfig r;
  r.set_path(f.rocksdb_dir);
  r.set_host_budget_bytes(f.host_budget_mb << 20);
  r.set_cache_rows(f.cache_rows);
  r.set_cache_fraction(f.cache_fraction);
  if (f.eviction == "lfu") {
    r.set_eviction(RocksDbConfig::LFU);
  } else if (f.eviction != "lru") {
    return absl::InvalidArgumentError(
        absl::StrCat("--eviction must be lru or lfu, got '", f.eviction, "'"));
  }
  ASSIGN_OR_RETURN(
      config, PlaceTablesOnRocksDb(std::move(config), f.tables_on_rocksdb, r));
  return embedding::ApplyMemoryBudgets(config);
}

absl::Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(ModelConfig loaded, LoadModelConfig(f.config));
  RETURN_IF_ERROR(f.dense.Apply(&loaded));
  ASSIGN_OR_RETURN(ModelConfig config, ApplyStorageFlags(loaded, f));
  if (f.threads > 0) {
    omp_set_num_threads(f.threads);
  }
  const uint64_t data_seed = f.data_seed != 0 ? f.data_seed : config.seed();
  std::printf(
      "model: %s  tables %d  embedding params %lld  dense params %lld"
      "  threads %d  device %s\n",
      f.config.c_str(), config.tables_size(),
      static_cast<long long>(EmbeddingParameterCount(config)),
      static_cast<long long>(DenseParameterCount(config)),
      omp_get_max_threads(), DeviceName(config.device()));
  int rocksdb_tables = 0;
  for (const auto& t : config.tables()) {
    rocksdb_tables += t.storage() == STORAGE_ROCKSDB;
  }
  if (rocksdb_tables > 0) {
    const std::string cache =
        config.rocksdb().cache_rows() > 0
            ? absl::StrCat(config.rocksdb().cache_rows(), " rows")
            : absl::StrCat(config.rocksdb().cache_fraction(), " of the rows");
    std::printf("storage: %d tables on RocksDB under %s, cache %s per table\n",
                rocksdb_tables, config.rocksdb().path().c_str(), cache.c_str());
  }

  std::unique_ptr<data::BatchSource> train, eval;
  model::ReferenceScorer reference;
  std::shared_ptr<data::Teacher> teacher;
  if (f.train_files.empty()) {
    data::SyntheticOptions o;
    o.zipf_alpha = f.zipf_alpha;
    o.teacher_seed = data_seed;
    o.sample_seed = data_seed + 1;
    o.num_samples = f.train_samples;
    ASSIGN_OR_RETURN(train, data::MakeSyntheticSource(config, o));
    o.sample_seed = data_seed + 2;
    o.num_samples = f.eval_samples;
    ASSIGN_OR_RETURN(eval, data::MakeSyntheticSource(config, o));
    teacher = std::make_shared<data::Teacher>(config, data_seed);
    reference = [teacher](const data::Batch& b, float* out) {
      teacher->Probabilities(b, out);
    };
    std::printf(
        "data: synthetic, zipf alpha %.2f, %s train samples, %lld "
        "eval samples\n",
        f.zipf_alpha,
        f.train_samples > 0 ? std::to_string(f.train_samples).c_str()
                            : "endless",
        static_cast<long long>(f.eval_samples));
    if (f.train_samples == 0 && f.steps == 0) {
      return absl::InvalidArgumentError(
          "--steps is required with endless synthetic data "
          "(or set --train-samples)");
    }
  } else {
    ASSIGN_OR_RETURN(train, OpenFiles(f.train_files, config, f.hash_ids));
    if (!f.eval_files.empty()) {
      ASSIGN_OR_RETURN(eval, OpenFiles(f.eval_files, config, f.hash_ids));
    }
  }

  ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model,
                   model::Model::Create(config));
  std::printf("dense precision: %s\n",
              dense::DescribePrecision(config.device(),
                                       config.dense_precision())
                  .c_str());
  // TF32 applies to fp32 GEMMs only; under bf16 every GEMM takes bf16.
  if (config.device() == DEVICE_CUDA &&
      model->dense_precision() == PRECISION_FP32) {
    std::printf("tf32 GEMMs: %s\n", config.gpu_disable_tf32() ? "off" : "on");
  }
  if (config.device() == DEVICE_CUDA) {
    std::printf("cuda graphs: %s\n", config.gpu_cuda_graphs() ? "on" : "off");
  } else if (config.gpu_cuda_graphs()) {
    std::printf("cuda graphs: ignored (the dense part runs on the CPU)\n");
  }

  model::TrainOptions to;
  to.batch_size = f.batch_size;
  to.epochs = f.epochs;
  to.max_steps = f.steps;
  to.eval_interval = f.eval_interval;
  to.log_interval = f.log_interval;
  model::EvalOptions eo;
  model::TrainCallbacks cb;
  cb.on_progress = [](const model::TrainProgress& p) {
    std::printf(
        "step %7lld  epoch %d  samples %10lld  loss %.5f  "
        "samples/s %9.0f  elapsed %.1fs\n",
        static_cast<long long>(p.step), p.epoch,
        static_cast<long long>(p.samples), p.loss, p.samples_per_second,
        p.elapsed_seconds);
    std::fflush(stdout);
  };
  cb.on_eval = PrintEval;
  ASSIGN_OR_RETURN(
      model::TrainResult r,
      model::Train(*model, *train, eval.get(), to, eo, cb, reference));
  std::printf(
      "train: %lld steps, %lld samples, %.1f s wall, %.0f samples/s "
      "(training steps only), final loss %.5f\n",
      static_cast<long long>(r.steps), static_cast<long long>(r.samples),
      r.seconds, r.model_seconds > 0 ? r.samples / r.model_seconds : 0.0,
      r.final_loss);
  std::printf("stage time per step (ms):");
  for (int s = 0; s < model::StageTimes::kNumStages; ++s) {
    std::printf(" %s %.2f", model::StageTimes::Name(s),
                r.steps > 0 ? 1e3 * r.stage_seconds.seconds[s] / r.steps : 0.0);
  }
  std::printf("\n");
  if (model->HasRocksDbShards()) {
    const embedding::StoreMetrics m = model->RocksDbMetrics();
    const int64_t lookups = m.hits + m.misses;
    std::printf(
        "rocksdb cache: hit rate %.4f  hits %lld  misses %lld  prefetch hits "
        "%lld  evictions %lld  rows read %lld  initialised %lld  written "
        "%lld\n",
        lookups > 0 ? static_cast<double>(m.hits) / lookups : 0.0,
        static_cast<long long>(m.hits), static_cast<long long>(m.misses),
        static_cast<long long>(m.prefetch_hits),
        static_cast<long long>(m.evictions),
        static_cast<long long>(m.rows_read),
        static_cast<long long>(m.rows_initialized),
        static_cast<long long>(m.rows_written));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{"Train a DLRM in-process and evaluate it."};
  app.add_option("--config", f.config,
                 "Model config: a preset (tiny, kaggle, kaggle-full, "
                 "mlperf-dlrm-v1, mlperf-dlrm-dcnv2, xl-113b) or a "
                 "text-format ModelConfig file")
      ->capture_default_str();
  f.dense.AddTo(app);
  app.add_option("--train", f.train_files,
                 "Training data: Criteo TSV files, or one .bin file "
                 "(default: synthetic)");
  app.add_option("--eval", f.eval_files, "Evaluation data (same formats)");
  app.add_option("--train-samples", f.train_samples,
                 "Synthetic training samples per epoch (0 = endless)")
      ->capture_default_str();
  app.add_option("--eval-samples", f.eval_samples, "Synthetic eval samples")
      ->capture_default_str();
  app.add_option("--zipf-alpha", f.zipf_alpha, "Synthetic id skew")
      ->capture_default_str();
  app.add_option("--data-seed", f.data_seed,
                 "Synthetic data seed (0 = the model seed)");
  app.add_flag("--hash-ids", f.hash_ids,
               "Hash Criteo categoricals before the modulo");
  app.add_option("--steps", f.steps, "Stop after this many steps (0 = epochs)")
      ->capture_default_str();
  app.add_option("--epochs", f.epochs, "Passes over the training data")
      ->capture_default_str();
  app.add_option("--batch-size", f.batch_size, "Samples per step")
      ->capture_default_str();
  app.add_option("--eval-interval", f.eval_interval,
                 "Evaluate every N steps (0 = at the end only)")
      ->capture_default_str();
  app.add_option("--log-interval", f.log_interval, "Report every N steps")
      ->capture_default_str();
  app.add_option("--threads", f.threads, "Worker threads (0 = all cores)");
  app.add_option("--tables-on-rocksdb", f.tables_on_rocksdb,
                 "Tables kept in RocksDB behind a row cache: 'all' or table "
                 "names (C3,C4,...); the others stay in host memory")
      ->delimiter(',');
  app.add_option("--rocksdb-dir", f.rocksdb_dir,
                 "Directory for the RocksDB tier (scratch; the model makes "
                 "and removes a database in it)");
  app.add_option("--host-budget-mb", f.host_budget_mb,
                 "Host memory for embedding rows (tables whole, caches of "
                 "RocksDB tables); the largest tables move to RocksDB until "
                 "the rest fit (needs --rocksdb-dir; 0 = no budget)")
      ->capture_default_str();
  app.add_option("--cache-rows", f.cache_rows,
                 "Cached rows per RocksDB table (0 = --cache-fraction)")
      ->capture_default_str();
  app.add_option("--cache-fraction", f.cache_fraction,
                 "Fraction of each RocksDB table's rows cached")
      ->capture_default_str();
  app.add_option("--eviction", f.eviction, "Cache eviction: lru or lfu")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const absl::Status s = dlrm::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "dlrm_train: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
