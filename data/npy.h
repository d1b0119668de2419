// NumPy's .npy files and .npz archives of them, read in place: an .npy file
// and the stored (uncompressed) members of an .npz are memory-mapped, a
// deflated member (np.savez_compressed) is inflated into memory when opened.
// Only what the field's Criteo files need: C-order arrays of one
// little-endian scalar type (format versions 1.0, 2.0 and 3.0).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrm::data {

// The scalar types an array may hold, by their NumPy dtype strings.
enum class NpyType {
  kBool,     // |b1
  kInt8,     // |i1
  kUint8,    // |u1
  kInt16,    // <i2
  kUint16,   // <u2
  kInt32,    // <i4
  kUint32,   // <u4
  kInt64,    // <i8
  kUint64,   // <u8
  kFloat32,  // <f4
  kFloat64,  // <f8
};

// True for the integer types (not bool, not the floats).
bool IsIntegerType(NpyType type);

// An array's header: its type, shape and where its data starts.
struct NpyHeader {
  NpyType type = NpyType::kFloat32;
  // The dtype as the file writes it, e.g. "<f4".
  std::string descr;
  // Dimensions, outermost first; empty for a 0-d array.
  std::vector<int64_t> shape;
  // Bytes from the start of the .npy data to the first element.
  size_t data_offset = 0;
  // Bytes per element.
  int item_bytes = 0;

  // Elements in the array (the product of shape, 1 for a 0-d array).
  int64_t elements() const;
};

// Parses the header at the start of `bytes` (an .npy file or member), named
// `name` in errors. InvalidArgument naming `name` and the problem: a bad
// magic, an unknown format version, a header cut short or not a dict, a
// dtype this reader does not take (big-endian, structured, other), Fortran
// order with two or more dimensions, or a shape whose size overflows.
absl::StatusOr<NpyHeader> ParseNpyHeader(std::string_view bytes,
                                         const std::string& name);

// A read-only view of one array; copies share the underlying mapping.
// Thread-compatible: const methods may be called from several threads.
class NpyArray {
 public:
  NpyArray() = default;

  // The file, or "file:member" for an .npz member.
  const std::string& name() const { return name_; }
  const NpyHeader& header() const { return header_; }
  NpyType type() const { return header_.type; }
  const std::vector<int64_t>& shape() const { return header_.shape; }
  // shape[0], or 1 for a 0-d array.
  int64_t rows() const;
  // Elements per row: the product of shape[1:] (1 for 0-d and 1-d arrays).
  int64_t cols() const;
  int item_bytes() const { return header_.item_bytes; }
  // rows() * cols() elements in C order; may be unaligned (read with
  // memcpy).
  const char* data() const { return data_; }

  // Element `i` (C order, i < rows() * cols()) of an integer or bool array
  // as the unsigned integer of its width with the same bits (an int32 -1 is
  // 0xffffffff).
  uint64_t UnsignedAt(int64_t i) const;
  // Element `i` of any array as a double.
  double DoubleAt(int64_t i) const;

 private:
  friend absl::StatusOr<NpyArray> MakeNpyArray(
      std::shared_ptr<const void> owner, std::string_view bytes,
      std::string name, bool exact);

  std::shared_ptr<const void> owner_;  // keeps the mapping or buffer alive
  std::string name_;
  NpyHeader header_;
  const char* data_ = nullptr;
};

// Memory-maps the .npy file `path`. NotFound for a missing file,
// PermissionDenied for one that cannot be opened otherwise; InvalidArgument
// naming the file for a bad header (as ParseNpyHeader) or a size that does
// not match its header's shape (a truncated file).
absl::StatusOr<NpyArray> OpenNpy(const std::string& path);

// One member of an .npz archive: its name without ".npy" ("0", "arr_0").
struct NpzMember {
  std::string name;
  NpyArray array;
};

// Opens every member of the .npz archive `path` (ZIP or ZIP64, as np.savez
// and np.savez_compressed write it), in the archive's order: stored members
// memory-mapped, deflated ones inflated and their CRC checked. Errors as
// OpenNpy's for the file; InvalidArgument naming the file (and the member)
// for a damaged or truncated archive, an encrypted member, a compression
// method other than stored or deflate, a member not named *.npy, or a
// member's bad .npy header or size.
absl::StatusOr<std::vector<NpzMember>> OpenNpz(const std::string& path);

}  // namespace dlrm::data
