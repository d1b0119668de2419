// Conversion between the wire Batch (proto/dlrm/service.proto: columnar,
// bag lengths) and data::Batch (offsets), with the validation every batch
// from a client passes before it reaches a model. Library dlrm_wire (no
// gRPC): the server and the clients share it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "data/batch.h"
#include "dlrm/service.pb.h"

namespace dlrm::data {

// What a batch must look like to fit a model.
struct BatchShape {
  // Dense features per sample. Default: 13.
  int num_dense = 13;
  // The bound each table's ids stay below, in ModelConfig.tables order
  // (data::TableIdLimits: a static table's rows, kDynamicIdLimit for a
  // dynamic one). Default: empty.
  std::vector<int64_t> id_limits;
};

// Whether a conversion needs labels.
enum class Labels {
  // Training and evaluation: batch.labels must hold size values, each 0 or 1.
  kRequired,
  // Prediction: batch.labels is not read; the result has all-zero labels
  // (data::Batch always carries them).
  kIgnored,
};

// Checks `in` against `shape` and converts it into `out` (replaced; its
// capacity is reused). `field` names the batch in error messages (e.g.
// "batch" or "batches[2]"). InvalidArgument naming the field and the sample
// for: size < 1 or above `max_samples` (0 = no limit), wrong dense or
// sparse counts, NaN/Inf dense values, lengths that are negative or do not
// sum to the id count, ids out of range (negative, or at or past
// the table's id limit), labels missing or not 0/1. On
// error `out` is unspecified.
absl::Status BatchFromProto(const dlrm::Batch& in, const BatchShape& shape,
                            Labels labels, int64_t max_samples,
                            absl::string_view field, data::Batch* out);

// Writes `in` (a batch with well-formed offsets) into `out` (replaced).
// Labels are written only with `include_labels`.
void BatchToProto(const data::Batch& in, bool include_labels, dlrm::Batch* out);

}  // namespace dlrm::data
