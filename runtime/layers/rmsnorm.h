// RMSNorm (LlamaRMSNorm): out = x / sqrt(mean(x^2) + eps) * weight. No bias, no mean subtraction.
#pragma once

namespace fsdpsim::runtime {

// Llama 2's config.json: "rms_norm_eps": 1e-05 (meta-llama/Llama-2-7b-hf).
inline constexpr float kRmsNormEps = 1e-5f;

// out[N,C] and rstd[N] (1/rms per row; may be null when not needed) from inp[N,C], weight[C].
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C);
// dinp[N,C] += d/dinp, dweight[C] += d/dweight (null to skip), from dout[N,C], the forward input
// inp[N,C] and its rstd[N] (recomputed from inp when rstd is null).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);

}  // namespace fsdpsim::runtime
