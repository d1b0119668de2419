// The CUDA dense backend: device twins of the CPU backend's buffers, the
// MLPs layer by layer (device_mlp.h: fp32, or PRECISION_BF16's bf16 layers
// with bf16 copies of the weights), the interaction (its
// DeviceInteractionLayer, DCN's cross network of cuda_cross_net.cc, or the
// kernels of dense_kernels.cu), loss and optimizer kernels of
// dense_kernels.cu over the parameters of device_params.h, and the host
// view kept in step lazily (dense/backend.h); double-buffered pinned
// staging and the CUDA graphs of the training calls' launch sequences
// (step_staging.h; docs/cuda.md "CUDA graphs").
#include "dense/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "core/aligned.h"
#include "core/cuda/cuda_raii.h"
#include "core/cuda_status.h"
#include "core/device.h"
#include "core/graph_replay.h"
#include "core/status.h"
#include "dense/cpu_isa.h"
#include "dense/cuda/cuda_dense.h"
#include "dense/cuda/device_copy.h"
#include "dense/cuda/device_mlp.h"
#include "dense/cuda/device_params.h"
#include "dense/cuda/step_staging.h"
#include "dense/interaction_layer.h"
#include "dense/loss.h"
#include "dense/optimizer.h"
#include "optim/optimizer.h"

