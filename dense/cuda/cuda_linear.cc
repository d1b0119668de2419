// Linear layers on cuBLAS / cuBLASLt. Row-major [rows x cols] buffers are
// column-major [cols x rows] to cuBLAS, so y = x W^T (row-major) is
// y^T = W x^T in cuBLAS's terms: A = W stored [in x out] used transposed,
// B = x stored [in x batch], D = y stored [out x batch]. The bias then runs
// along D's rows, which is what the cuBLASLt BIAS epilogue broadcasts.
#include <climits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "core/status.h"
#include "dense/cuda/cuda_dense.h"

namespace dlrm::dense::cuda {
namespace {

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

absl::StatusOr<Layout> MakeLayout(uint64_t rows, uint64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, rows, cols, ld));
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

// y = act(x W^T + b) (no bias when b is null) in one cuBLASLt call. Returns
// NotFound when cuBLASLt has no algorithm for the shape, so the caller falls
// back to cuBLAS.
absl::Status LtForward(BlasContext* ctx, const float* x, int batch, int in,
                       int out, const float* w, const float* b, bool relu,
                       float* y) {
  const cublasComputeType_t compute = ctx->options().allow_tf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(&raw_desc, compute, CUDA_R_32F));
  MatmulDesc desc(raw_desc);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  const cublasLtEpilogue_t epilogue =
      b == nullptr
          ? (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT)
          : (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (b != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)));
  }

  ASSIGN_OR_RETURN(Layout a, MakeLayout(in, out, in));
  ASSIGN_OR_RETURN(Layout bl, MakeLayout(in, batch, in));
  ASSIGN_OR_RETURN(Layout d, MakeLayout(out, batch, out));

  cublasLtMatmulPreference_t raw_pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
  Preference pref(raw_pref);
  const size_t workspace = ctx->options().workspace_bytes;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
      sizeof(workspace)));
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      ctx->lt(), raw_desc, a.get(), bl.get(), d.get(), d.get(), raw_pref, 1,
      &result, &found);
  // cuBLASLt says "no algorithm" either way, depending on the shape.
  if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED ||
      (heuristic == CUBLAS_STATUS_SUCCESS && found == 0)) {
    return absl::NotFoundError("cuBLASLt: no algorithm for this shape");
  }
  CUBLAS_RETURN_IF_ERROR(heuristic);
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      ctx->lt(), raw_desc, &alpha, w, a.get(), x, bl.get(), &beta, y, d.get(),
      y, d.get(), &result.algo, ctx->lt_workspace(), workspace, ctx->stream()));
  return absl::OkStatus();
}

}  // namespace

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
    const absl::Status lt = LtForward(ctx, x, n, in, out, w, b, relu, y);
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
  for (int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("Gemm: sizes m ", m, " n ", n, " k ", k, " lda ", lda,
                       " ldb ", ldb, " ldc ", ldc, " must be in [0, 2^31)"));
    }
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // row-major buffers are the column-major transposes, so B goes first.
  const cublasOperation_t op_a = trans_a == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha = 1.0f;
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(
      ctx->cublas(), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
      static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a,
      static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
  return absl::OkStatus();
}

absl::Status LinearBackward(BlasContext* ctx, const float* x, const float* y,
                            float* dy, int64_t batch, int in, int out,
                            const float* w, bool relu, float* dw, float* db,
                            float* dx) {
  RETURN_IF_ERROR(CheckDims("LinearBackward", batch, in, out));
  if (batch == 0) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        dw, 0, sizeof(float) * static_cast<size_t>(in) * out, ctx->stream()));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(db, 0, sizeof(float) * out, ctx->stream()));
    return absl::OkStatus();
  }
  const int n = static_cast<int>(batch);
  ASSIGN_OR_RETURN(
      float* partial,
      ctx->Scratch(static_cast<size_t>(internal::BiasGradBlocks(batch)) * out));
  RETURN_IF_ERROR(internal::MaskAndBiasGrad(dy, y, batch, out, relu, partial,
                                            db, ctx->stream()));
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

}  // namespace dlrm::dense::cuda
