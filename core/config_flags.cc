// The flags that set ModelConfig fields the same way in every binary
// (--precision, --row-precision, --tf32, --cuda-graphs; --device is in
// config.cc beside the checks it runs), and the names they print
// (core/config.h).
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"

namespace dlrm {

absl::StatusOr<ComputeDevice> ParseDevice(std::string_view name) {
  if (name == "cpu") return DEVICE_CPU;
  if (name == "cuda") return DEVICE_CUDA;
  return absl::InvalidArgumentError(absl::StrCat(
      "device must be cpu or cuda, got '", std::string(name), "'"));
}

const char* DeviceName(ComputeDevice device) {
  return device == DEVICE_CUDA ? "cuda" : "cpu";
}

absl::Status ApplyPrecisionFlag(std::string_view flag, ModelConfig* config) {
  if (flag.empty()) return absl::OkStatus();
  if (flag == "auto") {
    config->set_dense_precision(PRECISION_AUTO);
  } else if (flag == "fp32") {
    config->set_dense_precision(PRECISION_FP32);
  } else if (flag == "bf16") {
    config->set_dense_precision(PRECISION_BF16);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision must be auto, fp32 or bf16, got '",
                     std::string(flag), "'"));
  }
  return absl::OkStatus();
}

absl::Status ApplyRowPrecisionFlag(std::string_view flag, ModelConfig* config) {
  if (flag.empty()) return absl::OkStatus();
  RowPrecision precision;
  if (flag == "fp32") {
    precision = ROW_FP32;
  } else if (flag == "fp16") {
    precision = ROW_FP16;
  } else if (flag == "bf16") {
    precision = ROW_BF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--row-precision must be fp32, fp16 or bf16, got '",
                     std::string(flag), "'"));
  }
  for (TableConfig& t : *config->mutable_tables()) {
    t.set_weight_precision(precision);
  }
  return absl::OkStatus();
}

const char* RowPrecisionName(RowPrecision precision) {
  switch (precision) {
    case ROW_FP16:
      return "fp16";
    case ROW_BF16:
      return "bf16";
    default:
      return "fp32";
  }
}

const char* PrecisionName(DensePrecision precision) {
  switch (precision) {
    case PRECISION_BF16:
      return "bf16";
    case PRECISION_FP32:
      return "fp32";
    default:
      return "auto";
  }
}

namespace {

// An on/off flag's value `flag` (empty: not given, nullopt); InvalidArgument
// naming `name` for anything else.
absl::StatusOr<std::optional<bool>> ParseOnOff(std::string_view name,
                                               std::string_view flag) {
  if (flag.empty()) return std::nullopt;
  if (flag != "on" && flag != "off") {
    return absl::InvalidArgumentError(absl::StrCat(std::string(name),
                                                   " must be on or off, got '",
                                                   std::string(flag), "'"));
  }
  return flag == "on";
}

}  // namespace

absl::Status ApplyTf32Flag(std::string_view flag, ModelConfig* config) {
  ASSIGN_OR_RETURN(const std::optional<bool> on, ParseOnOff("--tf32", flag));
  if (on.has_value()) config->set_gpu_disable_tf32(!*on);
  return absl::OkStatus();
}

absl::Status ApplyCudaGraphsFlag(std::string_view flag, ModelConfig* config) {
  ASSIGN_OR_RETURN(const std::optional<bool> on,
                   ParseOnOff("--cuda-graphs", flag));
  if (on.has_value()) config->set_gpu_cuda_graphs(*on);
  return absl::OkStatus();
}

}  // namespace dlrm
