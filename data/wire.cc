// Wire batch validation and conversion. Every size is checked before it is
// used to index anything, because the input comes straight off the network.
#include "data/wire.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dlrm::data {
namespace {

absl::Status Invalid(absl::string_view field, auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(field, parts...));
}

const char* NonFiniteName(float v) {
  if (std::isnan(v)) return "NaN";
  return v > 0 ? "+Inf" : "-Inf";
}

absl::Status ConvertSparse(const dlrm::SparseIds& in, int t, int64_t size,
                           int64_t rows, absl::string_view field,
                           data::SparseFeature* out) {
  const std::string name = absl::StrCat(field, ".sparse[", t, "]");
  if (in.lengths_size() != size) {
    return Invalid(name, ".lengths has ", in.lengths_size(),
                   " entries, expected one per sample (", size, ")");
  }
  out->offsets.resize(size + 1);
  out->offsets[0] = 0;
  int64_t total = 0;
  for (int64_t s = 0; s < size; ++s) {
    const int32_t len = in.lengths(static_cast<int>(s));
    if (len < 0) {
      return Invalid(name, ".lengths[", s, "] (sample ", s, "): length ", len,
                     " is negative");
    }
    total += len;
    out->offsets[s + 1] = total;
  }
  if (total != in.ids_size()) {
    return Invalid(name, ".lengths sum to ", total, " but ", name, ".ids has ",
                   in.ids_size(), " ids");
  }
  const int64_t* ids = in.ids().data();
  bool all_in_range = true;
  for (int64_t i = 0; i < total; ++i) {
    all_in_range &= static_cast<uint64_t>(ids[i]) < static_cast<uint64_t>(rows);
  }
  if (!all_in_range) {
    for (int64_t s = 0; s < size; ++s) {
      for (int64_t i = out->offsets[s]; i < out->offsets[s + 1]; ++i) {
        if (ids[i] < 0 || ids[i] >= rows) {
          return Invalid(
              name, ".ids[", i, "] (sample ", s, "): id ", ids[i],
              rows == kDynamicIdLimit
                  ? " out of range: a dynamic table's ids are raw ids in "
                    "[0, 2^63 - 1)"
                  : absl::StrCat(" out of range [0, ", rows, ")"));
        }
      }
    }
  }
  out->ids.assign(ids, ids + total);
  return absl::OkStatus();
}

}  // namespace

absl::Status BatchFromProto(const dlrm::Batch& in, const BatchShape& shape,
                            Labels labels, int64_t max_samples,
                            absl::string_view field, data::Batch* out) {
  const int64_t size = in.size();
  if (size < 1) {
    return Invalid(field, ".size = ", size,
                   ": a batch needs at least 1 sample");
  }
  if (max_samples > 0 && size > max_samples) {
    return Invalid(field, ".size = ", size, " exceeds the limit of ",
                   max_samples, " samples per batch");
  }
  // No repeated field holds more entries than this, so a larger size cannot
  // be described, and the products below stay far from overflowing.
  if (size > std::numeric_limits<int>::max()) {
    return Invalid(field, ".size = ", size,
                   " exceeds the most samples a message can describe (",
                   std::numeric_limits<int>::max(), ")");
  }
  const int64_t num_dense = shape.num_dense;
  if (in.dense_size() != size * num_dense) {
    return Invalid(field, ".dense has ", in.dense_size(),
                   " values, expected size x num_dense_features = ", size,
                   " x ", num_dense, " = ", size * num_dense);
  }
  const int num_tables = static_cast<int>(shape.id_limits.size());
  if (in.sparse_size() != num_tables) {
    return Invalid(field, ".sparse has ", in.sparse_size(),
                   " features, the model has ", num_tables, " tables");
  }
  if (labels == Labels::kRequired && in.labels_size() != size) {
    return Invalid(field, ".labels has ", in.labels_size(),
                   " values, expected one per sample (", size, ")");
  }
  const float* dense = in.dense().data();
  for (int64_t i = 0; i < size * num_dense; ++i) {
    if (!std::isfinite(dense[i])) {
      return Invalid(field, ".dense[", i, "] (sample ", i / num_dense,
                     ", feature ", i % num_dense, "): value is ",
                     NonFiniteName(dense[i]));
    }
  }
  if (labels == Labels::kRequired) {
    for (int64_t s = 0; s < size; ++s) {
      const float y = in.labels(static_cast<int>(s));
      if (y != 0.0f && y != 1.0f) {
        return Invalid(field, ".labels[", s, "] (sample ", s, "): label ", y,
                       " must be 0 or 1");
      }
    }
  }
  out->Reset(shape.num_dense, num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const absl::Status status = ConvertSparse(
        in.sparse(t), t, size, shape.id_limits[t], field, &out->sparse[t]);
    if (!status.ok()) return status;
  }
  out->size = size;
  out->dense.assign(dense, dense + size * num_dense);
  if (labels == Labels::kRequired) {
    out->labels.assign(in.labels().begin(), in.labels().end());
  } else {
    out->labels.assign(size, 0.0f);
  }
  return absl::OkStatus();
}

void BatchToProto(const data::Batch& in, bool include_labels,
                  dlrm::Batch* out) {
  out->Clear();
  out->set_size(in.size);
  out->mutable_dense()->Add(in.dense.begin(), in.dense.end());
  if (include_labels) {
    out->mutable_labels()->Add(in.labels.begin(), in.labels.end());
  }
  for (const data::SparseFeature& f : in.sparse) {
    dlrm::SparseIds* ids = out->add_sparse();
    ids->mutable_lengths()->Reserve(static_cast<int>(f.num_bags()));
    for (int64_t s = 0; s < f.num_bags(); ++s) {
      ids->add_lengths(static_cast<int32_t>(f.bag_size(s)));
    }
    ids->mutable_ids()->Add(f.ids.begin(), f.ids.end());
  }
}

}  // namespace dlrm::data
