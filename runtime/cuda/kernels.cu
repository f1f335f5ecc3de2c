// The CUDA backend's kernels: thin __global__ wrappers over kernel_math.cuh (one translation unit,
// to keep nvcc's share of the build small). Launch shapes:
//  * elementwise: grid-stride loops, 256 threads per block;
//  * per-row (RMSNorm, cross-entropy): one block of 256 threads per row, fp32 block reductions;
//  * attention: one thread per query (forward, dQ) or key (dK/dV) row, K/V or Q/dO tiles staged in
//    shared memory as fp32. These run on CUDA cores, not tensor cores: correct and memory-efficient
//    (O(T) memory), not FlashAttention's speed. With head_dim 64 or 128, attention_forward and
//    attention_backward hand over to the tensor-core kernels of attention_tc.h instead, unless
//    FSDPSIM_CUDA_ATTENTION=simple.
#include <algorithm>

#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernel_math.cuh"
#include "runtime/cuda/kernels.h"

namespace fsdpsim::runtime::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kEps = 1e-5f;   // runtime/layers/rmsnorm.h kRmsNormEps

unsigned blocks_for(long n) {
  const long b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<long>(1, std::min<long>(b, 4096)));
}

#define GRID_STRIDE(i, n) for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < (n); \
                               i += static_cast<long>(gridDim.x) * blockDim.x)

// Sum over the block (blockDim.x == kThreads); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[kThreads / 32];
  __shared__ float total;
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) s += part[w];
    total = s;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

// ---- embedding ----
__global__ void embedding_fwd_k(bf16* out, const std::int32_t* tokens, const bf16* wte, long n, int C) {
  GRID_STRIDE(i, n) math::embedding_fwd(out, wte, tokens, i, C);
}
__global__ void embedding_bwd_k(bf16* dwte, const bf16* dout, const std::int32_t* uniq, const std::int32_t* off,
                                const std::int32_t* pos, int C) {
  for (int c = threadIdx.x; c < C; c += blockDim.x) math::embedding_bwd(dwte, dout, uniq, off, pos, blockIdx.x, c, C);
}

// ---- RMSNorm ----
__global__ void rmsnorm_fwd_k(bf16* out, float* rstd, const bf16* inp, const bf16* w, int C) {
  const long row = blockIdx.x;
  const bf16* x = inp + row * C;
  const float r = math::rms_rstd(block_sum(math::rms_sumsq_partial(x, threadIdx.x, blockDim.x, C)), C, kEps);
  if (threadIdx.x == 0 && rstd) rstd[row] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[row * C + c] = math::rms_out(x[c], w[c], r);
}
__global__ void rmsnorm_bwd_dx_k(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* w, const float* rstd, int C) {
  const long row = blockIdx.x;
  const bf16 *g = dout + row * C, *x = inp + row * C;
  const float r = rstd[row];
  const float k = math::rms_bwd_k(block_sum(math::rms_bwd_dot_partial(g, w, x, threadIdx.x, blockDim.x, C)), r, C);
  for (int c = threadIdx.x; c < C; c += blockDim.x) add_to_bf16(dinp[row * C + c], math::rms_bwd_dx(g[c], w[c], x[c], r, k));
}
__global__ void rmsnorm_bwd_dw_k(bf16* dw, const bf16* dout, const bf16* inp, const float* rstd, int N, int C) {
  GRID_STRIDE(c, C) add_to_bf16(dw[c], math::rms_bwd_dweight_col(dout, inp, rstd, N, C, static_cast<int>(c)));
}

// ---- rotary ----
__global__ void rotary_k(bf16* x, const float* cs, int T, int H, int HD, float sign, long n) {
  const int half = HD / 2;
  GRID_STRIDE(idx, n) {   // idx over [B, T, H, half]
    const int i = static_cast<int>(idx % half);
    const long row = idx / half;   // (b*T + t)*H + h
    const int t = static_cast<int>((row / H) % T);
    const float* c = cs + (static_cast<long>(t) * half + i) * 2;
    math::rope_pair(x + row * HD, i, half, c[0], c[1], sign);
  }
}

