// Linear layers on cuBLAS / cuBLASLt. Row-major [rows x cols] buffers are
// column-major [cols x rows] to cuBLAS, so y = x W^T (row-major) is
// y^T = W x^T in cuBLAS's terms: A = W stored [in x out] used transposed,
// B = x stored [in x batch], D = y stored [out x batch]. The bias then runs
// along D's rows, which is what the cuBLASLt BIAS epilogue broadcasts.
// Each cuBLASLt call's descriptor, layouts and algorithm are made once per
// shape, data type and pointer alignments and kept in the BlasContext. The
// bf16 layers (PRECISION_BF16) take bf16 A and B and write fp32, as the
// CPU's dense::Bgemm.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/lru_cache.h"
#include "core/status.h"
#include "dense/cuda/cuda_dense.h"

namespace dlrm::dense::cuda {
namespace {

using internal::LinearForwardKey;
using internal::LtPlanKey;

// Owners of cuBLASLt descriptors, freed however the call ends.
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const {
    cublasLtMatmulDescDestroy(d);
  }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const {
    cublasLtMatrixLayoutDestroy(l);
  }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using MatmulDesc =
    std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference =
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

absl::StatusOr<Layout> MakeLayout(cudaDataType_t type, uint64_t rows,
                                  uint64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  return Layout(l);
}

absl::Status CheckDims(const char* what, int64_t batch, int in, int out) {
  if (batch < 0 || batch > INT_MAX || in <= 0 || out <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": batch ", batch, " must be in [0, 2^31), in ", in,
                     " and out ", out, " positive"));
  }
  return absl::OkStatus();
}

// One cuBLASLt GEMM set up: the descriptor (its bias pointer is set again
// on each call), the layouts and the heuristic's algorithm, if it found one.
struct LtPlan {
  MatmulDesc desc;
  Layout a, b, d;
  bool found = false;
  cublasLtMatmulAlgo_t algo = {};
};

cublasLtEpilogue_t Epilogue(bool bias, bool relu) {
  return bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
              : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
}

// The plan of `key`: its descriptor, layouts, and the heuristic's best
// algorithm for a workspace of `workspace` bytes and pointers aligned as
// the key says (`bias` is the bias pointer the heuristic sees, null
// without one).
absl::StatusOr<LtPlan> MakePlan(cublasLtHandle_t lt, const LtPlanKey& key,
                                const float* bias, size_t workspace) {
  LtPlan plan;
  const cublasComputeType_t compute =
      key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(&raw_desc, compute, CUDA_R_32F));
  plan.desc.reset(raw_desc);
  const cublasOperation_t trans_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  const auto epilogue = static_cast<cublasLtEpilogue_t>(key.epilogue);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // Stored shapes: op(A) [m x k] is A [k x m] when transposed. A and B
  // have the key's type; C and D are fp32, and so is the bias (cuBLASLt's
  // default bias type is D's, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
  const auto type = static_cast<cudaDataType_t>(key.data_type);
  ASSIGN_OR_RETURN(plan.a, key.trans_a
                               ? MakeLayout(type, key.k, key.m, key.lda)
                               : MakeLayout(type, key.m, key.k, key.lda));
  ASSIGN_OR_RETURN(plan.b, key.trans_b
                               ? MakeLayout(type, key.n, key.k, key.ldb)
                               : MakeLayout(type, key.k, key.n, key.ldb));
  ASSIGN_OR_RETURN(plan.d, MakeLayout(CUDA_R_32F, key.m, key.n, key.ldd));

  cublasLtMatmulPreference_t raw_pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
  Preference pref(raw_pref);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
      sizeof(workspace)));
  // The real pointers' alignments, so the heuristic may pick the kernels
  // that need them (it assumes only the element size otherwise).
  const uint32_t align_a = key.align_a, align_b = key.align_b,
                 align_d = key.align_d;
  for (auto [attribute, value] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d}}) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        raw_pref, attribute, value, sizeof(*value)));
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      lt, raw_desc, plan.a.get(), plan.b.get(), plan.d.get(), plan.d.get(),
      raw_pref, 1, &result, &found);
  switch (internal::ClassifyHeuristic(heuristic, found)) {
    case internal::HeuristicAnswer::kUse:
      plan.found = true;
      plan.algo = result.algo;
      break;
    case internal::HeuristicAnswer::kNone:
      break;
    case internal::HeuristicAnswer::kError:
      // Once per plan (the plan is cached): this shape runs cublasGemmEx.
      std::fprintf(stderr,
                   "cuBLASLt heuristic (m %lld, n %lld, k %lld): %s; falling "
                   "back to cublasGemmEx\n",
                   static_cast<long long>(key.m), static_cast<long long>(key.n),
                   static_cast<long long>(key.k),
                   cublasGetStatusString(heuristic));
      break;
  }
  return plan;
}

}  // namespace

