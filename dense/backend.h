// The dense part of a DLRM step behind one interface: bottom MLP ->
// interaction -> top MLP -> BCE loss, forward and backward, the inference
// path, and the dense optimizer. Two implementations, picked once by
// CreateDenseBackend from the config's device: the CPU one (oneDNN,
// dense/cpu_backend.h) and the CUDA one (cuBLASLt and the kernels of
// dense/cuda/, dense/cuda/cuda_backend.h). The model calls only this
// interface and never asks which one it holds.
//
// The model writes the pooled vectors of tables in host memory into the
// host buffer InteractionInput returns and reads their gradients from the
// host buffer InteractionBackward returns. The CUDA backend copies what it
// needs to the device (those columns of the interaction input, the dense
// features, the labels) through pinned staging, and those gradients back.
// Tables in the CUDA device's memory (STORAGE_DEVICE) pool into, and
// update from, the backend's device buffers directly (SetDeviceColumns,
// DeviceInteractionInput, DeviceInteractionGradient), on its stream.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/status.h"
#include "dense/interaction.h"
#include "dense/interaction_layer.h"
#include "dense/linear.h"
#include "dense/optimizer.h"
#include "dlrm/config.pb.h"

namespace dlrm::dense {

// The dense parameters in the two all-reduce buckets of the overlapped
// step. kTop: the top MLP's, final after TopBackward. kBottom: the bottom
// MLP's and the interaction layer's (DCN's cross network), final after
// BottomBackward (the interaction's are final after InteractionBackward
// already, but that runs while kTop's all-reduce may be in flight, so they
// wait for kBottom's). kAll is both, in parameter order: bottom MLP,
// interaction, top MLP.
enum class GradBucket { kBottom, kTop, kAll };

// What a backend's CUDA graphs (ModelConfig.gpu_cuda_graphs) have done
// since it was created (core/graph_replay.h): launch sequences captured,
// graphs replayed, captures that failed (those sequences run plainly) and
// the last failure, and how often a larger batch dropped the graphs keyed
// by batch size; of the captures and replays, those of Update's graph
// (one, kept whatever the batch). All zero where no graphs run (the CPU
// backend, graphs off).
struct GraphCounts {
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t failed_captures = 0;
  absl::Status last_failure;
  int64_t invalidations = 0;
  int64_t update_captures = 0;
  int64_t update_replays = 0;
};

// Columns [begin, end) of a row of the interaction input.
struct ColumnRange {
  int begin = 0;
  int end = 0;
};

// One model's dense part. The training step calls, in order, with the same
// `batch` (samples, >= 0): InteractionInput, BottomForward,
// InteractionForward, TopForward, QueueLoss, TopBackward,
// InteractionBackward, BottomBackward, then (after the gradients'
// all-reduce, if any) Update; ReadLoss whenever the loss is wanted.
// Prediction calls InteractionInput, then Predict. Not thread-safe, except
// that PackGradients / UnpackGradients may run on another thread (the
// overlapped all-reduce): for GradBucket::kTop from TopBackward on, while
// InteractionBackward and BottomBackward run; for the others after
// BottomBackward, while no other call runs; and CopyParamsTo as it says.
//
// Every call that returns a Status fails only on a device error (Internal,
// naming the call) or, on CUDA, InvalidArgument for a shape its kernels
// cannot run.
class DenseBackend {
 public:
  virtual ~DenseBackend() = default;

  // The config's device.
  virtual ComputeDevice device() const = 0;
  // The precision the GEMMs run at: the config's dense_precision, or, on
  // the CPU backend, PRECISION_FP32 where the CPU has no bf16 instructions
  // (dense/bf16.h). The CUDA backend runs what the config says.
  virtual DensePrecision precision() const = 0;
  const InteractionShape& interaction() const { return interaction_; }

  // The host buffer [batch x interaction().input_width] the caller fills
  // with the pooled embeddings (columns from interaction().dim on); the
  // backend writes the bottom MLP's output into columns [0, dim). Valid
  // until the next call of InteractionInput. On CUDA only the columns not
  // written on the device (SetDeviceColumns) are there, rows of
  // input_width up to the last row's last such column (HostRowsFloats):
  // nothing, possibly null, when every embedding column is on the device.
  virtual absl::StatusOr<float*> InteractionInput(int64_t batch) = 0;

