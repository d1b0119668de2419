// ModelConfig parsing, presets, defaults and validation.
#include "core/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/presets.h"
#include "core/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "optim/optimizer.h"

namespace dlrm {
namespace {

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) {
      first_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ",
                            message);
    }
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// The fields of ModelConfig an interaction owns, with their interaction
// (InteractionConfigFields).
struct InteractionField {
  const char* name;
  Interaction owner;
};
constexpr InteractionField kInteractionFields[] = {
    {"dcn_num_layers", INTERACTION_DCN},
    {"dcn_low_rank_dim", INTERACTION_DCN},
};

const google::protobuf::FieldDescriptor* ConfigField(const char* name) {
  return ModelConfig::descriptor()->FindFieldByName(name);
}

// Whether the singular field `name` of `c` differs from its default.
bool IsSet(const ModelConfig& c, const char* name) {
  return c.GetReflection()->HasField(c, ConfigField(name));
}

// The text of the singular field `name` of `c`.
std::string FieldText(const ModelConfig& c, const char* name) {
  std::string out;
  google::protobuf::TextFormat::PrintFieldValueToString(c, ConfigField(name),
                                                        -1, &out);
  return out;
}

// Sizes past these are no model this server can hold, and bounding them
// keeps every derived size (parameter counts, the interaction width) far
// from overflowing its integer type.
constexpr int kMaxTables = 1024;
constexpr int kMaxDim = 4096;
constexpr int kMaxWidth = 1 << 16;  // MLP widths and num_dense_features
constexpr int kMaxLayers = 64;
constexpr int64_t kMaxRows = int64_t{1} << 40;

// proto3 strings must be UTF-8: a config holding anything else would fail
// to parse wherever the server sends or stores it (GetModelInfo,
// checkpoints). Control characters are refused too, since names end up in
// file names, logs and tensor names.
bool IsCleanUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return false;
      ++i;
      continue;
    }
    int extra;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      extra = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

absl::Status CheckMlp(const google::protobuf::RepeatedField<int32_t>& mlp,
                      const char* name) {
  if (mlp.size() > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " has ", mlp.size(), " layers; at most ", kMaxLayers));
  }
  for (int i = 0; i < mlp.size(); ++i) {
    if (mlp.Get(i) <= 0 || mlp.Get(i) > kMaxWidth) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", i, "] = ", mlp.Get(i), " must be in [1, ",
                       kMaxWidth, "]"));
    }
  }
  return absl::OkStatus();
}

bool UsesRocksDb(const ModelConfig& c) {
  for (const auto& t : c.tables()) {
    if (RowsOnRocksDb(t)) return true;
  }
  return false;
}

// InvalidArgument naming the field when table `i` keeps its rows in device
// memory (STORAGE_DEVICE) but the model does not run on CUDA, sets
// device_cache_rows negative or without STORAGE_DEVICE, or sets
// device_cache_backing to anything but STORAGE_HOST or STORAGE_ROCKSDB,
// without device_cache_rows, or to STORAGE_ROCKSDB without rocksdb.path.
absl::Status CheckStorageOnDevice(const ModelConfig& c, int i) {
  const TableConfig& t = c.tables(i);
  if (t.storage() == STORAGE_DEVICE && c.device() != DEVICE_CUDA) {
    return absl::InvalidArgumentError(
        absl::StrCat("tables[", i, "].storage (", t.name(),
                     ") is STORAGE_DEVICE, which needs device: DEVICE_CUDA"));
  }
  if (t.device_cache_rows() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tables[", i, "].device_cache_rows (", t.name(),
                     ") must be >= 0, got ", t.device_cache_rows()));
  }
  if (t.device_cache_rows() > 0 && t.storage() != STORAGE_DEVICE) {
    return absl::InvalidArgumentError(
        absl::StrCat("tables[", i, "].device_cache_rows (", t.name(),
                     ") is set but the table's storage is ",
                     StorageTier_Name(t.storage()), ", not STORAGE_DEVICE"));
  }
  if (!StorageTier_IsValid(t.device_cache_backing()) ||
      t.device_cache_backing() == STORAGE_DEVICE) {
    return absl::InvalidArgumentError(
        absl::StrCat("tables[", i, "].device_cache_backing (", t.name(),
                     ") must be STORAGE_HOST or STORAGE_ROCKSDB, got ",
                     t.device_cache_backing()));
  }
  if (t.device_cache_backing() != STORAGE_HOST && t.device_cache_rows() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tables[", i, "].device_cache_backing (", t.name(),
                     ") is ", StorageTier_Name(t.device_cache_backing()),
                     " but device_cache_rows is 0 (no device cache to back)"));
  }
  if (t.device_cache_backing() == STORAGE_ROCKSDB &&
      c.rocksdb().path().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tables[", i, "].device_cache_backing (", t.name(),
                     ") is STORAGE_ROCKSDB but rocksdb.path is empty"));
  }
  // The device cache evicts by the row caches' policy.
  if (t.device_cache_rows() > 0 &&
      !RocksDbConfig::Eviction_IsValid(c.rocksdb().eviction())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rocksdb.eviction is invalid (tables[", i, "] (", t.name(),
                     ") evicts its device cache by it)"));
  }
  return absl::OkStatus();
}

