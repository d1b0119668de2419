// The checkpoint's layout.json (model/checkpoint_layout.h): a SavedLayout
// written as JSON and read back, checked against the config.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "model/checkpoint_layout.h"

namespace dlrm::model {

std::string LayoutToJson(const SavedLayout& layout, const ModelConfig& config) {
  nlohmann::json tables = nlohmann::json::array();
  for (int k = 0; k < config.tables_size(); ++k) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const SavedShard& b : layout.tables[k]) {
      nlohmann::json j = {{"rank", b.rank},
                          {"row_begin", b.row_begin},
                          {"row_end", b.row_end},
                          {"col_begin", b.col_begin},
                          {"col_end", b.col_end},
                          {"tier", b.rocksdb_dir.empty() ? "host" : "rocksdb"}};
      if (!b.base.empty()) j["tensors"] = b.base;
      blocks.push_back(std::move(j));
    }
    tables.push_back({{"name", config.tables(k).name()}, {"blocks", blocks}});
  }
  const nlohmann::json json = {
      {"version", 1}, {"world_size", layout.world_size}, {"tables", tables}};
  return json.dump(2) + "\n";
}

absl::StatusOr<SavedLayout> LayoutFromJson(const std::string& text,
                                           const ModelConfig& config,
                                           const std::string& path) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint layout ", path, ": ", what));
  };
  const nlohmann::json json =
      nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("world_size") ||
      !json["world_size"].is_number_integer() || !json.contains("tables") ||
      !json["tables"].is_array()) {
    return bad("not a layout");
  }
  SavedLayout layout;
  layout.world_size = json["world_size"].get<int>();
  layout.dense_weights_file = layout.dense_state_file = kDenseFile;
  const nlohmann::json& tables = json["tables"];
  if (static_cast<int>(tables.size()) != config.tables_size()) {
    return bad(absl::StrCat(tables.size(), " tables, the config has ",
                            config.tables_size()));
  }
  for (int k = 0; k < config.tables_size(); ++k) {
    const nlohmann::json& t = tables[k];
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
        t["name"].get<std::string>() != config.tables(k).name() ||
        !t.contains("blocks") || !t["blocks"].is_array()) {
      return bad(absl::StrCat("tables[", k, "] is not table ",
                              config.tables(k).name()));
    }
    std::vector<SavedShard>& blocks = layout.tables.emplace_back();
    for (const nlohmann::json& j : t["blocks"]) {
      SavedShard b;
      for (const char* key :
           {"rank", "row_begin", "row_end", "col_begin", "col_end"}) {
        if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) {
          return bad(absl::StrCat("a block of table ", config.tables(k).name(),
                                  " lacks ", key));
        }
      }
      b.rank = j["rank"].get<int>();
      b.row_begin = j["row_begin"].get<int64_t>();
      b.row_end = j["row_end"].get<int64_t>();
      b.col_begin = j["col_begin"].get<int>();
      b.col_end = j["col_end"].get<int>();
      const std::string tier =
          j.contains("tier") && j["tier"].is_string() ? j["tier"] : "";
      if (tier == "rocksdb") {
        b.rocksdb_dir = RankRocksDbDir(b.rank);
      } else if (tier == "host" && j.contains("tensors") &&
                 j["tensors"].is_string()) {
        b.weights_file = b.state_file = RankFileName(b.rank);
        b.base = j["tensors"].get<std::string>();
        b.step_key = "table_step." + b.base;
      } else {
        return bad(absl::StrCat("a block of table ", config.tables(k).name(),
                                " has no tier"));
      }
      blocks.push_back(std::move(b));
    }
  }
  if (absl::Status s = layout.Validate(config); !s.ok()) {
    return bad(std::string(s.message()));
  }
  return layout;
}

}  // namespace dlrm::model
