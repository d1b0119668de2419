// The low-rank cross network of DCNv2 (INTERACTION_DCN) on the CPU: its
// parameters, gradients and activations, the forward, backward and
// inference passes on oneDNN's sgemm (dense/linear.h) or, under
// PRECISION_BF16, the project's AMX kernel (dense/amx_gemm.h, its epilogue
// doing each layer's elementwise steps) where the tiles run and oneDNN's
// bf16 matmul (dense/bf16.h) elsewhere, and a plain-loop reference in
// double.
//
// What it matches, checked against TorchRec's LowRankCrossNet
// (torchrec/modules/crossnet.py) and InteractionDCNArch / DLRM_DCN
// (torchrec/models/dlrm.py), which the MLPerf DLRM-DCNv2 reference
// (mlcommons/training recommendation_v2/torchrec_dlrm) builds with
// dcn_num_layers 3 and dcn_low_rank_dim 512:
// - x_0 is the bottom MLP's output, then every table's pooled vector,
//   concatenated (the interaction input, width N); the top MLP's input is
//   x_L alone, width N (TorchRec's over arch takes (F + 1) * D features,
//   nothing concatenated to the cross network's output).
// - Layer l: x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l, "*" elementwise:
//   TorchRec's linear(linear(x_l, V_kernels[l]), W_kernels[l]) + bias[l].
// - Parameters, in TorchRec's shapes and row-major order, so a state_dict
//   tensor copies over as it is (named and shaped by core/config.cc's
//   InteractionParamSpecs):
//     interaction.crossnet.<l>.V    [r x N]  inter_arch.crossnet.V_kernels.<l>
//     interaction.crossnet.<l>.W    [N x r]  inter_arch.crossnet.W_kernels.<l>
//     interaction.crossnet.<l>.bias [N]      inter_arch.crossnet.bias.<l>
//   (the DCNv2 paper's U_l is W_l; its V_l is our V_l transposed).
// - Init: V_l and W_l xavier-normal, N(0, sqrt(2 / (N + r))) for both
//   shapes (fan_in + fan_out = N + r); the biases zeros. The draws come
//   from our own generator (core/random.h), so the values are TorchRec's
//   distribution, not its numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/random.h"
#include "dense/bf16.h"
#include "dense/interaction_layer.h"
#include "dense/linear.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// L cross layers over rows of width N with rank r. Row-major throughout:
// inputs and outputs [batch x N]. At PRECISION_BF16 the four products of a
// layer (V x_l, W p and, backward, their three gradients) take bf16 inputs
// (bf16 copies of V, W, x_l, p and the gradients flowing into them) and
// accumulate in fp32; the bias, the product with x_0, the residual, every
// output and every gradient stay fp32. INTERACTION_DCN's InteractionLayer
// (dense/interaction_layer.cc). Not thread-safe.
class CrossNet final : public InteractionLayer {
 public:
  // `width` N >= 1, `num_layers` L >= 0 (0: no parameters), `rank` r >= 1
  // when L > 0.
  CrossNet(int width, int num_layers, int rank);

  // The floats per sample the passes' buffers of such a network hold
  // (InteractionLayerFloatsPerSample).
  static InteractionLayerFloats FloatsPerSample(int width, int num_layers,
                                                int rank);

  // Xavier-normal V_l then W_l, layer by layer, each row-major, from `rng`;
  // zero biases.
  void Init(Rng* rng) override;

  // Sets the precision of the passes below; PRECISION_BF16 also writes the
  // bf16 weights (SyncBf16Weights).
  void SetPrecision(DensePrecision precision) override;
  DensePrecision precision() const { return precision_; }
  // Under PRECISION_BF16, rewrites the bf16 copies of V and W from the fp32
  // master weights; call after they change. Does nothing at PRECISION_FP32.
  void SyncBf16Weights() override;

  // Training forward: writes x_L [batch x N] to `out` from x0 [batch x N]
  // and keeps what Backward needs. x0 is borrowed: it must be unchanged
  // when Backward runs. `out` may not overlap x0.
  void Forward(const float* x0, int64_t batch, float* out) override;

