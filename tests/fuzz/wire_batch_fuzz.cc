// Fuzzes the gate every client batch passes: a serialized dlrm.Batch (the
// bytes a Train or Predict message carries) through BatchFromProto, and the
// same fields taken as a raw data::Batch through Batch::Validate. What
// passes must be a well-formed batch: it validates, survives Slice/Append,
// and round-trips through BatchToProto.
#include <cstdint>
#include <vector>

#include "data/batch.h"
#include "data/wire.h"
#include "dlrm/service.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using dlrm::data::Labels;

// A small model: 2 dense features, tables of 1, 5 and 2^40 rows.
dlrm::data::BatchShape Shape() {
  dlrm::data::BatchShape shape;
  shape.num_dense = 2;
  shape.id_limits = {1, 5, int64_t{1} << 40};
  return shape;
}

void CheckWellFormed(const dlrm::data::Batch& b,
                     const dlrm::data::BatchShape& shape) {
  dlrm::fuzz::CheckOk(b.Validate(shape.num_dense, shape.id_limits),
                      "a batch BatchFromProto accepted validates");
  dlrm::data::Batch half;
  b.Slice(b.size / 2, b.size, &half);
  dlrm::data::Batch joined;
  b.Slice(0, b.size / 2, &joined);
  joined.Append(half);
  dlrm::fuzz::CheckOk(joined.Validate(shape.num_dense, shape.id_limits),
                      "slices appended back together validate");
  dlrm::fuzz::Check(joined.dense == b.dense && joined.labels == b.labels,
                    "slices appended back together are the batch");
  dlrm::Batch wire;
  dlrm::data::BatchToProto(b, true, &wire);
  dlrm::data::Batch back;
  dlrm::fuzz::CheckOk(dlrm::data::BatchFromProto(wire, shape, Labels::kRequired,
                                                 0, "round trip", &back),
                      "BatchToProto output is accepted");
  dlrm::fuzz::Check(back.dense == b.dense && back.labels == b.labels,
                    "the proto round trip keeps the batch");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dlrm::Batch in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  const dlrm::data::BatchShape shape = Shape();

  dlrm::data::Batch out;
  for (const Labels labels : {Labels::kRequired, Labels::kIgnored}) {
    for (const int64_t max_samples : {int64_t{0}, int64_t{16}}) {
      const absl::Status status = dlrm::data::BatchFromProto(
          in, shape, labels, max_samples, "batch", &out);
      if (!status.ok()) {
        dlrm::fuzz::CheckInvalidArgument(status,
                                         "a bad wire batch is InvalidArgument");
        continue;
      }
      CheckWellFormed(out, shape);
    }
  }

  // The same fields as an unchecked data::Batch, lengths read as offsets:
  // Validate is the model's own gate and must reject, not crash on, any of
  // it.
  dlrm::data::Batch raw;
  raw.size = in.size();
  raw.num_dense = shape.num_dense;
  raw.dense.assign(in.dense().begin(), in.dense().end());
  raw.labels.assign(in.labels().begin(), in.labels().end());
  for (const dlrm::SparseIds& s : in.sparse()) {
    dlrm::data::SparseFeature f;
    f.offsets.assign(s.lengths().begin(), s.lengths().end());
    f.ids.assign(s.ids().begin(), s.ids().end());
    raw.sparse.push_back(std::move(f));
  }
  if (raw.Validate(shape.num_dense, shape.id_limits).ok()) {
    CheckWellFormed(raw, shape);
  }
  return 0;
}
