// The C++ half of tests/model/torchrec_interop_test.py: predictions of a
// checkpoint on given inputs, and a checkpoint of a model of ours trained
// a few steps (what the test exports to TorchRec).
//
//   torchrec_check predict CHECKPOINT_DIR INPUTS.json OUT.json
//     INPUTS.json: {"dense": [[float x num_dense] x B],
//                   "sparse": [{"offsets": [B + 1], "ids": [...]} x tables]}
//     OUT.json: {"probs": [B floats]} (model::Model::Predict)
//   torchrec_check train CONFIG STEPS CHECKPOINT_DIR [VOCABULARY]
//     A model of CONFIG (preset or file) trained STEPS steps of 64 synthetic
//     samples (raw ids from VOCABULARY distinct ones per table, if given),
//     saved with SaveCheckpoint.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "core/config.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "model/checkpoint.h"
#include "model/model.h"

namespace dlrm {
namespace {

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not JSON"));
  }
  return j;
}

// The batch of the inputs `j` (see the top of the file) for `config`;
// json exceptions for another layout.
absl::Status FillBatch(const nlohmann::json& j, const ModelConfig& config,
                       data::Batch* out) {
  data::Batch& batch = *out;
  batch.Reset(config.num_dense_features(), config.tables_size());
  batch.size = static_cast<int64_t>(j.at("dense").size());
  for (const auto& row : j.at("dense")) {
    for (const auto& v : row) batch.dense.push_back(v.get<float>());
  }
  if (j.at("sparse").size() != batch.sparse.size()) {
    return absl::InvalidArgumentError("sparse: one entry per table expected");
  }
  for (size_t k = 0; k < batch.sparse.size(); ++k) {
    batch.sparse[k].offsets =
        j.at("sparse")[k].at("offsets").get<std::vector<int64_t>>();
    batch.sparse[k].ids =
        j.at("sparse")[k].at("ids").get<std::vector<int64_t>>();
  }
  batch.labels.assign(batch.size, 0.0f);  // ignored by Predict
  return absl::OkStatus();
}

absl::Status Predict(const std::string& dir, const std::string& inputs,
                     const std::string& out) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<model::Model> m,
      model::LoadCheckpointOn(dir, /*weights_only=*/true, DEVICE_CPU));
  ASSIGN_OR_RETURN(const nlohmann::json j, ReadJson(inputs));
  data::Batch batch;
  try {
    RETURN_IF_ERROR(FillBatch(j, m->config(), &batch));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(inputs, ": not the expected layout: ", e.what()));
  }
  std::vector<float> probs;
  RETURN_IF_ERROR(m->Predict(batch, &probs));
  std::ofstream o(out);
  o << nlohmann::json{{"probs", probs}}.dump();
  return o ? absl::OkStatus()
           : absl::InternalError(absl::StrCat("cannot write ", out));
}

absl::Status Train(const std::string& spec, const std::string& steps_text,
                   const std::string& dir, const std::string& vocabulary) {
  int steps = 0;
  if (!absl::SimpleAtoi(steps_text, &steps) || steps < 0) {
    return absl::InvalidArgumentError("STEPS must be a count");
  }
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(spec));
  ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m,
                   model::Model::Create(config));
  data::SyntheticOptions options;
  if (!vocabulary.empty() &&
      !absl::SimpleAtoi(vocabulary, &options.vocabulary)) {
    return absl::InvalidArgumentError("VOCABULARY must be a count");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<data::BatchSource> source,
                   data::MakeSyntheticSource(config, options));
  data::Batch batch;
  for (int s = 0; s < steps; ++s) {
    ASSIGN_OR_RETURN(const bool more, source->Next(64, &batch));
    if (!more) break;
    RETURN_IF_ERROR(m->TrainStep(batch).status());
  }
  return model::SaveCheckpoint(*m, dir).status();
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  absl::Status s;
  if (cmd == "predict" && argc == 5) {
    s = dlrm::Predict(argv[2], argv[3], argv[4]);
  } else if (cmd == "train" && (argc == 5 || argc == 6)) {
    s = dlrm::Train(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : "");
  } else {
    std::fprintf(stderr,
                 "usage: torchrec_check predict CHECKPOINT INPUTS.json "
                 "OUT.json | train CONFIG STEPS CHECKPOINT [VOCABULARY]\n");
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "torchrec_check: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
