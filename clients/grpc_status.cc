// Client-side status mapping: grpc::Status -> absl::Status.
#include "clients/grpc_status.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace dlrm::clients {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // Both enums are the canonical gRPC codes (0..16) with the same values;
  // anything else (never sent by a conforming peer) becomes Unknown.
  const int code = static_cast<int>(status.error_code());
  const absl::StatusCode absl_code = code >= 1 && code <= 16
                                         ? static_cast<absl::StatusCode>(code)
                                         : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

}  // namespace dlrm::clients
