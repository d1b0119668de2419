// Client-side status mapping: grpc::Status -> absl::Status. (Batches are
// converted by data/wire.h, shared with the server.)
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dlrm::clients {

// The absl::Status for a finished RPC: the same canonical code and the
// server's message unchanged.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace dlrm::clients
