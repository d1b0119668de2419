// Fuzzes the model-config path a user's file takes: text-format parsing,
// normalisation and validation, then everything the server derives from a
// config that passed (parameter counts, the interaction width, RocksDB
// cache sizes). UBSan catches overflow in the derived sizes.
#include <cstdint>
#include <string>

#include "core/config.h"
#include "google/protobuf/text_format.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = dlrm::ParseModelConfigText(text);
  if (!parsed.ok()) {
    dlrm::fuzz::CheckInvalidArgument(parsed.status(),
                                     "a parse error is InvalidArgument");
    return 0;
  }
  auto config = dlrm::NormalizeModelConfig(*parsed);
  if (!config.ok()) {
    dlrm::fuzz::CheckInvalidArgument(config.status(),
                                     "a bad config is InvalidArgument");
    return 0;
  }
  // A normalised config is a fixed point of normalisation.
  auto again = dlrm::NormalizeModelConfig(*config);
  dlrm::fuzz::CheckOk(again.status(), "normalising a normalised config");
  dlrm::fuzz::Check(again->SerializeAsString() == config->SerializeAsString(),
                    "normalisation is idempotent");
  // The server sends the config in GetModelInfo and stores it in every
  // checkpoint: it must parse back (proto3 strings must be UTF-8).
  dlrm::ModelConfig wire;
  dlrm::fuzz::Check(wire.ParseFromString(config->SerializeAsString()),
                    "an accepted config survives the binary round trip");

  const int width = dlrm::InteractionOutputDim(*config);
  dlrm::fuzz::Check(width > 0, "the interaction width is positive");
  dlrm::fuzz::Check(dlrm::EmbeddingParameterCount(*config) > 0,
                    "embedding parameter count is positive");
  dlrm::fuzz::Check(dlrm::DenseParameterCount(*config) > 0,
                    "dense parameter count is positive");
  for (int t = 0; t < config->tables_size(); ++t) {
    if (config->tables(t).storage() != dlrm::STORAGE_ROCKSDB) continue;
    const int64_t rows = dlrm::CachedRowsOfTable(*config, t);
    dlrm::fuzz::Check(rows >= 1 && rows <= config->tables(t).rows(),
                      "cached rows in [1, rows]");
  }
  // Text round trip: what the server prints (GetModelInfo, checkpoints)
  // parses back to the same config.
  std::string printed;
  dlrm::fuzz::Check(
      google::protobuf::TextFormat::PrintToString(*config, &printed),
      "printing a config");
  auto reparsed = dlrm::ParseModelConfigText(printed);
  dlrm::fuzz::CheckOk(reparsed.status(), "re-parsing a printed config");
  return 0;
}
