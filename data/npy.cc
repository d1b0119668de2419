// .npy header parsing, memory-mapped .npy files, and .npz archives (the ZIP
// central directory, ZIP64 included, with stored members mapped in place
// and deflated ones inflated by zlib).
#include "data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/escape.h"
#include "core/status.h"

namespace dlrm::data {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader takes little-endian arrays as they lie");

// Builds an array over `bytes` (an .npy file or member, alive as long as
// `owner`). With `exact`, the data must fill `bytes` to the end; otherwise
// it must fit. Errors as ParseNpyHeader's, or InvalidArgument naming `name`
// for data of the wrong size.
absl::StatusOr<NpyArray> MakeNpyArray(std::shared_ptr<const void> owner,
                                      std::string_view bytes, std::string name,
                                      bool exact);

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

struct TypeInfo {
  const char* code;  // kind and size, after the byte-order character
  NpyType type;
  int bytes;
};
constexpr TypeInfo kTypes[] = {
    {"b1", NpyType::kBool, 1},    {"i1", NpyType::kInt8, 1},
    {"u1", NpyType::kUint8, 1},   {"i2", NpyType::kInt16, 2},
    {"u2", NpyType::kUint16, 2},  {"i4", NpyType::kInt32, 4},
    {"u4", NpyType::kUint32, 4},  {"i8", NpyType::kInt64, 8},
    {"u8", NpyType::kUint64, 8},  {"f4", NpyType::kFloat32, 4},
    {"f8", NpyType::kFloat64, 8},
};

uint16_t Le16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint32_t Le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint64_t Le64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Whether `length` bytes from `offset` lie within a file of `bytes`, with
// no unsigned wrap-around when the file is shorter than `length`.
bool Within(uint64_t offset, uint64_t length, uint64_t bytes) {
  return offset <= bytes && length <= bytes - offset;
}

// A cursor over the header's dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 13), }
class DictParser {
 public:
  explicit DictParser(std::string_view text) : text_(text) {}

  void SkipSpace() {
    while (at_ < text_.size() && std::isspace(Byte())) ++at_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  bool AtEnd() {
    SkipSpace();
    return at_ >= text_.size();
  }
  // A '...' or "..." string (no escapes: numpy's keys and dtypes hold none).
  bool String(std::string* out) {
    SkipSpace();
    if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"')) {
      return false;
    }
    const char quote = text_[at_++];
    const size_t end = text_.find(quote, at_);
    if (end == std::string_view::npos) return false;
    *out = std::string(text_.substr(at_, end - at_));
    at_ = end + 1;
    return true;
  }
  bool Word(std::string_view word) {
    SkipSpace();
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }
  bool Integer(int64_t* out) {
    SkipSpace();
    const size_t start = at_;
    int64_t v = 0;
    while (at_ < text_.size() && std::isdigit(Byte())) {
      const int digit = text_[at_] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) return false;
      v = v * 10 + digit;
      ++at_;
    }
    if (at_ == start) return false;
    // Python 2's numpy wrote longs as "3L".
    if (at_ < text_.size() && text_[at_] == 'L') ++at_;
    *out = v;
    return true;
  }
  // A tuple of non-negative integers: (), (n,), (n, m), ...
  bool Shape(std::vector<int64_t>* out) {
    if (!Eat('(')) return false;
    out->clear();
    while (!Eat(')')) {
      int64_t v;
      if (!Integer(&v)) return false;
      out->push_back(v);
      if (!Eat(',')) return Eat(')');
    }
    return true;
  }
  // The next character, for messages.
  char Peek() {
    SkipSpace();
    return at_ < text_.size() ? text_[at_] : '\0';
  }

 private:
  unsigned char Byte() const { return static_cast<unsigned char>(text_[at_]); }

  std::string_view text_;
  size_t at_ = 0;
};

// Closes a file descriptor and maps it, for OpenNpy and OpenNpz.
struct Mapping {
  const char* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base != nullptr && bytes > 0) munmap(const_cast<char*>(base), bytes);
  }
};