  // Bottom MLP on the dense features x [batch x num_dense_features] (host
  // memory), into the interaction input.
  virtual absl::Status BottomForward(const float* x, int64_t batch) = 0;
  virtual absl::Status InteractionForward(int64_t batch) = 0;
  virtual absl::Status TopForward(int64_t batch) = 0;
  // BCE with logits against `labels` (host memory, read before this
  // returns); the logits' gradient is scaled by `grad_scale` (1 / the
  // global batch, so summed gradients are the global mean's). The mean loss
  // over the batch is for ReadLoss: on CUDA it is copied back
  // asynchronously and nothing here waits for the device.
  virtual absl::Status QueueLoss(const float* labels, int64_t batch,
                                 float grad_scale) = 0;
  // The mean loss of the last QueueLoss. On CUDA this waits for that loss's
  // copy to the host only (an event), not for work queued after it. May
  // run on the all-reduce thread (PackGradients' rule). FailedPrecondition
  // before any QueueLoss.
  virtual absl::StatusOr<double> ReadLoss() = 0;
  // QueueLoss, then ReadLoss.
  absl::StatusOr<double> Loss(const float* labels, int64_t batch,
                              float grad_scale) {
    RETURN_IF_ERROR(QueueLoss(labels, batch, grad_scale));
    return ReadLoss();
  }
  // Fills the top MLP's gradients (GradBucket::kTop).
  virtual absl::Status TopBackward(int64_t batch) = 0;
  // Returns the gradient of the interaction input, [batch x input_width] in
  // host memory (columns from dim on: the pooled vectors'; on CUDA only the
  // host columns, as InteractionInput), valid until the next step; with an
  // interaction layer also fills its gradients.
  virtual absl::StatusOr<const float*> InteractionBackward(int64_t batch) = 0;
  // Fills the bottom MLP's gradients (with the interaction layer's, the
  // GradBucket::kBottom bucket); `x` as in BottomForward.
  virtual absl::Status BottomBackward(const float* x, int64_t batch) = 0;
  // One dense optimizer step from the gradients.
  virtual absl::Status Update() = 0;

  // For embedding stores in the backend's device memory (memory_space()
  // kDevice). The CPU backend has none: SetDeviceColumns with a column is
  // Unimplemented there, the others return null.
  //
  // From now on columns `columns` of the interaction input (sorted,
  // disjoint, within [interaction().dim, input_width); InvalidArgument
  // otherwise) are written on the device, into DeviceInteractionInput, and
  // their gradient read there: BottomForward and Predict copy only the other
  // columns of the host buffer up, and InteractionBackward copies only the
  // other columns' gradient down (nothing, and without waiting for the
  // device, when every embedding column is on it). Default: none.
  virtual absl::Status SetDeviceColumns(std::vector<ColumnRange> columns);
  // The cudaStream_t every call queues its device work on, for the stores
  // to queue theirs (so pooling runs before the interaction and updates
  // after the gradient without a host wait); null on the CPU.
  virtual void* cuda_stream() const { return nullptr; }
  // The device interaction input [batch x input_width] of the next training
  // step (read by BottomForward and what follows) or, when `predict`, of
  // the next Predict; valid until the next call with the same `predict`.
  virtual absl::StatusOr<float*> DeviceInteractionInput(int64_t batch,
                                                        bool predict);
  // The gradient of the device interaction input (rows of input_width) once
  // InteractionBackward has been queued; valid until the next step.
  virtual const float* DeviceInteractionGradient() const { return nullptr; }

  // Click probabilities of the batch into probs[0, batch) (host memory):
  // the inference path, which keeps no activations, from the dense
  // features x and the interaction input the caller filled.
  virtual absl::Status Predict(const float* x, int64_t batch, float* probs) = 0;

  // The gradients of `bucket` in a flat host buffer of the bucket's
  // parameters' sizes plus `extra` floats at the end (left for the caller:
  // the loss), for an all-reduce; valid until UnpackGradients(bucket).
  virtual absl::StatusOr<std::span<float>> PackGradients(GradBucket bucket,
                                                         int extra) = 0;
  // Writes PackGradients' buffer (all-reduced) back into the gradients.
  virtual absl::Status UnpackGradients(GradBucket bucket) = 0;
  // As PackGradients, but the flat buffer is in the memory the backend's
  // device interaction input lives in, for an all-reduce over a device
  // communicator on cuda_stream(): on CUDA a device buffer, complete when
  // this returns; on the CPU, PackGradients' host buffer. Valid until
  // UnpackDeviceGradients(bucket), which writes it back into the gradients
  // (on CUDA queued on cuda_stream(), so after the all-reduce queued there
  // and before Update). From the step's thread only, after BottomBackward.
  virtual absl::StatusOr<std::span<float>> PackDeviceGradients(
      GradBucket bucket, int extra) {
    return PackGradients(bucket, extra);
  }
  virtual absl::Status UnpackDeviceGradients(GradBucket bucket) {
    return UnpackGradients(bucket);
  }

  // See GraphCounts.
  virtual GraphCounts graph_counts() const { return {}; }

  // Copies the dense parameters (the weights, not the optimizer state) into
  // `dst`, a backend of the same device and parameter shapes that only
  // predicts (a SnapshotPredictor's): its next Predict runs on them, at
  // PRECISION_BF16 on bf16 copies rewritten from them. Reads only what
  // Update and PublishHostView write, so it may run on another thread than
  // this backend's other calls while neither of those runs (the model's
  // weights_mutex() held shared); writes only `dst`, which no other thread
  // may use meanwhile. On CUDA the copy is queued on dst's stream after an
  // event recorded behind the last queued Update (or upload) on this
  // backend's stream and is complete on return; it waits for nothing else
  // queued on this backend's stream and for no other stream. On the CPU a
  // plain copy. FailedPrecondition naming the difference when `dst` is on
  // another device or has other parameters; Internal on a device error.
  virtual absl::Status CopyParamsTo(DenseBackend& dst) = 0;
  // For a writer of the host view that holds CopyParamsTo's callers off (a
  // restore, under the model's weights_mutex()): makes what CopyParamsTo
  // reads follow the host view now. On CUDA the upload the next step or
  // prediction would do (and a failed download's error); nothing on the
  // CPU, whose host view is what CopyParamsTo reads.
  virtual absl::Status PublishHostView() { return absl::OkStatus(); }

