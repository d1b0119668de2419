// What may change in a ModelConfig once a model has trained: the one table
// of rules and the field-by-field comparison over protobuf reflection.
#include "core/config_change.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config.h"

namespace dlrm {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

struct FieldRuleEntry {
  const char* path;
  FieldMutability mutability;
};

constexpr FieldMutability kMutable = FieldMutability::kMutable;
constexpr FieldMutability kImmutable = FieldMutability::kImmutable;

// Every field of ModelConfig (proto/dlrm/config.proto) but the
// interactions' own (InteractionConfigFields, immutable: they shape the
// interaction's parameters): an entry for a message covers its fields that
// have none of their own. Mutable is what
// changes how the model trains or where its rows and dense part live;
// immutable is what the saved weights and optimizer state mean.
constexpr FieldRuleEntry kConfigFieldRules[] = {
    {"num_dense_features", kImmutable},
    {"embedding_dim", kImmutable},
    // The number of tables too.
    {"tables", kImmutable},
    {"tables.name", kImmutable},
    {"tables.rows", kImmutable},
    {"tables.dim", kImmutable},
    {"tables.pooling", kImmutable},
    // The ids a Criteo sample's bag holds: what the rows were trained on.
    {"tables.multi_hot_size", kImmutable},
    // A restore reshards and moves rows between tiers (docs/checkpoints.md).
    {"tables.sharding", kMutable},
    {"tables.shard_ranks", kMutable},
    {"tables.storage", kMutable},
    {"tables.multi_hot_distribution", kMutable},
    {"tables.device_cache_rows", kMutable},
    {"tables.device_cache_backing", kMutable},
    // What the ids mean: raw ids through the map, or rows.
    {"tables.dynamic", kImmutable},
    // Which ids get rows from here on, and what the kept row does.
    {"tables.admission", kMutable},
    {"tables.eviction", kMutable},
    {"tables.unadmitted", kMutable},
    // A restore converts the saved rows: exactly into a wider precision,
    // rounded to nearest into a narrower one (docs/storage.md).
    {"tables.weight_precision", kMutable},
    {"bottom_mlp", kImmutable},
    {"top_mlp", kImmutable},
    {"interaction", kImmutable},
    // The type fixes the optimizer state; the initial accumulator is the
    // state of rows never touched yet (RocksDB initialises them on read).
    {"dense_optimizer.type", kImmutable},
    {"dense_optimizer.initial_accumulator", kImmutable},
    {"dense_optimizer", kMutable},  // rate, schedule, eps, betas, decay, ...
    {"sparse_optimizer.type", kImmutable},
    {"sparse_optimizer.initial_accumulator", kImmutable},
    {"sparse_optimizer", kMutable},
    // Initial values of rows never touched yet.
    {"seed", kImmutable},
    {"max_rows_per_table", kImmutable},
    // Scratch directory, cache sizes, eviction, budget: where rows live.
    {"rocksdb", kMutable},
    {"device", kMutable},
    {"dense_precision", kMutable},
    {"gpu_disable_tf32", kMutable},
    {"device_budget_bytes", kMutable},
    {"gpu_cuda_graphs", kMutable},
};

// Text of one value of `field` (index < 0: a singular field).
std::string ValueText(const Message& m, const FieldDescriptor* field,
                      int index) {
  std::string out;
  google::protobuf::TextFormat::PrintFieldValueToString(m, field, index, &out);
  return out;
}

std::string RepeatedText(const Message& m, const FieldDescriptor* field) {
  const int n = m.GetReflection()->FieldSize(m, field);
  std::vector<std::string> values;
  for (int i = 0; i < n; ++i) values.push_back(ValueText(m, field, i));
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

bool SameValue(const Message& a, const Message& b, const FieldDescriptor* f,
               int i) {
  const Reflection* ra = a.GetReflection();
  const Reflection* rb = b.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
#define DLRM_SAME(CPP, T)                                                   \
  case FieldDescriptor::CPP:                                                \
    return rep ? ra->GetRepeated##T(a, f, i) == rb->GetRepeated##T(b, f, i) \
               : ra->Get##T(a, f) == rb->Get##T(b, f);
    DLRM_SAME(CPPTYPE_INT32, Int32)
    DLRM_SAME(CPPTYPE_INT64, Int64)
    DLRM_SAME(CPPTYPE_UINT32, UInt32)
    DLRM_SAME(CPPTYPE_UINT64, UInt64)
    DLRM_SAME(CPPTYPE_DOUBLE, Double)
    DLRM_SAME(CPPTYPE_FLOAT, Float)
    DLRM_SAME(CPPTYPE_BOOL, Bool)
    DLRM_SAME(CPPTYPE_ENUM, EnumValue)
    DLRM_SAME(CPPTYPE_STRING, String)
#undef DLRM_SAME
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return false;
}

FieldMutability RuleOrImmutable(const std::string& path) {
  absl::StatusOr<FieldMutability> rule = FieldRule(path);
  return rule.ok() ? *rule : kImmutable;
}

// Appends the differing leaves of `a` and `b` (same type) to *out. `shown`
// names the message ("tables[2]."), `rule` its rule path ("tables.").
void Diff(const Message& a, const Message& b, const std::string& shown,
          const std::string& rule, std::vector<ConfigDifference>* out) {
  const google::protobuf::Descriptor* d = a.GetDescriptor();
  const Reflection* ra = a.GetReflection();
  const Reflection* rb = b.GetReflection();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    const std::string name = shown + f->name();
    const std::string rule_path = rule + f->name();
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) {
        Diff(ra->GetMessage(a, f), rb->GetMessage(b, f), name + ".",
             rule_path + ".", out);
        continue;
      }
      const int na = ra->FieldSize(a, f), nb = rb->FieldSize(b, f);
      if (na != nb) {
        out->push_back({name, absl::StrCat(na, " entries"),
                        absl::StrCat(nb, " entries"),
                        RuleOrImmutable(rule_path)});
        continue;
      }
      for (int i = 0; i < na; ++i) {
        Diff(ra->GetRepeatedMessage(a, f, i), rb->GetRepeatedMessage(b, f, i),
             absl::StrCat(name, "[", i, "]."), rule_path + ".", out);
      }
      continue;
    }
    bool same = true;
    if (f->is_repeated()) {
      const int na = ra->FieldSize(a, f), nb = rb->FieldSize(b, f);
      same = na == nb;
      for (int i = 0; same && i < na; ++i) same = SameValue(a, b, f, i);
      if (!same) {
        out->push_back({name, RepeatedText(a, f), RepeatedText(b, f),
                        RuleOrImmutable(rule_path)});
      }
      continue;
    }
    if (!SameValue(a, b, f, -1)) {
      out->push_back({name, ValueText(a, f, -1), ValueText(b, f, -1),
                      RuleOrImmutable(rule_path)});
    }
  }
}

}  // namespace

