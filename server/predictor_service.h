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

// Validates each request against the model and hands it to the batcher,
// which finishes the call. A call needs the auth token only when `auth`
// requires it for Predict (Unauthenticated otherwise). Pointers are borrowed
// and must outlive the service.
class PredictorService final : public Predictor::CallbackService {
 public:
  // `max_batch_samples`: the largest request accepted.
  PredictorService(ModelHost* host, PredictBatcher* batcher,
                   ServerMetrics* metrics, const TokenAuth* auth,
                   int64_t max_batch_samples);

  grpc::ServerUnaryReactor* Predict(grpc::CallbackServerContext* context,
                                    const PredictRequest* request,
                                    PredictResponse* response) override;

 private:
  ModelHost* const host_;
  PredictBatcher* const batcher_;
  ServerMetrics* const metrics_;
  const TokenAuth* const auth_;
  const int64_t max_batch_samples_;
};

}  // namespace dlrm::server
