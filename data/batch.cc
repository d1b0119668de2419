// Batch: reset, validation against a model's shape, slicing and appending.
// Validate is the gate for untrusted input, so it checks every size before
// it indexes anything.
#include "data/batch.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dlrm::data {
namespace {

absl::Status ValidateSparse(const SparseFeature& f, int t, int64_t size,
                            int64_t rows) {
  const int64_t num_offsets = static_cast<int64_t>(f.offsets.size());
  if (num_offsets != size + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse[", t, "].offsets must have size+1 = ", size + 1,
                     " entries, has ", num_offsets));
  }
  if (f.offsets[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse[", t, "].offsets[0] = ", f.offsets[0], " must be 0"));
  }
  for (int64_t s = 0; s < size; ++s) {
    if (f.offsets[s + 1] < f.offsets[s]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse[", t, "].offsets[", s + 1, "] = ", f.offsets[s + 1],
          " is less than offsets[", s, "] = ", f.offsets[s], " (sample ", s,
          "): offsets must be non-decreasing"));
    }
  }
  const int64_t num_ids = static_cast<int64_t>(f.ids.size());
  if (f.offsets[size] != num_ids) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse[", t, "].offsets[", size, "] = ", f.offsets[size],
                     " must equal ids.size() = ", num_ids));
  }
  // Offsets are now known to be in range, so the per-bag loop only looks for
  // the first bad id; the fast scan keeps the common (valid) case cheap.
  const int64_t* ids = f.ids.data();
  bool all_in_range = true;
  for (int64_t i = 0; i < num_ids; ++i) {
    all_in_range &= static_cast<uint64_t>(ids[i]) < static_cast<uint64_t>(rows);
  }
  if (all_in_range) return absl::OkStatus();
  for (int64_t s = 0; s < size; ++s) {
    for (int64_t i = f.offsets[s]; i < f.offsets[s + 1]; ++i) {
      if (ids[i] < 0 || ids[i] >= rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("sparse[", t, "].ids[", i, "] (sample ", s,
                         ") = ", ids[i], " is out of range [0, ", rows, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

void Batch::Reset(int num_dense_features, int num_sparse) {
  size = 0;
  num_dense = num_dense_features;
  dense.clear();
  labels.clear();
  sparse.resize(std::max(num_sparse, 0));
  for (SparseFeature& f : sparse) {
    f.offsets.assign(1, 0);
    f.ids.clear();
  }
}

absl::Status Batch::Validate(int num_dense_features,
                             std::span<const int64_t> table_rows) const {
  if (size == 0) return absl::InvalidArgumentError("batch is empty");
  if (size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size ", size, " is negative"));
  }
  if (num_dense != num_dense_features) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch has num_dense = ", num_dense, ", the model has ",
                     num_dense_features, " dense features"));
  }
  const int64_t num_tables = static_cast<int64_t>(table_rows.size());
  if (static_cast<int64_t>(sparse.size()) != num_tables) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch has ", sparse.size(), " sparse features, the model has ",
        num_tables, " tables"));
  }
  // Labels first: their count bounds size by what memory holds, so the
  // dense product below cannot overflow.
  if (static_cast<int64_t>(labels.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "labels must have size = ", size, " entries, has ", labels.size()));
  }
  if (num_dense < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch has num_dense = ", num_dense, " (negative)"));
  }
  const int64_t expected_dense = size * num_dense;
  if (static_cast<int64_t>(dense.size()) != expected_dense) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dense must have size x num_dense = ", size, " x ", num_dense, " = ",
        expected_dense, " values, has ", dense.size()));
  }
  for (int64_t i = 0; i < expected_dense; ++i) {
    if (!std::isfinite(dense[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dense[sample ", i / num_dense, ", feature ", i % num_dense, "] is ",
          std::isnan(dense[i]) ? "NaN" : (dense[i] > 0 ? "+inf" : "-inf")));
    }
  }
  for (int64_t s = 0; s < size; ++s) {
    if (labels[s] != 0.0f && labels[s] != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("labels[", s, "] = ", labels[s], " must be 0 or 1"));
    }
  }
  for (int64_t t = 0; t < num_tables; ++t) {
    if (table_rows[t] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t, " has ", table_rows[t],
                       " rows; it must have at least 1"));
    }
    absl::Status status =
        ValidateSparse(sparse[t], static_cast<int>(t), size, table_rows[t]);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

void Batch::Slice(int64_t begin, int64_t end, Batch* out) const {
  if (out == this) {
    Batch copy;
    Slice(begin, end, &copy);
    *out = std::move(copy);
    return;
  }
  begin = std::clamp<int64_t>(begin, 0, size);
  end = std::clamp<int64_t>(end, begin, size);
  out->Reset(num_dense, static_cast<int>(sparse.size()));
  out->size = end - begin;
  out->dense.assign(dense.begin() + begin * num_dense,
                    dense.begin() + end * num_dense);
  out->labels.assign(labels.begin() + begin, labels.begin() + end);
  for (size_t t = 0; t < sparse.size(); ++t) {
    const SparseFeature& in = sparse[t];
    SparseFeature& f = out->sparse[t];
    const int64_t base = in.offsets[begin];
    f.offsets.resize(out->size + 1);
    for (int64_t s = 0; s <= out->size; ++s) {
      f.offsets[s] = in.offsets[begin + s] - base;
    }
    f.ids.assign(in.ids.begin() + base, in.ids.begin() + in.offsets[end]);
  }
}

void Batch::Append(const Batch& other) {
  if (&other == this) {
    const Batch copy = other;
    Append(copy);
    return;
  }
  // A default-constructed (unshaped) batch takes the shape of `other`.
  if (size == 0 && sparse.empty() && dense.empty()) {
    Reset(other.num_dense, static_cast<int>(other.sparse.size()));
  }
  dense.insert(dense.end(), other.dense.begin(), other.dense.end());
  labels.insert(labels.end(), other.labels.begin(), other.labels.end());
  const size_t num_sparse = std::min(sparse.size(), other.sparse.size());
  for (size_t t = 0; t < num_sparse; ++t) {
    SparseFeature& f = sparse[t];
    const SparseFeature& o = other.sparse[t];
    if (f.offsets.empty()) f.offsets.push_back(0);
    if (o.offsets.empty()) continue;
    const int64_t shift = f.offsets.back() - o.offsets.front();
    for (size_t s = 1; s < o.offsets.size(); ++s) {
      f.offsets.push_back(o.offsets[s] + shift);
    }
    f.ids.insert(f.ids.end(), o.ids.begin(), o.ids.end());
  }
  size += other.size;
}

}  // namespace dlrm::data