std::string ConfigDifference::ToString() const {
  return absl::StrCat("resume: ", field, " ", before, " -> ", after);
}

absl::StatusOr<FieldMutability> FieldRule(std::string_view path) {
  for (const std::string& field : InteractionConfigFields()) {
    if (path == field) return kImmutable;
  }
  const FieldRuleEntry* best = nullptr;
  size_t best_length = 0;
  for (const FieldRuleEntry& e : kConfigFieldRules) {
    const std::string_view p = e.path;
    const bool covers =
        path == p || (path.size() > p.size() && path.substr(0, p.size()) == p &&
                      path[p.size()] == '.');
    if (covers && p.size() >= best_length) {
      best = &e;
      best_length = p.size();
    }
  }
  if (best == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no rule for the config field ", std::string(path)));
  }
  return best->mutability;
}

std::vector<ConfigDifference> DiffConfigs(const ModelConfig& saved,
                                          const ModelConfig& next) {
  std::vector<ConfigDifference> out;
  Diff(saved, next, "", "", &out);
  return out;
}

absl::StatusOr<ModelConfig> ResumeConfig(
    const ModelConfig& saved, const ModelConfig& next,
    std::vector<ConfigDifference>* changes) {
  std::vector<ConfigDifference> refused, applied;
  for (ConfigDifference& d : DiffConfigs(saved, next)) {
    (d.mutability == kMutable ? applied : refused).push_back(std::move(d));
  }
  if (!refused.empty()) {
    std::vector<std::string> parts;
    for (const ConfigDifference& d : refused) {
      parts.push_back(absl::StrCat(d.field, ": the checkpoint has ", d.before,
                                   ", the config ", d.after));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the config differs from the checkpoint's in what a resumed model "
        "cannot change: ",
        absl::StrJoin(parts, "; "),
        " (resume with the checkpoint's config, or start afresh with "
        "--no-resume)"));
  }
  if (changes != nullptr) *changes = std::move(applied);
  return next;
}

std::vector<std::string> ConfigFieldRulePaths() {
  std::vector<std::string> out;
  for (const FieldRuleEntry& e : kConfigFieldRules) out.push_back(e.path);
  for (std::string& field : InteractionConfigFields()) {
    out.push_back(std::move(field));
  }
  return out;
}

}  // namespace dlrm