// ---- attention ----
constexpr int kAttnRows = 64;   // query rows per block (forward, dQ)
constexpr int kAttnTile = 32;   // key rows per shared-memory tile (forward, dQ)
constexpr int kKvRows = 32;     // key rows per block (dK/dV)
constexpr int kQTile = 16;      // query rows per shared-memory tile (dK/dV)

__device__ long qkv_off(int b, int t, int h, int T, int H, int HD) { return ((static_cast<long>(b) * T + t) * H + h) * HD; }

template <int HD>
__device__ void load_rows(float* dst, const bf16* src, int b, int t0, int n, int h, int T, int H) {
  for (int idx = threadIdx.x; idx < n * HD; idx += blockDim.x) {
    const int j = idx / HD, d = idx % HD;
    dst[idx] = bf2f(src[qkv_off(b, t0 + j, h, T, H, HD) + d]);
  }
}

template <int HD>
__global__ void attn_fwd_k(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int T, int NH, int NKV,
                           float scale) {
  __shared__ float Ks[kAttnTile * HD], Vs[kAttnTile * HD];
  const int b = blockIdx.z, h = blockIdx.y, t0 = blockIdx.x * kAttnRows, kvh = h / (NH / NKV);
  const int t = t0 + threadIdx.x;
  float qr[HD];
  math::AttnRow<HD> st;
  math::attn_row_init(st);
  if (t < T)
    for (int d = 0; d < HD; ++d) qr[d] = bf2f(q[qkv_off(b, t, h, T, NH, HD) + d]);
  const int kend = min(T, t0 + kAttnRows);
  for (int k0 = 0; k0 < kend; k0 += kAttnTile) {
    const int n = min(kAttnTile, kend - k0);
    load_rows<HD>(Ks, k, b, k0, n, kvh, T, NKV);
    load_rows<HD>(Vs, v, b, k0, n, kvh, T, NKV);
    __syncthreads();
    if (t < T) math::attn_fwd_tile<HD, kAttnTile>(qr, Ks, Vs, n, k0, t, scale, st);
    __syncthreads();
  }
  if (t < T) math::attn_fwd_finish(st, out + qkv_off(b, t, h, T, NH, HD), lse + (static_cast<long>(b) * NH + h) * T + t);
}

// D[b,h,t] = rowsum(dO o O): one warp per row.
__global__ void attn_bwd_D_k(float* D, const bf16* dout, const bf16* out, int T, int NH, int HD, long rows) {
  const long row = blockIdx.x * static_cast<long>(blockDim.x / 32) + threadIdx.x / 32;   // (b*T + t)*NH + h
  if (row >= rows) return;
  float s = math::attn_bwd_D_partial(dout + row * HD, out + row * HD, threadIdx.x % 32, 32, HD);
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) {
    const long h = row % NH, bt = row / NH, t = bt % T, b = bt / T;
    D[(b * NH + h) * T + t] = s;
  }
}

template <int HD>
__global__ void attn_bwd_kv_k(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                              const float* lse, const float* D, int T, int NH, int NKV, float scale) {
  __shared__ float Qs[kQTile * HD], dOs[kQTile * HD], ls[kQTile], Ds[kQTile];
  const int b = blockIdx.z, kvh = blockIdx.y, u0 = blockIdx.x * kKvRows, group = NH / NKV;
  const int u = u0 + threadIdx.x;
  float kr[HD], vr[HD], dkr[HD], dvr[HD];
  for (int d = 0; d < HD; ++d) {
    kr[d] = u < T ? bf2f(k[qkv_off(b, u, kvh, T, NKV, HD) + d]) : 0.0f;
    vr[d] = u < T ? bf2f(v[qkv_off(b, u, kvh, T, NKV, HD) + d]) : 0.0f;
    dkr[d] = dvr[d] = 0.0f;
  }
  for (int j = 0; j < group; ++j) {
    const int h = kvh * group + j;
    const float* lrow = lse + (static_cast<long>(b) * NH + h) * T;
    const float* drow = D + (static_cast<long>(b) * NH + h) * T;
    for (int q0 = u0; q0 < T; q0 += kQTile) {   // queries before u0 see none of this block's keys
      const int n = min(kQTile, T - q0);
      load_rows<HD>(Qs, q, b, q0, n, h, T, NH);
      load_rows<HD>(dOs, dout, b, q0, n, h, T, NH);
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        ls[i] = lrow[q0 + i];
        Ds[i] = drow[q0 + i];
      }
      __syncthreads();
      if (u < T) math::attn_bwd_kv_tile<HD>(kr, vr, u, Qs, dOs, ls, Ds, n, q0, scale, dkr, dvr);
      __syncthreads();
    }
  }
  if (u < T)
    for (int d = 0; d < HD; ++d) {
      dk[qkv_off(b, u, kvh, T, NKV, HD) + d] = f2bf(dkr[d]);
      dv[qkv_off(b, u, kvh, T, NKV, HD) + d] = f2bf(dvr[d]);
    }
}