namespace internal {

HeuristicAnswer ClassifyHeuristic(cublasStatus_t status, int found) {
  if (status == CUBLAS_STATUS_SUCCESS) {
    return found > 0 ? HeuristicAnswer::kUse : HeuristicAnswer::kNone;
  }
  return status == CUBLAS_STATUS_NOT_SUPPORTED ? HeuristicAnswer::kNone
                                               : HeuristicAnswer::kError;
}

int PointerAlignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int alignment = kMaxPointerAlignment;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

LtPlanKey LinearForwardKey(const void* x, int64_t batch, int in, int out,
                           const void* w, const float* b, bool relu, bool tf32,
                           float* y, cudaDataType_t data_type) {
  LtPlanKey key;
  key.m = out;
  key.n = batch;
  key.k = in;
  key.lda = in;
  key.ldb = in;
  key.ldd = out;
  key.trans_a = true;
  key.trans_b = false;
  key.epilogue = Epilogue(b != nullptr, relu);
  key.tf32 = tf32 && data_type == CUDA_R_32F;
  key.data_type = data_type;
  key.align_a = PointerAlignment(w);
  key.align_b = PointerAlignment(x);
  key.align_d = PointerAlignment(y);
  key.align_bias = b == nullptr ? 0 : PointerAlignment(b);
  return key;
}

// The plans of one BlasContext, by key: the kMaxLtPlans most recently used
// (a server answering many batch sizes makes a plan again only for shapes
// it has not used lately).
class LtPlanCache {
 public:
  // The plan of `key`, made when not cached (MakePlan). The pointer is
  // valid until the next Find. Internal on cuBLAS errors.
  absl::StatusOr<const LtPlan*> Find(cublasLtHandle_t lt, const LtPlanKey& key,
                                     const float* bias, size_t workspace) {
    if (const LtPlan* plan = plans_.Find(key)) return plan;
    ASSIGN_OR_RETURN(LtPlan plan, MakePlan(lt, key, bias, workspace));
    return &plans_.Insert(key, std::move(plan));
  }

  size_t size() const { return plans_.size(); }

 private:
  LruCache<LtPlanKey, LtPlan> plans_{kMaxLtPlans};
};

}  // namespace internal

namespace {

// InvalidArgument naming `name` unless every size fits cuBLAS's int.
absl::Status CheckGemmSizes(const char* name, int64_t m, int64_t n, int64_t k,
                            int64_t lda, int64_t ldb, int64_t ldc) {
  for (int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": sizes m ", m, " n ", n, " k ", k, " lda ", lda,
                       " ldb ", ldb, " ldc ", ldc, " must be in [0, 2^31)"));
    }
  }
  return absl::OkStatus();
}

// 'T': transposed; anything else: as is.
cublasOperation_t CublasOp(char trans) {
  return trans == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// Gemm and GemmBf16: row-major C = op(A) op(B) + beta C with A and B of
// `type`, through cublasSgemm (CUDA_R_32F) or cublasGemmEx with fp32
// accumulation (CUDA_R_16BF). That is column-major C^T = op(B)^T op(A)^T:
// the row-major buffers are the column-major transposes, so B goes first.
// Errors as CheckGemmSizes (naming `name`), then cuBLAS's.
absl::Status RowMajorGemm(BlasContext* ctx, const char* name,
                          cudaDataType_t type, char trans_a, char trans_b,
                          int64_t m, int64_t n, int64_t k, const void* a,
                          int64_t lda, const void* b, int64_t ldb, float beta,
                          float* c, int64_t ldc) {
  RETURN_IF_ERROR(CheckGemmSizes(name, m, n, k, lda, ldb, ldc));
  if (m == 0 || n == 0) return absl::OkStatus();
  const cublasOperation_t op_a = CublasOp(trans_a);
  const cublasOperation_t op_b = CublasOp(trans_b);
  const float alpha = 1.0f;
  if (type == CUDA_R_32F) {
    CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        ctx->cublas(), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
        static_cast<int>(k), &alpha, static_cast<const float*>(b),
        static_cast<int>(ldb), static_cast<const float*>(a),
        static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
  } else {
    CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
        ctx->cublas(), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
        static_cast<int>(k), &alpha, b, type, static_cast<int>(ldb), a, type,
        static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return absl::OkStatus();
}

// The gradients of an empty batch: dW [out x in] and db [out] zeroed on
// the context's stream.
absl::Status ZeroGrads(BlasContext* ctx, int in, int out, float* dw,
                       float* db) {
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      dw, 0, sizeof(float) * static_cast<size_t>(in) * out, ctx->stream()));
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(db, 0, sizeof(float) * out, ctx->stream()));
  return absl::OkStatus();
}

