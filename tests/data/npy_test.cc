// Tests for the NumPy readers (data/npy.h, the Criteo days of
// data/criteo.h) on files numpy writes: .npy of every format version and
// dtype, .npz stored and deflated, TorchRec's and MLPerf's Criteo days read
// bit for bit against numpy's own dump, malformed files, dlrm_convert, and
// dlrm_train training on numpy-written days. numpy comes from a Python found
// at run time (DLRM_TEST_PYTHON alone when set, else the peers' venv,
// /usr/bin/python3, python3); without one the tests skip, saying so.
#include "data/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "data/criteo.h"
#include "tests/support/expect.h"
#include "tests/support/files.h"

namespace dlrm::data {
namespace {

using test::ReadFile;
using test::WriteFile;

using test::ExpectBatchesEqual;
using test::ExpectInvalid;

namespace fs = std::filesystem;

// The first Python that imports numpy, or "". DLRM_TEST_PYTHON, when set,
// is the only one tried.
std::string FindNumpyPython() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DLRM_TEST_PYTHON")) {
    candidates.push_back(env);
  } else if (const char* home = std::getenv("HOME")) {
    candidates.push_back(
        absl::StrCat(home, "/.cache/dlrm-peers-venv/bin/python"));
  }
  if (std::getenv("DLRM_TEST_PYTHON") == nullptr) {
    candidates.push_back("/usr/bin/python3");
    candidates.push_back("python3");
  }
  for (const std::string& python : candidates) {
    const std::string probe =
        absl::StrCat("'", python, "' -c 'import numpy' > /dev/null 2>&1");
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

// Every sample of `source` in one batch, read `batch_size` at a time.
Batch ReadWhole(BatchSource* source, int64_t batch_size) {
  Batch whole;
  while (true) {
    Batch b;
    absl::StatusOr<bool> more = source->Next(batch_size, &b);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    whole.Append(b);
  }
  return whole;
}

template <typename T>
std::vector<T> ReadRaw(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// The 26 Kaggle table sizes are too big for a test; these are small and
// uneven, with one of 2^32 + 7 rows (a 64-bit modulo).
std::vector<int64_t> TestRows() {
  std::vector<int64_t> rows;
  for (int t = 0; t < 26; ++t) rows.push_back(3 + 97 * t + t * t * 1009);
  rows[5] = (int64_t{1} << 32) + 7;
  return rows;
}

class NpyTest : public testing::Test {
 protected:
  void SetUp() override {
    python_ = FindNumpyPython();
    if (python_.empty()) {
      GTEST_SKIP() << "no Python with numpy (tried "
                   << (std::getenv("DLRM_TEST_PYTHON") != nullptr
                           ? absl::StrCat("DLRM_TEST_PYTHON=",
                                          std::getenv("DLRM_TEST_PYTHON"))
                           : "~/.cache/dlrm-peers-venv/bin/python, "
                             "/usr/bin/python3, python3")
                   << "): install python3-numpy (scripts/install-deps.sh)";
    }
    dir_ = test::MakeTestDir().string();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Runs `script` with numpy imported as np, D the test's directory and
  // `args` (words, unquoted) as sys.argv[2:].
  void Python(const std::string& script, const std::string& args = "") {
    const std::string file = Path("script.py");
    WriteFile(file, absl::StrCat("import sys, zipfile\nimport numpy as np\n",
                                 "D = sys.argv[1]\n", script));
    const std::string command =
        absl::StrCat("'", python_, "' '", file, "' '", dir_, "' ", args);
    ASSERT_EQ(std::system(command.c_str()), 0) << script;
  }

  std::string Path(const std::string& name) const {
    return (fs::path(dir_) / name).string();
  }

  std::string python_;
  std::string dir_;
};

// --- .npy and .npz -------------------------------------------------------

TEST_F(NpyTest, EveryVersionAndDtypeReadsBitForBit) {
  Python(R"(
rng = np.random.default_rng(5)
names = []
for dt in ['f4', 'f8', 'i1', 'u1', 'i2', 'u2', 'i4', 'u4', 'i8', 'u8', '?']:
    for version in [(1, 0), (2, 0), (3, 0)]:
        for shape in [(7, 3), (5,), (), (2, 3, 4), (0, 13)]:
            if dt == '?':
                a = rng.integers(0, 2, size=shape).astype(bool)
            elif dt[0] == 'f':
                a = rng.standard_normal(size=shape).astype(dt)
            else:
                info = np.iinfo(dt)
                a = rng.integers(info.min, info.max, size=shape, dtype=dt,
                                 endpoint=True)
            name = 'a_%s_%d_%d' % (dt, version[0], len(names))
            with open('%s/%s.npy' % (D, name), 'wb') as f:
                np.lib.format.write_array(f, a, version=version)
            a.tofile('%s/%s.raw' % (D, name))
            names.append('%s %s %s' % (name, a.dtype.str,
                                       ','.join(map(str, a.shape))))
open(D + '/names.txt', 'w').write('\n'.join(names) + '\n')
)");
  std::istringstream names(ReadFile(Path("names.txt")));
  std::string name, descr, shape;
  int checked = 0;
  while (names >> name >> descr) {
    std::getline(names, shape);
    SCOPED_TRACE(name);
    absl::StatusOr<NpyArray> a = OpenNpy(Path(name + ".npy"));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->header().descr, descr);
    std::string got_shape;
    for (size_t i = 0; i < a->shape().size(); ++i) {
      absl::StrAppend(&got_shape, i > 0 ? "," : "", a->shape()[i]);
    }
    EXPECT_EQ(" " + got_shape, shape == "" ? " " : shape);
    const std::string raw = ReadFile(Path(name + ".raw"));
    ASSERT_EQ(static_cast<size_t>(a->rows() * a->cols() * a->item_bytes()),
              raw.size());
    EXPECT_EQ(std::memcmp(a->data(), raw.data(), raw.size()), 0);
    ++checked;
  }
  EXPECT_EQ(checked, 11 * 3 * 5);
}

TEST_F(NpyTest, NpzStoredAndDeflatedMembersReadBitForBit) {
  Python(R"(
rng = np.random.default_rng(9)
arrays = {str(t): rng.integers(-2**31, 2**31, size=(50, t + 1), dtype='i4')
          for t in range(4)}
arrays['dense'] = rng.standard_normal(size=(50, 13)).astype('f4')
np.savez(D + '/stored.npz', **arrays)
np.savez_compressed(D + '/deflated.npz', **arrays)
# ZIP64 records as a member over 4 GiB would need them: zipfile's limits
# lowered so that every size, offset and count overflows.
zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 100, 1
np.savez(D + '/zip64.npz', **arrays)
np.savez_compressed(D + '/zip64_deflated.npz', **arrays)
for k, a in arrays.items():
    a.tofile('%s/%s.raw' % (D, k))
# The order np.savez wrote them in, as the archive lists them.
names = [n[:-4] for n in zipfile.ZipFile(D + '/stored.npz').namelist()]
open(D + '/order.txt', 'w').write(' '.join(names))
)");
  const std::string order = ReadFile(Path("order.txt"));
  for (const char* archive :
       {"stored.npz", "deflated.npz", "zip64.npz", "zip64_deflated.npz"}) {
    SCOPED_TRACE(archive);
    absl::StatusOr<std::vector<NpzMember>> members = OpenNpz(Path(archive));
    ASSERT_TRUE(members.ok()) << members.status();
    std::string names;
    for (const NpzMember& m : *members) {
      absl::StrAppend(&names, names.empty() ? "" : " ", m.name);
      const std::string raw = ReadFile(Path(m.name + ".raw"));
      ASSERT_EQ(static_cast<size_t>(m.array.rows() * m.array.cols() *
                                    m.array.item_bytes()),
                raw.size())
          << m.name;
      EXPECT_EQ(std::memcmp(m.array.data(), raw.data(), raw.size()), 0)
          << m.name;
      EXPECT_EQ(m.array.name(), Path(archive) + ":" + m.name + ".npy");
    }
    EXPECT_EQ(names, order);
  }
}

TEST_F(NpyTest, MalformedNpyAndNpzFilesAreNamedWithTheProblem) {
  Python(R"(
a = np.arange(60, dtype='f4').reshape(5, 12)
np.save(D + '/good.npy', a)
np.save(D + '/fortran.npy', np.asfortranarray(a))
np.save(D + '/half.npy', a.astype('f2'))
np.save(D + '/big_endian.npy', a.astype('>f4'))
np.save(D + '/structured.npy', np.zeros(3, dtype=[('x', 'i4'), ('y', 'f4')]))
np.save(D + '/strings.npy', np.array(['a', 'bc']))
np.savez(D + '/good.npz', x=a)
zipfile.ZipFile(D + '/notnpy.npz', 'w').writestr('readme.txt', 'hello')
with zipfile.ZipFile(D + '/bzip2.npz', 'w', zipfile.ZIP_BZIP2) as z:
    z.writestr('x.npy', open(D + '/good.npy', 'rb').read())
# A deflated member whose central-directory entry claims 2 GiB (found by
# npy_fuzz: it became an allocation of that size), and one whose CRC-32 is
# wrong.
def patched(name, offset, value):
    np.savez_compressed(D + '/' + name, x=a)
    b = bytearray(open(D + '/' + name, 'rb').read())
    cd = b.rfind(b'PK\x01\x02')
    b[cd + offset:cd + offset + 4] = value.to_bytes(4, 'little')
    open(D + '/' + name, 'wb').write(b)
patched('bomb.npz', 24, 0x7fffffff)
patched('crc.npz', 16, 12345)
)");
  const std::string good = ReadFile(Path("good.npy"));
  WriteFile(Path("truncated_data.npy"), good.substr(0, good.size() - 4));
  WriteFile(Path("longer.npy"), good + "xxxx");
  WriteFile(Path("truncated_header.npy"), good.substr(0, 40));
  WriteFile(Path("tiny.npy"), good.substr(0, 8));
  WriteFile(Path("magic.npy"), "PK" + good.substr(2));
  std::string v9 = good;
  v9[6] = 9;
  WriteFile(Path("v9.npy"), v9);
  const std::string npz = ReadFile(Path("good.npz"));
  WriteFile(Path("truncated.npz"), npz.substr(0, npz.size() / 2));
  WriteFile(Path("cut_tail.npz"), npz.substr(0, npz.size() - 10));
  // Found by npy_fuzz: a 52-byte file with a ZIP64 locator whose record
  // offset passed a bounds check that wrapped around below 56 bytes.
  const std::string short_zip64(
      "PK\x03\x00!\x00\xb1\x11\x00\x00PK\x06\x07\x00\x00\x00\x00.\x05"
      "\xf6\x00\x00\x00\xa0\x00\x01\x00\x00\x00PK\x05\x06\x00\x00\x00\x00"
      "\x02\x00\x02\x00\x96\x00\x00\x00\x98\x04\x00\x00\x00\x00",
      52);
  WriteFile(Path("short_zip64.npz"), short_zip64);

  // A file and what its error says.
  struct BadFile {
    const char* file;
    const char* message;
  };
  const BadFile cases[] = {
      {"fortran.npy", "Fortran (column-major) order"},
      {"half.npy", "dtype '<f2' is not one this reader takes"},
      {"big_endian.npy", "big-endian"},
      {"structured.npy", "structured dtype"},
      {"strings.npy", "dtype '<U2'"},
      {"truncated_data.npy", "the file is truncated"},
      {"longer.npy", "the file is corrupt"},
      {"truncated_header.npy", "truncated"},
      {"tiny.npy", "fewer than an .npy header's first 10"},
      {"magic.npy", "bad magic"},
      {"v9.npy", "unsupported .npy format version 9.0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const absl::StatusOr<NpyArray> a = OpenNpy(Path(c.file));
    ExpectInvalid(a.status(), c.message);
    ExpectInvalid(a.status(), Path(c.file));
  }
  EXPECT_EQ(OpenNpy(Path("missing.npy")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(OpenNpy(dir_).status().code(), absl::StatusCode::kInvalidArgument);

  const BadFile archives[] = {
      {"truncated.npz", "end-of-central-directory"},
      {"cut_tail.npz", "end-of-central-directory"},
      {"notnpy.npz", "readme.txt: member is not an .npy array"},
      {"bzip2.npz", "x.npy: compression method 12"},
      {"bomb.npz", "x.npy: claims 2147483647 bytes inflated from"},
      {"crc.npz", "x.npy: CRC-32"},
      {"short_zip64.npz", "bad ZIP64 end-of-central-directory record"},
      {"good.npy", "end-of-central-directory"},
  };
  for (const auto& c : archives) {
    SCOPED_TRACE(c.file);
    const auto members = OpenNpz(Path(c.file));
    ExpectInvalid(members.status(), c.message);
    ExpectInvalid(members.status(), Path(c.file));
  }
}

// --- Criteo days -----------------------------------------------------------

// Writes TorchRec-style days day_0 .. day_{days-1} (int32 sparse over the
// whole int32 range, as TorchRec's wrap of hex values above 2^31 leaves
// them) and numpy's reference: the rows each value maps to under
// TestRows(), the dense values and the labels, concatenated over the days.
constexpr char kTorchRecDays[] = R"(
rows = np.array([int(r) for r in sys.argv[2].split(',')], dtype=np.uint64)
days = int(sys.argv[3])
rng = np.random.default_rng(17)
ref_dense, ref_labels, ref_rows = [], [], []
for d in range(days):
    n = 100 + 37 * d
    # TorchRec's transform of the counts (-2 is the smallest in Criteo).
    dense = np.log((rng.integers(-2, 1000, size=(n, 13)) + 3)
                   .astype(np.float32))
    sparse = rng.integers(-2**31, 2**31, size=(n, 26), dtype=np.int32)
    labels = rng.integers(0, 2, size=(n, 1), dtype=np.int32)
    np.save('%s/day_%d_dense.npy' % (D, d), dense)
    np.save('%s/day_%d_sparse.npy' % (D, d), sparse)
    np.save('%s/day_%d_labels.npy' % (D, d), labels)
    ref_dense.append(dense)
    ref_labels.append(labels.astype(np.float32))
    # Each value's 32 bits as unsigned, modulo its table's rows.
    ref_rows.append((sparse.view(np.uint32).astype(np.uint64) % rows)
                    .astype(np.int64))
np.concatenate(ref_dense).tofile(D + '/ref_dense.raw')
np.concatenate(ref_labels).tofile(D + '/ref_labels.raw')
# Table-major, as the batch's columns hold them.
np.concatenate(ref_rows).T.copy().tofile(D + '/ref_rows.raw')
)";

std::string Joined(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) absl::StrAppend(&s, s.empty() ? "" : ",", x);
  return s;
}

TEST_F(NpyTest, TorchRecDaysReadBitForBitAgainstNumpy) {
  const std::vector<int64_t> rows = TestRows();
  ASSERT_NO_FATAL_FAILURE(
      Python(kTorchRecDays, absl::StrCat(Joined(rows), " 3")));
  absl::StatusOr<std::vector<CriteoNpyDay>> days =
      FindCriteoNpyDays({Path("day_0"), Path("day_1"), Path("day_2")}, false);
  ASSERT_TRUE(days.ok()) << days.status();
  ASSERT_EQ(days->size(), 3u);
  EXPECT_EQ((*days)[1].sparse, Path("day_1_sparse.npy"));
  CriteoOptions options;
  options.table_rows = rows;
  absl::StatusOr<std::unique_ptr<BatchSource>> source =
      OpenCriteoNpy(*days, options);
  ASSERT_TRUE(source.ok()) << source.status();
  const std::vector<float> dense = ReadRaw<float>(Path("ref_dense.raw"));
  const std::vector<float> labels = ReadRaw<float>(Path("ref_labels.raw"));
  const std::vector<int64_t> ids = ReadRaw<int64_t>(Path("ref_rows.raw"));
  const int64_t n = 100 + 137 + 174;
  ASSERT_EQ(labels.size(), static_cast<size_t>(n));
  for (int epoch = 0; epoch < 2; ++epoch) {
    SCOPED_TRACE(epoch);
    // 64 a batch: batches span the days' boundaries.
    const Batch whole = ReadWhole(source->get(), 64);
    ASSERT_EQ(whole.size, n);
    EXPECT_EQ(std::memcmp(whole.dense.data(), dense.data(),
                          dense.size() * sizeof(float)),
              0);
    EXPECT_EQ(whole.labels, labels);
    for (int t = 0; t < 26; ++t) {
      const std::vector<int64_t> want(ids.begin() + t * n,
                                      ids.begin() + (t + 1) * n);
      EXPECT_EQ(whole.sparse[t].ids, want) << "table " << t;
    }
    EXPECT_TRUE(whole.Validate(13, rows).ok());
    ASSERT_TRUE((*source)->Rewind().ok());
  }
  // Skipping across a day's end lands where reading would have.
  ASSERT_EQ(*(*source)->Skip(130), 130);
  Batch b;
  ASSERT_TRUE(*(*source)->Next(3, &b));
  EXPECT_EQ(b.labels,
            std::vector<float>(labels.begin() + 130, labels.begin() + 133));
  EXPECT_EQ(b.sparse[4].ids[0], ids[4 * n + 130]);

  // Files named one by one read the same samples; a multi-hot size derives
  // the bags from each row as the TSV reader does.
  absl::StatusOr<std::vector<CriteoNpyDay>> named =
      FindCriteoNpyDays({Path("day_0_dense.npy"), Path("day_0_sparse.npy"),
                         Path("day_0_labels.npy")},
                        true);
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_EQ(named->size(), 1u);
  options.multi_hot_sizes.assign(26, 1);
  options.multi_hot_sizes[2] = 4;
  source = OpenCriteoNpy(*named, options);
  ASSERT_TRUE(source.ok()) << source.status();
  const Batch day0 = ReadWhole(source->get(), 1000);
  ASSERT_EQ(day0.size, 100);
  ASSERT_EQ(day0.sparse[2].ids.size(), 400u);
  EXPECT_EQ(day0.sparse[2].ids[4 * 7], ids[2 * n + 7]);
  EXPECT_EQ(day0.sparse[3].ids[7], ids[3 * n + 7]);
}

// MLPerf DLRM-DCNv2's layout for the tiny preset's tables (50, 20 and 100
// rows; bags of 1, 3 and 2): members "0" .. "2" of
// day_N_sparse_multi_hot.npz, int32, N x k; day 1 compressed.
constexpr char kMultiHotDays[] = R"(
rng = np.random.default_rng(23)
sizes, rows = [1, 3, 2], [50, 20, 100]
ref_dense, ref_labels, ref_ids = [], [], [[] for _ in sizes]
for d in range(2):
    n = 40 + 9 * d
    dense = rng.standard_normal(size=(n, 4)).astype(np.float32)
    labels = rng.integers(0, 2, size=(n, 1), dtype=np.int32)
    bags = {str(t): rng.integers(0, rows[t], size=(n, k), dtype=np.int32)
            for t, k in enumerate(sizes)}
    np.save('%s/day_%d_dense.npy' % (D, d), dense)
    np.save('%s/day_%d_labels.npy' % (D, d), labels)
    save = np.savez if d == 0 else np.savez_compressed
    save('%s/day_%d_sparse_multi_hot.npz' % (D, d), **bags)
    ref_dense.append(dense)
    ref_labels.append(labels.astype(np.float32))
    for t in range(len(sizes)):
        ref_ids[t].append(bags[str(t)].astype(np.int64).reshape(-1))
np.concatenate(ref_dense).tofile(D + '/ref_dense.raw')
np.concatenate(ref_labels).tofile(D + '/ref_labels.raw')
np.concatenate([np.concatenate(i) for i in ref_ids]).tofile(D + '/ref_ids.raw')
)";

ModelConfig Tiny() {
  absl::StatusOr<ModelConfig> config = LoadModelConfig("tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig();
}

TEST_F(NpyTest, MlperfMultiHotNpzDaysReadBitForBitAgainstNumpy) {
  Python(kMultiHotDays);
  const CriteoOptions options = CriteoOptionsForModel(Tiny(), false);
  absl::StatusOr<std::vector<CriteoNpyDay>> days =
      FindCriteoNpyDays({Path("day_0"), Path("day_1")}, true);
  ASSERT_TRUE(days.ok()) << days.status();
  EXPECT_EQ((*days)[0].sparse, Path("day_0_sparse_multi_hot.npz"));
  absl::StatusOr<std::unique_ptr<BatchSource>> source =
      OpenCriteoNpy(*days, options);
  ASSERT_TRUE(source.ok()) << source.status();
  const Batch whole = ReadWhole(source->get(), 16);
  const int64_t n = 40 + 49;
  ASSERT_EQ(whole.size, n);
  EXPECT_EQ(whole.dense, ReadRaw<float>(Path("ref_dense.raw")));
  EXPECT_EQ(whole.labels, ReadRaw<float>(Path("ref_labels.raw")));
  const std::vector<int64_t> ids = ReadRaw<int64_t>(Path("ref_ids.raw"));
  size_t at = 0;
  const int sizes[] = {1, 3, 2};
  for (int t = 0; t < 3; ++t) {
    const std::vector<int64_t> want(ids.begin() + at,
                                    ids.begin() + at + n * sizes[t]);
    at += n * sizes[t];
    EXPECT_EQ(whole.sparse[t].ids, want) << "table " << t;
    EXPECT_EQ(whole.sparse[t].offsets.back(), n * sizes[t]);
    EXPECT_EQ(whole.sparse[t].bag_size(5), sizes[t]);
  }
  EXPECT_TRUE(whole.Validate(4, options.table_rows).ok());
}

TEST_F(NpyTest, FindsADaysFilesFromPrefixesAndNamedFiles) {
  fs::create_directories(Path("a"));
  fs::create_directories(Path("b"));
  for (const char* f : {"a/day_0_dense.npy", "a/day_0_labels.npy",
                        "a/day_0_sparse.npy", "b/day_0_sparse_multi_hot.npz",
                        "a/day_0_sparse_multi_hot.npz", "a/day_1_dense.npy"}) {
    WriteFile(Path(f), "");
  }
  auto one_hot = FindCriteoNpyDays({Path("a/day_0")}, false);
  ASSERT_TRUE(one_hot.ok()) << one_hot.status();
  EXPECT_EQ((*one_hot)[0].sparse, Path("a/day_0_sparse.npy"));
  auto multi_hot = FindCriteoNpyDays({Path("a/day_0")}, true);
  ASSERT_TRUE(multi_hot.ok()) << multi_hot.status();
  EXPECT_EQ((*multi_hot)[0].sparse, Path("a/day_0_sparse_multi_hot.npz"));
  // MLPerf's bags beside TorchRec's dense and labels in another directory.
  auto mixed = FindCriteoNpyDays(
      {Path("a/day_0_dense.npy"), Path("b/day_0_sparse_multi_hot.npz")}, false);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->size(), 1u);
  EXPECT_EQ((*mixed)[0].labels, Path("a/day_0_labels.npy"));
  EXPECT_EQ((*mixed)[0].sparse, Path("b/day_0_sparse_multi_hot.npz"));

  // Two directories' day_0 are two days, named by prefix or by file.
  fs::create_directories(Path("c"));
  for (const char* f :
       {"c/day_0_dense.npy", "c/day_0_labels.npy", "c/day_0_sparse.npy"}) {
    WriteFile(Path(f), "");
  }
  auto two = FindCriteoNpyDays({Path("a/day_0"), Path("c/day_0")}, false);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].dense, Path("c/day_0_dense.npy"));
  EXPECT_EQ((*two)[1].sparse, Path("c/day_0_sparse.npy"));
  auto files = FindCriteoNpyDays(
      {Path("a/day_0_dense.npy"), Path("a/day_0_sparse.npy"),
       Path("a/day_0_labels.npy"), Path("c/day_0_dense.npy"),
       Path("c/day_0_sparse.npy"), Path("c/day_0_labels.npy")},
      false);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].labels, Path("a/day_0_labels.npy"));
  EXPECT_EQ((*files)[1].labels, Path("c/day_0_labels.npy"));

  EXPECT_TRUE(IsCriteoNpy({Path("a/day_0"), Path("a/day_0_labels.npy")}));
  EXPECT_FALSE(IsCriteoNpy({Path("a/day_0_dense.npy"), Path("train.txt")}));
  WriteFile(Path("a/day_9"), "");  // a TSV day beside npy files is TSV
  WriteFile(Path("a/day_9_dense.npy"), "");
  EXPECT_FALSE(IsCriteoNpy({Path("a/day_9")}));

  const auto missing = FindCriteoNpyDays({Path("a/day_1")}, false);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_HAS_SUBSTR(missing.status().message(), "day_1_sparse.npy")
      << missing.status();
  ExpectInvalid(FindCriteoNpyDays({Path("a/x.npy")}, false).status(),
                "must end in _dense.npy");
  ExpectInvalid(FindCriteoNpyDays({}, false).status(), "no NumPy day");
}