// InvalidArgument naming tables[i].weight_precision when it is not a
// RowPrecision, or is 16-bit on a tier that keeps only fp32 rows: 16-bit
// rows live in host memory (STORAGE_HOST) or on RocksDB (STORAGE_ROCKSDB,
// its row cache too) on a DEVICE_CPU model; the device tier (STORAGE_DEVICE,
// its cache included) stores fp32 rows.
absl::Status CheckWeightPrecision(const ModelConfig& c, int i) {
  const TableConfig& t = c.tables(i);
  const std::string field =
      absl::StrCat("tables[", i, "].weight_precision (", t.name(), ")");
  if (!RowPrecision_IsValid(t.weight_precision())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is invalid, got ", t.weight_precision(),
                     " (ROW_FP32, ROW_FP16 or ROW_BF16)"));
  }
  if (t.weight_precision() == ROW_FP32) return absl::OkStatus();
  const std::string precision = RowPrecision_Name(t.weight_precision());
  if (t.storage() != STORAGE_HOST && t.storage() != STORAGE_ROCKSDB) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", precision, ", which the ", StorageTier_Name(t.storage()),
        " tier does not keep (16-bit rows are STORAGE_HOST or STORAGE_ROCKSDB "
        "only)"));
  }
  if (c.device() != DEVICE_CPU) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", precision, ", which the device tier and the ",
        ComputeDevice_Name(c.device()),
        " step do not run (16-bit rows need device: DEVICE_CPU)"));
  }
  return absl::OkStatus();
}