namespace dlrm::dense::cuda {
namespace {

using dlrm::cuda::CudaEvent;
using dlrm::cuda::CudaStream;
using dlrm::cuda::DeviceBuffer;
// Device buffers grow through device_mlp.h's Sized; the host ones below.
using ::dlrm::dense::cuda::Sized;

// The device the backend runs on ("cuda" means device 0).
constexpr int kOrdinal = 0;

// Grows `v` to at least `n` elements and returns its data.
float* Sized(AlignedVector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// Grows the pinned `b` to at least `n` elements (contents lost when it
// grows) and returns its data. Called only while no copy from or to it is
// queued: a staging set's buffers once its event has completed
// (StagingSet), the others after a stream synchronisation.
absl::StatusOr<float*> Sized(dlrm::cuda::PinnedBuffer<float>& b, int64_t n) {
  RETURN_IF_ERROR(b.Reserve(static_cast<size_t>(n)));
  return b.data();
}

class CudaDenseBackend final : public DenseBackend {
 public:
  static absl::StatusOr<std::unique_ptr<DenseBackend>> Create(
      const ModelConfig& config);

  ComputeDevice device() const override { return DEVICE_CUDA; }

  // Starts a step's (or a prediction's) staging: the other set than the
  // last step's, once the device is done with it (the step before last's
  // copies; the host waits for that set's event, not for the stream). Only
  // the host columns are pinned (HostRowsFloats): none when every table is
  // in device memory.
  absl::StatusOr<float*> InteractionInput(int64_t batch) override {
    set_ ^= 1;
    RETURN_IF_ERROR(staging_[set_].done.Synchronize());
    return Sized(staging_[set_].t, HostFloats(batch));
  }

  absl::Status SetDeviceColumns(std::vector<ColumnRange> columns) override {
    RETURN_IF_ERROR(CheckDeviceColumns(interaction(), columns));
    host_columns_ = HostColumns(interaction(), columns);
    return absl::OkStatus();
  }

  void* cuda_stream() const override { return stream_.get(); }

  absl::StatusOr<float*> DeviceInteractionInput(int64_t batch,
                                                bool predict) override {
    return Sized(predict ? infer_t_ : t_, batch * interaction().input_width);
  }

  const float* DeviceInteractionGradient() const override { return dt_at_; }

  absl::Status BottomForward(const float* x, int64_t batch) override {
    RETURN_IF_ERROR(Ready());
    // A larger batch than any before grows the buffers below: the graphs
    // that point into them go.
    graphs_.Reserve(batch);
    const InteractionShape& s = interaction();
    ASSIGN_OR_RETURN(const float* x_dev, UploadDense(x, batch, x_));
    ASSIGN_OR_RETURN(float* t, Sized(t_, batch * s.input_width));
    RETURN_IF_ERROR(UploadHostColumns(t, batch));
    RETURN_IF_ERROR(staging_[set_].done.Record(stream()));
    return Graphed(GraphCall::kBottomForward, batch, [&]() -> absl::Status {
      ASSIGN_OR_RETURN(
          const float* out,
          MlpTrainForward(blas_.get(), bf16(), bottom_, x_dev, batch));
      return CopyColumns(out, s.dim, t, s.input_width, batch, s.dim, stream());
    });
  }

  absl::Status InteractionForward(int64_t batch) override {
    const InteractionShape& s = interaction();
    if (identity_) {
      z_at_ = t_.data();
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(z_at_, Sized(z_, batch * s.output_width));
    return Graphed(GraphCall::kInteractionForward, batch, [&] {
      return cuda::InteractionForward(blas_.get(), s, t_.data(), batch, z_at_,
                                      interaction_.get());
    });
  }

  absl::Status TopForward(int64_t batch) override {
    return Graphed(GraphCall::kTopForward, batch, [&] {
      return MlpTrainForward(blas_.get(), bf16(), top_, z_at_, batch).status();
    });
  }

  // No graph: the labels come from this step's staging set.
  absl::Status QueueLoss(const float* labels, int64_t batch,
                         float grad_scale) override {
    StagingSet& set = staging_[set_];
    ASSIGN_OR_RETURN(float* labels_dev, Sized(labels_, batch));
    ASSIGN_OR_RETURN(float* dlogits, Sized(dlogits_, batch));
    ASSIGN_OR_RETURN(float* staged, Sized(set.labels, batch));
    std::copy(labels, labels + batch, staged);
    RETURN_IF_ERROR(
        CopyAsync(labels_dev, staged, batch, cudaMemcpyHostToDevice, stream()));
    RETURN_IF_ERROR(BceWithLogits(top_.layers.back().y.data(), labels_dev,
                                  batch, grad_scale, dlogits, loss_.data(),
                                  stream()));
    RETURN_IF_ERROR(set.loss.Reserve(1));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(set.loss.data(), loss_.data(),
                                         sizeof(double), cudaMemcpyDeviceToHost,
                                         stream()));
    RETURN_IF_ERROR(set.done.Record(stream()));
    loss_set_ = set_;
    return absl::OkStatus();
  }

  absl::StatusOr<double> ReadLoss() override {
    if (loss_set_ < 0) {
      return absl::FailedPreconditionError("ReadLoss: no loss queued yet");
    }
    const StagingSet& set = staging_[loss_set_];
    // The set's event was recorded after the loss's copy (nothing records
    // it again before the next step but one, which waits for it first).
    RETURN_IF_ERROR(set.done.Synchronize());
    return *set.loss.data();
  }

  absl::Status TopBackward(int64_t batch) override {
    ASSIGN_OR_RETURN(float* dz, Sized(dz_, batch * interaction().output_width));
    RETURN_IF_ERROR(Graphed(GraphCall::kTopBackward, batch, [&] {
      return MlpTrainBackward(blas_.get(), bf16(), top_, z_at_, dlogits_.data(),
                              batch, dz, &mlp_scratch_);
    }));
    // Outside the graph: PackGradients' copy stream waits for it.
    return top_ready_.Record(stream());
  }

  absl::StatusOr<const float*> InteractionBackward(int64_t batch) override {
    const InteractionShape& s = interaction();
    if (identity_) {
      dt_at_ = dz_.data();
    } else {
      ASSIGN_OR_RETURN(dt_at_, Sized(dt_, batch * s.input_width));
      RETURN_IF_ERROR(Graphed(GraphCall::kInteractionBackward, batch, [&] {
        return cuda::InteractionBackward(blas_.get(), s, t_.data(), dz_.data(),
                                         batch, dt_at_, interaction_.get());
      }));
    }
    ASSIGN_OR_RETURN(float* host, Sized(dt_host_, HostFloats(batch)));
    // Only the host tables' columns go down; with every table on the device
    // nothing does (and nothing is pinned for them), and the step does not
    // wait here.
    if (host_columns_.empty() || batch == 0) return host;
    RETURN_IF_ERROR(CopyRanges(dt_at_, host, s.input_width, batch,
                               host_columns_, cudaMemcpyDeviceToHost,
                               stream()));
    // A real dependency: the host tables' update reads this gradient as
    // soon as this returns.
    RETURN_IF_ERROR(stream_.Synchronize());
    return host;
  }

  // `x` is already on the device (BottomForward's copy).
  absl::Status BottomBackward(const float* x, int64_t batch) override {
    const InteractionShape& s = interaction();
    ASSIGN_OR_RETURN(float* dbottom, Sized(dbottom_, batch * s.dim));
    RETURN_IF_ERROR(Graphed(GraphCall::kBottomBackward, batch, [&] {
      RETURN_IF_ERROR(CopyColumns(dt_at_, s.input_width, dbottom, s.dim, batch,
                                  s.dim, stream()));
      return MlpTrainBackward(blas_.get(), bf16(), bottom_, x_.data(), dbottom,
                              batch, /*dx=*/nullptr, &mlp_scratch_);
    }));
    return bottom_ready_.Record(stream());
  }

  // The step's constants go up through the current staging set (a plain
  // copy); the kernels read them from constants_, so the launches (and
  // the bf16 weight copies' refresh) are the same every step: one graph,
  // which no batch size drops.
  absl::Status Update() override {
    ++step_;
    ASSIGN_OR_RETURN(const optim::PackedStep packed,
                     optim::MakePackedStep(optimizer_config_, step_));
    StagingSet& set = staging_[set_];
    // The last upload from this slot (the step before last's, or an Update
    // without a step between) has run.
    RETURN_IF_ERROR(set.constants_done.Synchronize());
    std::memcpy(set.constants.data(), packed.bytes.data(), packed.size);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(constants_.data(),
                                         set.constants.data(), packed.size,
                                         cudaMemcpyHostToDevice, stream()));
    RETURN_IF_ERROR(set.constants_done.Record(stream()));
    RETURN_IF_ERROR(update_graphs_.Run(
        {static_cast<int>(GraphCall::kUpdate), 0}, [&] { return Optimize(); }));
    host_stale_ = true;
    // CopyParamsTo's copies wait for this, not for the stream's later work.
    return params_written_.Record(stream());
  }

  absl::Status Predict(const float* x, int64_t batch, float* probs) override {
    RETURN_IF_ERROR(Ready());
    const InteractionShape& s = interaction();
    ASSIGN_OR_RETURN(const float* x_dev, UploadDense(x, batch, infer_x_));
    ASSIGN_OR_RETURN(float* t, Sized(infer_t_, batch * s.input_width));
    ASSIGN_OR_RETURN(float* bottom_out, Sized(infer_bottom_, batch * s.dim));
    ASSIGN_OR_RETURN(float* logits, Sized(infer_logits_, batch));
    RETURN_IF_ERROR(UploadHostColumns(t, batch));
    RETURN_IF_ERROR(MlpInfer(blas_.get(), bf16(), bottom_, x_dev, batch,
                             bottom_out, &mlp_scratch_));
    RETURN_IF_ERROR(CopyColumns(bottom_out, s.dim, t, s.input_width, batch,
                                s.dim, stream()));
    float* z = t;
    if (!identity_) {
      ASSIGN_OR_RETURN(z, Sized(infer_z_, batch * s.output_width));
      RETURN_IF_ERROR(cuda::InteractionInfer(blas_.get(), s, t, batch, z,
                                             interaction_.get(),
                                             &infer_interaction_));
    }
    RETURN_IF_ERROR(
        MlpInfer(blas_.get(), bf16(), top_, z, batch, logits, &mlp_scratch_));
    ASSIGN_OR_RETURN(float* staged, Sized(probs_host_, batch));
    RETURN_IF_ERROR(
        CopyAsync(staged, logits, batch, cudaMemcpyDeviceToHost, stream()));
    // The caller reads the probabilities on return (and this also leaves
    // the staging set free).
    RETURN_IF_ERROR(stream_.Synchronize());
    // The CPU's sigmoid, on the host: the same function either way.
    for (int64_t l = 0; l < batch; ++l) probs[l] = Sigmoid(staged[l]);
    return absl::OkStatus();
  }

  absl::StatusOr<std::span<float>> PackGradients(GradBucket bucket,
                                                 int extra) override {
    // May run on the all-reduce thread, whose current device is its own.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(kOrdinal));
    const int64_t total = params_.GradientFloats(host_->Range(bucket)) + extra;
    float* flat = Sized(Flat(bucket), total);
    return PackInto(bucket, flat, total, cudaMemcpyDeviceToHost);
  }

  absl::Status UnpackGradients(GradBucket bucket) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(kOrdinal));
    RETURN_IF_ERROR(params_.CopyGradients(
        host_->Range(bucket), Flat(bucket).data(), /*to_flat=*/false,
        cudaMemcpyHostToDevice, copy_stream_.get()));
    // Update (on the compute stream) runs after this returns.
    return copy_stream_.Synchronize();
  }

