// dlrm.Predictor handler.
#include "server/predictor_service.h"

#include <chrono>
#include <utility>
#include <vector>

#include "data/wire.h"
#include "server/grpc_status.h"
#include "server/raw_message.h"

namespace dlrm::server {
namespace {

constexpr char kMethod[] = "/dlrm.Predictor/Predict";

}  // namespace

PredictorService::PredictorService(ModelHost* host, PredictBatcher* batcher,
                                   ServerMetrics* metrics,
                                   const TokenAuth* auth,
                                   int64_t max_batch_samples)
    : host_(host),
      batcher_(batcher),
      metrics_(metrics),
      auth_(auth),
      max_batch_samples_(max_batch_samples) {}

grpc::ServerUnaryReactor* PredictorService::Predict(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const auto start = std::chrono::steady_clock::now();
  if (!AdmitUnary(*auth_, *context, RpcAccess::kPredict, reactor, metrics_,
                  kMethod)) {
    return reactor;
  }
  PredictRequest parsed;
  // A copy shares the bytes (reference-counted slices); parsing consumes it.
  grpc::ByteBuffer bytes(*request);
  absl::Status status = ParseRaw(&bytes, &parsed, "request");
  data::Batch batch;
  if (status.ok()) {
    status = data::BatchFromProto(parsed.batch(), host_->shape(),
                                  data::Labels::kIgnored, max_batch_samples_,
                                  "batch", &batch);
  }
  if (!status.ok()) {
    FinishUnary(reactor, metrics_, kMethod, status);
    return reactor;
  }
  ServerMetrics* metrics = metrics_;
  batcher_->Submit(std::move(batch), [reactor, response, metrics, start](
                                         absl::Status status,
                                         std::vector<float> probs,
                                         int64_t step) {
    if (status.ok()) {
      PredictResponse reply;
      reply.mutable_probabilities()->Add(probs.begin(), probs.end());
      reply.set_model_step(step);
      status = SerializeRaw(reply, response);
    }
    metrics->RecordPredictLatency(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
    FinishUnary(reactor, metrics, kMethod, status);
  });
  return reactor;
}

}  // namespace dlrm::server
