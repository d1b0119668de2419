// The host stand-in of the CUDA sparse backward pass: each stage a plain
// loop over what the device's stage computes, with the device's float
// operations (core/host_device.h Rn*) in the device's order.
#include "embedding/sparse_backward_host.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/host_device.h"
#include "core/status.h"
#include "embedding/sparse_chunks.h"

namespace dlrm::embedding {
namespace {

// acc[0, dim) += each occurrence's gradient term, for sorted pairs
// [begin, end) in order: grad row s times 1 / bag size when `mean` (1
// otherwise), one rounded multiply and one rounded add per column, as the
// device kernels do.
void AddOccurrences(const SparseBackwardProducts& p, int64_t begin, int64_t end,
                    int dim, bool mean, const std::vector<int64_t>& offsets,
                    const float* grad, int64_t grad_stride, float* acc) {
  for (int64_t e = begin; e < end; ++e) {
    const int64_t s = p.sorted_bags[e];
    const float scale =
        mean ? RnDiv(1.0f, static_cast<float>(offsets[s + 1] - offsets[s]))
             : 1.0f;
    const float* gs = grad + s * grad_stride;
    for (int c = 0; c < dim; ++c) acc[c] = RnAdd(acc[c], RnMul(gs[c], scale));
  }
}

absl::Status CheckArgs(const char* what, int64_t rows, int dim,
                       const data::SparseFeature& bags, int64_t grad_stride) {
  if (dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dim ", dim, " is below 1"));
  }
  if (grad_stride < dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": grad_stride ", grad_stride, " is below dim ", dim));
  }
  if (rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rows ", rows, " is negative"));
  }
  const int64_t num_bags = bags.num_bags();
  const int64_t n = num_bags == 0 ? 0 : bags.offsets[num_bags];
  if (n > std::numeric_limits<int32_t>::max() ||
      num_bags > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", n, " ids in ", num_bags,
                     " bags; at most 2^31 - 1 of each per call"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SparseBackwardGradients(int64_t rows, int dim, bool mean,
                                     const data::SparseFeature& bags,
                                     const float* grad, int64_t grad_stride,
                                     SparseBackwardProducts* out) {
  RETURN_IF_ERROR(
      CheckArgs("SparseBackwardGradients", rows, dim, bags, grad_stride));
  const int64_t num_bags = bags.num_bags();
  const int64_t n = num_bags == 0 ? 0 : bags.offsets[num_bags];

  // Expand: each occurrence's key and bag, in position (= bag) order.
  struct Pair {
    uint64_t key;
    int32_t bag;
  };
  std::vector<Pair> pairs;
  pairs.reserve(n);
  for (int64_t s = 0; s < num_bags; ++s) {
    for (int64_t p = bags.offsets[s]; p < bags.offsets[s + 1]; ++p) {
      const int64_t id = bags.ids[p];
      pairs.push_back({id >= 0 && id < rows ? static_cast<uint64_t>(id)
                                            : static_cast<uint64_t>(rows),
                       static_cast<int32_t>(s)});
    }
  }
  // The radix sort is stable: equal keys keep position order.
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const Pair& a, const Pair& b) { return a.key < b.key; });
  out->sorted_keys.resize(n);
  out->sorted_bags.resize(n);
  for (int64_t e = 0; e < n; ++e) {
    out->sorted_keys[e] = pairs[e].key;
    out->sorted_bags[e] = pairs[e].bag;
  }

  // Run-length encode, and the runs' starts (the exclusive sum of counts).
  out->unique_keys.clear();
  out->counts.clear();
  out->starts.clear();
  for (int64_t e = 0; e < n; ++e) {
    if (e == 0 || out->sorted_keys[e] != out->sorted_keys[e - 1]) {
      out->unique_keys.push_back(out->sorted_keys[e]);
      out->counts.push_back(0);
      out->starts.push_back(static_cast<int32_t>(e));
    }
    ++out->counts.back();
  }
  const int64_t u = static_cast<int64_t>(out->unique_keys.size());

