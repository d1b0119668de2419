// dlrm.Predictor: click probabilities, micro-batched across requests.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "dlrm/service.grpc.pb.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/model_host.h"
#include "server/predict_batcher.h"

namespace dlrm::server {

// Predict is registered raw (server/raw_message.h): bytes that are not a
// PredictRequest get InvalidArgument "request could not be parsed as
// PredictRequest", where gRPC would answer UNIMPLEMENTED with no message.
using PredictorBase =
    Predictor::WithRawCallbackMethod_Predict<Predictor::Service>;

// Parses and validates each request against the model and hands it to the
// batcher, which finishes the call. A call needs the auth token only when
// `auth` requires it for Predict (Unauthenticated, before the request is
// parsed). Pointers are borrowed and must outlive the service.
class PredictorService final : public PredictorBase {
 public:
  // `max_batch_samples`: the largest request accepted.
  PredictorService(ModelHost* host, PredictBatcher* batcher,
                   ServerMetrics* metrics, const TokenAuth* auth,
                   int64_t max_batch_samples);

  // `request` holds a PredictRequest's bytes; `response` gets a
  // PredictResponse's.
  grpc::ServerUnaryReactor* Predict(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

 private:
  ModelHost* const host_;
  PredictBatcher* const batcher_;
  ServerMetrics* const metrics_;
  const TokenAuth* const auth_;
  const int64_t max_batch_samples_;
};

}  // namespace dlrm::server