// InvalidArgument naming the field when table `i` sets admission,
// eviction or unadmitted without being dynamic, or is dynamic with fewer
// than 2 rows, data-parallel sharding, or an out-of-range admission or
// eviction field.
absl::Status CheckDynamicTable(const ModelConfig& c, int i) {
  const TableConfig& t = c.tables(i);
  const std::string field = absl::StrCat("tables[", i, "]");
  // InvalidArgument "tables[i].<name> (<table>) <what...>".
  auto refused = [&](const char* name, const auto&... what) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".", name, " (", t.name(), ") ", what...));
  };
  if (!t.dynamic()) {
    const char* set = t.has_admission()     ? "admission"
                      : t.has_eviction()    ? "eviction"
                      : t.unadmitted() != 0 ? "unadmitted"
                                            : nullptr;
    if (set != nullptr) {
      return refused(set,
                     "is set but the table is not dynamic (set dynamic: "
                     "true to map raw ids onto its rows)");
    }
    return absl::OkStatus();
  }
  if (t.rows() < 2) {
    return refused("rows", "= ", t.rows(),
                   ": a dynamic table needs rows >= 2 (its capacity; one row "
                   "is kept for ids without a row)");
  }
  if (t.sharding() == SHARDING_DATA_PARALLEL) {
    return refused(
        "sharding", "is ", ShardingKind_Name(t.sharding()),
        ", which a dynamic table cannot take: replicas would each learn "
        "their own map; use SHARDING_TABLE_WISE, SHARDING_COLUMN_WISE, "
        "SHARDING_ROW_WISE (by hash of the id) or SHARDING_AUTO");
  }
  const Admission& a = t.admission();
  if (!Admission::Kind_IsValid(a.kind())) {
    return refused("admission.kind", "is invalid: ", a.kind());
  }
  if (a.min_sightings() < 0) {
    return refused("admission.min_sightings", "must be >= 0, got ",
                   a.min_sightings());
  }
  if (a.kind() == Admission::ADMIT_WITH_PROBABILITY &&
      !(a.probability() > 0 && a.probability() <= 1)) {
    return refused("admission.probability", "must be in (0, 1], got ",
                   a.probability());
  }
  if (a.kind() != Admission::ADMIT_WITH_PROBABILITY && a.probability() != 0) {
    return refused("admission.probability", "is set but admission.kind is ",
                   Admission::Kind_Name(a.kind()));
  }
  const Eviction& e = t.eviction();
  if (!Eviction::Kind_IsValid(e.kind())) {
    return refused("eviction.kind", "is invalid: ", e.kind());
  }
  if (e.ttl_steps() < 0) {
    return refused("eviction.ttl_steps", "must be >= 0, got ", e.ttl_steps());
  }
  if (!UnadmittedIds_IsValid(t.unadmitted())) {
    return refused("unadmitted", "is invalid: ", t.unadmitted());
  }
  return absl::OkStatus();
}

absl::Status ValidateRocksDbConfig(const RocksDbConfig& r) {
  if (r.cache_rows() < 0) {
    return absl::InvalidArgumentError("rocksdb.cache_rows must be >= 0");
  }
  if (r.cache_rows() == 0 &&
      !(r.cache_fraction() > 0 && r.cache_fraction() <= 1)) {
    return absl::InvalidArgumentError(
        "rocksdb.cache_fraction must be in (0, 1] when cache_rows is 0");
  }
  if (!RocksDbConfig::Eviction_IsValid(r.eviction())) {
    return absl::InvalidArgumentError("rocksdb.eviction is invalid");
  }
  if (r.block_cache_bytes() < 0) {
    return absl::InvalidArgumentError("rocksdb.block_cache_bytes must be >= 0");
  }
  if (r.write_buffer_bytes() < 0) {
    return absl::InvalidArgumentError(
        "rocksdb.write_buffer_bytes must be >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfigText(const std::string& text) {
  ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", errors.first()));
  }
  return config;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& p : internal::Presets()) names.emplace_back(p.name);
  return names;
}

