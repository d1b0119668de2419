// Where a training step's time and bytes went: the stages of the step and
// the exchanges between ranks (model/model.h, model/exchange.h).
#pragma once

#include <array>
#include <cstdint>

namespace dlrm::model {

// Wall time of each stage of a step, and the bytes each exchange moved out
// of this rank to other ranks (0 on one rank).
struct StageTimes {
  enum Stage {
    kInputDist,   // all-to-all of bag lengths, then ids
    kLookup,      // pooling the shards for the global batch
    kOutputDist,  // all-to-all of pooled vectors to the samples' ranks
    kBottomForward,
    kInteractionForward,
    kTopForward,
    kLoss,
    kTopBackward,
    kInteractionBackward,
    kBottomBackward,
    kBackwardDist,     // all-to-all of pooled-vector gradients to the shards
    kEmbeddingUpdate,  // fused sparse backward + optimizer on the shards
    kAllReduce,        // dense gradients (and the loss)
    kDenseUpdate,
    // Making the shards' rows resident (RocksDB tier; ~0 in host memory),
    // agreeing on it, and the next batch's ids and prefetch.
    kPrepare,
    kNumStages
  };
  // The stage's short name ("input_dist", ..., "emb_prepare").
  static const char* Name(int stage) {
    static const char* const kNames[] = {
        "input_dist", "lookup",       "output_dist", "bottom_fwd",
        "inter_fwd",  "top_fwd",      "loss",        "top_bwd",
        "inter_bwd",  "bottom_bwd",   "bwd_dist",    "emb_update",
        "allreduce",  "dense_update", "emb_prepare"};
    return kNames[stage];
  }
  std::array<double, kNumStages> seconds{};

  enum Exchange { kLengths, kIds, kPooled, kGradients, kDense, kNumExchanges };
  static const char* ExchangeName(int exchange) {
    static const char* const kNames[] = {"lengths", "ids", "pooled",
                                         "gradients", "dense_allreduce"};
    return kNames[exchange];
  }
  std::array<int64_t, kNumExchanges> bytes_sent{};
};

}  // namespace dlrm::model
