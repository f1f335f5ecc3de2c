// Launchers of the CUDA backend's kernels (kernels.cu; their math: kernel_math.cuh). Every launcher
// enqueues on `stream` and returns at once; launch errors are checked (cuda_check.h). Shapes and
// layouts are those of runtime/layers (the fp32 reference); tensors are bf16 (raw bits) unless typed
// float. "+=" marks outputs that accumulate, as the reference's do.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/elem.h"

namespace fsdpsim::runtime::cuda {

using bf16 = std::uint16_t;

// out[N,C] = wte[tokens[N]].
void embedding_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, int N, int C, cudaStream_t s);
// dwte[uniq[k]] += sum of dout rows pos[off[k] .. off[k+1]) (CSR from group_positions_by_token).
void embedding_backward(bf16* dwte, const bf16* dout, const std::int32_t* uniq, const std::int32_t* off,
                        const std::int32_t* pos, int n_uniq, int C, cudaStream_t s);

// out[N,C], rstd[N] from inp[N,C], weight[C] (eps 1e-5, runtime/layers/rmsnorm.h).
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C, cudaStream_t s);
// dinp[N,C] += ; dweight[C] += (null to skip).
void rmsnorm_backward(bf16* dinp, bf16* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int N, int C, cudaStream_t s);

// In place on x[B,T,H,HD]; cos_sin[T][HD/2][2] (rotary_table). backward: applies R(t)^T.
void rotary(bf16* x, const float* cos_sin, int B, int T, int H, int HD, bool backward, cudaStream_t s);

// Flash-style causal attention with GQA: q/out [B,T,NH,HD], k/v [B,T,NKV,HD], lse [B,NH,T] (fp32).
bool attention_supports_head_dim(int HD);   // 16, 32, 64, 128
void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int NH,
                       int NKV, int HD, cudaStream_t s);
// dq/dk/dv overwritten. D is fp32 scratch [B,NH,T].
void attention_backward(bf16* dq, bf16* dk, bf16* dv, float* D, const bf16* dout, const bf16* q, const bf16* k,
                        const bf16* v, const bf16* out, const float* lse, int B, int T, int NH, int NKV, int HD,
                        cudaStream_t s);

// act[N] (may be null), h[N] from gate, up; backward overwrites dgate, dup.
void swiglu_forward(bf16* act, bf16* h, const bf16* gate, const bf16* up, long N, cudaStream_t s);
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* act, const bf16* up, long N,
                     cudaStream_t s);

// Fused cross-entropy over bf16 logits[N,V]: lse[N] and per-token loss[N] (fp32).
void cross_entropy_forward(float* lse, float* loss, const bf16* logits, const std::int32_t* targets, int N, int V,
                           cudaStream_t s);
// logits[N,V] <- dlogits = (softmax - onehot) * dloss_scale, in place.
void cross_entropy_backward(bf16* logits, const float* lse, const std::int32_t* targets, int N, int V,
                            float dloss_scale, cudaStream_t s);

void bias_add(bf16* out, const bf16* bias, int N, int OC, cudaStream_t s);      // out[N,OC] += bias
void bias_grad(bf16* dbias, const bf16* dout, int N, int OC, cudaStream_t s);   // dbias[OC] += colsum
void add_bf16(bf16* y, const bf16* x, long n, cudaStream_t s);                  // y += x

// Copies with a dtype change (either side fp32 or bf16, runtime/elem.h); same dtype is a cudaMemcpyAsync.
void convert(void* dst, Elem dst_type, const void* src, Elem src_type, long n, cudaStream_t s);
// dst (fp32) += src (fp32 or bf16).
void accumulate_f32(float* dst, const void* src, Elem src_type, long n, cudaStream_t s);
void scale(void* x, Elem type, float factor, long n, cudaStream_t s);          // x *= factor

// Optimizer steps on fp32 shards (runtime/train/optimizer.h): m, v / momentum buffer of n each.
void adamw_step(float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2, float eps,
                float wd, float step_size, float bc2_sqrt, cudaStream_t s);
void sgd_step(float* p, const float* g, float* buf, long n, float lr, float momentum, float wd, bool first,
              cudaStream_t s);

}  // namespace fsdpsim::runtime::cuda