absl::StatusOr<std::shared_ptr<const Mapping>> MapFile(const std::string& path,
                                                       const char* what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("cannot open ", what, " ", path, ": ", strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::PermissionDeniedError(message);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string message =
        absl::StrCat("cannot stat ", path, ": ", strerror(errno));
    close(fd);
    return absl::InternalError(message);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " is not a regular file"));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->bytes = static_cast<size_t>(st.st_size);
  if (mapping->bytes > 0) {
    void* map = mmap(nullptr, mapping->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    const int error = errno;
    close(fd);  // the mapping keeps the file open
    if (map == MAP_FAILED) {
      mapping->bytes = 0;
      return absl::InternalError(
          absl::StrCat("cannot mmap ", path, ": ", strerror(error)));
    }
    mapping->base = static_cast<const char*>(map);
    madvise(map, mapping->bytes, MADV_SEQUENTIAL);
  } else {
    close(fd);
  }
  return std::shared_ptr<const Mapping>(std::move(mapping));
}

}  // namespace

bool IsIntegerType(NpyType type) {
  return type != NpyType::kBool && type != NpyType::kFloat32 &&
         type != NpyType::kFloat64;
}

int64_t NpyHeader::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<NpyHeader> ParseNpyHeader(std::string_view bytes,
                                         const std::string& name) {
  auto fail = [&name](std::string message) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", message));
  };
  if (bytes.size() < kMagicBytes + 4 ||
      bytes.substr(0, kMagicBytes) != std::string_view(kMagic, kMagicBytes)) {
    return fail(
        bytes.size() < kMagicBytes + 4
            ? absl::StrCat("has ", bytes.size(),
                           " bytes, fewer than an .npy header's first 10")
            : "bad magic: not an .npy array (it does not start with "
              "\\x93NUMPY)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  size_t header_bytes = 0;
  size_t text_at = 0;
  if (major == 1) {
    header_bytes = Le16(bytes.data() + 8);
    text_at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) {
      return fail("header cut short before its length");
    }
    header_bytes = Le32(bytes.data() + 8);
    text_at = 12;
  } else {
    return fail(absl::StrCat("unsupported .npy format version ", major, ".",
                             minor, " (this build reads 1.0, 2.0 and 3.0)"));
  }
  if (header_bytes > bytes.size() - text_at) {
    return fail(absl::StrCat("header of ", header_bytes,
                             " bytes runs past the ", bytes.size(),
                             " bytes there are: truncated"));
  }
  const std::string_view text = bytes.substr(text_at, header_bytes);
  NpyHeader header;
  header.data_offset = text_at + header_bytes;
  const auto quoted = [&text] {
    return absl::StrCat("'", EscapeForMessage(std::string(text.substr(0, 120))),
                        "'");
  };
  DictParser p(text);
  if (!p.Eat('{'))
    return fail(absl::StrCat("header ", quoted(), " is not a dict"));
  bool has_descr = false, has_order = false, has_shape = false;
  bool fortran = false;
  while (!p.Eat('}')) {
    std::string key;
    if (!p.String(&key) || !p.Eat(':')) {
      return fail(absl::StrCat("header ", quoted(), " is not a dict"));
    }
    if (key == "descr") {
      if (p.Peek() == '[') {
        return fail(
            "holds a structured dtype; this reader takes arrays of "
            "one scalar type");
      }
      if (!p.String(&header.descr)) {
        return fail(absl::StrCat("header ", quoted(), ": bad 'descr'"));
      }
      has_descr = true;
    } else if (key == "fortran_order") {
      if (p.Word("True")) {
        fortran = true;
      } else if (!p.Word("False")) {
        return fail(absl::StrCat("header ", quoted(), ": bad 'fortran_order'"));
      }
      has_order = true;
    } else if (key == "shape") {
      if (!p.Shape(&header.shape)) {
        return fail(absl::StrCat("header ", quoted(), ": bad 'shape'"));
      }
      has_shape = true;
    } else {
      return fail(absl::StrCat("header has an unknown key '",
                               EscapeForMessage(key), "'"));
    }
    if (!p.Eat(',')) {
      if (!p.Eat('}')) {
        return fail(absl::StrCat("header ", quoted(), " is not a dict"));
      }
      break;
    }
  }
  if (!has_descr || !has_order || !has_shape) {
    return fail(absl::StrCat("header ", quoted(), " lacks ",
                             !has_descr   ? "'descr'"
                             : !has_order ? "'fortran_order'"
                                          : "'shape'"));
  }
  const std::string& d = header.descr;
  const bool known_order =
      !d.empty() && (d[0] == '<' || d[0] == '|' || d[0] == '=');
  const TypeInfo* info = nullptr;
  if (known_order) {
    for (const TypeInfo& t : kTypes) {
      if (d.substr(1) == t.code) info = &t;
    }
  }
  if (info == nullptr) {
    return fail(absl::StrCat(
        "dtype '", EscapeForMessage(d), "' is not one this reader takes (",
        !d.empty() && d[0] == '>' ? "big-endian; " : "",
        "little-endian b1, i1, u1, i2, u2, i4, u4, i8, u8, f4 or f8)"));
  }
  header.type = info->type;
  header.item_bytes = info->bytes;
  if (fortran && header.shape.size() >= 2) {
    return fail(
        "array is in Fortran (column-major) order; this reader takes C "
        "order: save it with np.save(path, np.ascontiguousarray(a))");
  }
  int64_t elements = 1;
  for (int64_t dim : header.shape) {
    if (dim != 0 && elements > std::numeric_limits<int64_t>::max() /
                                   header.item_bytes / dim) {
      return fail(absl::StrCat("shape's size overflows"));
    }
    elements *= dim;
  }
  return header;
}