  // After Forward(x0, batch, ...), from dout (the gradient wrt x_L, [batch x
  // N]): writes dx0 [batch x N] (overwritten; every path through x_0, the
  // factor of each layer's product and layer 0's input) and writes (does
  // not accumulate) every layer's gradients. dx0 may not overlap x0 or
  // dout. The bias gradient is summed in fixed blocks of rows, so it does
  // not depend on the thread count.
  void Backward(const float* x0, const float* dout, int64_t batch,
                float* dx0) override;

  // Inference forward into `out`: the same arithmetic as Forward, keeping
  // none of its activations (those of a pending Backward stay valid).
  // `scratch` is resized as needed.
  void Infer(const float* x0, int64_t batch, float* out,
             AlignedVector<float>* scratch) const override;

  // V, W and the bias, layer by layer (InteractionParamSpecs' order;
  // unnamed).
  std::vector<ParamRef> Parameters() override;
  // Their bf16 copies in the same order (DenseOptimizer::SetBf16Copies):
  // V's and W's under PRECISION_BF16, null for the biases and at
  // PRECISION_FP32.
  std::vector<Bf16*> Bf16Copies() override;

  int width() const { return width_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  int rank() const { return rank_; }
  // Layer l's parameters and gradients: V [r x N], W [N x r], bias [N].
  const float* v(int l) const { return layers_[l].v.data(); }
  const float* w(int l) const { return layers_[l].w.data(); }
  const float* bias(int l) const { return layers_[l].b.data(); }
  float* v(int l) { return layers_[l].v.data(); }
  float* w(int l) { return layers_[l].w.data(); }
  float* bias(int l) { return layers_[l].b.data(); }
  const float* v_grad(int l) const { return layers_[l].dv.data(); }
  const float* w_grad(int l) const { return layers_[l].dw.data(); }
  const float* bias_grad(int l) const { return layers_[l].db.data(); }

 private:
  struct Layer {
    AlignedVector<float> v, w, b, dv, dw, db;
    AlignedVector<Bf16> vb, wb;  // PRECISION_BF16's copies of v and w
  };

  void ForwardBf16(const float* x0, int64_t batch, float* out);
  void BackwardBf16(const float* x0, const float* dout, int64_t batch,
                    float* dx0);
  void InferBf16(const float* x0, int64_t batch, float* out,
                 AlignedVector<float>* scratch) const;

  int width_, rank_;
  DensePrecision precision_ = PRECISION_FP32;
  std::vector<Layer> layers_;
  // The last Forward's activations: x_[l - 1] = x_l for l in [1, L) (x_0 is
  // the caller's, x_L the output); for every layer l, p_[l] = V_l x_l
  // [batch x r] and q_[l] = W_l p_l + b_l [batch x N].
  std::vector<AlignedVector<float>> x_, p_, q_;
  // Backward's: the gradient wrt x_l (two, in turn), W_l's output gradient
  // x_0 * g, p_l's gradient, and the bias gradient's block sums.
  AlignedVector<float> g_a_, g_b_, h_, dp_, partial_;
  // PRECISION_BF16's: x_l in bf16 for l in [0, L) (x_0 the input's copy),
  // p_l in bf16 (p_ stays empty), and the backward's h and dp in bf16.
  std::vector<AlignedVector<Bf16>> x_bf16_, p_bf16_;
  AlignedVector<Bf16> h_bf16_, dp_bf16_;
  // InferBf16's x_0, x_l (two, in turn) and p in bf16.
  mutable AlignedVector<Bf16> infer_bf16_;
};

// Plain loops in double: the reference the optimized passes are tested
// against. x_L [batch x N] of `net`'s parameters from x0 [batch x N].
namespace reference {
std::vector<double> CrossNetForward(const CrossNet& net, const float* x0,
                                    int64_t batch);
}  // namespace reference

}  // namespace dlrm::dense
