// Which fields of a ModelConfig may change once a model has trained: on a
// resume with another config (docs/checkpoints.md "Resuming with another
// config") and, for the optimizers' rates, live (Admin.SetLearningRate).
// One table (kConfigFieldRules in config_change.cc) decides per field, and
// an interaction's own fields (InteractionConfigFields) are immutable.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "dlrm/config.pb.h"

namespace dlrm {

// Whether a field may differ between a checkpoint's config and the config
// a resumed run is given.
enum class FieldMutability {
  // How the model trains or where it runs, not what its weights mean
  // (learning rates, schedules, storage tiers, device): the new value is
  // applied.
  kMutable,
  // The architecture or the meaning of the saved weights and state (table
  // rows and dims, MLP widths, interaction, optimizer types, seed): a
  // difference is refused.
  kImmutable,
};

// One field that differs between two configs.
struct ConfigDifference {
  // The field's path, "sparse_optimizer.learning_rate", "tables[3].rows",
  // "tables" (the number of tables).
  std::string field;
  // Its values in the two configs, as text ("0.1", "[512, 256, 64]").
  std::string before, after;
  FieldMutability mutability = FieldMutability::kImmutable;
  // "resume: <field> <before> -> <after>".
  std::string ToString() const;
};

// The rule of the field at `path` (dotted, without repeated indices:
// "tables.rows", "dense_optimizer.schedule.warmup_steps"): that of the
// longest entry of the table that is the path or a message above it.
// NotFound for a path the table does not cover (the tests hold every field
// of ModelConfig covered).
absl::StatusOr<FieldMutability> FieldRule(std::string_view path);

// Every leaf field of `saved` and `next` (both normalised) that differs, in
// field order, each with its rule. A different number of tables is one
// difference, "tables", and their fields are not compared further.
std::vector<ConfigDifference> DiffConfigs(const ModelConfig& saved,
                                          const ModelConfig& next);

// The config a run resumed from a checkpoint of `saved` with the config
// `next` (both normalised) uses: `next`, when every difference is mutable,
// with those differences in *changes (may be null). FailedPrecondition
// naming the first immutable field that differs and both values
// ("tables[3].rows: the checkpoint has 1000, the config 2000"), with the
// other immutable differences after it.
absl::StatusOr<ModelConfig> ResumeConfig(
    const ModelConfig& saved, const ModelConfig& next,
    std::vector<ConfigDifference>* changes);

// Every field path kConfigFieldRules lists, in its order, then the
// interactions' fields (InteractionConfigFields) (for the tests
// that hold the table complete).
std::vector<std::string> ConfigFieldRulePaths();

}  // namespace dlrm
