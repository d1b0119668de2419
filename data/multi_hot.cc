// The multi-hot derivation of data/multi_hot.h.
#include "data/multi_hot.h"

#include "core/random.h"
#include "data/batch.h"

namespace dlrm::data {

void DeriveMultiHotBag(int64_t row, int64_t rows, int size, uint64_t seed,
                       int64_t* out) {
  out[0] = row;
  // HashKey(seed, row, j) = Mix64(Mix64(Mix64(seed) ^ row) + j): the part
  // before "+ j" is shared by the whole bag.
  const uint64_t stream = Mix64(Mix64(seed) ^ static_cast<uint64_t>(row));
  const unsigned __int128 n = static_cast<uint64_t>(rows);
  for (int j = 1; j < size; ++j) {
    const uint64_t bits = Mix64(stream + static_cast<uint64_t>(j));
    out[j] = static_cast<int64_t>((bits * n) >> 64);
  }
}

void DeriveDynamicMultiHotBag(int64_t id, int size, uint64_t seed,
                              int64_t* out) {
  out[0] = id;
  const uint64_t stream = Mix64(Mix64(seed) ^ static_cast<uint64_t>(id));
  for (int j = 1; j < size; ++j) {
    out[j] = DynamicId(Mix64(stream + static_cast<uint64_t>(j)));
  }
}

}  // namespace dlrm::data
