// The safetensors reader and writer (model/safetensors.h): every dtype
// round-trips, a tensor is read only as its own dtype and shape, and a bad
// header is InvalidArgument naming the tensor.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "tests/support/expect.h"

namespace dlrm::model {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  // Writes a file of `header` (JSON) followed by `data_bytes` zero bytes.
  std::string RawFile(const std::string& name, const std::string& header,
                      size_t data_bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    const uint64_t size = header.size();
    out.write(reinterpret_cast<const char*>(&size), 8);
    out << header << std::string(data_bytes, '\0');
    return path;
  }
  fs::path dir_;
};

TEST_F(SafetensorsTest, EveryDtypeRoundTripsInAnyOrder) {
  std::mt19937_64 rng(7);
  std::vector<float> f32(12);
  for (float& v : f32) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint16_t> f16(5), bf16(7);  // odd counts: unaligned after them
  for (uint16_t& v : f16) v = static_cast<uint16_t>(rng());
  for (uint16_t& v : bf16) v = static_cast<uint16_t>(rng());
  std::vector<int64_t> i64 = {-1, 0, 1, INT64_MAX, INT64_MIN, 42};
  const std::string path = (dir_ / "all.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"half", {5}, f16.data(), Dtype::kF16},
                                {"ids", {2, 3}, i64.data(), Dtype::kI64},
                                {"brain", {7}, bf16.data(), Dtype::kBF16},
                                {"w", {3, 4}, f32.data()}},
                               {{"step", "3"}})
                  .ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("step"), "3");
  auto w = (*f)->Get("w", {3, 4});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(std::vector<float>(w->begin(), w->end()), f32);
  auto ids = (*f)->GetInt64("ids", {2, 3});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, i64);
  for (auto [name, dtype, want] : {std::tuple{"half", Dtype::kF16, &f16},
                                   std::tuple{"brain", Dtype::kBF16, &bf16}}) {
    EXPECT_EQ(*(*f)->DtypeOf(name), dtype);
    auto bytes = (*f)->GetBytes(name, dtype, {int64_t(want->size())});
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    std::vector<uint16_t> got(want->size());
    ASSERT_EQ(bytes->size(), got.size() * 2);
    std::memcpy(got.data(), bytes->data(), bytes->size());
    EXPECT_EQ(got, *want) << name;
  }
}

// Tensors of no elements, alone in a file with no data bytes (the fuzzer's
// find: GetInt64 handed memcpy a null pointer), read back empty.
TEST_F(SafetensorsTest, EmptyTensorsReadBackEmpty) {
  const std::string path =
      RawFile("empty.safetensors",
              R"({"ids":{"dtype":"I64","shape":[0,5],"data_offsets":[0,0]},)"
              R"("w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
              0);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto ids = (*f)->GetInt64("ids", {0, 5});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_TRUE(ids->empty());
  auto w = (*f)->Get("w", {0});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->empty());
}

TEST_F(SafetensorsTest, ATensorIsReadOnlyAsItsDtypeAndShape) {
  std::vector<int64_t> i64 = {1, 2, 3, 4};
  std::vector<float> f32 = {1, 2, 3, 4};
  const std::string path = (dir_ / "two.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"ids", {4}, i64.data(), Dtype::kI64},
                                {"w", {2, 2}, f32.data()}},
                               {})
                  .ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const absl::Status as_float = (*f)->Get("ids", {4}).status();
  EXPECT_EQ(as_float.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(as_float.message(), "ids has dtype I64, expected F32");
  const absl::Status as_int = (*f)->GetInt64("w", {2, 2}).status();
  EXPECT_HAS_SUBSTR(as_int.message(), "w has dtype F32, expected I64");
  const absl::Status shape = (*f)->GetInt64("ids", {2, 2}).status();
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(shape.message(), "ids has shape [4], expected [2, 2]");
  EXPECT_EQ((*f)->GetBytes("none", Dtype::kF16, {1}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*f)->DtypeOf("none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*f)->GetFlat("w", 4).ok());
}

TEST_F(SafetensorsTest, BadHeadersAreInvalidArgumentNamingTheTensor) {
  struct Case {
    std::string header;
    size_t data;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
       "tensor t has dtype F64; only F32, F16, BF16 and I64"},
      {R"({"t":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", 8,
       "tensor t offsets do not fit its shape [2]"},
      {R"({"t":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})", 4,
       "tensor t offsets do not fit its shape [3]"},
      {R"({"t":{"dtype":"F16","shape":[-1],"data_offsets":[0,2]}})", 2,
       "tensor t has a bad shape"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path =
        RawFile("bad" + std::to_string(i), cases[i].header, cases[i].data);
    const absl::Status s = SafetensorsFile::Open(path).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_HAS_SUBSTR(s.message(), cases[i].expected) << s;
  }
}

}  // namespace
}  // namespace dlrm::model
