// dlrm_bench_cuda: times the CUDA kernels of the backend (embedding-bag
// forward, fused backward + optimizer, Linear, dot interaction) with CUDA
// events: warm-up, then the median of timed runs, rotating among several
// input sets so repeated runs do not just measure the L2. Prints one table
// row per case: time, logical bytes (each input read once, each output
// written once) and GB/s, or TFLOP/s for GEMMs; the embedding rows also as
// a percentage of the device's measured device-to-device copy bandwidth
// (bytes read plus bytes written, timed first; issue 16's goals are 70%
// forward and 30% backward + optimizer). Without a device it says so and
// exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda/cuda_raii.h"
#include "core/cuda_status.h"
#include "core/device.h"
#include "core/random.h"
#include "core/status.h"
#include "data/batch.h"
#include "dense/cuda/cuda_dense.h"
#include "dense/interaction.h"
#include "embedding/cuda/cuda_embedding_table.h"
#include "embedding/embedding_table.h"
#include "optim/optimizer.h"

namespace dlrm {
namespace {

constexpr int kWarmup = 5;
constexpr int kRuns = 30;
constexpr int kInputSets = 3;

// Median milliseconds of `run(i)` over kRuns runs, i = input set.
absl::StatusOr<double> TimeMs(cudaStream_t stream,
                              const std::function<absl::Status(int)>& run) {
  ASSIGN_OR_RETURN(cuda::CudaEvent start, cuda::CudaEvent::Create(true));
  ASSIGN_OR_RETURN(cuda::CudaEvent stop, cuda::CudaEvent::Create(true));
  for (int i = 0; i < kWarmup; ++i) RETURN_IF_ERROR(run(i % kInputSets));
  std::vector<double> ms;
  for (int i = 0; i < kRuns; ++i) {
    RETURN_IF_ERROR(start.Record(stream));
    RETURN_IF_ERROR(run(i % kInputSets));
    RETURN_IF_ERROR(stop.Record(stream));
    RETURN_IF_ERROR(stop.Synchronize());
    ASSIGN_OR_RETURN(float t, stop.ElapsedMsSince(start));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One table row; `copy_gbs` > 0 adds the GB/s as a percentage of it.
void Row(const std::string& name, double ms, double bytes, double flops,
         double copy_gbs = 0) {
  std::printf("%-52s %9.4f ms", name.c_str(), ms);
  if (bytes > 0) std::printf(" %9.1f GB/s", bytes / ms / 1e6);
  if (bytes > 0 && copy_gbs > 0) {
    std::printf(" %5.1f%% of copy", 100 * bytes / ms / 1e6 / copy_gbs);
  }
  if (flops > 0) std::printf(" %9.1f TFLOP/s", flops / ms / 1e9);
  std::printf("\n");
}

// The device-to-device copy bandwidth, GB/s of bytes read plus bytes
// written: cudaMemcpyAsync of 1 GiB between two buffers, timed as the
// kernels are.
absl::StatusOr<double> CopyBandwidth(cudaStream_t stream) {
  constexpr size_t kFloats = size_t{1} << 28;
  ASSIGN_OR_RETURN(auto a, cuda::DeviceBuffer<float>::Allocate(kFloats));
  ASSIGN_OR_RETURN(auto b, cuda::DeviceBuffer<float>::Allocate(kFloats));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.data(), 1, kFloats * 4, stream));
  ASSIGN_OR_RETURN(
      double ms, TimeMs(stream, [&](int i) -> absl::Status {
        float* src = i % 2 == 0 ? a.data() : b.data();
        float* dst = i % 2 == 0 ? b.data() : a.data();
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, kFloats * 4,
                                             cudaMemcpyDeviceToDevice, stream));
        return absl::OkStatus();
      }));
  const double bytes = 2.0 * kFloats * 4;
  Row("device-to-device copy 1 GiB (read + written)", ms, bytes, 0);
  return bytes / ms / 1e6;
}

data::SparseFeature UniformIds(Rng& rng, int64_t bags, int hot, int64_t rows) {
  data::SparseFeature f;
  f.offsets.resize(bags + 1);
  f.ids.resize(bags * hot);
  for (int64_t s = 0; s <= bags; ++s) f.offsets[s] = s * hot;
  for (int64_t& id : f.ids) id = static_cast<int64_t>(rng.Below(rows));
  return f;
}