absl::StatusOr<NpyArray> MakeNpyArray(std::shared_ptr<const void> owner,
                                      std::string_view bytes, std::string name,
                                      bool exact) {
  ASSIGN_OR_RETURN(NpyHeader header, ParseNpyHeader(bytes, name));
  const uint64_t need = static_cast<uint64_t>(header.elements()) *
                        static_cast<uint64_t>(header.item_bytes);
  const uint64_t have = bytes.size() - header.data_offset;
  if (have < need || (exact && have != need)) {
    std::string shape;
    for (size_t i = 0; i < header.shape.size(); ++i) {
      absl::StrAppend(&shape, i > 0 ? ", " : "", header.shape[i]);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": holds ", have, " bytes of data, its header's shape (", shape,
        ") of ", header.descr, " needs ", need, ": the file is ",
        have < need ? "truncated" : "corrupt"));
  }
  NpyArray array;
  array.owner_ = std::move(owner);
  array.name_ = std::move(name);
  array.data_ = bytes.data() + header.data_offset;
  array.header_ = std::move(header);
  return array;
}

int64_t NpyArray::rows() const {
  return header_.shape.empty() ? 1 : header_.shape[0];
}

int64_t NpyArray::cols() const {
  int64_t n = 1;
  for (size_t i = 1; i < header_.shape.size(); ++i) n *= header_.shape[i];
  return n;
}

uint64_t NpyArray::UnsignedAt(int64_t i) const {
  const char* p = data_ + i * header_.item_bytes;
  switch (header_.item_bytes) {
    case 1:
      return static_cast<unsigned char>(*p);
    case 2:
      return Le16(p);
    case 4:
      return Le32(p);
    default:
      return Le64(p);
  }
}

double NpyArray::DoubleAt(int64_t i) const {
  const char* p = data_ + i * header_.item_bytes;
  switch (header_.type) {
    case NpyType::kBool:
    case NpyType::kUint8:
      return static_cast<unsigned char>(*p);
    case NpyType::kInt8:
      return static_cast<signed char>(*p);
    case NpyType::kInt16:
      return static_cast<int16_t>(Le16(p));
    case NpyType::kUint16:
      return Le16(p);
    case NpyType::kInt32:
      return static_cast<int32_t>(Le32(p));
    case NpyType::kUint32:
      return Le32(p);
    case NpyType::kInt64:
      return static_cast<double>(static_cast<int64_t>(Le64(p)));
    case NpyType::kUint64:
      return static_cast<double>(Le64(p));
    case NpyType::kFloat32:
      return std::bit_cast<float>(Le32(p));
    case NpyType::kFloat64:
      return std::bit_cast<double>(Le64(p));
  }
  return 0;
}

absl::StatusOr<NpyArray> OpenNpy(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Mapping> map,
                   MapFile(path, ".npy file"));
  const std::string_view bytes(map->base, map->bytes);
  return MakeNpyArray(map, bytes, path, /*exact=*/true);
}

namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr size_t kEndBytes = 22;
constexpr size_t kLocatorBytes = 20;
constexpr size_t kZip64EndBytes = 56;
constexpr size_t kCentralBytes = 46;
constexpr size_t kLocalBytes = 30;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr uint16_t kStored = 0;
constexpr uint16_t kDeflated = 8;

