// Shared helpers of the CUDA tests: the skip for machines without a GPU,
// random inputs, device round trips and tolerance checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_raii.h"
#include "core/device.h"
#include "core/random.h"
#include "data/batch.h"
#include "dlrm/config.pb.h"

// Skips the test, saying why, when this process sees no CUDA device; CI
// machines have none and compile and link these tests only. With
// DLRM_REQUIRE_CUDA=1 in the environment (a GPU machine's run) the missing
// device fails the test instead, so a broken driver cannot pass as skips.
#define DLRM_SKIP_WITHOUT_CUDA() DLRM_SKIP_WITHOUT_CUDA_DEVICES(1)

// As DLRM_SKIP_WITHOUT_CUDA, and also skips (never fails) when fewer than
// `n` devices are present: multi-GPU tests on a one-GPU machine.
#define DLRM_SKIP_WITHOUT_CUDA_DEVICES(n)                                    \
  do {                                                                       \
    const int _dlrm_devices = ::dlrm::CudaDeviceCount();                     \
    if (_dlrm_devices == 0 && ::dlrm::testing::CudaRequired()) {             \
      GTEST_FAIL() << "DLRM_REQUIRE_CUDA=1 but no CUDA device: "             \
                   << ::dlrm::CudaUnavailableReason();                       \
    }                                                                        \
    if (_dlrm_devices == 0) {                                                \
      GTEST_SKIP() << "no CUDA device: " << ::dlrm::CudaUnavailableReason(); \
    }                                                                        \
    if (_dlrm_devices < (n)) {                                               \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, this process sees " \
                   << _dlrm_devices;                                         \
    }                                                                        \
  } while (0)

namespace dlrm::testing {

// Whether DLRM_REQUIRE_CUDA=1 is set: CUDA tests then fail without a device.
inline bool CudaRequired() {
  const char* env = std::getenv("DLRM_REQUIRE_CUDA");
  return env != nullptr && std::string(env) == "1";
}

// Fixed seed, printed by the tests that use it (STYLE.md habit 9).
constexpr uint64_t kCudaTestSeed = 20261123;

// The trace of a case run with sparse optimizer `type` from kCudaTestSeed:
// "optimizer ADAM seed 20261123".
inline std::string OptimizerTrace(OptimizerConfig::Type type) {
  return absl::StrCat("optimizer ", OptimizerConfig::Type_Name(type), " seed ",
                      kCudaTestSeed);
}

inline std::vector<float> RandomFloats(Rng& rng, size_t n, double scale = 1) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal() * scale);
  return v;
}

// Device copy of `host`, there for any stream once this returns; fails the
// test on error. The copy is a cudaMemcpy on the legacy stream, which does
// not order itself with the kernels' non-blocking streams, and from
// pageable memory it may return before the data lands: the device is
// synchronised before (no queued kernel still uses memory the allocation
// may reuse) and after (no kernel queued next reads it early).
template <typename T>
cuda::DeviceBuffer<T> ToDevice(std::span<const T> host) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto buf = cuda::DeviceBuffer<T>::Allocate(host.size());
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return {};
  const absl::Status st = buf->CopyFromHost(host);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return std::move(buf).value();
}
template <typename T>
cuda::DeviceBuffer<T> ToDevice(const std::vector<T>& host) {
  return ToDevice(std::span<const T>(host));
}

// A device buffer of n elements filled with a NaN pattern, so an element
// the kernel fails to write shows up in the comparison (synchronised as
// ToDevice).
inline cuda::DeviceBuffer<float> Poisoned(size_t n) {
  return ToDevice(std::vector<float>(std::max<size_t>(n, 1), std::nanf("")));
}

// The first n elements of `buf` once every stream's queued work is done.
template <typename T>
std::vector<T> ToHost(const cuda::DeviceBuffer<T>& buf, size_t n) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> host(n);
  const absl::Status st = buf.CopyToHost(std::span<T>(host));
  EXPECT_TRUE(st.ok()) << st;
  return host;
}

// Elementwise |a - b| <= rel * max(|b|, rms(b)); NaN never passes. Reports
// the first few failures under `what`, and the largest error seen.
inline void ExpectCloseToScale(std::span<const float> a,
                               std::span<const float> b, double rel,
                               const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double sum_sq = 0;
  for (float x : b) sum_sq += double{x} * x;
  const double rms = b.empty() ? 0.0 : std::sqrt(sum_sq / b.size());
  int failures = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(double{a[i]} - b[i]);
    const double tol = rel * std::max<double>(std::fabs(b[i]), rms);
    if (!(err <= tol)) {
      if (failures++ < 5) {
        ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
      }
    }
    if (err > worst) worst = err;
  }
  if (failures > 0) {
    ADD_FAILURE() << what << ": " << failures << " of " << a.size()
                  << " elements off; largest error " << worst << ", rms "
                  << rms;
  }
}

// Bitwise equality (a NaN equals only the same NaN).
inline void ExpectBitwiseEqual(std::span<const float> a,
                               std::span<const float> b,
                               const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && failures++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  EXPECT_EQ(failures, 0) << what << ": elements differ";
}

// The shape of a batch of bags for one embedding table in the CUDA
// embedding tests.
struct BagShape {
  int dim;
  Pooling pooling;
  // Bags hold 0..max_hot ids (one in eight empty) when max_hot > 1.
  int max_hot;
  int64_t bags;
  int64_t rows;
  // Output / gradient stride is dim + pad.
  int pad;
};

inline std::string Name(const BagShape& s) {
  return absl::StrCat("d", s.dim, s.pooling == POOLING_MEAN ? "_mean" : "_sum",
                      "_hot", s.max_hot, "_bags", s.bags, "_rows", s.rows,
                      "_pad", s.pad);
}

inline void PrintTo(const BagShape& s, std::ostream* os) { *os << Name(s); }

// Name(s) of a BagShape case, for INSTANTIATE_TEST_SUITE_P.
inline std::string BagShapeName(
    const ::testing::TestParamInfo<BagShape>& info) {
  return Name(info.param);
}

// Ids skewed towards small values (many repeats, also inside a bag), the
// largest id rows - 1 always present, empty bags when multi-hot.
inline data::SparseFeature RandomIds(Rng& rng, const BagShape& s) {
  data::SparseFeature f;
  f.offsets.push_back(0);
  for (int64_t b = 0; b < s.bags; ++b) {
    int64_t n = 1;
    if (s.max_hot > 1) n = rng.Below(8) == 0 ? 0 : 1 + rng.Below(s.max_hot);
    for (int64_t i = 0; i < n; ++i) {
      const double u = rng.Uniform();
      f.ids.push_back(std::min<int64_t>(s.rows - 1, u * u * s.rows));
    }
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  if (!f.ids.empty()) f.ids[rng.Below(f.ids.size())] = s.rows - 1;
  return f;
}

}  // namespace dlrm::testing