template <int HD>
__global__ void attn_bwd_q_k(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,
                             const float* D, int T, int NH, int NKV, float scale) {
  __shared__ float Ks[kAttnTile * HD], Vs[kAttnTile * HD];
  const int b = blockIdx.z, h = blockIdx.y, t0 = blockIdx.x * kAttnRows, kvh = h / (NH / NKV);
  const int t = t0 + threadIdx.x;
  float qr[HD], dor[HD], dqr[HD];
  float l = 0.0f, Dt = 0.0f;
  for (int d = 0; d < HD; ++d) {
    qr[d] = t < T ? bf2f(q[qkv_off(b, t, h, T, NH, HD) + d]) : 0.0f;
    dor[d] = t < T ? bf2f(dout[qkv_off(b, t, h, T, NH, HD) + d]) : 0.0f;
    dqr[d] = 0.0f;
  }
  if (t < T) {
    l = lse[(static_cast<long>(b) * NH + h) * T + t];
    Dt = D[(static_cast<long>(b) * NH + h) * T + t];
  }
  const int kend = min(T, t0 + kAttnRows);
  for (int k0 = 0; k0 < kend; k0 += kAttnTile) {
    const int n = min(kAttnTile, kend - k0);
    load_rows<HD>(Ks, k, b, k0, n, kvh, T, NKV);
    load_rows<HD>(Vs, v, b, k0, n, kvh, T, NKV);
    __syncthreads();
    if (t < T) math::attn_bwd_q_tile<HD>(qr, dor, l, Dt, t, Ks, Vs, n, k0, scale, dqr);
    __syncthreads();
  }
  if (t < T)
    for (int d = 0; d < HD; ++d) dq[qkv_off(b, t, h, T, NH, HD) + d] = f2bf(dqr[d]);
}

template <int HD>
void attn_fwd_launch(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int NH, int NKV,
                     cudaStream_t s) {
  const dim3 grid((T + kAttnRows - 1) / kAttnRows, NH, B);
  attn_fwd_k<HD><<<grid, kAttnRows, 0, s>>>(out, lse, q, k, v, T, NH, NKV, 1.0f / sqrtf(static_cast<float>(HD)));
  FSDPSIM_LAUNCH_CHECK();
}

template <int HD>
void attn_bwd_launch(bf16* dq, bf16* dk, bf16* dv, const float* D, const bf16* dout, const bf16* q, const bf16* k,
                     const bf16* v, const float* lse, int B, int T, int NH, int NKV, cudaStream_t s) {
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  const dim3 gkv((T + kKvRows - 1) / kKvRows, NKV, B);
  attn_bwd_kv_k<HD><<<gkv, kKvRows, 0, s>>>(dk, dv, q, k, v, dout, lse, D, T, NH, NKV, scale);
  FSDPSIM_LAUNCH_CHECK();
  const dim3 gq((T + kAttnRows - 1) / kAttnRows, NH, B);
  attn_bwd_q_k<HD><<<gq, kAttnRows, 0, s>>>(dq, q, k, v, dout, lse, D, T, NH, NKV, scale);
  FSDPSIM_LAUNCH_CHECK();
}

