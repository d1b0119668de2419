// bf16 conversions and GEMMs on oneDNN's matmul primitive (the Debian
// oneDNN 2.6 has no bf16 GEMM in its C API; its matmul dispatches bf16 x
// bf16 -> fp32 to the avx512_core_bf16 / AMX brgemm kernels).
#include "dense/bf16.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <unordered_map>

#include "dense/cpu_isa.h"

namespace dlrm::dense {
namespace {

// Conversions below this many floats run on one thread.
constexpr int64_t kParallelFloats = 1 << 16;

// Cached primitives per thread past which the cache starts over (inference
// on many batch sizes); oneDNN's own primitive cache keeps the JIT code.
constexpr size_t kMaxCachedPrimitives = 256;

struct GemmKey {
  char trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  float beta;
  bool bf16_out;
  bool bias = false;  // an fp32 bias [n] added to every row of C
  bool relu = false;  // ReLU on the sums (after the bias)
  bool operator<(const GemmKey& o) const {
    return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldc, beta, bf16_out,
                    bias, relu) < std::tie(o.trans_a, o.trans_b, o.m, o.n, o.k,
                                           o.lda, o.ldb, o.ldc, o.beta,
                                           o.bf16_out, o.bias, o.relu);
  }
};

struct Gemm {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
};

[[noreturn]] void Die(const GemmKey& key, const char* what) {
  std::fprintf(stderr, "bf16 matmul(%c, %c, %lld, %lld, %lld) failed: %s\n",
               key.trans_a, key.trans_b, static_cast<long long>(key.m),
               static_cast<long long>(key.n), static_cast<long long>(key.k),
               what);
  std::abort();
}

// Row-major op(X) of `rows` x `cols` stored with leading dimension ld.
dnnl::memory::desc Operand(char trans, int64_t rows, int64_t cols, int64_t ld) {
  const dnnl::memory::dims strides =
      trans == 'N' ? dnnl::memory::dims{ld, 1} : dnnl::memory::dims{1, ld};
  return dnnl::memory::desc({rows, cols}, dnnl::memory::data_type::bf16,
                            strides);
}

dnnl::matmul::primitive_desc MakeDesc(const GemmKey& key) {
  const dnnl::memory::desc a = Operand(key.trans_a, key.m, key.k, key.lda);
  const dnnl::memory::desc b = Operand(key.trans_b, key.k, key.n, key.ldb);
  const dnnl::memory::desc c({key.m, key.n},
                             key.bf16_out ? dnnl::memory::data_type::bf16
                                          : dnnl::memory::data_type::f32,
                             dnnl::memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (key.beta != 0.0f) ops.append_sum(key.beta);
  if (key.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0, 0);
  attr.set_post_ops(ops);
  if (key.bias) {
    const dnnl::memory::desc bias({1, key.n}, dnnl::memory::data_type::f32,
                                  dnnl::memory::dims{key.n, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), attr,
                                        CpuEngine());
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr,
                                      CpuEngine());
}

const Gemm& Cached(const GemmKey& key) {
  thread_local std::map<GemmKey, Gemm> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxCachedPrimitives) cache.clear();
  try {
    dnnl::matmul::primitive_desc pd = MakeDesc(key);
    dnnl::matmul primitive(pd);
    return cache.emplace(key, Gemm{std::move(pd), std::move(primitive)})
        .first->second;
  } catch (const dnnl::error& e) {
    Die(key, e.what());
  }
}

void Run(const GemmKey& key, const Bf16* a, const Bf16* b, void* c,
         const float* bias = nullptr) {
  const Gemm& g = Cached(key);
  thread_local dnnl::stream stream(CpuEngine());
  try {
    dnnl::memory am(g.pd.src_desc(), CpuEngine(), const_cast<Bf16*>(a));
    dnnl::memory bm(g.pd.weights_desc(), CpuEngine(), const_cast<Bf16*>(b));
    dnnl::memory cm(g.pd.dst_desc(), CpuEngine(), c);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (key.bias) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(g.pd.bias_desc(), CpuEngine(),
                                               const_cast<float*>(bias)));
    }
    g.primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    Die(key, e.what());
  }
}

}  // namespace

void ToBf16(const float* in, int64_t n, Bf16* out) {
#pragma omp parallel for schedule(static) if (n >= kParallelFloats)
  for (int64_t i = 0; i < n; ++i) out[i] = ToBf16(in[i]);
}

void Bgemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
           const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no product: oneDNN refuses an empty reduction
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      }
    }
    return;
  }
  Run({trans_a, trans_b, m, n, k, lda, ldb, ldc, beta, false}, a, b, c);
}

void BgemmToBf16(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
                 const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb,
                 Bf16* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = 0;
    }
    return;
  }
  Run({trans_a, trans_b, m, n, k, lda, ldb, ldc, 0.0f, true}, a, b, c);
}

void BgemmBiasAct(int64_t m, int64_t n, int64_t k, const Bf16* a, int64_t lda,
                  const Bf16* b, int64_t ldb, const float* bias, bool relu,
                  float* c_f32, Bf16* c_bf16, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no product: oneDNN refuses an empty reduction
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float v = relu ? std::max(bias[j], 0.0f) : bias[j];
        if (c_f32 != nullptr) c_f32[i * ldc + j] = v;
        if (c_bf16 != nullptr) c_bf16[i * ldc + j] = ToBf16(v);
      }
    }
    return;
  }
  GemmKey key{'N', 'T', m, n, k, lda, ldb, ldc, 0.0f, c_bf16 != nullptr};
  key.bias = true;
  key.relu = relu;
  Run(key, a, b, c_bf16 != nullptr ? static_cast<void*>(c_bf16) : c_f32, bias);
}

std::string BgemmImplementation(char trans_a, char trans_b, int64_t m,
                                int64_t n, int64_t k) {
  const GemmKey key{trans_a,
                    trans_b,
                    m,
                    n,
                    k,
                    trans_a == 'N' ? k : m,
                    trans_b == 'N' ? n : k,
                    n,
                    0.0f,
                    false};
  return Cached(key).pd.impl_info_str();
}

bool CpuHasBf16() {
  static const bool has = [] {
    EnsureCpuIsa();
    __builtin_cpu_init();
    const bool cpu = __builtin_cpu_supports("avx512bf16");
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    // dnnl_cpu_isa_all (0) means no limit; otherwise the limit is a mask of
    // the ISA extensions oneDNN may use.
    return cpu && (isa == 0 || (isa & bf16) == bf16);
  }();
  return has;
}

}  // namespace dlrm::dense
