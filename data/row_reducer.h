// RowReducer: value % rows without a hardware divide, shared by the binary
// and the .npy Criteo readers (through CriteoIdMap, data/criteo.h), which
// reduce 26 ids per sample (a 64-bit divide would dominate their copy
// loops), and the synthetic vocabulary's modulo.
#pragma once

#include <cstdint>
#include <limits>

namespace dlrm::data {

// Lemire's fastmod for 32-bit values; a 64-bit value falls back to `%`.
// Gives exactly value % rows. Requires rows > 0.
class RowReducer {
 public:
  explicit RowReducer(int64_t rows)
      : rows_(static_cast<uint64_t>(rows)),
        small_(rows_ <= std::numeric_limits<uint32_t>::max()),
        magic_(small_ ? ~uint64_t{0} / rows_ + 1 : 0) {}

  int64_t operator()(uint32_t value) const {
    if (!small_) return value;  // value < 2^32 <= rows
    const uint64_t low = magic_ * value;
    return static_cast<int64_t>((static_cast<unsigned __int128>(low) * rows_) >>
                                64);
  }

  int64_t operator()(uint64_t value) const {
    if (value <= std::numeric_limits<uint32_t>::max()) {
      return (*this)(static_cast<uint32_t>(value));
    }
    return static_cast<int64_t>(value % rows_);
  }

 private:
  uint64_t rows_;
  bool small_;
  uint64_t magic_;
};

}  // namespace dlrm::data