// ---- SwiGLU ----
__global__ void swiglu_fwd_k(bf16* act, bf16* h, const bf16* gate, const bf16* up, long n) {
  GRID_STRIDE(i, n) math::swiglu_fwd(act, h, gate, up, i);
}
__global__ void swiglu_bwd_k(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* act, const bf16* up,
                             long n) {
  GRID_STRIDE(i, n) math::swiglu_bwd(dgate, dup, dh, gate, act, up, i);
}

// ---- cross-entropy ----
__global__ void ce_fwd_k(float* lse, float* loss, const bf16* logits, const std::int32_t* targets, int V) {
  __shared__ float ms[kThreads], ss[kThreads];
  const long row = blockIdx.x;
  const bf16* x = logits + row * V;
  float m, s;
  math::lse_partial(x, threadIdx.x, blockDim.x, V, m, s);
  ms[threadIdx.x] = m;
  ss[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      float a = ms[threadIdx.x], b = ss[threadIdx.x];
      math::lse_merge(a, b, ms[threadIdx.x + w], ss[threadIdx.x + w]);
      ms[threadIdx.x] = a;
      ss[threadIdx.x] = b;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float l = ms[0] + logf(ss[0]);
    lse[row] = l;
    loss[row] = l - bf2f(x[targets[row]]);
  }
}
__global__ void ce_bwd_k(bf16* logits, const float* lse, const std::int32_t* targets, int V, float scale, long n) {
  GRID_STRIDE(i, n) {
    const long row = i / V;
    const int col = static_cast<int>(i % V);
    logits[i] = f2bf(math::ce_dlogit(logits[i], lse[row], col == targets[row], scale));
  }
}

// ---- elementwise ----
__global__ void bias_add_k(bf16* out, const bf16* bias, int OC, long n) { GRID_STRIDE(i, n) math::bias_add(out, bias, i, OC); }
__global__ void bias_grad_k(bf16* db, const bf16* dout, int N, int OC) {
  GRID_STRIDE(o, OC) add_to_bf16(db[o], math::col_sum(dout, N, OC, static_cast<int>(o)));
}
__global__ void add_bf16_k(bf16* y, const bf16* x, long n) { GRID_STRIDE(i, n) add_to_bf16(y[i], bf2f(x[i])); }
__global__ void f32_to_bf16_k(bf16* d, const float* s, long n) { GRID_STRIDE(i, n) d[i] = f2bf(s[i]); }
__global__ void bf16_to_f32_k(float* d, const bf16* s, long n) { GRID_STRIDE(i, n) d[i] = bf2f(s[i]); }
__global__ void acc_f32_k(float* d, const float* s, long n) { GRID_STRIDE(i, n) d[i] += s[i]; }
__global__ void acc_bf16_k(float* d, const bf16* s, long n) { GRID_STRIDE(i, n) d[i] += bf2f(s[i]); }
__global__ void scale_f32_k(float* x, float f, long n) { GRID_STRIDE(i, n) x[i] *= f; }
__global__ void scale_bf16_k(bf16* x, float f, long n) { GRID_STRIDE(i, n) x[i] = f2bf(bf2f(x[i]) * f); }

// ---- optimizer ----
__global__ void adamw_k(float* p, const float* g, float* m, float* v, long n, float lr, float b1, float b2, float eps,
                        float wd, float step_size, float bc2_sqrt) {
  GRID_STRIDE(i, n) math::adamw(p[i], g[i], m[i], v[i], lr, b1, b2, eps, wd, step_size, bc2_sqrt);
}
__global__ void sgd_k(float* p, const float* g, float* buf, long n, float lr, float mom, float wd, bool first) {
  GRID_STRIDE(i, n) math::sgd_momentum(p[i], g[i], buf[i], lr, mom, wd, first);
}

}  // namespace

void embedding_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, int N, int C, cudaStream_t s) {
  const long n = static_cast<long>(N) * C;
  embedding_fwd_k<<<blocks_for(n), kThreads, 0, s>>>(out, tokens, wte, n, C);
  FSDPSIM_LAUNCH_CHECK();
}