absl::Status BenchEmbedding(cudaStream_t stream, double copy_gbs, int64_t rows,
                            int dim, int64_t bags, int hot, Pooling pooling) {
  Rng rng(7);
  for (auto type : {OptimizerConfig::SGD, OptimizerConfig::ROWWISE_ADAGRAD,
                    OptimizerConfig::ADAM}) {
    OptimizerConfig opt;
    opt.set_type(type);
    opt.set_learning_rate(0.01f);
    opt.set_eps(1e-8f);
    opt.set_beta1(0.9f);
    opt.set_beta2(0.999f);
    embedding::EmbeddingTable host(0, rows, dim, pooling, opt, 1);
    ASSIGN_OR_RETURN(auto table,
                     embedding::cuda::CudaEmbeddingTable::FromHost(host));
    std::vector<embedding::cuda::DeviceSparseFeature> sets(kInputSets);
    for (auto& set : sets) {
      RETURN_IF_ERROR(set.Upload(UniformIds(rng, bags, hot, rows)));
    }
    ASSIGN_OR_RETURN(auto out, cuda::DeviceBuffer<float>::Allocate(bags * dim));
    std::vector<float> g(bags * dim);
    for (float& x : g) x = static_cast<float>(rng.Normal());
    ASSIGN_OR_RETURN(auto grad, cuda::DeviceBuffer<float>::Allocate(g.size()));
    RETURN_IF_ERROR(grad.CopyFromHost(std::span<const float>(g)));
    const double ids = static_cast<double>(bags) * hot;
    const std::string shape = "rows " + std::to_string(rows) + " d " +
                              std::to_string(dim) + " bags " +
                              std::to_string(bags) + " x" + std::to_string(hot);
    if (type == OptimizerConfig::SGD) {
      ASSIGN_OR_RETURN(double fwd, TimeMs(stream, [&](int i) {
                         return table->Forward(sets[i].bags(), out.data(), dim,
                                               stream);
                       }));
      Row("forward " + shape, fwd,
          ids * (8 + 4.0 * dim) + 8.0 * bags + 4.0 * bags * dim, 0, copy_gbs);
    }
    // Ids read, each touched row read and written with its optimizer state
    // (the expected number of distinct rows among uniform ids), gradients
    // read once per bag. A tiny table's hot rows also have their gradients
    // summed in chunks (docs/cuda.md): partials not counted.
    const double state = optim::SparseStateFloatsPerRow(opt, dim);
    const double touched =
        rows * -std::expm1(ids * std::log1p(-1.0 / static_cast<double>(rows)));
    ASSIGN_OR_RETURN(double bwd, TimeMs(stream, [&](int i) {
                       return table->BackwardUpdate(sets[i].bags(), grad.data(),
                                                    dim, stream);
                     }));
    Row("backward+" + OptimizerConfig::Type_Name(type) + " " + shape, bwd,
        ids * 8 + touched * 2 * 4.0 * (dim + state) + 4.0 * bags * dim, 0,
        copy_gbs);
  }
  return absl::OkStatus();
}

absl::Status BenchLinear(cudaStream_t stream, int64_t batch, int in, int out,
                         bool tf32) {
  dense::cuda::GemmOptions options;
  options.allow_tf32 = tf32;
  ASSIGN_OR_RETURN(auto ctx, dense::cuda::BlasContext::Create(stream, options));
  Rng rng(3);
  auto make = [&](size_t n) -> absl::StatusOr<cuda::DeviceBuffer<float>> {
    std::vector<float> h(n);
    for (float& x : h) x = static_cast<float>(rng.Normal());
    ASSIGN_OR_RETURN(auto d, cuda::DeviceBuffer<float>::Allocate(n));
    RETURN_IF_ERROR(d.CopyFromHost(std::span<const float>(h)));
    return d;
  };
  ASSIGN_OR_RETURN(auto x, make(batch * in));
  ASSIGN_OR_RETURN(auto w, make(static_cast<size_t>(in) * out));
  ASSIGN_OR_RETURN(auto b, make(out));
  ASSIGN_OR_RETURN(auto y, make(batch * out));
  ASSIGN_OR_RETURN(auto dy, make(batch * out));
  ASSIGN_OR_RETURN(auto dw, make(static_cast<size_t>(in) * out));
  ASSIGN_OR_RETURN(auto db, make(out));
  ASSIGN_OR_RETURN(auto dx, make(batch * in));
  const double flops = 2.0 * batch * in * out;
  const std::string shape = std::to_string(batch) + "x" + std::to_string(in) +
                            "x" + std::to_string(out) +
                            (tf32 ? " tf32" : " fp32");
  ASSIGN_OR_RETURN(double fwd, TimeMs(stream, [&](int) {
                     return dense::cuda::LinearForward(
                         ctx.get(), x.data(), batch, in, out, w.data(),
                         b.data(), true, y.data());
                   }));
  Row("linear forward+bias+relu " + shape, fwd, 0, flops);
  ASSIGN_OR_RETURN(double bwd, TimeMs(stream, [&](int) {
                     return dense::cuda::LinearBackward(
                         ctx.get(), x.data(), y.data(), dy.data(), batch, in,
                         out, w.data(), true, dw.data(), db.data(), dx.data());
                   }));
  Row("linear backward " + shape, bwd, 0, 2 * flops);
  return absl::OkStatus();
}