TEST_F(NpyTest, MalformedDaysGiveErrorsNamingTheFile) {
  Python(R"(
n = 20
def day(name, dense=None, sparse=None, labels=None):
    np.save('%s/%s_dense.npy' % (D, name),
            dense if dense is not None else np.zeros((n, 13), 'f4'))
    np.save('%s/%s_sparse.npy' % (D, name),
            sparse if sparse is not None else np.zeros((n, 26), 'i4'))
    np.save('%s/%s_labels.npy' % (D, name),
            labels if labels is not None else np.zeros((n, 1), 'i4'))
day('rows', labels=np.zeros((n - 1, 1), 'i4'))
day('cols', dense=np.zeros((n, 12), 'f4'))
day('intdense', dense=np.zeros((n, 13), 'i4'))
day('floatsparse', sparse=np.zeros((n, 26), 'f4'))
day('sparsecols', sparse=np.zeros((n, 25), 'i8'))
day('labelcols', labels=np.zeros((n, 2), 'i4'))
day('fortran', dense=np.asfortranarray(np.zeros((n, 13), 'f4')))
bad_label = np.zeros((n, 1), 'f4'); bad_label[7] = 0.5
day('badlabel', labels=bad_label)
nan = np.zeros((n, 13), 'f4'); nan[11, 3] = np.nan
day('nan', dense=nan)
np.save(D + '/npz_dense.npy', np.zeros((n, 4), 'f4'))
np.save(D + '/npz_labels.npy', np.zeros((n,), 'u1'))
np.savez(D + '/npz_sparse_multi_hot.npz', **{'0': np.zeros((n, 1), 'i4'),
         '1': np.zeros((n, 2), 'i4'), '2': np.zeros((n, 2), 'i4')})
np.savez(D + '/gap_sparse_multi_hot.npz', **{'0': np.zeros((n, 1), 'i4'),
         '2': np.zeros((n, 2), 'i4')})
np.savez(D + '/extra_sparse_multi_hot.npz', **{'0': np.zeros((n, 1), 'i4'),
         '1': np.zeros((n, 3), 'i4'), '2': np.zeros((n, 2), 'i4'),
         '3': np.zeros((n, 1), 'i4')})
)");
  CriteoOptions options;
  options.table_rows.assign(26, 1000);
  const auto open = [&](const std::string& name) {
    return OpenCriteoNpy({CriteoNpyDay{Path(name + "_dense.npy"),
                                       Path(name + "_sparse.npy"),
                                       Path(name + "_labels.npy")}},
                         options)
        .status();
  };
  ExpectInvalid(open("rows"), Path("rows_labels.npy") + ": has 19 rows");
  ExpectInvalid(open("rows"), "must hold the same samples");
  ExpectInvalid(open("cols"),
                Path("cols_dense.npy") + ": shape (20, 12) is not (rows, 13)");
  ExpectInvalid(open("intdense"), "dense features are <i4, not float32");
  ExpectInvalid(open("floatsparse"), Path("floatsparse_sparse.npy") +
                                         ": sparse values are <f4, not "
                                         "integers");
  ExpectInvalid(open("sparsecols"), "shape (20, 25) is not (rows, 26)");
  ExpectInvalid(open("labelcols"), "is not (rows, 1) or (rows,)");
  ExpectInvalid(open("fortran"), Path("fortran_dense.npy") +
                                     ": array is in "
                                     "Fortran");
  EXPECT_EQ(open("absent").code(), absl::StatusCode::kNotFound);

  // Bad values are found when read, naming the file and row; reading goes
  // on after them.
  for (const char* name : {"badlabel", "nan"}) {
    SCOPED_TRACE(name);
    auto source =
        OpenCriteoNpy({CriteoNpyDay{Path(absl::StrCat(name, "_dense.npy")),
                                    Path(absl::StrCat(name, "_sparse.npy")),
                                    Path(absl::StrCat(name, "_labels.npy"))}},
                      options);
    ASSERT_TRUE(source.ok()) << source.status();
    Batch b;
    const absl::StatusOr<bool> more = (*source)->Next(64, &b);
    if (std::string(name) == "badlabel") {
      ExpectInvalid(more.status(), Path("badlabel_labels.npy") +
                                       ": row 7: label 0.5 must be 0 or 1");
    } else {
      ExpectInvalid(more.status(),
                    Path("nan_dense.npy") + ": row 11: dense 3 is NaN");
    }
    ASSERT_TRUE(*(*source)->Next(64, &b));
    EXPECT_GT(b.size, 0);
  }

  // An .npz whose bags do not match the model's multi-hot sizes, or that
  // lacks a table or has one too many.
  const CriteoOptions tiny = CriteoOptionsForModel(Tiny(), false);
  const auto open_npz = [&](const std::string& sparse) {
    return OpenCriteoNpy({CriteoNpyDay{Path("npz_dense.npy"), Path(sparse),
                                       Path("npz_labels.npy")}},
                         tiny)
        .status();
  };
  ExpectInvalid(open_npz("npz_sparse_multi_hot.npz"),
                Path("npz_sparse_multi_hot.npz") +
                    ":1.npy: bags of table 1 hold 2 ids, the model's "
                    "multi_hot_size is 3");
  ExpectInvalid(open_npz("gap_sparse_multi_hot.npz"), "no member for table 1");
  ExpectInvalid(open_npz("extra_sparse_multi_hot.npz"),
                ":3.npy: member is not named by a table of the model");
}

