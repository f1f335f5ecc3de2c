#include "runtime/layers/blas.h"

#include <cblas.h>

namespace fsdpsim::runtime {

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, const float* B,
           float beta, float* C) {
  if (M == 0 || N == 0) return;
  const int lda = trans_a ? M : K;
  const int ldb = trans_b ? K : N;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, N);
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace fsdpsim::runtime