  absl::StatusOr<std::span<float>> PackDeviceGradients(GradBucket bucket,
                                                       int extra) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(kOrdinal));
    const int64_t total = params_.GradientFloats(host_->Range(bucket)) + extra;
    // The last step's unpack (on the compute stream) may still read the
    // buffer: growing it (cudaFree) waits for the device anyway, and the
    // copies below wait for this step's backward, queued after it.
    ASSIGN_OR_RETURN(float* flat, Sized(flat_device_, total));
    return PackInto(bucket, flat, total, cudaMemcpyDeviceToDevice);
  }

  absl::Status UnpackDeviceGradients(GradBucket bucket) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(kOrdinal));
    // On the compute stream: after the all-reduce, before Update.
    return params_.CopyGradients(host_->Range(bucket), flat_device_.data(),
                                 /*to_flat=*/false, cudaMemcpyDeviceToDevice,
                                 stream());
  }

  DensePrecision precision() const override { return precision_; }

  // Reads only params_ (fixed since Create), params_written_ (recorded by
  // Update and Upload) and the weights they write; host_->params for the
  // names and sizes, which never change.
  absl::Status CopyParamsTo(DenseBackend& dst) override {
    if (dst.device() != DEVICE_CUDA) {
      return absl::FailedPreconditionError(
          "dense parameters: the destination backend is not on CUDA");
    }
    // The one CUDA implementation.
    auto& to = static_cast<CudaDenseBackend&>(dst);
    RETURN_IF_ERROR(CheckSameParams(host_->params, to.host_->params));
    // The caller's thread (a predictor's) may have another device current.
    CUDA_RETURN_IF_ERROR(cudaSetDevice(kOrdinal));
    // A host view of dst's handed out since its last upload goes up first,
    // so that its next Predict does not upload it over the copy.
    RETURN_IF_ERROR(to.Ready());
    CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(to.stream(), params_written_.get()));
    RETURN_IF_ERROR(params_.CopyValuesTo(to.params_, to.stream()));
    // After the copy on dst's stream, before its next forward.
    RETURN_IF_ERROR(to.SyncBf16Weights());
    to.host_stale_ = true;
    // The source may be overwritten by the next Update once the caller lets
    // it run: the copy is done before this returns. dst's stream only.
    return to.stream_.Synchronize();
  }

  absl::Status PublishHostView() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(kOrdinal));
    return Ready();
  }

  GraphCounts graph_counts() const override {
    GraphCounts c;
    if (!graphs_.enabled()) return c;
    c.update_captures = update_graphs_.captures();
    c.update_replays = update_graphs_.replays();
    c.captures = graphs_.captures() + c.update_captures;
    c.replays = graphs_.replays() + c.update_replays;
    c.failed_captures =
        graphs_.failed_captures() + update_graphs_.failed_captures();
    c.last_failure = update_graphs_.last_failure().ok()
                         ? graphs_.last_failure()
                         : update_graphs_.last_failure();
    c.invalidations = graphs_.invalidations();
    return c;
  }

  Mlp& bottom() override {
    HostAccess();
    return host_->bottom;
  }
  Mlp& top() override {
    HostAccess();
    return host_->top;
  }
  const std::vector<ParamRef>& params() override {
    HostAccess();
    return host_->params;
  }
  DenseOptimizer& optimizer() override {
    HostAccess();
    return *host_->optimizer;
  }
  // The host view's optimizer keeps the config a checkpoint saves; the
  // device's constants come from optimizer_config_ at the next Update.
  absl::Status SetOptimizerConfig(const OptimizerConfig& config) override {
    RETURN_IF_ERROR(host_->optimizer->SetConfig(config));
    optimizer_config_ = config;
    return absl::OkStatus();
  }

 private:
  // The packs' copies of `bucket`'s gradients into `flat` (`total`
  // floats, as `kind`) on the copy stream, complete on return (so that an
  // all-reduce queued afterwards on any stream reads them whole). They
  // wait there for the backward that wrote them.
  absl::StatusOr<std::span<float>> PackInto(GradBucket bucket, float* flat,
                                            int64_t total,
                                            cudaMemcpyKind kind) {
    const CudaEvent& ready =
        bucket == GradBucket::kTop ? top_ready_ : bottom_ready_;
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_.get(), ready.get()));
    RETURN_IF_ERROR(params_.CopyGradients(host_->Range(bucket), flat,
                                          /*to_flat=*/true, kind,
                                          copy_stream_.get()));
    RETURN_IF_ERROR(copy_stream_.Synchronize());
    return std::span<float>(flat, total);
  }
  CudaDenseBackend(const ModelConfig& config,
                   std::unique_ptr<HostDenseParams> host)
      : DenseBackend(MakeInteractionShape(config)),
        host_(std::move(host)),
        identity_(InteractionIsIdentity(interaction().kind)),
        optimizer_config_(config.dense_optimizer()),
        precision_(ResolvePrecision(DEVICE_CUDA, config.dense_precision())),
        layer_wise_(
            !optim::VisitElementWise(optimizer_config_.type(), [](auto) {})),
        graph_ops_{&stream_},
        graphs_(&graph_ops_, config.gpu_cuda_graphs()),
        update_graphs_(&graph_ops_, config.gpu_cuda_graphs()),
        host_columns_(HostColumns(interaction(), {})) {}

  cudaStream_t stream() const { return stream_.get(); }

  // Update's launches, after the constants' upload: every parameter's
  // optimizer kernels reading constants_, then the bf16 weight copies.
  absl::Status Optimize() {
    RETURN_IF_ERROR(params_.Optimize(optimizer_config_.type(),
                                     constants_.data(), stream()));
    return SyncBf16Weights();
  }

  // Queues `launches` (device work only: no host synchronisation, no
  // allocation, no copy from pageable memory, no event record) for `call`
  // on `batch` samples, as a graph when gpu_cuda_graphs is set
  // (GraphReplay: plain on the first run, captured on the second, replayed
  // after). The launches must not change host state that later calls read:
  // a replay does not run them.
  absl::Status Graphed(GraphCall call, int64_t batch,
                       absl::FunctionRef<absl::Status()> launches) {
    // An empty batch queues little or nothing.
    if (batch == 0) return launches();
    return graphs_.Run({static_cast<int>(call), batch}, launches);
  }

  // The dense features x (host memory) on the device, in `dev`, through the
  // current staging set.
  absl::StatusOr<const float*> UploadDense(const float* x, int64_t batch,
                                           DeviceBuffer<float>& dev) {
    const int64_t floats = batch * bottom_.layers.front().in;
    ASSIGN_OR_RETURN(float* x_dev, Sized(dev, floats));
    ASSIGN_OR_RETURN(float* staged, Sized(staging_[set_].x, floats));
    std::copy(x, x + floats, staged);
    RETURN_IF_ERROR(
        CopyAsync(x_dev, staged, floats, cudaMemcpyHostToDevice, stream()));
    return x_dev;
  }

  // Floats of the host staging of `batch` rows of the interaction input or
  // its gradient: up to the last host column (none without one).
  int64_t HostFloats(int64_t batch) const {
    return HostRowsFloats(interaction(), host_columns_, batch);
  }

  // The host tables' columns of the interaction input the caller filled
  // (InteractionInput) into the device's `t`.
  absl::Status UploadHostColumns(float* t, int64_t batch) {
    return CopyRanges(staging_[set_].t.data(), t, interaction().input_width,
                      batch, host_columns_, cudaMemcpyHostToDevice, stream());
  }

  AlignedVector<float>& Flat(GradBucket bucket) {
    return bucket == GradBucket::kTop ? flat_top_ : flat_;
  }

  // Allocates the device twins of the host view's layers, interaction
  // layer and optimizer state.
  absl::Status Allocate(const ModelConfig& config) {
    RETURN_IF_ERROR(AllocateMlp(host_->bottom, bf16(), &bottom_));
    RETURN_IF_ERROR(AllocateMlp(host_->top, bf16(), &top_));
    ASSIGN_OR_RETURN(interaction_,
                     CreateDeviceInteractionLayer(config, precision_));
    RETURN_IF_ERROR(
        params_.AddNetwork(bottom_, interaction_.get(), top_,
                           optim::DenseState(optimizer_config_).size()));
    RETURN_IF_ERROR(params_.Finish(host_->params, layer_wise_));
    ASSIGN_OR_RETURN(loss_, DeviceBuffer<double>::Allocate(1));
    ASSIGN_OR_RETURN(constants_,
                     DeviceBuffer<double>::Allocate(kConstantDoubles));
    for (StagingSet& set : staging_) {
      RETURN_IF_ERROR(set.constants.Reserve(kConstantDoubles));
    }
    return absl::OkStatus();
  }

  // Copies the host view (weights, optimizer state and step) to the device.
  absl::Status Upload() {
    const std::vector<ParamRef> state = host_->optimizer->State();
    const size_t arrays = optim::DenseState(optimizer_config_).size();
    RETURN_IF_ERROR(params_.CopyHostView(host_->params, state, arrays,
                                         cudaMemcpyHostToDevice, stream()));
    step_ = host_->optimizer->step();
    RETURN_IF_ERROR(SyncBf16Weights());
    RETURN_IF_ERROR(params_written_.Record(stream()));
    return stream_.Synchronize();
  }

  bool bf16() const { return precision_ == PRECISION_BF16; }

  // At PRECISION_BF16, queues on the compute stream the rewrite of every
  // bf16 weight copy from the fp32 weights (after an Update or an Upload,
  // before the next forward); nothing at fp32.
  absl::Status SyncBf16Weights() {
    if (!bf16()) return absl::OkStatus();
    RETURN_IF_ERROR(SyncMlpBf16(bottom_, stream()));
    RETURN_IF_ERROR(SyncMlpBf16(top_, stream()));
    if (interaction_ == nullptr) return absl::OkStatus();
    return interaction_->SyncBf16Weights(stream());
  }

  // Copies the device's weights, optimizer state and step to the host view.
  absl::Status Download() {
    const std::vector<ParamRef> state = host_->optimizer->State();
    const size_t arrays = optim::DenseState(optimizer_config_).size();
    RETURN_IF_ERROR(params_.CopyHostView(host_->params, state, arrays,
                                         cudaMemcpyDeviceToHost, stream()));
    host_->optimizer->set_step(step_);
    return stream_.Synchronize();
  }

  // The host view is about to be read, and maybe written.
  void HostAccess() {
    if (host_stale_) {
      deferred_.Update(Download());
      host_stale_ = false;
    }
    device_stale_ = true;
  }

  // Before device work: a failed download is reported, and a host view
  // handed out since the last upload is copied in.
  absl::Status Ready() {
    RETURN_IF_ERROR(std::exchange(deferred_, absl::OkStatus()));
    if (device_stale_) {
      RETURN_IF_ERROR(Upload());
      device_stale_ = false;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<HostDenseParams> host_;
  const bool identity_;
  OptimizerConfig optimizer_config_;
  // PRECISION_BF16 runs the bf16 layers (every GPU this is
  // built for, sm_80 and up, has bf16 tensor cores).
  const DensePrecision precision_;
  // LAMB or LARS: Update runs LayerOptimizerUpdate.
  const bool layer_wise_;
  int64_t step_ = 0;
  // The host view is older than the device (an Update since the last
  // download) / was handed out since the last upload / a download's error
  // for the next call.
  bool host_stale_ = false;
  bool device_stale_ = false;
  absl::Status deferred_;

  // Declared before what is queued on them and the buffers they use.
  CudaStream stream_, copy_stream_;
  std::unique_ptr<BlasContext> blas_;
  CudaEvent top_ready_, bottom_ready_;
  // Recorded on stream_ after each Update's and Upload's writes of the
  // weights: what CopyParamsTo's copies wait for.
  CudaEvent params_written_;
  // The training calls' graphs on stream_ (ModelConfig.gpu_cuda_graphs):
  // per (call, batch size), dropped when the batch grows; and Update's,
  // whose pointers (parameters, state, constants_, layer_scratch_) do not
  // depend on the batch, so it is never dropped.
  StreamGraphOps graph_ops_;
  GraphReplay<StreamGraphOps> graphs_;
  GraphReplay<StreamGraphOps> update_graphs_;

  DeviceMlp bottom_, top_;
  // The interaction layer's twin; null without one.
  std::unique_ptr<DeviceInteractionLayer> interaction_;
  DeviceParams params_;  // host_->params' order
  DeviceBuffer<double> loss_;
  // The current step's optimizer constants (an optim::PackedStep), which
  // Update uploads and its kernels read.
  DeviceBuffer<double> constants_;
  // The step's device buffers; z_at_ / dt_at_ point at z_ / dt_, or at
  // t_ / dz_ for an identity interaction.
  DeviceBuffer<float> x_, t_, z_, dz_, dt_, labels_, dlogits_, dbottom_;
  float* z_at_ = nullptr;
  float* dt_at_ = nullptr;
  // Predict's.
  DeviceBuffer<float> infer_x_, infer_t_, infer_z_, infer_bottom_,
      infer_logits_, infer_interaction_;
  // The MLP passes' scratch (both MLPs, training and Predict).
  MlpScratch mlp_scratch_;
  // The steps' inputs' pinned staging, double-buffered: set_ is the one
  // the current step (InteractionInput on) fills; loss_set_ holds the last
  // QueueLoss's loss (-1 before any).
  StagingSet staging_[2];
  int set_ = 1;
  int loss_set_ = -1;
  // Pinned staging read back within the call that fills it: the
  // interaction gradient (InteractionBackward waits for it) and the
  // predictions (Predict waits). One buffer each suffices.
  dlrm::cuda::PinnedBuffer<float> dt_host_, probs_host_;
  // The embedding columns the host fills: all of them, or those that
  // SetDeviceColumns left.
  std::vector<ColumnRange> host_columns_;
  // The all-reduce buckets, and PackDeviceGradients' one.
  AlignedVector<float> flat_, flat_top_;
  DeviceBuffer<float> flat_device_;
};

absl::StatusOr<std::unique_ptr<DenseBackend>> CudaDenseBackend::Create(
    const ModelConfig& config) {
  // FailedPrecondition naming why when there is no usable device; makes
  // the device current for this thread.
  absl::StatusOr<std::unique_ptr<Device>> device = CreateCudaDevice(kOrdinal);
  if (!device.ok()) {
    return absl::Status(
        device.status().code(),
        absl::StrCat("device cuda: ", device.status().message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HostDenseParams> host,
                   HostDenseParams::Create(config));
  std::unique_ptr<CudaDenseBackend> b(
      new CudaDenseBackend(config, std::move(host)));
  ASSIGN_OR_RETURN(b->stream_, CudaStream::Create());
  ASSIGN_OR_RETURN(b->copy_stream_, CudaStream::Create());
  GemmOptions gemm;
  gemm.allow_tf32 = !config.gpu_disable_tf32();
  ASSIGN_OR_RETURN(b->blas_, BlasContext::Create(b->stream_.get(), gemm));
  // cuBLAS gets the cuBLASLt workspace too (calls on one stream take turns
  // with it): a capture needs cuBLAS to use a workspace it was given rather
  // than one it allocates, and graphs on or off then run the same GEMMs.
  CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(
      b->blas_->cublas(), b->blas_->lt_workspace(), gemm.workspace_bytes));
  ASSIGN_OR_RETURN(b->top_ready_, CudaEvent::Create());
  ASSIGN_OR_RETURN(b->bottom_ready_, CudaEvent::Create());
  ASSIGN_OR_RETURN(b->params_written_, CudaEvent::Create());
  for (StagingSet& set : b->staging_) {
    ASSIGN_OR_RETURN(set.done, CudaEvent::Create());
    ASSIGN_OR_RETURN(set.constants_done, CudaEvent::Create());
  }
  RETURN_IF_ERROR(b->Allocate(config));
  RETURN_IF_ERROR(b->Upload());
  return std::unique_ptr<DenseBackend>(std::move(b));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DenseBackend>> CreateCudaDenseBackend(
    const ModelConfig& config) {
  return CudaDenseBackend::Create(config);
}

}  // namespace dlrm::dense::cuda
