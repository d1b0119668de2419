// Fully connected layers and MLPs on the CPU (oneDNN sgemm, or bf16 GEMMs
// with fp32 accumulation under PRECISION_BF16), with the DLRM reference's
// initialisation. Row-major throughout: activations are [batch x
// features], weights [out x in] as in PyTorch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/random.h"
#include "dense/bf16.h"
#include "dlrm/config.pb.h"

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

// sum [n] = the sum of `blocks` consecutive blocks of n floats at
// `partial`, in order: the bias gradients' reduction over fixed blocks of
// rows, whose bits do not depend on the thread count.
void SumBlocks(const float* partial, int64_t blocks, int n, float* sum);

// On the AMX kernel, what a layer's input-gradient product writes in place
// of dx for the layer below it (a ReLU layer whose output is this layer's
// input), so that layer's mask pass is done: the gradient masked by that
// output in bf16 (dyb [batch x in]) and transposed (dyb_t [in x batch],
// leading dimension AmxTransposedLd(batch)), and its sums over each block
// of 32 rows (sums [ceil(batch / 32) x in]).
struct MaskedGrad {
  Bf16* dyb = nullptr;
  Bf16* dyb_t = nullptr;
  float* sums = nullptr;
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

  // The bf16 passes (PRECISION_BF16), after SyncBf16Weights: the GEMMs take
  // bf16 inputs and accumulate in fp32; the bias and ReLU are applied to the
  // fp32 sums (the GEMM's post-ops), and the gradients stay fp32. Forward:
  // y [batch x out] from x [batch x in] in bf16, written as fp32 to y and/or
  // rounded to bf16 into y_bf16 (the next layer's input), whichever are not
  // null (at least one).
  void ForwardBf16(const Bf16* x, int64_t batch, float* y, Bf16* y_bf16) const;
  // As Backward, with x the bf16 copy of the forward's input; dy's masked
  // values are also written as bf16 to dy_bf16 ([batch x out], scratch),
  // which the weight and input gradients' GEMMs read.
  void BackwardBf16(const Bf16* x, const float* y, float* dy, int64_t batch,
                    float* dx, Bf16* dy_bf16,
                    const MaskedGrad* below = nullptr);
  // The same with the ReLU's mask read off the output's bf16 copy (a layer
  // whose forward kept only y_bf16), and dy only read: its masked values go
  // to dy_bf16 alone.
  void BackwardBf16(const Bf16* x, const Bf16* y_bf16, const float* dy,
                    int64_t batch, float* dx, Bf16* dy_bf16,
                    const MaskedGrad* below = nullptr);
  // BackwardMasked, on the AMX kernel (AmxGemmUsable()): the backward of a
  // layer whose mask pass the layer above wrote into `g` (its sums in
  // MaskedSums), writing dx unless null. With `below` non-null, here and
  // in the BackwardBf16 passes (dx null then), the input gradient's product
  // writes the MaskedGrad of the layer below instead. The bias gradient is
  // summed over the same blocks of 32 rows either way (the same bits).
  void BackwardMasked(const Bf16* x, const MaskedGrad& g, int64_t batch,
                      float* dx, const MaskedGrad* below);
  // The buffer for the sums of this layer's MaskedGrad at `batch` rows.
  float* MaskedSums(int64_t batch);
  // Writes the bf16 copy of the weights the bf16 passes read; call after
  // the weights change.
  void SyncBf16Weights();

  int in() const { return in_; }
  int out() const { return out_; }
  bool relu() const { return relu_; }
  float* weight() { return w_.data(); }
  float* bias() { return b_.data(); }
  const float* weight() const { return w_.data(); }
  const float* bias() const { return b_.data(); }
  float* weight_grad() { return dw_.data(); }
  float* bias_grad() { return db_.data(); }
  // The weights' bf16 copy the bf16 passes read; null before the first
  // SyncBf16Weights.
  Bf16* weight_bf16() { return wb_.empty() ? nullptr : wb_.data(); }

 private:
  // Backward's first pass (linear.cc); dyb_t, when not null, gets dyb's
  // transpose [out x batch].
  template <bool kWriteDy, typename Y>
  bool MaskAndBiasGrad(const Y* y, float* dy, int64_t batch, Bf16* dyb,
                       Bf16* dyb_t);
  // The bf16 backward's weight and input gradients from dy's bf16 copy and,
  // on the AMX kernel, its transpose (null: oneDNN's GEMMs).
  void GradGemmsBf16(const Bf16* x, const Bf16* dy_bf16, const Bf16* dy_bf16_t,
                     int64_t batch, float* dx,
                     const MaskedGrad* below = nullptr);

  int in_, out_;
  bool relu_;
  AlignedVector<float> w_, b_, dw_, db_;
  AlignedVector<float> partial_;  // bias-gradient sums per block of rows
  AlignedVector<Bf16> wb_;        // w_ in bf16 (SyncBf16Weights)
};

// A stack of Linear layers holding its own activations for backward, at
// PRECISION_FP32 (the default) or PRECISION_BF16 (Linear's bf16 passes, the
// activations also kept in bf16 for the next layer and the backward).
// Not thread-safe.
class Mlp {
 public:
  // widths: output width of each layer. relu_last: ReLU after the last
  // layer too (the bottom MLP) or not (the top MLP, whose output is a logit).
  Mlp(int in, std::span<const int> widths, bool relu_last);

  void Init(Rng* rng);

  // Sets the precision of the passes below; PRECISION_BF16 also writes the
  // bf16 weights (SyncBf16Weights).
  void SetPrecision(DensePrecision precision);
  DensePrecision precision() const { return precision_; }
  // Under PRECISION_BF16, rewrites the bf16 copy of every layer's weights
  // from the fp32 master weights; call after they change (an optimizer
  // step, a restore). Does nothing at PRECISION_FP32.
  void SyncBf16Weights();

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
  // Their bf16 copies in the same order (DenseOptimizer::SetBf16Copies):
  // each weight's under PRECISION_BF16, null for the biases (read in fp32)
  // and at PRECISION_FP32.
  std::vector<Bf16*> Bf16Copies();

  int in() const { return in_; }
  int out() const { return layers_.back().out(); }
  std::vector<Linear>& layers() { return layers_; }
  const std::vector<Linear>& layers() const { return layers_; }

 private:
  // The widest output of the layers before the last.
  size_t WidestHidden() const;

  int in_;
  DensePrecision precision_ = PRECISION_FP32;
  std::vector<Linear> layers_;
  std::vector<AlignedVector<float>> acts_;  // output of each layer
  AlignedVector<float> grad_a_, grad_b_;    // ping-pong gradient buffers
  // PRECISION_BF16: the input and every layer's output but the last in bf16
  // (those layers keep no fp32 output: acts_ holds only the last's), and
  // the output gradient's bf16 copy (scratch of the backward).
  std::vector<AlignedVector<Bf16>> acts_bf16_;
  AlignedVector<Bf16> x_bf16_, dy_bf16_;
  // The MaskedGrad buffers, used in turns (Backward on the AMX kernel).
  AlignedVector<Bf16> masked_dyb_[2], masked_dyb_t_[2];
  // Infer's bf16 input and outputs (it keeps no activations).
  mutable AlignedVector<Bf16> infer_bf16_;
};

}  // namespace dlrm::dense
