// Fuzzes the safetensors reader (model/safetensors.h; a TorchRec state_dict
// a user brings reaches it first) over the input as a file: a bad header,
// dtype, shape or offsets must be InvalidArgument, and every tensor it
// accepts must be readable whole as its own dtype and shape (ASan checks
// the bounds).
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dlrm::model::Dtype;
  dlrm::fuzz::MemFile file(data, size);
  auto f = dlrm::model::SafetensorsFile::Open(file.path());
  if (!f.ok()) {
    dlrm::fuzz::CheckInvalidArgument(
        f.status(), "a bad safetensors file is InvalidArgument");
    return 0;
  }
  uint64_t sum = 0;
  for (const std::string& name : (*f)->Names()) {
    auto dtype = (*f)->DtypeOf(name);
    auto shape = (*f)->Shape(name);
    dlrm::fuzz::CheckOk(dtype.status(), "a listed tensor has a dtype");
    dlrm::fuzz::CheckOk(shape.status(), "a listed tensor has a shape");
    auto bytes = (*f)->GetBytes(name, *dtype, *shape);
    dlrm::fuzz::CheckOk(bytes.status(), "a listed tensor reads as itself");
    for (char c : *bytes) sum += static_cast<unsigned char>(c);
    if (*dtype == Dtype::kF32) {
      auto values = (*f)->Get(name, *shape);
      dlrm::fuzz::CheckOk(values.status(), "an F32 tensor reads as floats");
      dlrm::fuzz::Check(values->size() * 4 == bytes->size(),
                        "floats and bytes agree");
      float first = 0;
      if (!values->empty()) std::memcpy(&first, values->data(), 4);
      sum += static_cast<uint64_t>(first != 0);
    } else {
      dlrm::fuzz::Check(!(*f)->Get(name, *shape).ok(),
                        "a tensor of another dtype does not read as floats");
    }
    if (*dtype == Dtype::kI64) {
      auto ids = (*f)->GetInt64(name, *shape);
      dlrm::fuzz::CheckOk(ids.status(), "an I64 tensor reads as int64");
      dlrm::fuzz::Check(ids->size() * 8 == bytes->size(),
                        "int64s and bytes agree");
    }
  }
  volatile uint64_t keep = sum;
  (void)keep;
  return 0;
}
