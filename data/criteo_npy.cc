// TorchRec's and MLPerf's NumPy Criteo days (data/criteo.h): finding a
// day's files and reading them, memory-mapped, as batches.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status.h"
#include "data/criteo.h"
#include "data/fixed_width_source.h"
#include "data/multi_hot.h"
#include "data/npy.h"
#include "data/row_reducer.h"

namespace dlrm::data {
namespace {

constexpr char kDense[] = "_dense.npy";
constexpr char kLabels[] = "_labels.npy";
constexpr char kSparse[] = "_sparse.npy";
constexpr char kMultiHot[] = "_sparse_multi_hot.npz";

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// `path` without its directory's part.
std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// `path`'s directory with its trailing '/', or "" for a bare name.
std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

// One day's arrays. sparse holds one N x num_sparse array (one-hot) or one
// N x k_t array per table (an .npz's bags).
struct Day {
  NpyArray dense;
  NpyArray labels;
  std::vector<NpyArray> sparse;
  bool bags = false;
  int64_t rows = 0;
};

absl::Status Invalid(const std::string& name, std::string message) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", message));
}

std::string ShapeText(const NpyArray& a) {
  std::string text = "(";
  for (size_t i = 0; i < a.shape().size(); ++i) {
    absl::StrAppend(&text, i > 0 ? ", " : "", a.shape()[i]);
  }
  return absl::StrCat(text, a.shape().size() == 1 ? ",)" : ")");
}

absl::StatusOr<Day> OpenDay(const CriteoNpyDay& files,
                            const CriteoOptions& options) {
  const int num_dense = options.num_dense;
  const int num_sparse = static_cast<int>(options.table_rows.size());
  Day day;
  ASSIGN_OR_RETURN(day.dense, OpenNpy(files.dense));
  ASSIGN_OR_RETURN(day.labels, OpenNpy(files.labels));
  const NpyArray& dense = day.dense;
  if (dense.type() != NpyType::kFloat32 && dense.type() != NpyType::kFloat64) {
    return Invalid(dense.name(),
                   absl::StrCat("dense features are ", dense.header().descr,
                                ", not float32 (<f4) or float64 (<f8)"));
  }
  if (dense.shape().size() != 2 || dense.cols() != num_dense) {
    return Invalid(
        dense.name(),
        absl::StrCat("shape ", ShapeText(dense), " is not (rows, ", num_dense,
                     "): the model has ", num_dense, " dense features"));
  }
  day.rows = dense.rows();
  const NpyArray& labels = day.labels;
  if (labels.shape().empty() || labels.shape().size() > 2 ||
      labels.cols() != 1) {
    return Invalid(labels.name(), absl::StrCat("shape ", ShapeText(labels),
                                               " is not (rows, 1) or (rows,)"));
  }
  const auto same_rows = [&](const NpyArray& a) -> absl::Status {
    if (a.rows() == day.rows) return absl::OkStatus();
    return Invalid(
        a.name(),
        absl::StrCat("has ", a.rows(), " rows, ", dense.name(), " has ",
                     day.rows, ": a day's files must hold the same samples"));
  };
  RETURN_IF_ERROR(same_rows(labels));
  const auto integers = [](const NpyArray& a) -> absl::Status {
    if (IsIntegerType(a.type())) return absl::OkStatus();
    return Invalid(a.name(), absl::StrCat("sparse values are ",
                                          a.header().descr, ", not integers"));
  };
  if (EndsWith(files.sparse, ".npz")) {
    day.bags = true;
    ASSIGN_OR_RETURN(std::vector<NpzMember> members, OpenNpz(files.sparse));
    day.sparse.resize(num_sparse);
    std::vector<bool> found(num_sparse, false);
    for (NpzMember& m : members) {
      std::string digits = m.name;
      if (digits.rfind("arr_", 0) == 0) digits = digits.substr(4);
      int t = -1;
      if (!digits.empty() && digits.size() < 9 &&
          std::all_of(digits.begin(), digits.end(),
                      [](char c) { return c >= '0' && c <= '9'; })) {
        t = std::stoi(digits);
      }
      if (t < 0 || t >= num_sparse) {
        return Invalid(m.array.name(),
                       absl::StrCat("member is not named by a table of the "
                                    "model (\"0\" .. \"",
                                    num_sparse - 1, "\" or \"arr_0\" .. )"));
      }
      if (found[t]) {
        return Invalid(m.array.name(),
                       absl::StrCat("a second member for table ", t));
      }
      found[t] = true;
      const NpyArray& a = m.array;
      RETURN_IF_ERROR(integers(a));
      if (a.shape().empty() || a.shape().size() > 2) {
        return Invalid(a.name(), absl::StrCat("shape ", ShapeText(a),
                                              " is not (rows, bag size)"));
      }
      RETURN_IF_ERROR(same_rows(a));
      if (a.cols() != options.MultiHotSize(t)) {
        return Invalid(
            a.name(),
            absl::StrCat("bags of table ", t, " hold ", a.cols(),
                         " ids, the model's multi_hot_size is ",
                         options.MultiHotSize(t),
                         " (use a config whose tables match the file, such "
                         "as mlperf-dlrm-dcnv2)"));
      }
      day.sparse[t] = std::move(m.array);
    }
    for (int t = 0; t < num_sparse; ++t) {
      if (!found[t]) {
        return Invalid(
            files.sparse,
            absl::StrCat("no member for table ", t, " (\"", t,
                         ".npy\"); the model has ", num_sparse, " tables"));
      }
    }
  } else {
    ASSIGN_OR_RETURN(NpyArray sparse, OpenNpy(files.sparse));
    RETURN_IF_ERROR(integers(sparse));
    if (sparse.shape().size() != 2 || sparse.cols() != num_sparse) {
      return Invalid(
          sparse.name(),
          absl::StrCat("shape ", ShapeText(sparse), " is not (rows, ",
                       num_sparse, "): the model has ", num_sparse, " tables"));
    }
    RETURN_IF_ERROR(same_rows(sparse));
    day.sparse.push_back(std::move(sparse));
  }
  return day;
}

// Reads days in order; `starts_[d]` is the global index of day d's first
// sample.
class CriteoNpySource final : public FixedWidthSource {
 public:
  CriteoNpySource(std::vector<Day> days, CriteoOptions options)
      : days_(std::move(days)), options_(std::move(options)) {
    int64_t start = 0;
    for (const Day& d : days_) {
      starts_.push_back(start);
      start += d.rows;
    }
    count_ = start;
    for (size_t t = 0; t < options_.table_rows.size(); ++t) {
      ids_.emplace_back(options_, static_cast<int>(t));
    }
  }

