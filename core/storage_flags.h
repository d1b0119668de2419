// The flags of the binaries that train (dlrm_train, dlrm_bench_train,
// dlrm_server, dlrm_bench_hybrid) that say where the embedding rows live:
// --rocksdb-dir, --host-budget-mb, --tables-on-rocksdb, --cache-rows,
// --cache-fraction and --eviction (ModelConfig.rocksdb and the tables'
// storage; the tier planner, embedding::ApplyMemoryBudgets, then moves
// tables to fit the budget), and --row-precision (the tables'
// weight_precision).
// Header-only, so that core does not link CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "dlrm/config.pb.h"

namespace dlrm {

struct StorageFlags {
  // Directory of the RocksDB tier (rocksdb.path); empty keeps the config's.
  std::string rocksdb_dir;
  // Host memory for embedding rows, in MiB (rocksdb.host_budget_bytes);
  // 0 keeps the config's.
  int64_t host_budget_mb = 0;
  // Tables put on STORAGE_ROCKSDB by name, or "all"; empty moves none.
  std::vector<std::string> tables_on_rocksdb;
  // Rows cached per RocksDB table (rocksdb.cache_rows); 0 keeps the
  // config's.
  int64_t cache_rows = 0;
  // Fraction of each RocksDB table's rows cached (rocksdb.cache_fraction);
  // 0 keeps the config's (0.1 unless it sets one).
  double cache_fraction = 0;
  // "lru" or "lfu" (rocksdb.eviction); empty keeps the config's.
  std::string eviction;
  // "fp32", "fp16" or "bf16" (every table's weight_precision); empty keeps
  // the config's.
  std::string row_precision;

  // Adds the seven options to `app`.
  void AddTo(CLI::App& app) {
    app.add_option("--rocksdb-dir", rocksdb_dir,
                   "Directory for the RocksDB tier (scratch; the model makes "
                   "and removes a database in it)");
    app.add_option("--host-budget-mb", host_budget_mb,
                   "Host memory for embedding rows (tables whole, caches of "
                   "RocksDB tables), in MiB: the largest tables move to "
                   "RocksDB until the rest fit (needs --rocksdb-dir; default "
                   "0: the config's rocksdb.host_budget_bytes, else no "
                   "budget)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--tables-on-rocksdb", tables_on_rocksdb,
                   "Tables kept in RocksDB behind a row cache: 'all' or "
                   "table names (C3,C4,...); the others stay where the "
                   "config puts them (needs --rocksdb-dir)")
        ->delimiter(',');
    app.add_option("--cache-rows", cache_rows,
                   "Cached rows per RocksDB table (default 0: the config's "
                   "rocksdb.cache_rows, else --cache-fraction)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--cache-fraction", cache_fraction,
                   "Fraction of each RocksDB table's rows cached (default: "
                   "the config's rocksdb.cache_fraction, else 0.1)")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--eviction", eviction,
                   "Cache eviction: lru or lfu (default: the config's, lru "
                   "unless it sets one)")
        ->check(CLI::IsMember({"lru", "lfu"}));
    app.add_option("--row-precision", row_precision,
                   "Precision of every table's weights: fp32, fp16 or bf16 "
                   "(16-bit rows: half the memory, stochastic rounding on "
                   "update, host-memory and RocksDB tables on the CPU only; "
                   "default: the config's weight_precision, fp32 unless it "
                   "sets one)")
        ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  }

  // Whether any of the flags was given.
  bool any() const {
    return !rocksdb_dir.empty() || host_budget_mb != 0 ||
           !tables_on_rocksdb.empty() || cache_rows != 0 ||
           cache_fraction != 0 || !eviction.empty() || !row_precision.empty();
  }

  // Sets them in `config` (normalised): the given fields of config->rocksdb
  // and the named tables on STORAGE_ROCKSDB; the tier planner runs when the
  // model is created (or embedding::ApplyMemoryBudgets). InvalidArgument
  // naming the flag: a negative size, a bad eviction, --tables-on-rocksdb or
  // --host-budget-mb with no directory (neither --rocksdb-dir nor the
  // config's rocksdb.path), an unknown table.
  absl::Status Apply(ModelConfig* config) const {
    if (host_budget_mb < 0 || host_budget_mb > (int64_t{1} << 43)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--host-budget-mb must be in [0, 2^43], got ", host_budget_mb));
    }
    if (cache_rows < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cache-rows must be >= 0, got ", cache_rows));
    }
    if (!(cache_fraction >= 0 && cache_fraction <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cache-fraction must be in [0, 1], got ", cache_fraction));
    }
    if (!eviction.empty() && eviction != "lru" && eviction != "lfu") {
      return absl::InvalidArgumentError(
          absl::StrCat("--eviction must be lru or lfu, got '", eviction, "'"));
    }
    if (!any()) return absl::OkStatus();
    RETURN_IF_ERROR(ApplyRowPrecisionFlag(row_precision, config));
    if ((!tables_on_rocksdb.empty() || host_budget_mb > 0) &&
        rocksdb_dir.empty() && config->rocksdb().path().empty()) {
      return absl::InvalidArgumentError(
          "--tables-on-rocksdb and --host-budget-mb need --rocksdb-dir: the "
          "directory the RocksDB tier keeps the rows that leave host memory "
          "in");
    }
    RocksDbConfig r = config->rocksdb();
    if (!rocksdb_dir.empty()) r.set_path(rocksdb_dir);
    if (host_budget_mb > 0) r.set_host_budget_bytes(host_budget_mb << 20);
    if (cache_rows > 0) r.set_cache_rows(cache_rows);
    if (cache_fraction > 0) r.set_cache_fraction(cache_fraction);
    if (!eviction.empty()) {
      r.set_eviction(eviction == "lfu" ? RocksDbConfig::LFU
                                       : RocksDbConfig::LRU);
    }
    ASSIGN_OR_RETURN(*config, PlaceTablesOnRocksDb(std::move(*config),
                                                   tables_on_rocksdb, r));
    return absl::OkStatus();
  }
};

}  // namespace dlrm