absl::Status BenchInteraction(cudaStream_t stream, int64_t batch, int n,
                              int d) {
  const int64_t in = batch * n * d,
                out = batch * dense::DotInteractionDim(n, d);
  ASSIGN_OR_RETURN(auto t, cuda::DeviceBuffer<float>::Allocate(in));
  ASSIGN_OR_RETURN(auto z, cuda::DeviceBuffer<float>::Allocate(out));
  ASSIGN_OR_RETURN(auto dt, cuda::DeviceBuffer<float>::Allocate(in));
  std::vector<float> h(in);
  Rng rng(5);
  for (float& x : h) x = static_cast<float>(rng.Normal());
  RETURN_IF_ERROR(t.CopyFromHost(std::span<const float>(h)));
  const std::string shape =
      std::to_string(batch) + "x" + std::to_string(n) + "x" + std::to_string(d);
  ASSIGN_OR_RETURN(double fwd, TimeMs(stream, [&](int) {
                     return dense::cuda::DotInteractionForward(
                         t.data(), batch, n, d, z.data(), stream);
                   }));
  Row("dot interaction forward " + shape, fwd, 4.0 * (in + out), 0);
  ASSIGN_OR_RETURN(double bwd, TimeMs(stream, [&](int) {
                     return dense::cuda::DotInteractionBackward(
                         t.data(), z.data(), batch, n, d, dt.data(), stream);
                   }));
  Row("dot interaction backward " + shape, bwd, 4.0 * (2 * in + out), 0);
  return absl::OkStatus();
}

absl::Status Run() {
  ASSIGN_OR_RETURN(auto device, CreateCudaDevice(0));
  std::printf("device %s\n", device->name().c_str());
  ASSIGN_OR_RETURN(cuda::CudaStream stream, cuda::CudaStream::Create());
  const cudaStream_t s = stream.get();
  ASSIGN_OR_RETURN(const double copy, CopyBandwidth(s));
  // Kaggle-like one-hot lookups and a multi-hot mean, on tables far larger
  // than the L2 so rows come from HBM.
  RETURN_IF_ERROR(BenchEmbedding(s, copy, 4000000, 16, 65536, 1, POOLING_SUM));
  RETURN_IF_ERROR(BenchEmbedding(s, copy, 4000000, 64, 65536, 1, POOLING_SUM));
  RETURN_IF_ERROR(
      BenchEmbedding(s, copy, 4000000, 128, 16384, 20, POOLING_MEAN));
  // Criteo's tiny tables: every row tens of thousands of times a batch, so
  // the backward sums each row in chunks.
  RETURN_IF_ERROR(BenchEmbedding(s, copy, 3, 16, 65536, 1, POOLING_SUM));
  RETURN_IF_ERROR(BenchEmbedding(s, copy, 155, 16, 65536, 1, POOLING_SUM));
  for (bool tf32 : {false, true}) {
    RETURN_IF_ERROR(BenchLinear(s, 65536, 512, 512, tf32));
    RETURN_IF_ERROR(BenchLinear(s, 65536, 367, 512, tf32));
  }
  RETURN_IF_ERROR(BenchInteraction(s, 65536, 27, 16));
  RETURN_IF_ERROR(BenchInteraction(s, 16384, 27, 128));
  return absl::OkStatus();
}

}  // namespace
}  // namespace dlrm

int main() {
  if (dlrm::CudaDeviceCount() == 0) {
    std::printf("no CUDA device (%s): nothing to time\n",
                dlrm::CudaUnavailableReason().c_str());
    return 0;
  }
  const absl::Status st = dlrm::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "dlrm_bench_cuda: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