  absl::StatusOr<bool> Next(int64_t max_samples, Batch* batch) override {
    const int num_dense = options_.num_dense;
    ASSIGN_OR_RETURN(const int64_t n,
                     StartFixedBatch(options_, max_samples, batch));
    if (n <= 0) return false;
    // Copy day by day, then check the samples as the binary reader does.
    int64_t done = 0;
    while (done < n) {
      const int64_t global = next_ + done;
      const size_t d = static_cast<size_t>(
          std::upper_bound(starts_.begin(), starts_.end(), global) -
          starts_.begin() - 1);
      const int64_t row = global - starts_[d];
      const int64_t take = std::min(n - done, days_[d].rows - row);
      CopyRows(days_[d], row, take, done, batch);
      done += take;
    }
    for (int64_t s = 0; s < n; ++s) {
      const float label = batch->labels[s];
      const float* x = batch->dense.data() + s * num_dense;
      const bool label_ok = label == 0.0f || label == 1.0f;
      bool dense_ok = true;
      for (int i = 0; i < num_dense; ++i) dense_ok &= std::isfinite(x[i]);
      if (label_ok && dense_ok) continue;
      const int64_t global = next_ + s;
      const size_t d = static_cast<size_t>(
          std::upper_bound(starts_.begin(), starts_.end(), global) -
          starts_.begin() - 1);
      const int64_t row = global - starts_[d];
      next_ = global + 1;  // a later Next goes on after it
      std::string message;
      if (!label_ok) {
        message = absl::StrCat(days_[d].labels.name(), ": row ", row,
                               ": label ", label, " must be 0 or 1");
      } else {
        int bad = 0;
        while (std::isfinite(x[bad])) ++bad;
        message =
            absl::StrCat(days_[d].dense.name(), ": row ", row, ": dense ", bad,
                         " is ", std::isnan(x[bad]) ? "NaN" : "infinite");
      }
      batch->Reset(num_dense, static_cast<int>(options_.table_rows.size()));
      return absl::InvalidArgumentError(message);
    }
    next_ += n;
    return true;
  }

 private:
  // Copies rows [row, row + take) of `day` to samples [at, at + take) of
  // `batch` (shaped by Next).
  void CopyRows(const Day& day, int64_t row, int64_t take, int64_t at,
                Batch* batch) const {
    const int num_dense = options_.num_dense;
    const int num_sparse = static_cast<int>(options_.table_rows.size());
    float* dense = batch->dense.data() + at * num_dense;
    if (num_dense > 0) {
      if (day.dense.type() == NpyType::kFloat32) {
        std::memcpy(dense, day.dense.data() + row * num_dense * sizeof(float),
                    sizeof(float) * num_dense * take);
      } else {
        for (int64_t i = 0; i < take * num_dense; ++i) {
          dense[i] =
              static_cast<float>(day.dense.DoubleAt(row * num_dense + i));
        }
      }
    }
    for (int64_t s = 0; s < take; ++s) {
      batch->labels[at + s] = static_cast<float>(day.labels.DoubleAt(row + s));
    }
    for (int t = 0; t < num_sparse; ++t) {
      const int k = options_.MultiHotSize(t);
      int64_t* ids = batch->sparse[t].ids.data() + at * k;
      if (day.bags) {
        const NpyArray& a = day.sparse[t];
        const CriteoIdMap& map = ids_[t];
        for (int64_t i = 0; i < take * k; ++i) {
          ids[i] = map(a.UnsignedAt(row * k + i));
        }
        continue;
      }
      const NpyArray& a = day.sparse[0];
      const CriteoIdMap& map = ids_[t];
      for (int64_t s = 0; s < take; ++s) {
        const int64_t id = map(a.UnsignedAt((row + s) * num_sparse + t));
        if (k == 1) {
          ids[s] = id;
        } else {
          map.Bag(id, k, MultiHotTableSeed(t), ids + s * k);
        }
      }
    }
  }

