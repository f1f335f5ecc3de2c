// Linear layer (nn.Linear): out = inp W^T + b. N = rows (B*T tokens), IC/OC = in/out features.
#pragma once

namespace fsdpsim::runtime {

// out[N,OC] = inp[N,IC] * weight[OC,IC]^T + bias[OC] (bias may be null).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC);

// dinp[N,IC] += dout[N,OC] * weight[OC,IC]          (skipped if dinp is null)
// dweight[OC,IC] += dout^T * inp[N,IC]              (skipped if dweight is null)
// dbias[OC] += column sums of dout                   (skipped if dbias is null)
// "+=" so a parameter used twice (tied embeddings) or a residual branch accumulates.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

}  // namespace fsdpsim::runtime