void embedding_backward(bf16* dwte, const bf16* dout, const std::int32_t* uniq, const std::int32_t* off,
                        const std::int32_t* pos, int n_uniq, int C, cudaStream_t s) {
  if (n_uniq == 0) return;
  embedding_bwd_k<<<n_uniq, kThreads, 0, s>>>(dwte, dout, uniq, off, pos, C);
  FSDPSIM_LAUNCH_CHECK();
}

void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C, cudaStream_t s) {
  rmsnorm_fwd_k<<<N, kThreads, 0, s>>>(out, rstd, inp, weight, C);
  FSDPSIM_LAUNCH_CHECK();
}

void rmsnorm_backward(bf16* dinp, bf16* dweight, const bf16* dout, const bf16* inp, const bf16* weight,
                      const float* rstd, int N, int C, cudaStream_t s) {
  if (dinp) {
    rmsnorm_bwd_dx_k<<<N, kThreads, 0, s>>>(dinp, dout, inp, weight, rstd, C);
    FSDPSIM_LAUNCH_CHECK();
  }
  if (dweight) {
    rmsnorm_bwd_dw_k<<<blocks_for(C), kThreads, 0, s>>>(dweight, dout, inp, rstd, N, C);
    FSDPSIM_LAUNCH_CHECK();
  }
}

void rotary(bf16* x, const float* cos_sin, int B, int T, int H, int HD, bool backward, cudaStream_t s) {
  const long n = static_cast<long>(B) * T * H * (HD / 2);
  rotary_k<<<blocks_for(n), kThreads, 0, s>>>(x, cos_sin, T, H, HD, backward ? -1.0f : 1.0f, n);
  FSDPSIM_LAUNCH_CHECK();
}

bool attention_supports_head_dim(int HD) { return HD == 16 || HD == 32 || HD == 64 || HD == 128; }

void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int NH,
                       int NKV, int HD, cudaStream_t s) {
  if (attention_tc_selected(HD, {out, q, k, v})) return attention_forward_tc(out, lse, q, k, v, B, T, NH, NKV, HD, s);
  switch (HD) {
    case 16: return attn_fwd_launch<16>(out, lse, q, k, v, B, T, NH, NKV, s);
    case 32: return attn_fwd_launch<32>(out, lse, q, k, v, B, T, NH, NKV, s);
    case 64: return attn_fwd_launch<64>(out, lse, q, k, v, B, T, NH, NKV, s);
    case 128: return attn_fwd_launch<128>(out, lse, q, k, v, B, T, NH, NKV, s);
    default: ::fsdpsim::check_failed("attention_forward", __FILE__, __LINE__, "head_dim " + std::to_string(HD) + " not compiled");
  }
}

void attention_backward(bf16* dq, bf16* dk, bf16* dv, float* D, const bf16* dout, const bf16* q, const bf16* k,
                        const bf16* v, const bf16* out, const float* lse, int B, int T, int NH, int NKV, int HD,
                        cudaStream_t s) {
  if (attention_tc_selected(HD, {dq, dk, dv, dout, q, k, v, out}))
    return attention_backward_tc(dq, dk, dv, D, dout, q, k, v, out, lse, B, T, NH, NKV, HD, s);
  const long rows = static_cast<long>(B) * T * NH;
  attn_bwd_D_k<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(D, dout, out, T, NH, HD, rows);
  FSDPSIM_LAUNCH_CHECK();
  switch (HD) {
    case 16: return attn_bwd_launch<16>(dq, dk, dv, D, dout, q, k, v, lse, B, T, NH, NKV, s);
    case 32: return attn_bwd_launch<32>(dq, dk, dv, D, dout, q, k, v, lse, B, T, NH, NKV, s);
    case 64: return attn_bwd_launch<64>(dq, dk, dv, D, dout, q, k, v, lse, B, T, NH, NKV, s);
    case 128: return attn_bwd_launch<128>(dq, dk, dv, D, dout, q, k, v, lse, B, T, NH, NKV, s);
    default: ::fsdpsim::check_failed("attention_backward", __FILE__, __LINE__, "head_dim " + std::to_string(HD) + " not compiled");
  }
}