  const std::vector<Day> days_;
  const CriteoOptions options_;
  std::vector<int64_t> starts_;
  std::vector<CriteoIdMap> ids_;  // per table
};

}  // namespace

bool IsCriteoNpy(const std::vector<std::string>& paths) {
  if (paths.empty()) return false;
  for (const std::string& p : paths) {
    if (EndsWith(p, ".npy") || EndsWith(p, ".npz")) continue;
    if (IsFile(p) || !IsFile(p + kDense)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<CriteoNpyDay>> FindCriteoNpyDays(
    const std::vector<std::string>& paths, bool prefer_multi_hot) {
  if (paths.empty()) {
    return absl::InvalidArgumentError("no NumPy day files or prefixes given");
  }
  // Per day, in order of first mention: its file-name prefix (day_0), the
  // directory to complete it from, and the files named.
  struct Named {
    std::string key, dir;
    CriteoNpyDay files;
  };
  std::vector<Named> named;
  for (const std::string& p : paths) {
    const std::string base = BaseName(p);
    const std::pair<const char*, std::string CriteoNpyDay::*> roles[] = {
        {kDense, &CriteoNpyDay::dense},
        {kLabels, &CriteoNpyDay::labels},
        {kSparse, &CriteoNpyDay::sparse},
        {kMultiHot, &CriteoNpyDay::sparse},
    };
    bool matched = false;
    for (const auto& role : roles) {
      const std::string_view sv(role.first);
      std::string CriteoNpyDay::*const field = role.second;
      if (!EndsWith(base, sv) || base.size() == sv.size()) continue;
      // A named file joins the latest day of its prefix that lacks that
      // file, else it starts a day: the three files of day_0 in two
      // directories make one day, two dense files of day_0 two days.
      const std::string key = base.substr(0, base.size() - sv.size());
      auto day = std::find_if(named.rbegin(), named.rend(), [&](Named& n) {
        return n.key == key && (n.files.*field).empty();
      });
      if (day == named.rend()) {
        named.push_back(Named{key, DirName(p), {}});
        day = named.rbegin();
      }
      day->files.*field = p;
      matched = true;
      break;
    }
    if (matched) continue;
    if (EndsWith(p, ".npy") || EndsWith(p, ".npz")) {
      return absl::InvalidArgumentError(
          absl::StrCat(p, ": a NumPy day file must end in ", kDense, ", ",
                       kLabels, ", ", kSparse, " or ", kMultiHot,
                       " (or give the day's prefix, DIR/day_0)"));
    }
    // A prefix is a day of its own.
    named.push_back(Named{base, DirName(p), {}});
  }
  std::vector<CriteoNpyDay> days;
  for (Named& n : named) {
    const std::string prefix = n.dir + n.key;
    CriteoNpyDay& f = n.files;
    if (f.dense.empty()) f.dense = prefix + kDense;
    if (f.labels.empty()) f.labels = prefix + kLabels;
    if (f.sparse.empty()) {
      const std::string npy = prefix + kSparse, npz = prefix + kMultiHot;
      f.sparse = (prefer_multi_hot && IsFile(npz)) ? npz
                 : IsFile(npy)                     ? npy
                                                   : npz;
      if (!IsFile(f.sparse)) {
        return absl::NotFoundError(absl::StrCat("day ", prefix, ": neither ",
                                                npy, " nor ", npz, " exists"));
      }
    }
    for (const std::string* file : {&f.dense, &f.labels, &f.sparse}) {
      if (!IsFile(*file)) {
        return absl::NotFoundError(
            absl::StrCat("day ", prefix, ": ", *file, " does not exist"));
      }
    }
    days.push_back(std::move(f));
  }
  return days;
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenCriteoNpy(
    std::vector<CriteoNpyDay> days, CriteoOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (days.empty()) {
    return absl::InvalidArgumentError("no NumPy days to read");
  }
  std::vector<Day> opened;
  for (const CriteoNpyDay& files : days) {
    ASSIGN_OR_RETURN(Day day, OpenDay(files, options));
    opened.push_back(std::move(day));
  }
  return std::unique_ptr<BatchSource>(
      std::make_unique<CriteoNpySource>(std::move(opened), std::move(options)));
}

}  // namespace dlrm::data
