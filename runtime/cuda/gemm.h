// The CUDA backend's GEMMs: cuBLAS with bf16 operands, fp32 compute (CUBLAS_COMPUTE_32F) and bf16
// output, in the row-major convention of runtime/layers/blas.h, and the linear layer built on them
// (runtime/layers/matmul.h's shapes and "+=" gradients). One Gemm per stream that runs GEMMs.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fsdpsim::runtime::cuda {

using bf16 = std::uint16_t;

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // C[M,N] = alpha op(A) op(B) + beta C, row-major; A is [M,K] ([K,M] when trans_a), B [K,N] ([N,K]).
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, const bf16* B, float beta,
            bf16* C);
  // out[N,OC] = inp[N,IC] weight[OC,IC]^T (+ bias[OC]).
  void linear_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int IC, int OC);
  // dinp[N,IC] += dout weight; dweight[OC,IC] += dout^T inp; dbias[OC] += colsum(dout) (null: skipped).
  void linear_backward(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                       int N, int IC, int OC);
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace fsdpsim::runtime::cuda
