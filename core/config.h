// Loading, defaulting and validating ModelConfig (proto/dlrm/config.proto).
// This is the one place where a proto config becomes checked values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"

namespace dlrm {

// Parses protobuf text format. Errors are InvalidArgument with the line and
// column of the first problem. The result is not yet normalised.
absl::StatusOr<ModelConfig> ParseModelConfigText(const std::string& text);

// Names of the configs compiled into the binary (configs/*.textproto).
std::vector<std::string> PresetNames();

// The text of a compiled-in preset; NotFound for an unknown name.
absl::StatusOr<std::string> PresetText(const std::string& name);

// Loads `spec`: a preset name (PresetNames(): "kaggle", "tiny", ...) or a
// path to a text-format file. Returns the normalised, validated config;
// NotFound for a missing file, InvalidArgument for a bad one.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& spec);

// Fills defaults for zero fields (num_dense_features 13, table dims,
// multi_hot_size 1, dcn_num_layers 3 and dcn_low_rank_dim 512 under
// INTERACTION_DCN, optimizer defaults, RocksDB cache defaults where a
// table's rows are on RocksDB: RowsOnRocksDb), applies max_rows_per_table,
// then validates. InvalidArgument names the offending field.
absl::StatusOr<ModelConfig> NormalizeModelConfig(ModelConfig config);

// Checks a normalised config: positive sizes, unique table names, bottom MLP
// ending at the embedding dim (dot), top MLP ending at 1, an interaction's
// fields (InteractionConfigFields) set under that interaction only, a known
// dense_precision, rocksdb.path and cache sizes where a table's rows are on
// RocksDB (RowsOnRocksDb), the device cache's fields (device_cache_rows,
// device_cache_backing) on STORAGE_DEVICE tables only, the optimizers and their
// schedules (optim::Validate; the tables' optimizer by optim::ValidateSparse,
// which refuses the layer-wise LAMB and LARS).
absl::Status ValidateModelConfig(const ModelConfig& config);

// Puts the tables named in `tables` (or every table, for the one name
// "all") on STORAGE_ROCKSDB with `rocksdb` as the tier's options, then
// normalises. InvalidArgument naming an unknown table, or as
// NormalizeModelConfig.
absl::StatusOr<ModelConfig> PlaceTablesOnRocksDb(
    ModelConfig config, const std::vector<std::string>& tables,
    const RocksDbConfig& rocksdb);

// Whether a table's rows are stored in RocksDB: STORAGE_ROCKSDB, or a
// STORAGE_DEVICE table whose device cache (device_cache_rows > 0) is backed
// by RocksDB (device_cache_backing STORAGE_ROCKSDB). Its host memory is
// then its RocksDB row cache (CachedRows).
bool RowsOnRocksDb(const TableConfig& table);

// Rows of table `table` (STORAGE_ROCKSDB) kept in its cache, for a
// normalised config: rocksdb.cache_rows, or cache_fraction of the table's
// rows rounded up, clamped to [1, rows].
int64_t CachedRowsOfTable(const ModelConfig& config, int table);

// Rows a cache under `rocksdb` keeps of a table or shard of `rows` rows:
// cache_rows, or cache_fraction (0 read as the default 0.1) of `rows`
// rounded up, clamped to [1, rows]. Each shard of a sharded table has a
// cache of its own, sized from the shard's rows.
int64_t CachedRows(const RocksDbConfig& rocksdb, int64_t rows);

// The device named "cpu" or "cuda" (the --device flag); InvalidArgument
// otherwise.
absl::StatusOr<ComputeDevice> ParseDevice(std::string_view name);
// "cpu" or "cuda".
const char* DeviceName(ComputeDevice device);
// Sets config->device from a binary's --device flag; an empty flag keeps
// the config's own. InvalidArgument for another name, or naming the table
// field when a STORAGE_DEVICE table then lacks DEVICE_CUDA.
absl::Status ApplyDeviceFlag(std::string_view flag, ModelConfig* config);

// Sets config->dense_precision from a binary's --precision flag: "auto",
// "fp32" or "bf16"; an empty flag keeps the config's. InvalidArgument naming
// the flag otherwise.
absl::Status ApplyPrecisionFlag(std::string_view flag, ModelConfig* config);
// "auto", "fp32" or "bf16".
const char* PrecisionName(DensePrecision precision);

// Sets every table's weight_precision from a binary's --row-precision flag:
// "fp32", "fp16" or "bf16"; an empty flag keeps the config's.
// InvalidArgument naming the flag otherwise (ValidateModelConfig then
// checks the tables' tiers).
absl::Status ApplyRowPrecisionFlag(std::string_view flag, ModelConfig* config);
// "fp32", "fp16" or "bf16".
const char* RowPrecisionName(RowPrecision precision);

// Sets config->gpu_disable_tf32 from a binary's --tf32 flag: "on" (TF32
// GEMMs on a GPU, the default) clears it, "off" sets it; an empty flag
// keeps the config's. InvalidArgument naming the flag otherwise.
absl::Status ApplyTf32Flag(std::string_view flag, ModelConfig* config);
// Sets config->gpu_cuda_graphs from a binary's --cuda-graphs flag: "on"
// sets it, "off" clears it; an empty flag keeps the config's.
// InvalidArgument naming the flag otherwise.
absl::Status ApplyCudaGraphsFlag(std::string_view flag, ModelConfig* config);

// Width of the interaction output (the top MLP's input) for a normalised
// config: d + n(n-1)/2 for dot with n = tables + 1, d + the sum of the
// tables' dims for cat and DCN (the cross network keeps its input's width).
int InteractionOutputDim(const ModelConfig& config);

// A dense parameter: its name ("interaction.crossnet.0.V") and its shape,
// row-major.
struct DenseParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  // Floats: the product of the shape's sizes.
  int64_t size() const;
};

// The parameters of a normalised config's interaction, in the order the
// dense backend initialises, lists, checkpoints and exports them: none for
// dot and cat; under DCN, layer by layer, "interaction.crossnet.<l>.V" [r x
// N], ".W" [N x r] and ".bias" [N] (dense/cross_net.h). The one place an
// interaction's parameters are named and shaped: DenseParameterCount, the
// dense backend (HostDenseParams names its interaction layer's parameters
// with them), the weights export and the TorchRec mapping read them here.
std::vector<DenseParamSpec> InteractionParamSpecs(const ModelConfig& config);

// The fields of ModelConfig an interaction owns ("dcn_num_layers",
// "dcn_low_rank_dim"), in field order: set only under their interaction
// (ValidateModelConfig), part of a checkpoint's architecture and immutable
// on a resume (core/config_change.h).
std::vector<std::string> InteractionConfigFields();

// The first of InteractionConfigFields whose value differs between `a` and
// `b`; empty when none does.
std::string DifferentInteractionField(const ModelConfig& a,
                                      const ModelConfig& b);

// The interaction's own fields as text to follow its name: " (3 layers,
// rank 512)" under DCN, empty for an interaction without fields.
std::string InteractionFieldsText(const ModelConfig& config);

// Total parameters: embedding rows x dims; MLP weights and biases plus the
// interaction's (InteractionParamSpecs).
int64_t EmbeddingParameterCount(const ModelConfig& config);
int64_t DenseParameterCount(const ModelConfig& config);

}  // namespace dlrm