// dy masked by ReLU where y is 0 (when `relu`) and db = its column sums,
// through the context's scratch (MaskAndBiasGrad).
absl::Status MaskAndBiasGrad(BlasContext* ctx, float* dy, const float* y,
                             int64_t batch, int out, bool relu, float* db) {
  ASSIGN_OR_RETURN(
      float* partial,
      ctx->Scratch(static_cast<size_t>(internal::BiasGradBlocks(batch)) * out));
  return internal::MaskAndBiasGrad(dy, y, batch, out, relu, partial, db,
                                   ctx->stream());
}

// y = act(x W^T + b) (no bias when b is null) in one cuBLASLt call, with
// the context's plan for the call's key (made on first use); x and W of
// `type` (fp32 or bf16). Returns NotFound when cuBLASLt has no algorithm
// for it, so the caller falls back to cuBLAS.
absl::Status LtForward(BlasContext* ctx, const void* x, int batch, int in,
                       int out, const void* w, const float* b, bool relu,
                       float* y, cudaDataType_t type) {
  const LtPlanKey key = LinearForwardKey(x, batch, in, out, w, b, relu,
                                         ctx->options().allow_tf32, y, type);
  const size_t workspace = ctx->options().workspace_bytes;
  ASSIGN_OR_RETURN(const LtPlan* plan,
                   ctx->lt_plans().Find(ctx->lt(), key, b, workspace));
  if (!plan->found) {
    return absl::NotFoundError("cuBLASLt: no algorithm for this shape");
  }
  if (b != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      ctx->lt(), plan->desc.get(), &alpha, w, plan->a.get(), x, plan->b.get(),
      &beta, y, plan->d.get(), y, plan->d.get(), &plan->algo,
      ctx->lt_workspace(), workspace, ctx->stream()));
  return absl::OkStatus();
}

}  // namespace

BlasContext::BlasContext()
    : lt_plans_(std::make_unique<internal::LtPlanCache>()) {}

BlasContext::~BlasContext() = default;

size_t BlasContext::lt_plan_count() const { return lt_plans_->size(); }

absl::Status GemmOptions::Validate() const {
  if (use_lt_epilogue && workspace_bytes == 0) {
    return absl::InvalidArgumentError(
        "GemmOptions.workspace_bytes: must be positive with use_lt_epilogue");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BlasContext>> BlasContext::Create(
    cudaStream_t stream, const GemmOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<BlasContext> ctx(new BlasContext());
  ctx->stream_ = stream;
  ctx->options_ = options;
  ASSIGN_OR_RETURN(ctx->cublas_, dlrm::cuda::CublasHandle::Create(stream));
  // Without TF32, pedantic-free default math: float GEMMs stay in float.
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      ctx->cublas_.get(),
      options.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  ASSIGN_OR_RETURN(ctx->lt_, dlrm::cuda::CublasLtHandle::Create());
  ASSIGN_OR_RETURN(ctx->workspace_, dlrm::cuda::RawDeviceBuffer::Allocate(
                                        options.workspace_bytes));
  return ctx;
}

absl::StatusOr<float*> BlasContext::Scratch(size_t floats) {
  if (scratch_.size() < floats) RETURN_IF_ERROR(scratch_.Resize(floats));
  return scratch_.data();
}

absl::Status LinearForward(BlasContext* ctx, const float* x, int64_t batch,
                           int in, int out, const float* w, const float* b,
                           bool relu, float* y) {
  RETURN_IF_ERROR(CheckDims("LinearForward", batch, in, out));
  if (batch == 0) return absl::OkStatus();
  const int n = static_cast<int>(batch);
  if (ctx->options().use_lt_epilogue) {
    const absl::Status lt =
        LtForward(ctx, x, n, in, out, w, b, relu, y, CUDA_R_32F);
    if (!absl::IsNotFound(lt)) return lt;
  }
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(ctx->cublas(), CUBLAS_OP_T, CUBLAS_OP_N,
                                     out, n, in, &alpha, w, in, x, in, &beta, y,
                                     out));
  if (b == nullptr && !relu) return absl::OkStatus();
  return internal::AddBiasAct(y, b, batch, out, relu, ctx->stream());
}

absl::Status Gemm(BlasContext* ctx, char trans_a, char trans_b, int64_t m,
                  int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  return RowMajorGemm(ctx, "Gemm", CUDA_R_32F, trans_a, trans_b, m, n, k, a,
                      lda, b, ldb, beta, c, ldc);
}

absl::Status LinearBackward(BlasContext* ctx, const float* x, const float* y,
                            float* dy, int64_t batch, int in, int out,
                            const float* w, bool relu, float* dw, float* db,
                            float* dx) {
  RETURN_IF_ERROR(CheckDims("LinearBackward", batch, in, out));
  if (batch == 0) return ZeroGrads(ctx, in, out, dw, db);
  const int n = static_cast<int>(batch);
  RETURN_IF_ERROR(MaskAndBiasGrad(ctx, dy, y, batch, out, relu, db));
  const float alpha = 1.0f, beta = 0.0f;
  // dW^T [in x out] = x^T [in x batch] (dy^T)^T.
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(ctx->cublas(), CUBLAS_OP_N, CUBLAS_OP_T,
                                     in, out, n, &alpha, x, in, dy, out, &beta,
                                     dw, in));
  if (dx != nullptr) {
    // dx^T [in x batch] = W^T [in x out] dy^T [out x batch].
    CUBLAS_RETURN_IF_ERROR(cublasSgemm(ctx->cublas(), CUBLAS_OP_N, CUBLAS_OP_N,
                                       in, n, out, &alpha, w, in, dy, out,
                                       &beta, dx, in));
  }
  return absl::OkStatus();
}