absl::StatusOr<std::string> PresetText(const std::string& name) {
  for (const auto& p : internal::Presets()) {
    if (p.name == name) return std::string(p.text);
  }
  return absl::NotFoundError(
      absl::StrCat("no preset config named '", name, "'"));
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& spec) {
  std::string text;
  std::string where = spec;
  auto preset = PresetText(spec);
  if (preset.ok()) {
    text = *preset;
    where = absl::StrCat("preset ", spec);
  } else {
    std::ifstream in(spec);
    if (!in) {
      return absl::NotFoundError(absl::StrCat(
          "model config '", spec, "' is neither a preset nor a readable file"));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto parsed = ParseModelConfigText(text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", parsed.status().message()));
  }
  auto normalized = NormalizeModelConfig(*std::move(parsed));
  if (!normalized.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", normalized.status().message()));
  }
  return normalized;
}

absl::StatusOr<ModelConfig> NormalizeModelConfig(ModelConfig c) {
  if (c.num_dense_features() == 0) c.set_num_dense_features(13);
  for (auto& t : *c.mutable_tables()) {
    if (t.dim() == 0) t.set_dim(c.embedding_dim());
    if (t.multi_hot_size() == 0) t.set_multi_hot_size(1);
    // A dynamic table's rows are its capacity, not a vocabulary to cap.
    if (t.dynamic() &&
        t.admission().kind() == Admission::ADMIT_AFTER_SIGHTINGS &&
        t.admission().min_sightings() == 0) {
      t.mutable_admission()->set_min_sightings(2);
    }
    if (!t.dynamic() && c.max_rows_per_table() > 0 &&
        t.rows() > c.max_rows_per_table()) {
      t.set_rows(c.max_rows_per_table());
    }
  }
  // The MLPerf DLRM-DCNv2 reference's cross network, only under DCN so
  // that other configs print as before.
  if (c.interaction() == INTERACTION_DCN) {
    if (c.dcn_num_layers() == 0) c.set_dcn_num_layers(3);
    if (c.dcn_low_rank_dim() == 0) c.set_dcn_low_rank_dim(512);
  }
  optim::SetDefaults(c.mutable_dense_optimizer());
  optim::SetDefaults(c.mutable_sparse_optimizer());
  // RocksDB defaults only where a table uses the tier, so host-only
  // configs print as before.
  if (UsesRocksDb(c) || c.rocksdb().host_budget_bytes() > 0) {
    RocksDbConfig* rocksdb = c.mutable_rocksdb();
    if (rocksdb->cache_rows() == 0 && rocksdb->cache_fraction() == 0) {
      rocksdb->set_cache_fraction(0.1);
    }
    if (rocksdb->block_cache_bytes() == 0) {
      rocksdb->set_block_cache_bytes(int64_t{256} << 20);
    }
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  if (c.num_dense_features() <= 0 || c.num_dense_features() > kMaxWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_dense_features = ", c.num_dense_features(),
                     " must be in [1, ", kMaxWidth, "]"));
  }
  if (c.tables_size() == 0) {
    return absl::InvalidArgumentError("tables: at least one table is needed");
  }
  if (c.tables_size() > kMaxTables) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tables: ", c.tables_size(), " tables; at most ", kMaxTables));
  }
  std::set<std::string> names;
  for (int i = 0; i < c.tables_size(); ++i) {
    const TableConfig& t = c.tables(i);
    const std::string field = absl::StrCat("tables[", i, "]");
    if (t.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name is empty"));
    }
    if (!IsCleanUtf8(t.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".name is not UTF-8 text (or holds control characters)"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name '", t.name(), "' is not unique"));
    }
    if (t.rows() <= 0 || t.rows() > kMaxRows) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".rows = ", t.rows(), " must be in [1, 2^40]"));
    }
    if (t.dim() <= 0 || t.dim() > kMaxDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".dim = ", t.dim(), " must be in [1, ", kMaxDim,
                       "] (or set embedding_dim)"));
    }
    if (t.multi_hot_size() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".multi_hot_size must be > 0"));
    }
    if (!MultiHotDistribution_IsValid(t.multi_hot_distribution())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".multi_hot_distribution is invalid"));
    }
    if (!Pooling_IsValid(t.pooling())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".pooling is invalid"));
    }
    if (!StorageTier_IsValid(t.storage())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".storage is invalid"));
    }
    if (t.storage() == STORAGE_ROCKSDB && c.rocksdb().path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " (", t.name(),
          ") has storage STORAGE_ROCKSDB but rocksdb.path is empty"));
    }
    RETURN_IF_ERROR(CheckStorageOnDevice(c, i));
    RETURN_IF_ERROR(CheckWeightPrecision(c, i));
    RETURN_IF_ERROR(CheckDynamicTable(c, i));
  }
  if (c.rocksdb().host_budget_bytes() < 0) {
    return absl::InvalidArgumentError("rocksdb.host_budget_bytes must be >= 0");
  }
  if (c.device_budget_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_budget_bytes must be >= 0, got ", c.device_budget_bytes()));
  }
  if (c.rocksdb().host_budget_bytes() > 0 && c.rocksdb().path().empty()) {
    return absl::InvalidArgumentError(
        "rocksdb.host_budget_bytes is set but rocksdb.path is empty (where "
        "tables over the budget would go)");
  }
  if (UsesRocksDb(c) || c.rocksdb().host_budget_bytes() > 0) {
    RETURN_IF_ERROR(ValidateRocksDbConfig(c.rocksdb()));
  }
  if (!IsCleanUtf8(c.rocksdb().path())) {
    return absl::InvalidArgumentError(
        "rocksdb.path is not UTF-8 text (or holds control characters)");
  }
  if (c.bottom_mlp_size() == 0 || c.top_mlp_size() == 0) {
    return absl::InvalidArgumentError(
        "bottom_mlp and top_mlp need at least one layer each");
  }
  RETURN_IF_ERROR(CheckMlp(c.bottom_mlp(), "bottom_mlp"));
  RETURN_IF_ERROR(CheckMlp(c.top_mlp(), "top_mlp"));
  if (c.top_mlp(c.top_mlp_size() - 1) != 1) {
    return absl::InvalidArgumentError("top_mlp must end with 1 (the logit)");
  }
  if (!Interaction_IsValid(c.interaction())) {
    return absl::InvalidArgumentError("interaction is invalid");
  }
  if (c.interaction() == INTERACTION_DOT) {
    const int d = c.bottom_mlp(c.bottom_mlp_size() - 1);
    for (int i = 0; i < c.tables_size(); ++i) {
      if (c.tables(i).dim() != d) {
        return absl::InvalidArgumentError(
            absl::StrCat("tables[", i, "].dim (", c.tables(i).dim(),
                         ") must equal the last bottom_mlp width (", d,
                         ") for the dot interaction"));
      }
    }
  }
  if (c.interaction() == INTERACTION_DCN) {
    if (c.dcn_num_layers() < 1 || c.dcn_num_layers() > kMaxLayers) {
      return absl::InvalidArgumentError(
          absl::StrCat("dcn_num_layers = ", c.dcn_num_layers(),
                       " must be in [1, ", kMaxLayers, "]"));
    }
    if (c.dcn_low_rank_dim() < 1 || c.dcn_low_rank_dim() > kMaxWidth) {
      return absl::InvalidArgumentError(
          absl::StrCat("dcn_low_rank_dim = ", c.dcn_low_rank_dim(),
                       " must be in [1, ", kMaxWidth, "]"));
    }
  }
  for (const InteractionField& f : kInteractionFields) {
    // A setting another interaction would ignore is a mistake in the
    // config, not something to drop silently.
    if (f.owner != c.interaction() && IsSet(c, f.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.name, " is set but interaction is ",
                       Interaction_Name(c.interaction()), ", not ",
                       Interaction_Name(f.owner)));
    }
  }
  if (!ComputeDevice_IsValid(c.device())) {
    return absl::InvalidArgumentError("device is invalid");
  }
  if (!DensePrecision_IsValid(c.dense_precision())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense_precision = ", c.dense_precision(),
        " is invalid (PRECISION_AUTO, PRECISION_FP32 or PRECISION_BF16)"));
  }
  if (c.max_rows_per_table() < 0) {
    return absl::InvalidArgumentError("max_rows_per_table must be >= 0");
  }
  RETURN_IF_ERROR(optim::Validate(c.dense_optimizer(), "dense_optimizer"));
  RETURN_IF_ERROR(
      optim::ValidateSparse(c.sparse_optimizer(), "sparse_optimizer"));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> PlaceTablesOnRocksDb(
    ModelConfig c, const std::vector<std::string>& tables,
    const RocksDbConfig& rocksdb) {
  const bool all = tables.size() == 1 && tables[0] == "all";
  std::set<std::string> wanted(tables.begin(), tables.end());
  for (auto& t : *c.mutable_tables()) {
    if (all || wanted.erase(t.name()) > 0) t.set_storage(STORAGE_ROCKSDB);
  }
  if (!all && !wanted.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no table named '", *wanted.begin(), "' to put on RocksDB"));
  }
  *c.mutable_rocksdb() = rocksdb;
  return NormalizeModelConfig(std::move(c));
}