  // The host view of the parameters, for checkpoints, exports and tests:
  // the MLPs; every dense parameter, named "bottom_mlp.<layer>.weight" /
  // ".bias", then the interaction's (InteractionParamSpecs: under DCN
  // "interaction.crossnet.<layer>.V" / ".W" / ".bias"), then "top_mlp....";
  // and their optimizer
  // with its state and step. On the CPU these are the live ones. On CUDA
  // they are a host copy, brought up to date when asked for after an
  // Update, and copied back to the device before the next step or
  // prediction (the caller may have written them: a restore); a failed copy
  // is returned by that next call.
  virtual Mlp& bottom() = 0;
  virtual Mlp& top() = 0;
  virtual const std::vector<ParamRef>& params() = 0;
  virtual DenseOptimizer& optimizer() = 0;
  // DenseOptimizer::SetConfig on the optimizer the next Update runs, and
  // its errors.
  virtual absl::Status SetOptimizerConfig(const OptimizerConfig& config) = 0;

 protected:
  explicit DenseBackend(const InteractionShape& interaction)
      : interaction_(interaction) {}

 private:
  InteractionShape interaction_;
};

// The dense parameters in host memory: both MLPs initialised from
// config.seed() as the DLRM reference does and the interaction layer, if
// any, as its own Init says (DCN's cross network as TorchRec does,
// dense/cross_net.h): the bottom MLP's draws, then the top's, then the
// interaction's, from one stream, so every rank's replica starts equal and
// the MLPs start as they would with another interaction. Their named
// parameters and their optimizer. The CPU backend trains these; the CUDA
// backend keeps them as its host view.
struct HostDenseParams {
  // `config` normalised. InvalidArgument as DenseOptimizer::Create;
  // Internal if the interaction layer's parameters are not its
  // InteractionParamSpecs (a programming error).
  static absl::StatusOr<std::unique_ptr<HostDenseParams>> Create(
      const ModelConfig& config);

  Mlp bottom, top;
  // The config's interaction layer (CreateInteractionLayer); null for an
  // interaction without parameters.
  std::unique_ptr<InteractionLayer> interaction;
  // Borrowed from bottom, interaction and top, in that order.
  std::vector<ParamRef> params;
  std::unique_ptr<DenseOptimizer> optimizer;
  // params[0, top_begin) are the bottom MLP's and the interaction's
  // (GradBucket::kBottom), the rest the top MLP's.
  size_t top_begin = 0;

  // [begin, end) of `bucket` in `params`.
  std::pair<size_t, size_t> Range(GradBucket bucket) const;

  // Sets the MLPs' and the interaction layer's precision, and hands the
  // optimizer their bf16 copies (PRECISION_BF16), which its steps then
  // write as they update the weights. Internal if the copies do not match
  // the parameters (a programming error).
  absl::Status SetPrecision(DensePrecision precision);

 private:
  explicit HostDenseParams(const ModelConfig& config);
};

// OK when `columns` are sorted, disjoint and within [shape.dim,
// shape.input_width) (DenseBackend::SetDeviceColumns); InvalidArgument
// naming the first bad range otherwise.
absl::Status CheckDeviceColumns(const InteractionShape& shape,
                                std::span<const ColumnRange> columns);
// The embedding columns [shape.dim, shape.input_width) not in `device`
// (checked), in order: what the host fills.
std::vector<ColumnRange> HostColumns(const InteractionShape& shape,
                                     std::span<const ColumnRange> device);
// The floats a host buffer of `batch` rows of shape.input_width needs to
// hold the columns `host` (HostColumns: sorted) of every row: up to the
// last row's last host column. 0 without host columns or rows, so a backend
// whose tables are all on the device stages nothing on the host.
int64_t HostRowsFloats(const InteractionShape& shape,
                       std::span<const ColumnRange> host, int64_t batch);

// OK when `to` has the parameters of `from`: as many, each with the same
// name and size (DenseBackend::CopyParamsTo's destination); FailedPrecondition
// naming the first that differs otherwise.
absl::Status CheckSameParams(std::span<const ParamRef> from,
                             std::span<const ParamRef> to);

// The backend of config.device() (`config` normalised). FailedPrecondition
// naming why for DEVICE_CUDA without a usable GPU (built without CUDA, no
// driver, no device); InvalidArgument as DenseOptimizer::Create; Internal
// on a CUDA error while setting up.
absl::StatusOr<std::unique_ptr<DenseBackend>> CreateDenseBackend(
    const ModelConfig& config);

}  // namespace dlrm::dense
