// dlrm_train: trains a DLRM in-process on Criteo TSV, the binary format,
// NumPy days (TorchRec's .npy, MLPerf's multi-hot .npz) or synthetic data,
// evaluates it and prints loss, AUC and samples/s.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cli_parse.h"
#include "core/config.h"
#include "core/dense_flags.h"
#include "core/path_checks.h"
#include "core/status.h"
#include "core/storage_flags.h"
#include "data/criteo.h"
#include "data/synthetic.h"
#include "dense/cpu_isa.h"
#include "embedding/sharding.h"
#include "model/memory_plan.h"
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
  // Synthetic vocabulary per table and its drift (data::SyntheticOptions).
  int64_t vocabulary = 0;
  double drift = 0;
  uint64_t data_seed = 0;
  bool hash_ids = false;
  int64_t steps = 0;
  int epochs = 1;
  int64_t batch_size = 2048;
  int64_t eval_interval = 0;
  int64_t log_interval = 100;
  int threads = 0;
  // --rocksdb-dir, --host-budget-mb, --tables-on-rocksdb, --cache-rows,
  // --cache-fraction, --eviction.
  StorageFlags storage;
  bool dry_run = false;
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
  if (data::IsCriteoNpy(files)) {
    ASSIGN_OR_RETURN(std::vector<data::CriteoNpyDay> days,
                     data::FindCriteoNpyDays(files, options.AnyMultiHot()));
    return data::OpenCriteoNpy(std::move(days), options);
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

// The path flags, checked before anything is allocated, each error naming
// its flag (core/path_checks.h, as dlrm_server's). NumPy day prefixes are
// no files: FindCriteoNpyDays names a day's missing file.
absl::Status CheckPaths(const Flags& f) {
  if (!data::IsCriteoNpy(f.train_files)) {
    RETURN_IF_ERROR(CheckReadableFiles("--train", f.train_files));
  }
  if (!data::IsCriteoNpy(f.eval_files)) {
    RETURN_IF_ERROR(CheckReadableFiles("--eval", f.eval_files));
  }
  if (!f.storage.rocksdb_dir.empty()) {
    RETURN_IF_ERROR(CheckWritableDir("--rocksdb-dir", f.storage.rocksdb_dir));
  }
  return absl::OkStatus();
}

absl::Status Run(const Flags& f) {
  RETURN_IF_ERROR(CheckPaths(f));
  ASSIGN_OR_RETURN(ModelConfig loaded, LoadModelConfig(f.config));
  RETURN_IF_ERROR(f.dense.Apply(&loaded));
  RETURN_IF_ERROR(f.storage.Apply(&loaded));
  // The tiers the model will choose (it plans the same when created).
  ASSIGN_OR_RETURN(ModelConfig config, embedding::ApplyMemoryBudgets(loaded));
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
  // What the model will hold, checked against the machine before anything
  // is allocated.
  model::MemoryPlanOptions mo;
  mo.batch_size = f.batch_size;
  const int64_t eval_batch = model::EvalOptions().batch_size;
  mo.eval_batch_size = f.train_files.empty()
                           ? std::min(eval_batch, f.eval_samples)
                           : (f.eval_files.empty() ? 0 : eval_batch);
  ASSIGN_OR_RETURN(const model::MemoryPlan plan,
                   model::PlanMemory(config, nullptr, mo));
  std::printf("%s", plan.ToString().c_str());
  std::fflush(stdout);
  ASSIGN_OR_RETURN(const model::MachineMemory machine,
                   model::AvailableMemory());
  RETURN_IF_ERROR(model::CheckMemory(config, plan, machine));
  if (f.dry_run) {
    std::printf(
        "dlrm_train --dry-run: fits the %.1f MiB of host memory this machine "
        "has (%s); nothing allocated\n",
        static_cast<double>(machine.bytes) / 1048576.0, machine.source.c_str());
    return absl::OkStatus();
  }

  std::unique_ptr<data::BatchSource> train, eval;
  model::ReferenceScorer reference;
  std::shared_ptr<data::Teacher> teacher;
  if (f.train_files.empty()) {
    data::SyntheticOptions o;
    o.zipf_alpha = f.zipf_alpha;
    o.vocabulary = f.vocabulary;
    o.drift = f.drift;
    o.teacher_seed = data_seed;
    o.sample_seed = data_seed + 1;
    o.num_samples = f.train_samples;
    ASSIGN_OR_RETURN(train, data::MakeSyntheticSource(config, o));
    // A drifting vocabulary is scored where training leaves it: the eval
    // samples are drawn from the vocabulary of the samples after the last
    // one trained on.
    o.sample_seed = data_seed + 2;
    o.num_samples = f.eval_samples;
    o.drift_start = f.train_samples;
    if (f.steps > 0) {
      o.drift_start = f.train_samples > 0
                          ? std::min(f.train_samples, f.steps * f.batch_size)
                          : f.steps * f.batch_size;
    }
    ASSIGN_OR_RETURN(eval, data::MakeSyntheticSource(config, o));
    // Ids reduced modulo a static table's rows are no longer the teacher's.
    if (data::SyntheticIdsAreTeacherIds(config, o)) {
      teacher =
          std::make_shared<data::Teacher>(config, data_seed, f.vocabulary);
      reference = [teacher](const data::Batch& b, float* out) {
        teacher->Probabilities(b, out);
      };
    }
    std::printf(
        "data: synthetic, zipf alpha %.2f, %s train samples, %lld "
        "eval samples",
        f.zipf_alpha,
        f.train_samples > 0 ? std::to_string(f.train_samples).c_str()
                            : "endless",
        static_cast<long long>(f.eval_samples));
    if (f.vocabulary > 0) {
      std::printf(", vocabulary %lld per table, drift %g%s",
                  static_cast<long long>(f.vocabulary), f.drift,
                  reference ? "" : " (no teacher AUC: ids taken modulo rows)");
    }
    std::printf("\n");
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
  std::printf(
      "dense precision: %s\n",
      dense::DescribePrecision(config.device(), config.dense_precision())
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
  if (model->shards().has_database()) {
    const embedding::StoreMetrics m = model->shards().HostCacheMetrics();
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
  const embedding::StoreBytes bytes = model->shards().MemoryBytes();
  std::printf(
      "embedding stores hold: host %.1f MiB  device %.1f MiB  disk "
      "%.1f MiB\n",
      bytes.host / 1048576.0, bytes.device / 1048576.0, bytes.disk / 1048576.0);
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  dlrm::Flags f;
  CLI::App app{"Train a DLRM in-process and evaluate it."};
  dlrm::AddVersionFlag(app, "dlrm_train");
  dlrm::AddConfigFlag(app, &f.config, dlrm::PresetNames(), "")
      ->capture_default_str();
  f.dense.AddTo(app);
  app.add_option("--train", f.train_files,
                 "Training data: Criteo TSV files, one .bin file, or NumPy "
                 "days: DIR/day_N prefixes (day_N_dense.npy, "
                 "day_N_labels.npy and day_N_sparse.npy or "
                 "day_N_sparse_multi_hot.npz) or those files "
                 "(default: synthetic)");
  app.add_option("--eval", f.eval_files, "Evaluation data (same formats)");
  dlrm::AddDefaulted(app, "--train-samples", f.train_samples,
                     "Synthetic training samples per epoch (0 = endless)");
  dlrm::AddDefaulted(app, "--eval-samples", f.eval_samples,
                     "Synthetic eval samples");
  dlrm::AddDefaulted(app, dlrm::kAlphaFlag, f.zipf_alpha, "Synthetic id skew");
  dlrm::AddDefaulted(app, dlrm::kVocabularyFlag, f.vocabulary,
                     dlrm::kVocabularyHelp);
  dlrm::AddDefaulted(app, dlrm::kDriftFlag, f.drift, dlrm::kDriftHelp);
  app.add_option("--data-seed", f.data_seed,
                 "Synthetic data seed (0 = the model seed)");
  app.add_flag("--hash-ids", f.hash_ids,
               "Hash Criteo categoricals before the modulo");
  dlrm::AddDefaulted(app, dlrm::kStepsFlag, f.steps,
                     "Stop after this many steps (0 = epochs)");
  dlrm::AddDefaulted(app, "--epochs", f.epochs,
                     "Passes over the training data");
  dlrm::AddDefaulted(app, dlrm::kBatchFlag, f.batch_size, "Samples per step");
  dlrm::AddDefaulted(app, "--eval-interval", f.eval_interval,
                     "Evaluate every N steps (0 = at the end only)");
  dlrm::AddDefaulted(app, "--log-interval", f.log_interval,
                     "Report every N steps");
  app.add_option("--threads", f.threads, "Worker threads (0 = all cores)");
  f.storage.AddTo(app);
  app.add_flag("--dry-run", f.dry_run,
               "Print the model, its storage tiers and its memory plan, "
               "check the plan against this machine's memory, and exit "
               "without allocating the model");
  if (const int code = dlrm::ParseCommandLine(app, argc, argv, "dlrm_train");
      code >= 0) {
    return code;
  }
  const absl::Status s = dlrm::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "dlrm_train: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
