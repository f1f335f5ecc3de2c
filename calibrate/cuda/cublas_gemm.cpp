#include "calibrate/cuda/cublas_gemm.h"

#include <cmath>
#include <vector>

#include "calibrate/cuda/nccl_collective.h"

namespace fsdpsim::calibrate::cuda {
namespace {
float a_val(std::int64_t i, std::int64_t p) { return static_cast<float>((i + p) % 2); }
float b_val(std::int64_t p, std::int64_t j) { return (p + j) % 3 == 0 ? 1.0f : 0.0f; }
}  // namespace

GemmBench::GemmBench(std::int64_t m, std::int64_t n, std::int64_t k, cublasHandle_t h, cudaStream_t s)
    : m_(m), n_(n), k_(k), h_(h), s_(s) {
  std::vector<Bf16Bits> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t p = 0; p < k; ++p) a[static_cast<size_t>(i * k + p)] = to_bf16(a_val(i, p));
  for (std::int64_t p = 0; p < k; ++p)
    for (std::int64_t j = 0; j < n; ++j) b[static_cast<size_t>(p * n + j)] = to_bf16(b_val(p, j));
  FSDPSIM_CUDA_CHECK(cudaMalloc(&a_, a.size() * 2));
  FSDPSIM_CUDA_CHECK(cudaMalloc(&b_, b.size() * 2));
  FSDPSIM_CUDA_CHECK(cudaMalloc(&c_, static_cast<size_t>(m * n) * 2));
  FSDPSIM_CUDA_CHECK(cudaMemcpy(a_, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  FSDPSIM_CUDA_CHECK(cudaMemcpy(b_, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  FSDPSIM_CUBLAS_CHECK(cublasSetStream(h_, s_));
}

GemmBench::~GemmBench() {
  cudaFree(a_);
  cudaFree(b_);
  cudaFree(c_);
}

void GemmBench::enqueue() {
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands, no transposes.
  FSDPSIM_CUBLAS_CHECK(cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n_), static_cast<int>(m_), static_cast<int>(k_),
                                    &alpha, b_, CUDA_R_16BF, static_cast<int>(n_), a_, CUDA_R_16BF, static_cast<int>(k_), &beta,
                                    c_, CUDA_R_16BF, static_cast<int>(n_), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

double GemmBench::time_ns(int reps) {
  enqueue();
  cudaEvent_t e0, e1;
  FSDPSIM_CUDA_CHECK(cudaEventCreate(&e0));
  FSDPSIM_CUDA_CHECK(cudaEventCreate(&e1));
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e0, s_));
  for (int r = 0; r < reps; ++r) enqueue();
  FSDPSIM_CUDA_CHECK(cudaEventRecord(e1, s_));
  FSDPSIM_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  FSDPSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  FSDPSIM_CUDA_CHECK(cudaEventDestroy(e0));
  FSDPSIM_CUDA_CHECK(cudaEventDestroy(e1));
  return static_cast<double>(ms) * 1e6 / reps;
}

bool GemmBench::check() {
  enqueue();
  FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(s_));
  Bf16Bits got = 0;
  std::int64_t i = m_ - 1, j = n_ - 1;
  FSDPSIM_CUDA_CHECK(cudaMemcpy(&got, static_cast<char*>(c_) + (i * n_ + j) * 2, 2, cudaMemcpyDeviceToHost));
  double expect = 0;
  for (std::int64_t p = 0; p < k_; ++p) expect += a_val(i, p) * b_val(p, j);
  return std::fabs(from_bf16(got) - expect) <= std::max(1.0, expect / 128.0);   // bf16 keeps 8 significant bits
}

}  // namespace fsdpsim::calibrate::cuda
