// The one place the runtime reaches OpenBLAS: a row-major single-precision GEMM and the thread
// count. Kept behind this header so the CUDA backend can swap in cuBLAS without touching layers.
#pragma once

namespace fsdpsim::runtime {

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op = transpose when the flag is set.
// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, const float* B,
           float beta, float* C);

// OpenBLAS threads per process. The runtime uses 1: one MPI rank per core, and a fixed thread
// count keeps GEMM reduction orders (hence results) reproducible.
void set_blas_threads(int n);

}  // namespace fsdpsim::runtime