// Inflates raw deflate data `in` into exactly `size` bytes whose CRC-32 is
// `crc`; errors (as text) for damage.
absl::StatusOr<std::shared_ptr<std::vector<char>>> Inflate(std::string_view in,
                                                           uint64_t size,
                                                           uint32_t crc) {
  // Deflate expands at most 1032:1; a larger claim is damage (and must not
  // become an allocation of that size).
  if (size / 1032 > in.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("claims ", size, " bytes inflated from ", in.size(),
                     ", more than deflate can give: damaged"));
  }
  auto out = std::make_shared<std::vector<char>>(size);
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) {
    return absl::InternalError("zlib inflateInit2 failed");
  }
  // avail_in / avail_out are 32-bit: feed and drain in chunks. inflate
  // returns Z_BUF_ERROR when it can make no progress (input used up, or the
  // data is longer than the archive says).
  constexpr size_t kChunk = size_t{1} << 30;
  size_t in_at = 0, out_at = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    const size_t in_now = std::min(kChunk, in.size() - in_at);
    const size_t out_now = std::min(kChunk, out->size() - out_at);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + in_at));
    z.avail_in = static_cast<uInt>(in_now);
    z.next_out = reinterpret_cast<Bytef*>(out->data() + out_at);
    z.avail_out = static_cast<uInt>(out_now);
    rc = inflate(&z, Z_NO_FLUSH);
    in_at += in_now - z.avail_in;
    out_at += out_now - z.avail_out;
  }
  const std::string zlib_message = z.msg != nullptr ? z.msg : zError(rc);
  inflateEnd(&z);
  if (rc != Z_STREAM_END || out_at != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "deflate data is damaged or truncated (zlib: ", zlib_message, "; ",
        out_at, " of ", size, " bytes inflated)"));
  }
  uLong got = crc32(0, nullptr, 0);
  for (size_t at = 0; at < out->size(); at += kChunk) {
    const size_t n = std::min(kChunk, out->size() - at);
    got = crc32(got, reinterpret_cast<const Bytef*>(out->data() + at),
                static_cast<uInt>(n));
  }
  if (got != crc) {
    return absl::InvalidArgumentError(
        absl::StrCat("CRC-32 ", absl::Hex(got),
                     " of the inflated data is not "
                     "the archive's ",
                     absl::Hex(crc)));
  }
  return out;
}

