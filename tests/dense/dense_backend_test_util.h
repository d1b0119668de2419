// Shared by the dense backend tests (dense_test, cuda_dense_test): random
// inputs for one dense step and a driver that runs a DenseBackend through
// the step as model::Model does, collecting what it produced in host
// memory; the inputs and the reference of the bf16 rounding tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config.h"
#include "core/random.h"
#include "core/status.h"
#include "dense/backend.h"

namespace dlrm::testing {

// The widths of a DenseBackendConfig. The defaults: 3 tables of dim 4
// over 5 dense features, bottom -8-4, top -6-3-1, DCN of rank 5, fp32 (the
// step the layer references compute; bf16 has its own tests).
struct DenseConfigShape {
  int num_dense_features = 5;
  int embedding_dim = 4;
  // One table of 10 rows per name.
  std::vector<std::string> tables = {"a", "b", "c"};
  std::vector<int> bottom_mlp = {8, 4};
  std::vector<int> top_mlp = {6, 3, 1};
  // With INTERACTION_DCN: the rank of its 2 cross layers.
  int dcn_low_rank_dim = 5;
  DensePrecision precision = PRECISION_FP32;
};

// A normalised config of `shape` with `interaction` and `optimizer` (learning
// rate 0.05) for the dense parameters, seed 7.
inline ModelConfig DenseBackendConfig(Interaction interaction,
                                      OptimizerConfig::Type optimizer,
                                      const DenseConfigShape& shape = {}) {
  ModelConfig c;
  c.set_num_dense_features(shape.num_dense_features);
  c.set_embedding_dim(shape.embedding_dim);
  for (const std::string& name : shape.tables) {
    TableConfig* t = c.add_tables();
    t->set_name(name);
    t->set_rows(10);
  }
  for (int w : shape.bottom_mlp) c.add_bottom_mlp(w);
  for (int w : shape.top_mlp) c.add_top_mlp(w);
  c.set_interaction(interaction);
  if (interaction == INTERACTION_DCN) {
    c.set_dcn_num_layers(2);
    c.set_dcn_low_rank_dim(shape.dcn_low_rank_dim);
  }
  c.mutable_dense_optimizer()->set_type(optimizer);
  c.mutable_dense_optimizer()->set_learning_rate(0.05f);
  c.set_seed(7);
  c.set_dense_precision(shape.precision);
  absl::StatusOr<ModelConfig> n = NormalizeModelConfig(c);
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *n : c;
}

// The inputs of one step: dense features, the pooled vectors (columns dim
// and up of each interaction-input row) and 0/1 labels.
struct DenseStepInputs {
  int64_t batch = 0;
  std::vector<float> x, pooled, labels;
};

inline DenseStepInputs RandomDenseStep(const ModelConfig& config, int64_t batch,
                                       Rng& rng) {
  const dense::InteractionShape s = dense::MakeInteractionShape(config);
  DenseStepInputs in;
  in.batch = batch;
  for (int64_t i = 0; i < batch * config.num_dense_features(); ++i) {
    in.x.push_back(static_cast<float>(rng.Normal()));
  }
  for (int64_t i = 0; i < batch * (s.input_width - s.dim); ++i) {
    in.pooled.push_back(static_cast<float>(rng.Normal() * 0.5));
  }
  for (int64_t i = 0; i < batch; ++i) {
    in.labels.push_back(rng.Normal() > 0 ? 1.0f : 0.0f);
  }
  return in;
}

// What one step produced, copied to host memory.
struct DenseStepResult {
  double loss = 0;
  std::vector<float> dt;      // the interaction input's gradient
  std::vector<float> grads;   // every gradient, packed (GradBucket::kAll)
  std::vector<float> params;  // every parameter after the update
  std::vector<float> state;   // the optimizer state after the update
  std::vector<float> probs;   // Predict on the same inputs, after the update
};

inline absl::Status FillInteractionInput(dense::DenseBackend& b,
                                         const DenseStepInputs& in) {
  const dense::InteractionShape& s = b.interaction();
  ASSIGN_OR_RETURN(float* t, b.InteractionInput(in.batch));
  const int pooled = s.input_width - s.dim;
  for (int64_t l = 0; l < in.batch; ++l) {
    std::memcpy(t + l * s.input_width + s.dim, in.pooled.data() + l * pooled,
                sizeof(float) * pooled);
  }
  return absl::OkStatus();
}

// The training step's calls in Model::TrainStep's order (the gradients are
// packed and unpacked unchanged where the all-reduce would be), then
// Predict on the same inputs.
inline absl::StatusOr<DenseStepResult> RunDenseStep(dense::DenseBackend& b,
                                                    const DenseStepInputs& in) {
  const dense::InteractionShape& s = b.interaction();
  const int64_t n = in.batch;
  DenseStepResult r;
  RETURN_IF_ERROR(FillInteractionInput(b, in));
  RETURN_IF_ERROR(b.BottomForward(in.x.data(), n));
  RETURN_IF_ERROR(b.InteractionForward(n));
  RETURN_IF_ERROR(b.TopForward(n));
  ASSIGN_OR_RETURN(r.loss, b.Loss(in.labels.data(), n,
                                  n > 0 ? 1.0f / static_cast<float>(n) : 1.0f));
  RETURN_IF_ERROR(b.TopBackward(n));
  ASSIGN_OR_RETURN(const float* dt, b.InteractionBackward(n));
  r.dt.assign(dt, dt + n * s.input_width);
  RETURN_IF_ERROR(b.BottomBackward(in.x.data(), n));
  ASSIGN_OR_RETURN(std::span<float> flat,
                   b.PackGradients(dense::GradBucket::kAll, 0));
  r.grads.assign(flat.begin(), flat.end());
  RETURN_IF_ERROR(b.UnpackGradients(dense::GradBucket::kAll));
  RETURN_IF_ERROR(b.Update());
  for (const dense::ParamRef& p : b.params()) {
    r.params.insert(r.params.end(), p.value, p.value + p.size);
  }
  for (const dense::ParamRef& p : b.optimizer().State()) {
    r.state.insert(r.state.end(), p.value, p.value + p.size);
  }
  RETURN_IF_ERROR(FillInteractionInput(b, in));
  r.probs.resize(n);
  RETURN_IF_ERROR(b.Predict(in.x.data(), n, r.probs.data()));
  return r;
}

inline std::vector<float> ParamValues(dense::DenseBackend& b) {
  std::vector<float> v;
  for (const dense::ParamRef& p : b.params()) {
    v.insert(v.end(), p.value, p.value + p.size);
  }
  return v;
}

inline double MaxAbsDiff(const std::vector<float>& a,
                         const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

// DenseBackend::CopyParamsTo on backends of `config` (CreateDenseBackend):
// a backend that trained `steps` steps copies its weights into a fresh one
// (whose host view was handed out first), which then holds them bitwise and
// predicts as the source within `tolerance` (0 where the same kernels run
// on the same inputs in the same order); the copy is a snapshot (the
// source's next step leaves it alone) until the next copy. `old_way`, when
// true, also checks the copy against the copy through params() that the
// predictors made before CopyParamsTo (bitwise, predictions included).
// Inputs from `seed`.
inline void ExpectCopyParamsToSnapshots(const ModelConfig& config, int steps,
                                        double tolerance, uint64_t seed,
                                        bool old_way) {
  auto src = dense::CreateDenseBackend(config);
  ASSERT_TRUE(src.ok()) << src.status();
  auto dst = dense::CreateDenseBackend(config);
  ASSERT_TRUE(dst.ok()) << dst.status();
  std::printf("[   seed   ] %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  for (int step = 0; step < steps; ++step) {
    const DenseStepInputs in = RandomDenseStep(config, 13 + step, rng);
    ASSERT_TRUE(RunDenseStep(**src, in).ok());
  }
  const DenseStepInputs probe = RandomDenseStep(config, 17, rng);
  auto predict = [&](dense::DenseBackend& b) {
    std::vector<float> probs(probe.batch);
    EXPECT_TRUE(FillInteractionInput(b, probe).ok());
    const absl::Status st =
        b.Predict(probe.x.data(), probe.batch, probs.data());
    EXPECT_TRUE(st.ok()) << st;
    return probs;
  };
  const std::vector<float> fresh = predict(**dst);
  // A host view handed out (and written back unchanged) before the copy
  // must not come back over it.
  (*dst)->params();
  ASSERT_TRUE((*src)->CopyParamsTo(**dst).ok());
  const std::vector<float> want = predict(**src);
  const std::vector<float> got = predict(**dst);
  EXPECT_LE(MaxAbsDiff(got, want), tolerance);
  EXPECT_GT(MaxAbsDiff(got, fresh), 1e-4) << "the copy changed nothing";
  EXPECT_EQ(ParamValues(**dst), ParamValues(**src));

  if (old_way) {
    auto old = dense::CreateDenseBackend(config);
    ASSERT_TRUE(old.ok()) << old.status();
    const std::vector<dense::ParamRef>& from = (*src)->params();
    const std::vector<dense::ParamRef>& to = (*old)->params();
    for (size_t i = 0; i < from.size(); ++i) {
      std::copy_n(from[i].value, from[i].size, to[i].value);
    }
    EXPECT_EQ(predict(**old), got);
    EXPECT_EQ(ParamValues(**old), ParamValues(**dst));
  }

  // The source trains on; the copy keeps the weights it was given.
  const DenseStepInputs in = RandomDenseStep(config, 11, rng);
  ASSERT_TRUE(RunDenseStep(**src, in).ok());
  EXPECT_LE(MaxAbsDiff(predict(**dst), want), tolerance);
  const std::vector<float> next = predict(**src);
  EXPECT_GT(MaxAbsDiff(next, want), 1e-5) << "the step changed nothing";
  ASSERT_TRUE((*src)->CopyParamsTo(**dst).ok());
  EXPECT_LE(MaxAbsDiff(predict(**dst), next), tolerance);
  EXPECT_EQ(ParamValues(**dst), ParamValues(**src));
}

// Floats that probe fp32 -> bf16 rounding: the special values (signed
// zeros, infinities, quiet and signalling NaNs, the smallest and largest
// denormals and normals, the values next to the overflow threshold), then
// `random` values alternating among uniformly random bit patterns (every
// exponent, denormals and NaN payloads included), exact ties (low half
// 0x8000 above odd and even bf16s), one bit either side of a tie, and
// denormals.
inline std::vector<float> Bf16RoundingInputs(Rng& rng, size_t random) {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
      0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x00000001u,
      0x80000001u, 0x007fffffu, 0x807fffffu, 0x00008000u, 0x00018000u,
      0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u,
      0x7f7f8001u, 0x7f7effffu, 0x3f808000u, 0x3f818000u, 0x3f807fffu};
  for (size_t i = 0; i < random; ++i) {
    const uint32_t r = static_cast<uint32_t>(rng.NextU64());
    switch (i % 5) {
      case 0:
        bits.push_back(r);
        break;
      case 1:
        bits.push_back((r & 0xffff0000u) | 0x8000u);
        break;
      case 2:
        bits.push_back((r & 0xffff0000u) | 0x7fffu);
        break;
      case 3:
        bits.push_back((r & 0xffff0000u) | 0x8001u);
        break;
      default:
        bits.push_back(r & 0x807fffffu);
        break;  // a denormal
    }
  }
  std::vector<float> v(bits.size());
  std::memcpy(v.data(), bits.data(), sizeof(float) * bits.size());
  return v;
}

// x rounded to bf16 from the definition, apart from ToBf16's bit
// arithmetic: the bf16 neighbours of |x| below (its upper half) and above
// (the next bf16, 2^128 past the largest, which is infinity) are compared
// by their distances to |x| in double (exact: every float is a double), a
// tie to the one with the even last bit. A NaN keeps its sign and upper
// payload bits and is made quiet (bit 6 of the bf16).
inline uint16_t ReferenceBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  const uint32_t below = mag & 0xffff0000u;
  if (below == mag) return static_cast<uint16_t>((sign | mag) >> 16);
  const uint32_t above = below + 0x10000u;
  auto value = [](uint32_t b) {
    if (b == 0x7f800000u) return std::ldexp(1.0, 128);
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return static_cast<double>(f);
  };
  const double a = std::fabs(static_cast<double>(x));
  const double to_below = a - value(below), to_above = value(above) - a;
  uint32_t pick = to_below < to_above ? below : above;
  if (to_below == to_above) pick = (below & 0x10000u) == 0 ? below : above;
  return static_cast<uint16_t>((sign | pick) >> 16);
}

}  // namespace dlrm::testing
