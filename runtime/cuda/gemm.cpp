#include "runtime/cuda/gemm.h"

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"

namespace fsdpsim::runtime::cuda {

Gemm::Gemm(cudaStream_t stream) : stream_(stream) {
  FSDPSIM_CUBLAS_CHECK(cublasCreate(&handle_));
  FSDPSIM_CUBLAS_CHECK(cublasSetStream(handle_, stream_));
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(handle_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first, and the
// leading dimensions of the row-major operands (blas.cpp's lda/ldb).
void Gemm::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, const bf16* B, float beta,
                bf16* C) {
  if (M == 0 || N == 0) return;
  const int lda = trans_a ? M : K;
  const int ldb = trans_b ? K : N;
  FSDPSIM_CUBLAS_CHECK(cublasGemmEx(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, CUDA_R_16BF,
                                    N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Gemm::linear_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int IC, int OC) {
  gemm(false, true, N, OC, IC, 1.0f, inp, weight, 0.0f, out);
  if (bias) bias_add(out, bias, N, OC, stream_);
}

void Gemm::linear_backward(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout, const bf16* inp,
                           const bf16* weight, int N, int IC, int OC) {
  if (dinp) gemm(false, false, N, IC, OC, 1.0f, dout, weight, 1.0f, dinp);
  if (dweight) gemm(true, false, OC, IC, N, 1.0f, dout, inp, 1.0f, dweight);
  if (dbias) bias_grad(dbias, dout, N, OC, stream_);
}

}  // namespace fsdpsim::runtime::cuda