// The ZIP64 extended-information field of `extra`: replaces each of
// `fields` that holds 0xffffffff by the next 8-byte value there.
bool ApplyZip64Extra(std::string_view extra,
                     std::initializer_list<uint64_t*> fields) {
  size_t at = 0;
  while (at + 4 <= extra.size()) {
    const uint16_t id = Le16(extra.data() + at);
    const uint16_t size = Le16(extra.data() + at + 2);
    if (at + 4 + size > extra.size()) return false;
    if (id == kZip64Extra) {
      size_t v = at + 4;
      for (uint64_t* f : fields) {
        if (*f != 0xffffffffu) continue;
        if (v + 8 > at + 4 + size) return false;
        *f = Le64(extra.data() + v);
        v += 8;
      }
      return true;
    }
    at += 4 + size;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<NpzMember>> OpenNpz(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Mapping> map,
                   MapFile(path, ".npz archive"));
  const char* base = map->base;
  const size_t bytes = map->bytes;
  auto fail = [&path](std::string message) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
  };
  // The end-of-central-directory record: the last 22 bytes, or earlier when
  // an archive comment (at most 65535 bytes) follows it.
  if (bytes < kEndBytes) {
    return fail(absl::StrCat("has ", bytes,
                             " bytes, too few for a ZIP archive (.npz)"));
  }
  size_t end = std::string_view::npos;
  const size_t lowest =
      bytes > kEndBytes + 65535 ? bytes - kEndBytes - 65535 : 0;
  for (size_t at = bytes - kEndBytes + 1; at-- > lowest;) {
    if (Le32(base + at) == kEndOfDirectory &&
        at + kEndBytes + Le16(base + at + 20) == bytes) {
      end = at;
      break;
    }
  }
  if (end == std::string_view::npos) {
    return fail(
        "no ZIP end-of-central-directory record: not an .npz "
        "archive, or truncated");
  }
  uint64_t entries = Le16(base + end + 10);
  uint64_t directory_bytes = Le32(base + end + 12);
  uint64_t directory = Le32(base + end + 16);
  // A ZIP64 archive has a locator just before that record (Python's
  // zipfile writes one when any count or offset overflows, and may then
  // still give the small values in the old record).
  const bool zip64 =
      end >= kLocatorBytes && Le32(base + end - kLocatorBytes) == kZip64Locator;
  if (!zip64 && (entries == 0xffff || directory_bytes == 0xffffffffu ||
                 directory == 0xffffffffu)) {
    return fail("ZIP64 archive without its end-of-directory locator");
  }
  if (zip64) {
    const uint64_t at = Le64(base + end - kLocatorBytes + 8);
    if (!Within(at, kZip64EndBytes, bytes) ||
        Le32(base + at) != kZip64EndOfDirectory) {
      return fail("bad ZIP64 end-of-central-directory record");
    }
    entries = Le64(base + at + 32);
    directory_bytes = Le64(base + at + 40);
    directory = Le64(base + at + 48);
  }
  if (!Within(directory, directory_bytes, bytes)) {
    return fail("central directory runs past the end of the file: truncated");
  }
  std::vector<NpzMember> members;
  size_t at = directory;
  const size_t directory_end = directory + directory_bytes;
  for (uint64_t e = 0; e < entries; ++e) {
    if (at + kCentralBytes > directory_end ||
        Le32(base + at) != kCentralHeader) {
      return fail(absl::StrCat("central directory entry ", e, " is damaged"));
    }
    const uint16_t flags = Le16(base + at + 8);
    const uint16_t method = Le16(base + at + 10);
    const uint32_t crc = Le32(base + at + 16);
    uint64_t packed = Le32(base + at + 20);
    uint64_t size = Le32(base + at + 24);
    const size_t name_bytes = Le16(base + at + 28);
    const size_t extra_bytes = Le16(base + at + 30);
    const size_t comment_bytes = Le16(base + at + 32);
    uint64_t local = Le32(base + at + 42);
    if (at + kCentralBytes + name_bytes + extra_bytes + comment_bytes >
        directory_end) {
      return fail(absl::StrCat("central directory entry ", e, " is damaged"));
    }
    const std::string file_name(base + at + kCentralBytes, name_bytes);
    const std::string where =
        absl::StrCat(path, ":", EscapeForMessage(file_name));
    if (!ApplyZip64Extra(
            std::string_view(base + at + kCentralBytes + name_bytes,
                             extra_bytes),
            {&size, &packed, &local})) {
      return fail(absl::StrCat("member ", EscapeForMessage(file_name),
                               ": damaged ZIP64 extra field"));
    }
    at += kCentralBytes + name_bytes + extra_bytes + comment_bytes;
    if ((flags & 1) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": member is encrypted"));
    }
    if (file_name.size() < 4 ||
        file_name.compare(file_name.size() - 4, 4, ".npy") != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": member is not an .npy array (np.savez writes NAME.npy)"));
    }
    if (!Within(local, kLocalBytes, bytes) ||
        Le32(base + local) != kLocalHeader) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": local header is missing or damaged"));
    }
    const uint64_t data =
        local + kLocalBytes + Le16(base + local + 26) + Le16(base + local + 28);
    if (!Within(data, packed, bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": member data runs past the end of the file: truncated"));
    }
    const std::string_view stored(base + data, packed);
    NpzMember member;
    member.name = file_name.substr(0, file_name.size() - 4);
    if (method == kStored) {
      if (packed != size) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": stored member of ", packed, " bytes claims ", size));
      }
      ASSIGN_OR_RETURN(member.array,
                       MakeNpyArray(map, stored, where, /*exact=*/true));
    } else if (method == kDeflated) {
      absl::StatusOr<std::shared_ptr<std::vector<char>>> inflated =
          Inflate(stored, size, crc);
      if (!inflated.ok()) {
        return absl::Status(
            inflated.status().code(),
            absl::StrCat(where, ": ", inflated.status().message()));
      }
      const std::string_view view((*inflated)->data(), (*inflated)->size());
      ASSIGN_OR_RETURN(member.array, MakeNpyArray(*std::move(inflated), view,
                                                  where, /*exact=*/true));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": compression method ", method,
                       " is not one this reader takes (0 stored, 8 deflate)"));
    }
    members.push_back(std::move(member));
  }
  return members;
}

}  // namespace dlrm::data
