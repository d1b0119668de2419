// Expectations several test binaries share: a status's code and message,
// two batches alike, two arrays alike bit for bit.
#ifndef DLRM_TESTS_SUPPORT_EXPECT_H_
#define DLRM_TESTS_SUPPORT_EXPECT_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "data/batch.h"

// EXPECT_HAS_SUBSTR(text, part): EXPECT_NE((text).find(part),
// std::string::npos), in one line; EXPECT_NO_SUBSTR the EXPECT_EQ; the
// ASSERT_ forms likewise. `<< ...` adds to the failure's message as usual.
#define EXPECT_HAS_SUBSTR(text, part) \
  EXPECT_NE((text).find(part), std::string::npos)
#define EXPECT_NO_SUBSTR(text, part) \
  EXPECT_EQ((text).find(part), std::string::npos)
#define ASSERT_HAS_SUBSTR(text, part) \
  ASSERT_NE((text).find(part), std::string::npos)
#define ASSERT_NO_SUBSTR(text, part) \
  ASSERT_EQ((text).find(part), std::string::npos)

namespace dlrm::test {

// The number of elements of a and b (n each of T) whose bits differ; the
// first three are reported as failures naming `what`, the index and both
// values.
template <typename T>
int64_t BitDifferences(const T* a, const T* b, int64_t n,
                       const std::string& what) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0 && ++differ <= 3) {
      ADD_FAILURE() << what << " [" << i << "]: " << +a[i] << " vs " << +b[i];
    }
  }
  return differ;
}

// `status`'s message contains `text`.
inline void ExpectMentions(const absl::Status& status,
                           const std::string& text) {
  EXPECT_NE(std::string(status.message()).find(text), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << text;
}

// `status` is InvalidArgument and its message contains `text` (the field).
inline void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  ExpectMentions(status, text);
}

// The same samples: sizes, dense features, labels and every table's bags.
inline void ExpectBatchesEqual(const data::Batch& a, const data::Batch& b) {
  ASSERT_EQ(a.size, b.size);
  ASSERT_EQ(a.num_dense, b.num_dense);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.labels, b.labels);
  ASSERT_EQ(a.sparse.size(), b.sparse.size());
  for (size_t t = 0; t < a.sparse.size(); ++t) {
    EXPECT_EQ(a.sparse[t].offsets, b.sparse[t].offsets) << "table " << t;
    EXPECT_EQ(a.sparse[t].ids, b.sparse[t].ids) << "table " << t;
  }
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_EXPECT_H_
