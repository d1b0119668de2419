// The flags the in-process step benchmarks share (dlrm_bench_train,
// dlrm_bench_hybrid): the model and its tiers, the synthetic batches, and
// the timed steps. Header-only (CLI11 is).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "core/cli_parse.h"
#include "core/config.h"
#include "core/dense_flags.h"
#include "core/storage_flags.h"

namespace dlrm::bench {

struct StepFlags {
  // Preset or text-format ModelConfig file. Default: kaggle.
  std::string config = "kaggle";
  // --device, --precision, --tf32, --cuda-graphs.
  DenseFlags dense;
  // Every table's rows, in place of the config's; 0 keeps them. Default: 0.
  int64_t rows = 0;
  // Samples per step (the global batch on several ranks). Default: 2048.
  int64_t batch = 2048;
  // Untimed steps, timed steps per repetition, repetitions (the median is
  // reported). Defaults: the binary's.
  int warmup = 5;
  int iters = 30;
  int repeats = 5;
  // Zipf exponent of the synthetic ids. Default: 1.05.
  double alpha = 1.05;
  // Synthetic vocabulary per table and its drift (data::SyntheticOptions).
  // Defaults: 0 (ids are rows), 0 (no drift).
  int64_t vocabulary = 0;
  double drift = 0;
  // Distinct pre-generated batches, used in rotation. Default: 4.
  int batches = 4;
  // --rocksdb-dir, --host-budget-mb, --tables-on-rocksdb, --cache-rows,
  // --cache-fraction, --eviction (per rank).
  StorageFlags storage;
  // TrainStep gets the next batch, whose rows the RocksDB tables prefetch
  // during the step. Default: true.
  bool prefetch = true;

  // Adds the flags above to `app`.
  void AddTo(CLI::App& app) {
    AddConfigFlag(app, &config, PresetNames(), "")->capture_default_str();
    dense.AddTo(app);
    app.add_option("--rows", rows,
                   "Override every table's rows (bench/compare_peers.sh: "
                   "100000 for kaggle)");
    AddDefaulted(app, kBatchFlag, batch,
                 "Samples per step (the global batch on several ranks)");
    AddDefaulted(app, "--warmup", warmup, "Untimed steps");
    AddDefaulted(app, kStepsFlag, iters, "Timed steps per repetition");
    AddDefaulted(app, "--repeats", repeats, "Repetitions (median reported)");
    AddDefaulted(app, kAlphaFlag, alpha, "Zipf exponent of ids");
    AddDefaulted(app, kVocabularyFlag, vocabulary, kVocabularyHelp);
    AddDefaulted(app, kDriftFlag, drift, kDriftHelp);
    AddDefaulted(app, "--batches", batches,
                 "Distinct pre-generated batches, used in rotation (more "
                 "batches: more distinct ids, so a cache misses more)");
    storage.AddTo(app);
    AddDefaulted(app, "--prefetch", prefetch,
                 "Prefetch the next batch's rows during a step (tables on "
                 "RocksDB; on several ranks its ids go to the shards)");
  }
};

}  // namespace dlrm::bench