void swiglu_forward(bf16* act, bf16* h, const bf16* gate, const bf16* up, long N, cudaStream_t s) {
  swiglu_fwd_k<<<blocks_for(N), kThreads, 0, s>>>(act, h, gate, up, N);
  FSDPSIM_LAUNCH_CHECK();
}

void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* act, const bf16* up, long N,
                     cudaStream_t s) {
  swiglu_bwd_k<<<blocks_for(N), kThreads, 0, s>>>(dgate, dup, dh, gate, act, up, N);
  FSDPSIM_LAUNCH_CHECK();
}

void cross_entropy_forward(float* lse, float* loss, const bf16* logits, const std::int32_t* targets, int N, int V,
                           cudaStream_t s) {
  ce_fwd_k<<<N, kThreads, 0, s>>>(lse, loss, logits, targets, V);
  FSDPSIM_LAUNCH_CHECK();
}

void cross_entropy_backward(bf16* logits, const float* lse, const std::int32_t* targets, int N, int V,
                            float dloss_scale, cudaStream_t s) {
  const long n = static_cast<long>(N) * V;
  ce_bwd_k<<<blocks_for(n), kThreads, 0, s>>>(logits, lse, targets, V, dloss_scale, n);
  FSDPSIM_LAUNCH_CHECK();
}

void bias_add(bf16* out, const bf16* bias, int N, int OC, cudaStream_t s) {
  const long n = static_cast<long>(N) * OC;
  bias_add_k<<<blocks_for(n), kThreads, 0, s>>>(out, bias, OC, n);
  FSDPSIM_LAUNCH_CHECK();
}

void bias_grad(bf16* dbias, const bf16* dout, int N, int OC, cudaStream_t s) {
  bias_grad_k<<<blocks_for(OC), kThreads, 0, s>>>(dbias, dout, N, OC);
  FSDPSIM_LAUNCH_CHECK();
}

void add_bf16(bf16* y, const bf16* x, long n, cudaStream_t s) {
  add_bf16_k<<<blocks_for(n), kThreads, 0, s>>>(y, x, n);
  FSDPSIM_LAUNCH_CHECK();
}

void convert(void* dst, Elem dt, const void* src, Elem st, long n, cudaStream_t s) {
  if (n <= 0) return;
  if (dt == st) {
    FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * (dt == Elem::F32 ? 4 : 2), cudaMemcpyDeviceToDevice, s));
    return;
  }
  if (dt == Elem::BF16) f32_to_bf16_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<bf16*>(dst), static_cast<const float*>(src), n);
  else bf16_to_f32_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<float*>(dst), static_cast<const bf16*>(src), n);
  FSDPSIM_LAUNCH_CHECK();
}

void accumulate_f32(float* dst, const void* src, Elem st, long n, cudaStream_t s) {
  if (n <= 0) return;
  if (st == Elem::F32) acc_f32_k<<<blocks_for(n), kThreads, 0, s>>>(dst, static_cast<const float*>(src), n);
  else acc_bf16_k<<<blocks_for(n), kThreads, 0, s>>>(dst, static_cast<const bf16*>(src), n);
  FSDPSIM_LAUNCH_CHECK();
}

void scale(void* x, Elem t, float f, long n, cudaStream_t s) {
  if (n <= 0) return;
  if (t == Elem::F32) scale_f32_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<float*>(x), f, n);
  else scale_bf16_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<bf16*>(x), f, n);
  FSDPSIM_LAUNCH_CHECK();
}

void adamw_step(float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2, float eps,
                float wd, float step_size, float bc2_sqrt, cudaStream_t s) {
  if (n <= 0) return;
  adamw_k<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, n, lr, beta1, beta2, eps, wd, step_size, bc2_sqrt);
  FSDPSIM_LAUNCH_CHECK();
}

void sgd_step(float* p, const float* g, float* buf, long n, float lr, float momentum, float wd, bool first,
              cudaStream_t s) {
  if (n <= 0) return;
  sgd_k<<<blocks_for(n), kThreads, 0, s>>>(p, g, buf, n, lr, momentum, wd, first);
  FSDPSIM_LAUNCH_CHECK();
}

}  // namespace fsdpsim::runtime::cuda