// --- Tools -----------------------------------------------------------------

TEST_F(NpyTest, ConvertToolWritesTheDaysSamples) {
  const std::vector<int64_t> rows = TestRows();
  ASSERT_NO_FATAL_FAILURE(
      Python(kTorchRecDays, absl::StrCat(Joined(rows), " 2")));
  const std::string tool = DLRM_CONVERT_BINARY;
  const std::string v1 = Path("v1.bin");
  ASSERT_EQ(std::system(absl::StrCat(tool, " --out ", v1, " ", Path("day_0"),
                                     " ", Path("day_1"), " > /dev/null")
                            .c_str()),
            0);
  CriteoOptions options;
  options.table_rows = rows;
  auto from_bin = OpenCriteoBinary(v1, options);
  ASSERT_TRUE(from_bin.ok()) << from_bin.status();
  auto days = FindCriteoNpyDays({Path("day_0"), Path("day_1")}, false);
  ASSERT_TRUE(days.ok()) << days.status();
  auto from_npy = OpenCriteoNpy(*days, options);
  ASSERT_TRUE(from_npy.ok()) << from_npy.status();
  const Batch expected = ReadWhole(from_npy->get(), 50);
  ASSERT_EQ(expected.size, 237);
  ExpectBatchesEqual(ReadWhole(from_bin->get(), 50), expected);

  // MLPerf's bags go to version 2 with --config; without it they are
  // refused.
  fs::create_directories(Path("mh"));
  const std::string mh = (fs::path(dir_) / "mh").string();
  WriteFile(Path("mh.py"), absl::StrCat("import sys\nimport numpy as np\n",
                                        "D = sys.argv[1]\n", kMultiHotDays));
  ASSERT_EQ(std::system(
                absl::StrCat("'", python_, "' '", Path("mh.py"), "' '", mh, "'")
                    .c_str()),
            0);
  const std::string v2 = Path("v2.bin");
  ASSERT_EQ(std::system(absl::StrCat(tool, " --config tiny --out ", v2, " ", mh,
                                     "/day_0 ", mh, "/day_1 > /dev/null")
                            .c_str()),
            0);
  const CriteoOptions tiny = CriteoOptionsForModel(Tiny(), false);
  auto v2_source = OpenCriteoBinary(v2, tiny);
  ASSERT_TRUE(v2_source.ok()) << v2_source.status();
  auto mh_days = FindCriteoNpyDays({mh + "/day_0", mh + "/day_1"}, true);
  ASSERT_TRUE(mh_days.ok()) << mh_days.status();
  auto mh_source = OpenCriteoNpy(*mh_days, tiny);
  ASSERT_TRUE(mh_source.ok()) << mh_source.status();
  ExpectBatchesEqual(ReadWhole(v2_source->get(), 30),
                     ReadWhole(mh_source->get(), 30));
  EXPECT_NE(std::system(absl::StrCat(tool,
                                     " --num-dense 4 --num-sparse 3 "
                                     "--out ",
                                     Path("refused.bin"), " ", mh,
                                     "/day_0 2> /dev/null")
                            .c_str()),
            0);
  EXPECT_FALSE(fs::exists(Path("refused.bin")));
}

