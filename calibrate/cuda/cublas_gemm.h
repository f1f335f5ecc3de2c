// cuBLAS bf16 GEMMs at given shapes (row-major C[m,n] = A[m,k] B[k,n], fp32 accumulation, bf16
// output: what torch.nn.Linear runs under bf16 autocast), timed with CUDA events.
#pragma once
#include <cstdint>

#include "calibrate/cuda/cuda_check.h"

namespace fsdpsim::calibrate::cuda {

class GemmBench {
 public:
  GemmBench(std::int64_t m, std::int64_t n, std::int64_t k, cublasHandle_t h, cudaStream_t s);
  ~GemmBench();
  void enqueue();                 // one GEMM on the stream
  double time_ns(int reps);       // mean of reps back-to-back GEMMs (after one warm-up)
  bool check();                   // C[m-1][n-1] against the exact dot product (bf16 rounding tolerance)

 private:
  std::int64_t m_, n_, k_;
  cublasHandle_t h_;
  cudaStream_t s_;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
};

}  // namespace fsdpsim::calibrate::cuda