absl::Status LinearForwardBf16(BlasContext* ctx, const Bf16* x, int64_t batch,
                               int in, int out, const Bf16* w, const float* b,
                               bool relu, float* y, Bf16* y_bf16) {
  RETURN_IF_ERROR(CheckDims("LinearForwardBf16", batch, in, out));
  if (batch == 0) return absl::OkStatus();
  const int n = static_cast<int>(batch);
  absl::Status lt = absl::NotFoundError("cuBLASLt not used");
  if (ctx->options().use_lt_epilogue) {
    lt = LtForward(ctx, x, n, in, out, w, b, relu, y, CUDA_R_16BF);
    if (!lt.ok() && !absl::IsNotFound(lt)) return lt;
  }
  if (!lt.ok()) {
    // y^T [out x batch] = W [in x out]^T x^T [in x batch], as LinearForward's
    // cublasSgemm, then the bias and ReLU.
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_RETURN_IF_ERROR(
        cublasGemmEx(ctx->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in,
                     &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF, in, &beta, y,
                     CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (b != nullptr || relu) {
      RETURN_IF_ERROR(
          internal::AddBiasAct(y, b, batch, out, relu, ctx->stream()));
    }
  }
  if (y_bf16 == nullptr) return absl::OkStatus();
  return RoundToBf16(y, batch * out, y_bf16, ctx->stream());
}

absl::Status GemmBf16(BlasContext* ctx, char trans_a, char trans_b, int64_t m,
                      int64_t n, int64_t k, const Bf16* a, int64_t lda,
                      const Bf16* b, int64_t ldb, float beta, float* c,
                      int64_t ldc) {
  return RowMajorGemm(ctx, "GemmBf16", CUDA_R_16BF, trans_a, trans_b, m, n, k,
                      a, lda, b, ldb, beta, c, ldc);
}

absl::Status LinearBackwardBf16(BlasContext* ctx, const Bf16* x, const float* y,
                                float* dy, int64_t batch, int in, int out,
                                const Bf16* w, bool relu, float* dw, float* db,
                                float* dx, Bf16* dy_bf16) {
  RETURN_IF_ERROR(CheckDims("LinearBackwardBf16", batch, in, out));
  if (batch == 0) return ZeroGrads(ctx, in, out, dw, db);
  RETURN_IF_ERROR(MaskAndBiasGrad(ctx, dy, y, batch, out, relu, db));
  RETURN_IF_ERROR(RoundToBf16(dy, batch * out, dy_bf16, ctx->stream()));
  // dense::Linear::BackwardBf16's two products, in its row-major terms.
  RETURN_IF_ERROR(GemmBf16(ctx, 'T', 'N', out, in, batch, dy_bf16, out, x, in,
                           0.0f, dw, in));
  if (dx == nullptr) return absl::OkStatus();
  return GemmBf16(ctx, 'N', 'N', batch, in, out, dy_bf16, out, w, in, 0.0f, dx,
                  in);
}

}  // namespace dlrm::dense::cuda
