// Batch: reset, validation against a model's shape, slicing and appending.
// Validate is the gate for untrusted input, so it checks every size before
// it indexes anything.
#include "data/batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
        return absl::InvalidArgumentError(absl::StrCat(
            "sparse[", t, "].ids[", i, "] (sample ", s, ") = ", ids[i],
            rows == kDynamicIdLimit
                ? " is out of range: a dynamic table's ids are raw ids in "
                  "[0, 2^63 - 1)"
                : absl::StrCat(" is out of range [0, ", rows, ")")));
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

std::vector<int64_t> TableIdLimits(const ModelConfig& config) {
  std::vector<int64_t> limits;
  limits.reserve(config.tables_size());
  for (const TableConfig& t : config.tables()) {
    limits.push_back(t.dynamic() ? kDynamicIdLimit : t.rows());
  }
  return limits;
}

absl::Status Batch::Validate(int num_dense_features,
                             std::span<const int64_t> id_limits) const {
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
  const int64_t num_tables = static_cast<int64_t>(id_limits.size());
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
    if (id_limits[t] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t, " has ", id_limits[t],
                       " rows; it must have at least 1"));
    }
    absl::Status status =
        ValidateSparse(sparse[t], static_cast<int>(t), size, id_limits[t]);
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

namespace {

// Appends `count` trivially copyable values to `out`.
template <typename T>
void Put(const T* values, size_t count, std::string* out) {
  out->append(reinterpret_cast<const char*>(values), count * sizeof(T));
}

// Reads values from the front of `*in`, bit for bit.
class ColumnReader {
 public:
  explicit ColumnReader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* values, size_t count) {
    const size_t bytes = count * sizeof(T);
    if (count > in_.size() / sizeof(T) || bytes > in_.size()) return false;
    std::memcpy(values, in_.data(), bytes);
    in_.remove_prefix(bytes);
    return true;
  }
  bool done() const { return in_.empty(); }
  size_t remaining() const { return in_.size(); }

 private:
  std::string_view in_;
};

}  // namespace

void EncodeColumns(const Batch& batch, int64_t begin, int64_t end, bool labels,
                   std::string* out) {
  begin = std::clamp<int64_t>(begin, 0, batch.size);
  end = std::clamp<int64_t>(end, begin, batch.size);
  const int64_t n = end - begin;
  const int64_t header[4] = {n, batch.num_dense,
                             static_cast<int64_t>(batch.sparse.size()),
                             labels ? 1 : 0};
  Put(header, 4, out);
  Put(batch.dense.data() + begin * batch.num_dense,
      static_cast<size_t>(n * batch.num_dense), out);
  if (labels) Put(batch.labels.data() + begin, static_cast<size_t>(n), out);
  std::vector<int64_t> lengths(n);
  for (const SparseFeature& f : batch.sparse) {
    for (int64_t s = 0; s < n; ++s) lengths[s] = f.bag_size(begin + s);
    Put(lengths.data(), lengths.size(), out);
    Put(f.ids.data() + f.offsets[begin],
        static_cast<size_t>(f.offsets[end] - f.offsets[begin]), out);
  }
}

absl::Status DecodeColumns(std::string_view bytes, int num_dense,
                           int num_sparse, Batch* batch) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch columns between ranks: ", what));
  };
  ColumnReader in(bytes);
  int64_t header[4];
  if (!in.Get(header, 4)) return bad("cut short in the header");
  const int64_t n = header[0];
  if (n < 0 || header[1] != num_dense || header[2] != num_sparse) {
    return bad(absl::StrCat("shape ", n, " x (", header[1], " dense, ",
                            header[2], " sparse), expected ", num_dense,
                            " dense and ", num_sparse, " sparse"));
  }
  batch->Reset(num_dense, num_sparse);
  batch->size = n;
  batch->dense.resize(n * num_dense);
  if (!in.Get(batch->dense.data(), batch->dense.size())) {
    return bad("cut short in the dense features");
  }
  batch->labels.assign(n, 0.0f);
  if (header[3] != 0 && !in.Get(batch->labels.data(), batch->labels.size())) {
    return bad("cut short in the labels");
  }
  std::vector<int64_t> lengths(n);
  for (int t = 0; t < num_sparse; ++t) {
    SparseFeature& f = batch->sparse[t];
    if (!in.Get(lengths.data(), lengths.size())) {
      return bad(absl::StrCat("cut short in sparse feature ", t));
    }
    f.offsets.resize(n + 1);
    f.offsets[0] = 0;
    for (int64_t s = 0; s < n; ++s) {
      if (lengths[s] < 0 || lengths[s] > static_cast<int64_t>(bytes.size())) {
        return bad(absl::StrCat("bag length ", lengths[s],
                                " of sparse feature ", t, ", sample ", s));
      }
      f.offsets[s + 1] = f.offsets[s] + lengths[s];
    }
    if (static_cast<uint64_t>(f.offsets[n]) >
        in.remaining() / sizeof(int64_t)) {
      return bad(absl::StrCat("cut short in the ids of sparse feature ", t));
    }
    f.ids.resize(f.offsets[n]);
    if (!in.Get(f.ids.data(), f.ids.size())) {
      return bad(absl::StrCat("cut short in the ids of sparse feature ", t));
    }
  }
  if (!in.done()) return bad("trailing bytes");
  return absl::OkStatus();
}

}  // namespace dlrm::data