TEST_F(NpyTest, DlrmTrainTrainsOnNumpyDays) {
  Python(kMultiHotDays);
  const std::string train = DLRM_TRAIN_BINARY;
  const std::string log = Path("train.log");
  const int rc = std::system(
      absl::StrCat(train, " --config tiny --threads 1 --batch-size 16",
                   " --log-interval 1 --train ", Path("day_0"), " --eval ",
                   Path("day_1_dense.npy"), " ",
                   Path("day_1_sparse_multi_hot.npz"), " ",
                   Path("day_1_labels.npy"), " > ", log, " 2>&1")
          .c_str());
  const std::string out = ReadFile(log);
  ASSERT_EQ(rc, 0) << out;
  // 40 training samples of 16 a step: 3 steps, then the 49 eval samples.
  EXPECT_HAS_SUBSTR(out, "train: 3 steps, 40 samples") << out;
  EXPECT_HAS_SUBSTR(out, "samples 49") << out;

  // A bad day fails before training, naming the file.
  fs::remove(Path("day_1_labels.npy"));
  const int bad = std::system(absl::StrCat(train, " --config tiny --train ",
                                           Path("day_1"), " > ", log, " 2>&1")
                                  .c_str());
  EXPECT_NE(bad, 0);
  EXPECT_HAS_SUBSTR(ReadFile(log), Path("day_1_labels.npy")) << ReadFile(log);
}

}  // namespace
}  // namespace dlrm::data
