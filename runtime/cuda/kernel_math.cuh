// The per-thread and per-tile math of the CUDA backend's kernels, as __host__ __device__ inline
// functions: each __global__ kernel in kernels.cu is a thin wrapper that maps its thread/block
// indices onto one of these, and tests/runtime/cuda/test_kernel_math.cu drives the same functions
// over an emulated grid on the CPU and compares them with runtime/layers (the fp32 reference). That
// host test is the oracle available without a GPU; the GPU tests compare the real kernels too.
//
// Storage is bf16 (the plan's param_dtype: parameters, activations, their gradients), arithmetic is
// fp32; reductions accumulate in fp32. bf16 is kept as its 16 raw bits (std::uint16_t) so the same
// code runs on the host, where the conversions below emulate the device's round-to-nearest-even.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define FSDPSIM_HD __host__ __device__ __forceinline__
#else
#define FSDPSIM_HD inline
#endif

namespace fsdpsim::runtime::cuda {

using bf16 = std::uint16_t;   // raw bf16 bits (cuBLAS: CUDA_R_16BF)

// ---- bf16 <-> fp32 (round to nearest even, NaN kept quiet; the same as __float2bfloat16_rn) ----
FSDPSIM_HD float bf2f(bf16 h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
FSDPSIM_HD bf16 f2bf(float f) {
  std::uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16>(u >> 16);
}
// dst (bf16) += v, the sum rounded once (autograd's accumulation of a bf16 .grad).
FSDPSIM_HD void add_to_bf16(bf16& dst, float v) { dst = f2bf(bf2f(dst) + v); }

namespace math {

#ifdef __CUDACC__
FSDPSIM_HD float fexp(float x) { return expf(x); }
FSDPSIM_HD float flog(float x) { return logf(x); }
FSDPSIM_HD float fsqrt(float x) { return sqrtf(x); }
#else
FSDPSIM_HD float fexp(float x) { return __builtin_expf(x); }
FSDPSIM_HD float flog(float x) { return __builtin_logf(x); }
FSDPSIM_HD float fsqrt(float x) { return __builtin_sqrtf(x); }
#endif
FSDPSIM_HD float fmaxf_(float a, float b) { return a > b ? a : b; }
constexpr float kNegInf = -__builtin_huge_valf();

// ---- embedding: out[n,c] = wte[tokens[n], c] ----
FSDPSIM_HD void embedding_fwd(bf16* out, const bf16* wte, const std::int32_t* tokens, long idx, int C) {
  const long n = idx / C;
  const int c = static_cast<int>(idx % C);
  out[idx] = wte[static_cast<long>(tokens[n]) * C + c];
}
// Backward without atomics: the host groups the micro-batch's positions by token (CSR: for unique
// token k, positions pos[off[k] .. off[k+1]) in increasing order); thread (k, c) sums its column in
// that order in fp32 and adds the sum to the bf16 grad row once (deterministic).
FSDPSIM_HD void embedding_bwd(bf16* dwte, const bf16* dout, const std::int32_t* uniq, const std::int32_t* off,
                              const std::int32_t* pos, int k, int c, int C) {
  float acc = 0.0f;
  for (int i = off[k]; i < off[k + 1]; ++i) acc += bf2f(dout[static_cast<long>(pos[i]) * C + c]);
  add_to_bf16(dwte[static_cast<long>(uniq[k]) * C + c], acc);
}

// ---- RMSNorm (one row of C per thread block; thread `tid` of `nt` owns columns tid, tid+nt, ...) ----
FSDPSIM_HD float rms_sumsq_partial(const bf16* x, int tid, int nt, int C) {
  float s = 0.0f;
  for (int c = tid; c < C; c += nt) {
    const float v = bf2f(x[c]);
    s += v * v;
  }
  return s;
}
FSDPSIM_HD float rms_rstd(float sumsq, int C, float eps) { return 1.0f / fsqrt(sumsq / static_cast<float>(C) + eps); }
FSDPSIM_HD bf16 rms_out(bf16 x, bf16 w, float rstd) { return f2bf(bf2f(x) * rstd * bf2f(w)); }
// Backward (rmsnorm.cpp): dx_j += r w_j g_j - k x_j, k = r^3 / C * sum_c g_c w_c x_c.
FSDPSIM_HD float rms_bwd_dot_partial(const bf16* g, const bf16* w, const bf16* x, int tid, int nt, int C) {
  float s = 0.0f;
  for (int c = tid; c < C; c += nt) s += bf2f(g[c]) * bf2f(w[c]) * bf2f(x[c]);
  return s;
}
FSDPSIM_HD float rms_bwd_k(float dot, float r, int C) { return dot / static_cast<float>(C) * r * r * r; }
FSDPSIM_HD float rms_bwd_dx(bf16 g, bf16 w, bf16 x, float r, float k) { return r * bf2f(w) * bf2f(g) - k * bf2f(x); }
// dweight[c] = sum over rows n (in order) of g[n,c] x[n,c] r[n]: one thread per column.
FSDPSIM_HD float rms_bwd_dweight_col(const bf16* g, const bf16* x, const float* rstd, int N, int C, int c) {
  float s = 0.0f;
  for (int n = 0; n < N; ++n) s += bf2f(g[static_cast<long>(n) * C + c]) * bf2f(x[static_cast<long>(n) * C + c]) * rstd[n];
  return s;
}

// ---- rotary (HF rotate_half): pair (i, i + HD/2) of one head of token t, cos/sin from a table
// [T][HD/2] the host fills in double as rotary.cpp does. sign = +1 forward, -1 backward (R^T). ----
FSDPSIM_HD void rope_pair(bf16* v, int i, int half, float c, float s, float sign) {
  const float x1 = bf2f(v[i]), x2 = bf2f(v[i + half]);
  const float sn = sign * s;
  v[i] = f2bf(x1 * c - x2 * sn);
  v[i + half] = f2bf(x2 * c + x1 * sn);
}

// ---- causal attention with GQA, flash style (never an S x S matrix) ----
// Layouts as runtime/layers/attention.h: q/out [B,T,NH,HD], k/v [B,T,NKV,HD], lse [B,NH,T].
// Forward: one query row per thread; keys come in tiles of up to BC rows (converted to fp32 in
// shared memory by the kernel). The running state is the online softmax of Milakov & Gimelshein
// (2018) as FlashAttention-2 uses it: m = max score so far, l = sum exp(s - m), o = sum exp(s - m) v.
template <int HD>
struct AttnRow {
  float m = kNegInf, l = 0.0f;
  float o[HD];
};
template <int HD>
FSDPSIM_HD void attn_row_init(AttnRow<HD>& st) {
  st.m = kNegInf;
  st.l = 0.0f;
  for (int d = 0; d < HD; ++d) st.o[d] = 0.0f;
}
template <int HD>
FSDPSIM_HD float dot_f(const float* a, const float* b) {
  float s = 0.0f;
  for (int d = 0; d < HD; ++d) s += a[d] * b[d];
  return s;
}
// Folds keys k0 .. k0+n-1 (K/V tile rows [n][HD], fp32) into the state of query position t.
template <int HD, int BC>
FSDPSIM_HD void attn_fwd_tile(const float* q, const float* K, const float* V, int n, int k0, int t, float scale,
                              AttnRow<HD>& st) {
  float s[BC];
  float mt = st.m;
  for (int j = 0; j < n; ++j) {
    s[j] = k0 + j <= t ? dot_f<HD>(q, K + j * HD) * scale : kNegInf;   // causal mask: key u <= query t
    mt = fmaxf_(mt, s[j]);
  }
  if (mt == kNegInf) return;   // the whole tile is in the future of t
  const float corr = st.m == kNegInf ? 0.0f : fexp(st.m - mt);
  st.l *= corr;
  for (int d = 0; d < HD; ++d) st.o[d] *= corr;
  for (int j = 0; j < n; ++j) {
    if (s[j] == kNegInf) continue;
    const float p = fexp(s[j] - mt);
    st.l += p;
    for (int d = 0; d < HD; ++d) st.o[d] += p * V[j * HD + d];
  }
  st.m = mt;
}
template <int HD>
FSDPSIM_HD void attn_fwd_finish(const AttnRow<HD>& st, bf16* out, float* lse) {
  const float inv = 1.0f / st.l;
  for (int d = 0; d < HD; ++d) out[d] = f2bf(st.o[d] * inv);
  *lse = st.m + flog(st.l);
}
// Backward (attention.cpp): P = exp(S - lse); dV = P^T dO; dP = dO V^T; dS = P o (dP - D);
// dQ = scale dS K; dK = scale dS^T Q, with D_t = rowsum(dO_t o O_t) computed first.
FSDPSIM_HD float attn_bwd_D_partial(const bf16* dout, const bf16* out, int tid, int nt, int HD) {
  float s = 0.0f;
  for (int d = tid; d < HD; d += nt) s += bf2f(dout[d]) * bf2f(out[d]);
  return s;
}
// dK/dV of key position u (one thread): queries q0 .. q0+n-1 of one query head (Q/dO tile rows
// [n][HD] fp32; their lse and D), accumulated into dk/dv (fp32, HD each). Only queries t >= u see u.
template <int HD>
FSDPSIM_HD void attn_bwd_kv_tile(const float* k, const float* v, int u, const float* Q, const float* dO,
                                 const float* lse, const float* D, int n, int q0, float scale, float* dk, float* dv) {
  for (int i = 0; i < n; ++i) {
    if (q0 + i < u) continue;
    const float* qi = Q + i * HD;
    const float* di = dO + i * HD;
    const float p = fexp(dot_f<HD>(qi, k) * scale - lse[i]);
    const float dp = dot_f<HD>(di, v);
    const float ds = p * (dp - D[i]) * scale;
    for (int d = 0; d < HD; ++d) {
      dv[d] += p * di[d];
      dk[d] += ds * qi[d];
    }
  }
}
// dQ of query position t (one thread): keys k0 .. k0+n-1 (K/V tile rows [n][HD] fp32).
template <int HD>
FSDPSIM_HD void attn_bwd_q_tile(const float* q, const float* dout, float lse, float D, int t, const float* K,
                                const float* V, int n, int k0, float scale, float* dq) {
  for (int j = 0; j < n; ++j) {
    if (k0 + j > t) break;
    const float* kj = K + j * HD;
    const float p = fexp(dot_f<HD>(q, kj) * scale - lse);
    const float dp = dot_f<HD>(dout, V + j * HD);
    const float ds = p * (dp - D) * scale;
    for (int d = 0; d < HD; ++d) dq[d] += ds * kj[d];
  }
}

// ---- SwiGLU (swiglu.cpp): act = silu(gate), h = act * up ----
FSDPSIM_HD void swiglu_fwd(bf16* act, bf16* h, const bf16* gate, const bf16* up, long i) {
  const float g = bf2f(gate[i]);
  const float a = g / (1.0f + fexp(-g));
  const bf16 ab = f2bf(a);
  if (act) act[i] = ab;
  h[i] = f2bf(bf2f(ab) * bf2f(up[i]));   // eager PyTorch: mul reads the bf16 act
}
FSDPSIM_HD void swiglu_bwd(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* act, const bf16* up,
                           long i) {
  const float g = bf2f(gate[i]);
  const float sig = 1.0f / (1.0f + fexp(-g));
  const float d = bf2f(dh[i]);
  dup[i] = f2bf(d * bf2f(act[i]));
  dgate[i] = f2bf(d * bf2f(up[i]) * sig * (1.0f + g * (1.0f - sig)));
}

// ---- fused cross-entropy over bf16 logits: online log-sum-exp in chunks of the vocabulary ----
// Each thread folds its strided share of a row into (m, s) = (max, sum exp(x - max)); the block
// merges the pairs; lse = m + log(s). loss = lse - x[target]. Backward writes, over the logits,
// dlogits = (exp(x - lse) - onehot) * dloss_scale.
FSDPSIM_HD void lse_fold(float x, float& m, float& s) {
  if (x > m) {
    s = (m == kNegInf ? 0.0f : s * fexp(m - x)) + 1.0f;
    m = x;
  } else {
    s += fexp(x - m);
  }
}
FSDPSIM_HD void lse_merge(float& m, float& s, float m2, float s2) {
  if (m2 == kNegInf) return;
  if (m == kNegInf) {
    m = m2;
    s = s2;
    return;
  }
  const float mm = fmaxf_(m, m2);
  s = s * fexp(m - mm) + s2 * fexp(m2 - mm);
  m = mm;
}
FSDPSIM_HD void lse_partial(const bf16* row, int tid, int nt, int V, float& m, float& s) {
  m = kNegInf;
  s = 0.0f;
  for (int i = tid; i < V; i += nt) lse_fold(bf2f(row[i]), m, s);
}
FSDPSIM_HD float ce_dlogit(bf16 x, float lse, bool is_target, float dloss_scale) {
  return (fexp(bf2f(x) - lse) - (is_target ? 1.0f : 0.0f)) * dloss_scale;
}

// ---- elementwise ----
FSDPSIM_HD void bias_add(bf16* out, const bf16* bias, long idx, int OC) { out[idx] = f2bf(bf2f(out[idx]) + bf2f(bias[idx % OC])); }
// dbias[o] += column sum of dout[N,OC], rows in order (one thread per column).
FSDPSIM_HD float col_sum(const bf16* dout, int N, int OC, int o) {
  float s = 0.0f;
  for (int n = 0; n < N; ++n) s += bf2f(dout[static_cast<long>(n) * OC + o]);
  return s;
}

// ---- optimizer on fp32 master shards (train/optimizer.cpp, the same operations in the same order;
// step_size = lr / (1 - beta1^step) and bc2_sqrt = sqrt(1 - beta2^step) come from the host) ----
FSDPSIM_HD void adamw(float& p, float g, float& m, float& v, float lr, float beta1, float beta2, float eps, float wd,
                      float step_size, float bc2_sqrt) {
  p *= 1.0f - lr * wd;
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  p -= step_size * m / (fsqrt(v) / bc2_sqrt + eps);
}
FSDPSIM_HD void sgd_momentum(float& p, float g, float& buf, float lr, float momentum, float wd, bool first) {
  const float gi = g + wd * p;
  buf = first ? gi : momentum * buf + gi;
  p -= lr * buf;
}

}  // namespace math
}  // namespace fsdpsim::runtime::cuda
