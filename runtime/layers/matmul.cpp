#include "runtime/layers/matmul.h"

#include "runtime/layers/blas.h"

namespace fsdpsim::runtime {

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC) {
  sgemm(false, true, N, OC, IC, 1.0f, inp, weight, 0.0f, out);
  if (!bias) return;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) out[static_cast<long>(n) * OC + o] += bias[o];
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
  if (dinp) sgemm(false, false, N, IC, OC, 1.0f, dout, weight, 1.0f, dinp);
  if (dweight) sgemm(true, false, OC, IC, N, 1.0f, dout, inp, 1.0f, dweight);
  if (dbias)
    for (int n = 0; n < N; ++n)   // fixed order: rows in sequence (deterministic)
      for (int o = 0; o < OC; ++o) dbias[o] += dout[static_cast<long>(n) * OC + o];
}

}  // namespace fsdpsim::runtime