  // The chunk plan: chunks per run, their exclusive sum, and the list, each
  // chunk's run found as the device's chunk kernel finds it.
  out->chunk_starts.assign(u + 1, 0);
  for (int64_t k = 0; k < u; ++k) {
    const int32_t chunks = out->unique_keys[k] < static_cast<uint64_t>(rows)
                               ? SplitChunks(out->counts[k])
                               : 0;
    out->chunk_starts[k + 1] = out->chunk_starts[k] + chunks;
  }
  const int64_t total = out->chunk_starts[u];
  out->chunks.resize(total);
  for (int64_t j = 0; j < total; ++j) {
    const int64_t k = RunOfChunk(out->chunk_starts.data(), u, j);
    const ChunkRange r = ChunkOccurrences(out->starts[k], out->counts[k],
                                          j - out->chunk_starts[k]);
    out->chunks[j] = SparseChunk{k, r.begin, r.end};
  }

  // Each chunk's partial sum from 0, in occurrence order.
  out->partials.assign(static_cast<size_t>(total) * dim, 0.0f);
  for (int64_t j = 0; j < total; ++j) {
    const SparseChunk& c = out->chunks[j];
    AddOccurrences(*out, c.begin, c.end, dim, mean, bags.offsets, grad,
                   grad_stride, out->partials.data() + j * dim);
  }

  // Each run's gradient from 0: its occurrences in order, or its chunks'
  // partials in chunk order.
  out->row_grads.assign(static_cast<size_t>(u) * dim, 0.0f);
  for (int64_t k = 0; k < u; ++k) {
    if (out->unique_keys[k] >= static_cast<uint64_t>(rows)) continue;
    float* g = out->row_grads.data() + k * dim;
    const int32_t chunks = SplitChunks(out->counts[k]);
    if (chunks == 0) {
      AddOccurrences(*out, out->starts[k], out->starts[k] + out->counts[k], dim,
                     mean, bags.offsets, grad, grad_stride, g);
      continue;
    }
    for (int32_t i = 0; i < chunks; ++i) {
      const float* partial =
          out->partials.data() +
          (static_cast<int64_t>(out->chunk_starts[k]) + i) * dim;
      for (int c = 0; c < dim; ++c) g[c] = RnAdd(g[c], partial[c]);
    }
  }
  return absl::OkStatus();
}

absl::Status SparseBackwardUpdateHost(float* weights, float* state1,
                                      float* state2, int64_t rows, int dim,
                                      bool mean, const optim::AnyStep& step,
                                      const data::SparseFeature& bags,
                                      const float* grad, int64_t grad_stride,
                                      SparseBackwardProducts* products) {
  RETURN_IF_ERROR(SparseBackwardGradients(rows, dim, mean, bags, grad,
                                          grad_stride, products));
  const int64_t u = static_cast<int64_t>(products->unique_keys.size());
  std::visit(
      [&](const auto& constants) {
        using Rule = typename std::decay_t<decltype(constants)>::Rule;
        int64_t floats[2] = {0, 0};
        int a = 0;
        for (const optim::StateArray& array : Rule::kSparseState) {
          floats[a++] = optim::FloatsPerRow(array, dim);
        }
        for (int64_t k = 0; k < u; ++k) {
          if (products->unique_keys[k] >= static_cast<uint64_t>(rows)) continue;
          const int64_t row = static_cast<int64_t>(products->unique_keys[k]);
          optim::UpdateSparseRow<Rule>(
              constants, products->row_grads.data() + k * dim, dim,
              weights + row * dim,
              floats[0] > 0 ? state1 + row * floats[0] : nullptr,
              floats[1] > 0 ? state2 + row * floats[1] : nullptr);
        }
      },
      step);
  return absl::OkStatus();
}

}  // namespace dlrm::embedding
