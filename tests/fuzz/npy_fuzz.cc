// Fuzzes the NumPy readers (OpenNpy, OpenNpz) over the input as a file: a
// bad header, size or archive must be InvalidArgument, and every element of
// every array they return must be readable (ASan checks the bounds).
#include <cstdint>
#include <cstring>
#include <vector>

#include "data/npy.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void ReadEverything(const dlrm::data::NpyArray& a) {
  const int64_t n = a.rows() * a.cols();
  dlrm::fuzz::Check(n == a.header().elements(),
                    "rows x cols is the header's element count");
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += a.DoubleAt(i);
    if (a.type() != dlrm::data::NpyType::kFloat32 &&
        a.type() != dlrm::data::NpyType::kFloat64) {
      sum += static_cast<double>(a.UnsignedAt(i));
    }
  }
  volatile double keep = sum;
  (void)keep;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dlrm::fuzz::MemFile file(data, size);
  auto array = dlrm::data::OpenNpy(file.path());
  if (array.ok()) {
    ReadEverything(*array);
  } else {
    dlrm::fuzz::CheckInvalidArgument(array.status(),
                                     "a bad .npy file is InvalidArgument");
  }
  auto members = dlrm::data::OpenNpz(file.path());
  if (members.ok()) {
    for (const dlrm::data::NpzMember& m : *members) ReadEverything(m.array);
  } else {
    dlrm::fuzz::CheckInvalidArgument(members.status(),
                                     "a bad .npz archive is InvalidArgument");
  }
  return 0;
}
