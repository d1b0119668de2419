// The Batch layout every module shares: dense features row-major, one CSR
// (offsets + ids) per sparse feature, labels. Columnar, so a batch maps
// directly onto wire messages and all-to-all buffers.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "dlrm/config.pb.h"

namespace dlrm::data {

// Ids of one sparse feature (one table) for every sample of a batch.
// Bag s holds ids[offsets[s] .. offsets[s+1]).
struct SparseFeature {
  // size() + 1 entries, offsets[0] == 0, non-decreasing.
  std::vector<int64_t> offsets;
  // offsets.back() ids.
  std::vector<int64_t> ids;

  int64_t num_bags() const {
    return offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1;
  }
  int64_t bag_size(int64_t s) const { return offsets[s + 1] - offsets[s]; }
};

struct Batch {
  // Number of samples.
  int64_t size = 0;
  // Dense features per sample.
  int num_dense = 0;
  // size x num_dense, row-major; already transformed (log(1+x) for Criteo).
  std::vector<float> dense;
  // size labels, each 0 or 1.
  std::vector<float> labels;
  // One per table, in ModelConfig.tables order.
  std::vector<SparseFeature> sparse;

  // Empties the batch and shapes it for `num_sparse` features; keeps
  // capacity so a reused Batch does not reallocate.
  void Reset(int num_dense_features, int num_sparse);

  // Checks the layout against the model: feature counts, vector sizes,
  // offsets (start at 0, non-decreasing, end at ids.size()), ids in
  // [0, id_limits[t]) (TableIdLimits: a static table's rows, a dynamic
  // table's kDynamicIdLimit), finite dense values, labels 0 or 1. Returns
  // InvalidArgument naming the field and the sample index.
  absl::Status Validate(int num_dense_features,
                        std::span<const int64_t> id_limits) const;

  // Writes samples [begin, end) of this batch into `out` (replacing it;
  // `out` may be this batch). The range is clamped to [0, size]; the batch's
  // offsets must be well formed (as Validate checks).
  void Slice(int64_t begin, int64_t end, Batch* out) const;

  // Appends all samples of `other` (same feature counts) to this batch. A
  // default-constructed batch first takes the shape of `other`.
  void Append(const Batch& other);
};

// The id limit of a dynamic table (TableConfig.dynamic): its ids are raw
// 64-bit ids in [0, kDynamicIdLimit) = [0, 2^63 - 1), never reduced.
inline constexpr int64_t kDynamicIdLimit = std::numeric_limits<int64_t>::max();

// The bound each table's ids must stay below, in `config`'s table order:
// a static table's rows, kDynamicIdLimit for a dynamic table. Every check
// of a batch's ids (Batch::Validate, wire BatchShape, the server's and the
// predictors' checks) takes these, so all callers agree.
std::vector<int64_t> TableIdLimits(const ModelConfig& config);

// A dynamic table's id from 64 hash bits: the low 63 bits, with 2^63 - 1
// (no id) taken as 2^63 - 2. What the readers give a hashed raw value and
// a derived multi-hot id of a dynamic table.
inline int64_t DynamicId(uint64_t bits) {
  const int64_t id = static_cast<int64_t>(bits & uint64_t{kDynamicIdLimit});
  return id == kDynamicIdLimit ? id - 1 : id;
}

// Batches between ranks travel in the internal column layout, not as the
// public protobuf: int64 words [size, num_dense, num_sparse, has_labels],
// then size x num_dense dense floats, size labels when has_labels, and per
// sparse feature its size offsets deltas (bag lengths) and then its ids.
// Floats are stored bit for bit, so a decoded batch equals the encoded one.
//
// Appends samples [begin, end) of `batch` (clamped to [0, size]; its offsets
// well formed, as Validate checks) to `out`; labels only when `labels`.
void EncodeColumns(const Batch& batch, int64_t begin, int64_t end, bool labels,
                   std::string* out);

// Decodes EncodeColumns' bytes into `batch` (replacing it; labels 0 when
// none were sent). Checks the
// structure only (the sender validated the values): InvalidArgument when
// the bytes are cut short, too long, or their shape is not
// `num_dense` x `num_sparse` features.
absl::Status DecodeColumns(std::string_view bytes, int num_dense,
                           int num_sparse, Batch* batch);

}  // namespace dlrm::data