bool RowsOnRocksDb(const TableConfig& t) {
  return t.storage() == STORAGE_ROCKSDB ||
         (t.storage() == STORAGE_DEVICE && t.device_cache_rows() > 0 &&
          t.device_cache_backing() == STORAGE_ROCKSDB);
}

int64_t CachedRowsOfTable(const ModelConfig& c, int table) {
  return CachedRows(c.rocksdb(), c.tables(table).rows());
}

int64_t CachedRows(const RocksDbConfig& r, int64_t rows) {
  int64_t cached = r.cache_rows();
  if (cached == 0) {
    const double fraction = r.cache_fraction() > 0 ? r.cache_fraction() : 0.1;
    cached =
        static_cast<int64_t>(std::ceil(fraction * static_cast<double>(rows)));
  }
  return std::clamp<int64_t>(cached, 1, std::max<int64_t>(rows, 1));
}

absl::Status ApplyDeviceFlag(std::string_view flag, ModelConfig* config) {
  if (flag.empty()) return absl::OkStatus();
  absl::StatusOr<ComputeDevice> device = ParseDevice(flag);
  if (!device.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", device.status().message()));
  }
  config->set_device(*device);
  for (int i = 0; i < config->tables_size(); ++i) {
    const absl::Status st = CheckStorageOnDevice(*config, i);
    if (!st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device ", std::string(flag), ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

int InteractionOutputDim(const ModelConfig& c) {
  const int d = c.bottom_mlp(c.bottom_mlp_size() - 1);
  if (c.interaction() == INTERACTION_DOT) {
    const int n = c.tables_size() + 1;
    return d + n * (n - 1) / 2;
  }
  int total = d;
  for (const auto& t : c.tables()) total += t.dim();
  return total;
}

int64_t EmbeddingParameterCount(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& t : c.tables()) n += t.rows() * t.dim();
  return n;
}

int64_t DenseParamSpec::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<DenseParamSpec> InteractionParamSpecs(const ModelConfig& c) {
  std::vector<DenseParamSpec> specs;
  if (c.interaction() == INTERACTION_DCN) {
    // TorchRec's LowRankCrossNet shapes, so a state_dict tensor copies over
    // as it is (dense/cross_net.h).
    const int64_t n = InteractionOutputDim(c), r = c.dcn_low_rank_dim();
    for (int l = 0; l < c.dcn_num_layers(); ++l) {
      const std::string layer = absl::StrCat("interaction.crossnet.", l, ".");
      specs.push_back({layer + "V", {r, n}});
      specs.push_back({layer + "W", {n, r}});
      specs.push_back({layer + "bias", {n}});
    }
  }
  return specs;
}

std::vector<std::string> InteractionConfigFields() {
  std::vector<std::string> names;
  for (const InteractionField& f : kInteractionFields) names.push_back(f.name);
  return names;
}

std::string DifferentInteractionField(const ModelConfig& a,
                                      const ModelConfig& b) {
  for (const InteractionField& f : kInteractionFields) {
    if (FieldText(a, f.name) != FieldText(b, f.name)) return f.name;
  }
  return "";
}

std::string InteractionFieldsText(const ModelConfig& c) {
  if (c.interaction() == INTERACTION_DCN) {
    return absl::StrCat(" (", c.dcn_num_layers(), " layers, rank ",
                        c.dcn_low_rank_dim(), ")");
  }
  return "";
}

int64_t DenseParameterCount(const ModelConfig& c) {
  int64_t n = 0;
  int in = c.num_dense_features();
  for (int w : c.bottom_mlp()) {
    n += static_cast<int64_t>(in) * w + w;
    in = w;
  }
  for (const DenseParamSpec& p : InteractionParamSpecs(c)) n += p.size();
  in = InteractionOutputDim(c);
  for (int w : c.top_mlp()) {
    n += static_cast<int64_t>(in) * w + w;
    in = w;
  }
  return n;
}

}  // namespace dlrm
