// The CPU dense backend: host MLPs and kernels, the buffers of the step
// grown on demand and reused.
#include "dense/cpu_backend.h"

#include <cstring>
#include <optional>
#include <utility>

#include "core/aligned.h"
#include "core/status.h"
#include "dense/bf16.h"
#include "dense/cpu_isa.h"
#include "dense/loss.h"

namespace dlrm::dense {
namespace {

// Grows `v` to at least `n` elements (never shrinks, so a step's buffers
// are reused) and returns its data.
float* Sized(AlignedVector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// Copies rows of `width` floats between buffers of different row strides.
void CopyColumns(const float* src, int64_t src_stride, float* dst,
                 int64_t dst_stride, int64_t rows, int width) {
  for (int64_t l = 0; l < rows; ++l) {
    std::memcpy(dst + l * dst_stride, src + l * src_stride,
                sizeof(float) * width);
  }
}

class CpuDenseBackend final : public DenseBackend {
 public:
  CpuDenseBackend(const InteractionShape& shape,
                  std::unique_ptr<HostDenseParams> params,
                  DensePrecision precision)
      : DenseBackend(shape),
        p_(std::move(params)),
        identity_(InteractionIsIdentity(shape.kind)),
        precision_(precision) {}

  ComputeDevice device() const override { return DEVICE_CPU; }
  DensePrecision precision() const override { return precision_; }

  absl::StatusOr<float*> InteractionInput(int64_t batch) override {
    return Sized(t_, batch * interaction().input_width);
  }

  absl::Status BottomForward(const float* x, int64_t batch) override {
    SyncIfStale();
    const InteractionShape& s = interaction();
    const float* out = p_->bottom.Forward(x, batch);
    CopyColumns(out, s.dim, t_.data(), s.input_width, batch, s.dim);
    return absl::OkStatus();
  }

  absl::Status InteractionForward(int64_t batch) override {
    const InteractionShape& s = interaction();
    z_at_ = identity_ ? t_.data() : Sized(z_, batch * s.output_width);
    if (!identity_) {
      dense::InteractionForward(s, t_.data(), batch, z_at_,
                                p_->interaction.get());
    }
    return absl::OkStatus();
  }

  absl::Status TopForward(int64_t batch) override {
    logits_ = p_->top.Forward(z_at_, batch);
    return absl::OkStatus();
  }

  absl::Status QueueLoss(const float* labels, int64_t batch,
                         float grad_scale) override {
    loss_ = BceWithLogits(logits_, labels, batch, grad_scale,
                          Sized(dlogits_, batch));
    return absl::OkStatus();
  }

  absl::StatusOr<double> ReadLoss() override {
    if (!loss_.has_value()) {
      return absl::FailedPreconditionError("ReadLoss: no loss queued yet");
    }
    return *loss_;
  }

  absl::Status TopBackward(int64_t batch) override {
    float* dz = Sized(dz_, batch * interaction().output_width);
    p_->top.Backward(z_at_, dlogits_.data(), batch, dz);
    return absl::OkStatus();
  }

  absl::StatusOr<const float*> InteractionBackward(int64_t batch) override {
    const InteractionShape& s = interaction();
    dt_at_ = identity_ ? dz_.data() : Sized(dt_, batch * s.input_width);
    if (!identity_) {
      dense::InteractionBackward(s, t_.data(), dz_.data(), batch, dt_at_,
                                 p_->interaction.get());
    }
    return dt_at_;
  }

  absl::Status BottomBackward(const float* x, int64_t batch) override {
    const InteractionShape& s = interaction();
    float* dbottom = Sized(dbottom_, batch * s.dim);
    CopyColumns(dt_at_, s.input_width, dbottom, s.dim, batch, s.dim);
    p_->bottom.Backward(x, dbottom, batch, /*dx=*/nullptr);
    return absl::OkStatus();
  }

  absl::Status Update() override {
    // Under PRECISION_BF16 the step also writes every weight's bf16 copy
    // (HostDenseParams::SetPrecision), so the copies are fresh after it.
    p_->optimizer->Step();
    stale_ = false;
    return absl::OkStatus();
  }

  absl::Status Predict(const float* x, int64_t batch, float* probs) override {
    SyncIfStale();
    const InteractionShape& s = interaction();
    float* bottom_out = Sized(infer_bottom_, batch * s.dim);
    p_->bottom.Infer(x, batch, bottom_out, &infer_scratch_);
    float* t = t_.data();
    CopyColumns(bottom_out, s.dim, t, s.input_width, batch, s.dim);
    float* z = identity_ ? t : Sized(z_, batch * s.output_width);
    if (!identity_) {
      dense::InteractionInfer(s, t, batch, z, p_->interaction.get(),
                              &infer_scratch_);
    }
    float* logits = Sized(infer_logits_, batch);
    p_->top.Infer(z, batch, logits, &infer_scratch_);
    for (int64_t l = 0; l < batch; ++l) probs[l] = Sigmoid(logits[l]);
    return absl::OkStatus();
  }

  absl::StatusOr<std::span<float>> PackGradients(GradBucket bucket,
                                                 int extra) override {
    const auto [begin, end] = p_->Range(bucket);
    int64_t total = extra;
    for (size_t i = begin; i < end; ++i) total += p_->params[i].size;
    float* flat = Sized(Flat(bucket), total);
    int64_t at = 0;
    for (size_t i = begin; i < end; ++i) {
      const ParamRef& p = p_->params[i];
      std::memcpy(flat + at, p.grad, sizeof(float) * p.size);
      at += p.size;
    }
    return std::span<float>(flat, total);
  }

  absl::Status UnpackGradients(GradBucket bucket) override {
    const auto [begin, end] = p_->Range(bucket);
    const float* flat = Flat(bucket).data();
    int64_t at = 0;
    for (size_t i = begin; i < end; ++i) {
      const ParamRef& p = p_->params[i];
      std::memcpy(p.grad, flat + at, sizeof(float) * p.size);
      at += p.size;
    }
    return absl::OkStatus();
  }

  // Reads p_->params, not params(): that would mark this backend's bf16
  // copies stale from the caller's thread.
  absl::Status CopyParamsTo(DenseBackend& dst) override {
    if (dst.device() != DEVICE_CPU) {
      return absl::FailedPreconditionError(
          "dense parameters: the destination backend is not on the CPU");
    }
    // Marks dst's bf16 copies stale: its next Predict rewrites them.
    const std::vector<ParamRef>& to = dst.params();
    RETURN_IF_ERROR(CheckSameParams(p_->params, to));
    for (size_t i = 0; i < to.size(); ++i) {
      std::memcpy(to[i].value, p_->params[i].value,
                  sizeof(float) * p_->params[i].size);
    }
    return absl::OkStatus();
  }

  Mlp& bottom() override {
    stale_ = true;
    return p_->bottom;
  }
  Mlp& top() override {
    stale_ = true;
    return p_->top;
  }
  const std::vector<ParamRef>& params() override {
    stale_ = true;
    return p_->params;
  }
  absl::Status SetOptimizerConfig(const OptimizerConfig& config) override {
    return p_->optimizer->SetConfig(config);
  }
  DenseOptimizer& optimizer() override {
    stale_ = true;
    return *p_->optimizer;
  }

 private:
  // Rewrites the bf16 copies of the weights (nothing at PRECISION_FP32).
  void SyncBf16Weights() {
    p_->bottom.SyncBf16Weights();
    p_->top.SyncBf16Weights();
    if (p_->interaction != nullptr) p_->interaction->SyncBf16Weights();
    stale_ = false;
  }
  // The host view was handed out since the last sync and may have been
  // written (a restore): the bf16 copies follow it.
  void SyncIfStale() {
    if (stale_) SyncBf16Weights();
  }

  // The top bucket has a buffer of its own: it is all-reduced on another
  // thread while the bottom MLP's backward runs.
  AlignedVector<float>& Flat(GradBucket bucket) {
    return bucket == GradBucket::kTop ? flat_top_ : flat_;
  }

  std::unique_ptr<HostDenseParams> p_;
  const bool identity_;
  const DensePrecision precision_;
  // The host view was handed out since the bf16 weights were last written.
  bool stale_ = false;
  // The interaction's output and input gradient: z_ / dt_, or t_ / dz_ for
  // an identity interaction.
  float* z_at_ = nullptr;
  float* dt_at_ = nullptr;
  const float* logits_ = nullptr;  // the top MLP's output (its activations)
  std::optional<double> loss_;     // the last QueueLoss's mean loss
  AlignedVector<float> t_, z_, dz_, dt_, dlogits_, dbottom_, flat_, flat_top_;
  // Predict's (the MLPs' and the interaction's inference paths keep no
  // activations; each is done with the scratch when it returns).
  AlignedVector<float> infer_bottom_, infer_logits_, infer_scratch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DenseBackend>> CreateCpuDenseBackend(
    const ModelConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<HostDenseParams> params,
                   HostDenseParams::Create(config));
  const DensePrecision precision =
      ResolveCpuPrecision(config.dense_precision());
  RETURN_IF_ERROR(params->SetPrecision(precision));
  return std::make_unique<CpuDenseBackend>(MakeInteractionShape(config),
                                           std::move(params), precision);
}

}  // namespace dlrm::dense
