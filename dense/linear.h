// Fully connected layers and MLPs on the CPU (oneDNN sgemm), with the
// DLRM reference's initialisation. Row-major throughout: activations are
// [batch x features], weights [out x in] as in PyTorch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/random.h"

namespace dlrm::dense {

// Row-major C [m x n] = op(A) [m x k] op(B) [k x n] + beta * C, op 'N'
// (as stored) or 'T' (transposed), on oneDNN's sgemm, threaded with OpenMP.
// Does nothing when m or n is 0. The callers check the shapes, so a oneDNN
// error is a programming error: it aborts naming the call.
void Sgemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc);

// A named parameter tensor and its gradient, borrowed from the layer that
// owns both; valid while that layer lives and is not resized.
struct ParamRef {
  std::string name;
  float* value;
  float* grad;
  int64_t size;
};

// y = act(x W^T + b), act = ReLU or identity. Not thread-safe.
class Linear {
 public:
  Linear(int in, int out, bool relu);

  // DLRM reference init: W ~ N(0, sqrt(2 / (in + out))), b ~ N(0, sqrt(1 /
  // out)), drawn in row-major order from `rng`.
  void Init(Rng* rng);

  // x: [batch x in], y: [batch x out].
  void Forward(const float* x, int64_t batch, float* y) const;

  // x and y are this layer's last forward input and output; dy (gradient of
  // the loss wrt y, [batch x out]) is overwritten with the gradient wrt the
  // pre-activation. Writes (does not accumulate) weight_grad and bias_grad,
  // and dx [batch x in] unless dx is null.
  void Backward(const float* x, const float* y, float* dy, int64_t batch,
                float* dx);

  int in() const { return in_; }
  int out() const { return out_; }
  bool relu() const { return relu_; }
  float* weight() { return w_.data(); }
  float* bias() { return b_.data(); }
  const float* weight() const { return w_.data(); }
  const float* bias() const { return b_.data(); }
  float* weight_grad() { return dw_.data(); }
  float* bias_grad() { return db_.data(); }

 private:
  int in_, out_;
  bool relu_;
  AlignedVector<float> w_, b_, dw_, db_;
  AlignedVector<float> partial_;  // bias-gradient sums per block of rows
};

// A stack of Linear layers holding its own activations for backward.
// Not thread-safe.
class Mlp {
 public:
  // widths: output width of each layer. relu_last: ReLU after the last
  // layer too (the bottom MLP) or not (the top MLP, whose output is a logit).
  Mlp(int in, std::span<const int> widths, bool relu_last);

  void Init(Rng* rng);

  // Runs all layers on x [batch x in]; returns the output [batch x out],
  // valid until the next Forward.
  const float* Forward(const float* x, int64_t batch);

  // Inference-only forward into caller buffers; does not touch the
  // activations kept for Backward, so it may run while no Backward is
  // pending. `scratch` is resized as needed.
  void Infer(const float* x, int64_t batch, float* out,
             AlignedVector<float>* scratch) const;

  // After Forward(x, batch): dy is the gradient wrt the output (overwritten).
  // Fills every layer's gradients, and dx [batch x in] unless null.
  void Backward(const float* x, float* dy, int64_t batch, float* dx);

  // Parameters named "<prefix>.<layer>.weight" / ".bias".
  std::vector<ParamRef> Parameters(const std::string& prefix);

  int in() const { return in_; }
  int out() const { return layers_.back().out(); }
  std::vector<Linear>& layers() { return layers_; }
  const std::vector<Linear>& layers() const { return layers_; }

 private:
  int in_;
  std::vector<Linear> layers_;
  std::vector<AlignedVector<float>> acts_;  // output of each layer
  AlignedVector<float> grad_a_, grad_b_;    // ping-pong gradient buffers
};

}  // namespace dlrm::dense
