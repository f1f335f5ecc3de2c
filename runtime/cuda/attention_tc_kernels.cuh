// The tensor-core attention kernels (attention_tc.h): FlashAttention-2-style causal GQA attention
// on bf16 tensor cores through nvcuda::wmma (16x16x16 tiles, fp32 accumulators), head_dim 64 and
// 128. Same layouts and semantics as attention_forward / attention_backward in kernels.h:
// q/out [B,T,NH,HD], k/v [B,T,NKV,HD] (bf16), lse/D [B,NH,T] (fp32), head h reads kv head
// h / (NH/NKV), key u visible to query t iff u <= t, scale 1/sqrt(HD), lse in natural log.
//
// This header holds the kernels and the launch arithmetic (grids, shared-memory sizes), templated on
// a launcher, so that the same code runs in two places: attention_tc.cu launches it on the GPU, and
// tests/runtime/cuda/test_attention_tc_emulated.cpp runs it on the CPU through a small CUDA emulator
// (tests/runtime/cuda/cuda_emu.h: threads, barriers, shared memory and wmma with a scrambled fragment
// layout), which checks the tiling, masking, tails and synchronisation without a GPU.
//
// Kernels (one block per tile of rows; every loop over a tile is causal-bounded, so fully masked
// tiles are never computed):
//  * forward: 4 warps, 64 query rows per block, each warp owns 16 rows end to end: S = Q K^T per
//    64-key tile into shared memory, the online softmax there (two lanes per row), O = diag(c) O + P V
//    with O in accumulator fragments (rescaled through the element map below).
//  * backward dK/dV: 8 warps, 64 keys per block, accumulating over every query tile of every query
//    head of its kv head (deterministic: no atomics); S^T = K Q^T and dP^T = V dO^T, then
//    P^T = exp(S^T scale - lse), dS^T = P^T o (dP^T - D) scale, elementwise in registers, into shared
//    memory as bf16, then dV += P^T dO (warps 0-3) and dK += dS^T Q (warps 4-7).
//  * backward dQ: 8 warps, 64 queries per block, over the key tiles up to the diagonal: S and dP
//    recomputed, dS into shared memory, dQ += dS K.
//  * D = rowsum(dO o O) first, one warp per row.
// P and dS are rounded to bf16 before their matrix products (as FlashAttention does); the row sums
// l and everything else stay fp32.
//
// wmma leaves the placement of matrix elements in a fragment unspecified. The kernels never assume
// one: they learn it once per thread (acc_map: load the matrix M[r][c] = 16 r + c into an
// accumulator fragment and read back which element each register holds) and use it for the
// elementwise work on accumulators. Every accumulator fragment of one type has the same placement:
// fragment element x[e] of a lane stands for the same matrix position whichever operation wrote it.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <mma.h>
#define FSDPSIM_TC_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#define FSDPSIM_TC_UNROLL _Pragma("unroll")
#else
#ifndef FSDPSIM_CUDA_EMU
#error "attention_tc_kernels.cuh: compile with nvcc, or include tests/runtime/cuda/cuda_emu.h first"
#endif
#define FSDPSIM_TC_DYNAMIC_SMEM(name) unsigned char* name = ::fsdpsim_emu::dynamic_smem()
#define FSDPSIM_TC_UNROLL
#endif

#include "runtime/cuda/kernel_math.cuh"

namespace fsdpsim::runtime::cuda::tc {

namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
// B = X^T for X [n][HD] stored row-major (K, V, Q, dO tiles): element (d, j) at X + j*ld + d.
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
constexpr int kAccElems = FragC::num_elements;
static_assert(kAccElems * 32 == 256, "a 16x16 fp32 accumulator is spread over the warp without copies");

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ const __nv_bfloat16* nv(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
template <int HD>
__device__ __forceinline__ long row_off(int b, int t, int h, int T, int H) {
  return ((static_cast<long>(b) * T + t) * H + h) * HD;
}

// Element e of this lane's accumulator fragments is matrix position (rc[e] >> 4, rc[e] & 15).
struct AccMap {
  int rc[kAccElems];
};
// scratch: 256 floats, 32-byte aligned, this warp's alone until the call returns.
__device__ __forceinline__ void acc_map(float* scratch, AccMap& m) {
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 256; i += 32) scratch[i] = static_cast<float>(i);
  __syncwarp();
  FragC f;
  wmma::load_matrix_sync(f, scratch, 16, wmma::mem_row_major);
  FSDPSIM_TC_UNROLL
  for (int e = 0; e < kAccElems; ++e) m.rc[e] = static_cast<int>(f.x[e]);
  __syncwarp();
}

// Rows t0 .. t0+rows-1 of head h of x [B,T,H,HD] into dst [rows][LD] (bf16), zeros from row T on
// (a zero V row times a zero probability stays 0; uninitialised shared memory could hold NaN).
// 16-byte accesses: the caller checked that x is 16-byte aligned (HD*2 bytes per row keep it so).
template <int HD, int LD>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* x, int b, int t0, int rows, int h, int T, int H) {
  constexpr int kChunks = HD / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = i % kChunks, t = t0 + r;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (t < T) w = *reinterpret_cast<const uint4*>(x + row_off<HD>(b, t, h, T, H) + c * 8);
    *reinterpret_cast<uint4*>(dst + r * LD + c * 8) = w;
  }
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  return static_cast<unsigned>(f2bf(lo)) | (static_cast<unsigned>(f2bf(hi)) << 16);
}
// Rows t0 .. t0+rows-1 (those < T) of head h of y [B,T,H,HD] (bf16) from src [rows][LD] (fp32),
// row r times row_scale[r] (null: 1).
template <int HD, int LD>
__device__ __forceinline__ void store_rows(bf16* y, const float* src, const float* row_scale, int b, int t0, int rows,
                                           int h, int T, int H) {
  constexpr int kChunks = HD / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = i % kChunks, t = t0 + r;
    if (t >= T) continue;
    const float f = row_scale ? row_scale[r] : 1.0f;
    const float* s = src + r * LD + c * 8;
    uint4 w;
    w.x = pack_bf16x2(s[0] * f, s[1] * f);
    w.y = pack_bf16x2(s[2] * f, s[3] * f);
    w.z = pack_bf16x2(s[4] * f, s[5] * f);
    w.w = pack_bf16x2(s[6] * f, s[7] * f);
    *reinterpret_cast<uint4*>(y + row_off<HD>(b, t, h, T, H) + c * 8) = w;
  }
}

// Shared-memory plans. Offsets in bytes from the 128-byte aligned dynamic shared memory; every
// buffer and every 16-row / 16-column fragment origin in it is 32-byte aligned (wmma's rule), and
// every row stride is padded by 16 bytes against shared-memory bank conflicts.
constexpr bool aligned32(std::size_t bytes) { return bytes % 32 == 0; }

template <int HD>
struct FwdPlan {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kBq = 16 * kWarps;    // query rows per block, 16 per warp
  static constexpr int kBc = 64;             // keys per tile
  static constexpr int kLdH = HD + 8;        // Q/K/V tiles [rows][kLdH] bf16
  static constexpr int kLdS = kBc + 4;       // a warp's scores [16][kLdS] fp32
  static constexpr int kLdP = kBc + 8;       // a warp's probabilities [16][kLdP] bf16
  static constexpr int kLdO = HD + 4;        // output staging [kBq][kLdO] fp32
  static constexpr std::size_t kQ = 0;
  static constexpr std::size_t kK = kQ + sizeof(bf16) * kBq * kLdH;
  static constexpr std::size_t kV = kK + sizeof(bf16) * kBc * kLdH;
  static constexpr std::size_t kS = kV + sizeof(bf16) * kBc * kLdH;
  static constexpr std::size_t kP = kS + sizeof(float) * kWarps * 16 * kLdS;
  static constexpr std::size_t kR = kP + sizeof(bf16) * kWarps * 16 * kLdP;   // [kBq] fp32 row factors
  static constexpr std::size_t kBytes = kR + sizeof(float) * kBq;
  static constexpr std::size_t kO = kK;      // the staging reuses K and V once the last tile is done
  static_assert(sizeof(float) * kBq * kLdO <= kS - kK, "output staging fits over K and V");
  static_assert(sizeof(float) * 16 * kLdS >= sizeof(float) * 256, "acc_map scratch fits in a warp's scores");
  static_assert(aligned32(kK) && aligned32(kV) && aligned32(kS) && aligned32(kP) && aligned32(kR));
  static_assert(aligned32(sizeof(bf16) * 16 * kLdH) && aligned32(sizeof(float) * 16 * kLdS) &&
                aligned32(sizeof(bf16) * 16 * kLdP) && aligned32(sizeof(float) * 16 * kLdO));
};

template <int HD>
struct BwdKvPlan {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kBk = 64;             // keys per block
  static constexpr int kBq = 64;             // queries per tile
  static constexpr int kLdH = HD + 8;        // K/V/Q/dO tiles bf16
  static constexpr int kLdP = kBq + 8;       // P^T, dS^T [kBk][kLdP] bf16
  static constexpr int kLdO = HD + 4;        // dK/dV staging [kBk][kLdO] fp32
  static constexpr std::size_t kK = 0;
  static constexpr std::size_t kV = kK + sizeof(bf16) * kBk * kLdH;
  static constexpr std::size_t kQ = kV + sizeof(bf16) * kBk * kLdH;
  static constexpr std::size_t kdO = kQ + sizeof(bf16) * kBq * kLdH;
  static constexpr std::size_t kP = kdO + sizeof(bf16) * kBq * kLdH;
  static constexpr std::size_t kdS = kP + sizeof(bf16) * kBk * kLdP;
  static constexpr std::size_t kL = kdS + sizeof(bf16) * kBk * kLdP;          // [kBq] lse of the tile
  static constexpr std::size_t kD = kL + sizeof(float) * kBq;                 // [kBq] D of the tile
  static constexpr std::size_t kBytes = kD + sizeof(float) * kBq;
  // After the loops: dV staged over Q + dO, dK over K + V. Before them: acc_map scratch over Q + dO.
  static constexpr std::size_t kOdV = kQ, kOdK = kK;
  static_assert(sizeof(float) * kBk * kLdO <= kP - kQ && sizeof(float) * kBk * kLdO <= kQ - kK);
  static_assert(sizeof(float) * 256 * kWarps <= kP - kQ);
  static_assert(kBk % kBq == 0 || kBq % kBk == 0);
  static_assert(aligned32(kV) && aligned32(kQ) && aligned32(kdO) && aligned32(kP) && aligned32(kdS) && aligned32(kL));
  static_assert(aligned32(sizeof(bf16) * 16 * kLdH) && aligned32(sizeof(bf16) * 16 * kLdP) &&
                aligned32(sizeof(float) * 16 * kLdO));
};

template <int HD>
struct BwdQPlan {
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kBq = 64;             // queries per block
  static constexpr int kBk = 64;             // keys per tile
  static constexpr int kLdH = HD + 8;        // Q/dO/K/V tiles bf16
  static constexpr int kLdS = kBk + 8;       // dS [kBq][kLdS] bf16
  static constexpr int kLdO = HD + 4;        // dQ staging [kBq][kLdO] fp32
  static constexpr std::size_t kQ = 0;
  static constexpr std::size_t kdO = kQ + sizeof(bf16) * kBq * kLdH;
  static constexpr std::size_t kK = kdO + sizeof(bf16) * kBq * kLdH;
  static constexpr std::size_t kV = kK + sizeof(bf16) * kBk * kLdH;
  static constexpr std::size_t kdS = kV + sizeof(bf16) * kBk * kLdH;
  static constexpr std::size_t kL = kdS + sizeof(bf16) * kBq * kLdS;
  static constexpr std::size_t kD = kL + sizeof(float) * kBq;
  static constexpr std::size_t kBytes = kD + sizeof(float) * kBq;
  // After the loop: dQ staged over K + V. Before it: acc_map scratch over K + V.
  static constexpr std::size_t kO = kK;
  static_assert(sizeof(float) * kBq * kLdO <= kdS - kK && sizeof(float) * 256 * kWarps <= kdS - kK);
  static_assert(aligned32(kdO) && aligned32(kK) && aligned32(kV) && aligned32(kdS) && aligned32(kL));
  static_assert(aligned32(sizeof(bf16) * 16 * kLdH) && aligned32(sizeof(bf16) * 16 * kLdS) &&
                aligned32(sizeof(float) * 16 * kLdO));
};

// ---- forward ----
// Grid: one block per (query tile, head, batch), the last (longest) query tiles first.
template <int HD>
__global__ void __launch_bounds__(FwdPlan<HD>::kThreads)
    attn_fwd_tc_k(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q,
                  const bf16* __restrict__ k, const bf16* __restrict__ v, int B, int T, int NH, int NKV,
                  float scale) {
  using P = FwdPlan<HD>;
  FSDPSIM_TC_DYNAMIC_SMEM(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long heads = static_cast<long>(B) * NH;
  const int n_tiles = (T + P::kBq - 1) / P::kBq;
  const int qt = n_tiles - 1 - static_cast<int>(blockIdx.x / heads);
  const int h = static_cast<int>(blockIdx.x % heads % NH), b = static_cast<int>(blockIdx.x % heads / NH);
  const int q0 = qt * P::kBq, kvh = h / (NH / NKV);
  bf16* Qs = reinterpret_cast<bf16*>(smem + P::kQ);
  bf16* Ks = reinterpret_cast<bf16*>(smem + P::kK);
  bf16* Vs = reinterpret_cast<bf16*>(smem + P::kV);
  float* Sw = reinterpret_cast<float*>(smem + P::kS) + warp * 16 * P::kLdS;   // this warp's S [16][kLdS]
  bf16* Pw = reinterpret_cast<bf16*>(smem + P::kP) + warp * 16 * P::kLdP;     // this warp's P [16][kLdP]
  float* Rw = reinterpret_cast<float*>(smem + P::kR) + warp * 16;             // this warp's row factors

  AccMap map;
  acc_map(Sw, map);
  load_rows<HD, P::kLdH>(Qs, q, b, q0, P::kBq, h, T, NH);
  __syncthreads();
  FragA qa[HD / 16];
  FSDPSIM_TC_UNROLL
  for (int kk = 0; kk < HD / 16; ++kk) wmma::load_matrix_sync(qa[kk], nv(Qs + warp * 16 * P::kLdH + kk * 16), P::kLdH);
  FragC o[HD / 16];
  FSDPSIM_TC_UNROLL
  for (int nb = 0; nb < HD / 16; ++nb) wmma::fill_fragment(o[nb], 0.0f);

  // The online softmax state of row r of the warp (query t) lives in lanes 2r and 2r+1; lane 2r+half
  // handles the tile's columns half, half+2, half+4, ...
  const int r = lane / 2, half = lane % 2;
  const int t = q0 + warp * 16 + r;   // >= T: a padding row, computed and never stored
  float m = math::kNegInf, l = 0.0f;
  const int kend = imin(T, q0 + P::kBq);   // keys any query of this block can see
  for (int k0 = 0; k0 < kend; k0 += P::kBc) {
    __syncthreads();   // no warp still reads the previous K/V tile (nor its P or row factors)
    load_rows<HD, P::kLdH>(Ks, k, b, k0, P::kBc, kvh, T, NKV);
    load_rows<HD, P::kLdH>(Vs, v, b, k0, P::kBc, kvh, T, NKV);
    __syncthreads();
    // S = Q K^T for the warp's 16 rows, fp32 into Sw.
    FSDPSIM_TC_UNROLL
    for (int nb = 0; nb < P::kBc / 16; ++nb) {
      FragC s;
      wmma::fill_fragment(s, 0.0f);
      FSDPSIM_TC_UNROLL
      for (int kk = 0; kk < HD / 16; ++kk) {
        FragBT kb;
        wmma::load_matrix_sync(kb, nv(Ks + nb * 16 * P::kLdH + kk * 16), P::kLdH);
        wmma::mma_sync(s, qa[kk], kb, s);
      }
      wmma::store_matrix_sync(Sw + nb * 16, s, P::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax over the tile: new max, rescale factor of the old state, P = exp(s - max).
    const float* srow = Sw + r * P::kLdS;
    float mx = math::kNegInf;
    for (int c = half; c < P::kBc; c += 2)
      if (k0 + c <= t && k0 + c < T) mx = fmaxf(mx, srow[c] * scale);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float m_ref = m_new == math::kNegInf ? 0.0f : m_new;   // nothing visible yet: all terms 0
    const float corr = expf(m - m_ref);                          // exp(-inf) = 0 on the first tile
    float sum = 0.0f;
    for (int c = half; c < P::kBc; c += 2) {
      const float p = (k0 + c <= t && k0 + c < T) ? expf(srow[c] * scale - m_ref) : 0.0f;
      sum += p;
      Pw[r * P::kLdP + c] = f2bf(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    if (half == 0) Rw[r] = corr;
    __syncwarp();
    // O = diag(corr) O + P V.
    FSDPSIM_TC_UNROLL
    for (int e = 0; e < kAccElems; ++e) {
      const float f = Rw[map.rc[e] >> 4];
      FSDPSIM_TC_UNROLL
      for (int nb = 0; nb < HD / 16; ++nb) o[nb].x[e] *= f;
    }
    FSDPSIM_TC_UNROLL
    for (int kk = 0; kk < P::kBc / 16; ++kk) {
      FragA pa;
      wmma::load_matrix_sync(pa, nv(Pw + kk * 16), P::kLdP);
      FSDPSIM_TC_UNROLL
      for (int nb = 0; nb < HD / 16; ++nb) {
        FragB vb;
        wmma::load_matrix_sync(vb, nv(Vs + kk * 16 * P::kLdH + nb * 16), P::kLdH);
        wmma::mma_sync(o[nb], pa, vb, o[nb]);
      }
    }
  }
  __syncthreads();   // K and V are done with: they become the output staging
  float* Os = reinterpret_cast<float*>(smem + P::kO);
  FSDPSIM_TC_UNROLL
  for (int nb = 0; nb < HD / 16; ++nb)
    wmma::store_matrix_sync(Os + warp * 16 * P::kLdO + nb * 16, o[nb], P::kLdO, wmma::mem_row_major);
  if (half == 0) {
    Rw[r] = l > 0.0f ? 1.0f / l : 0.0f;
    if (t < T) lse[(static_cast<long>(b) * NH + h) * T + t] = m + logf(l);
  }
  __syncthreads();
  store_rows<HD, P::kLdO>(out, Os, reinterpret_cast<const float*>(smem + P::kR), b, q0, P::kBq, h, T, NH);
}

// ---- backward ----
// D[b,h,t] = sum_d dout * out over the row (b, t, h): one warp per row, 8 rows per block.
template <int HD>
__global__ void __launch_bounds__(256) attn_bwd_D_tc_k(float* __restrict__ D, const bf16* __restrict__ dout,
                                                       const bf16* __restrict__ out, int T, int NH, long rows) {
  const long row = blockIdx.x * static_cast<long>(blockDim.x / 32) + threadIdx.x / 32;   // (b*T + t)*NH + h
  if (row >= rows) return;   // the same for the warp's 32 lanes
  const int lane = threadIdx.x % 32;
  float s = 0.0f;
  for (int d = lane; d < HD; d += 32) s += bf2f(dout[row * HD + d]) * bf2f(out[row * HD + d]);
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) {
    const long h = row % NH, bt = row / NH, t = bt % T, b = bt / T;
    D[(b * NH + h) * T + t] = s;
  }
}

// dK, dV: one block per (key tile, kv head, batch), key tile 0 (seen by every query) first.
template <int HD>
__global__ void __launch_bounds__(BwdKvPlan<HD>::kThreads)
    attn_bwd_kv_tc_k(bf16* __restrict__ dk, bf16* __restrict__ dv, const bf16* __restrict__ q,
                     const bf16* __restrict__ k, const bf16* __restrict__ v, const bf16* __restrict__ dout,
                     const float* __restrict__ lse, const float* __restrict__ D, int B, int T, int NH, int NKV,
                     float scale) {
  using P = BwdKvPlan<HD>;
  FSDPSIM_TC_DYNAMIC_SMEM(smem);
  const int warp = threadIdx.x / 32;
  const long heads = static_cast<long>(B) * NKV;
  const int kt = static_cast<int>(blockIdx.x / heads);
  const int kvh = static_cast<int>(blockIdx.x % heads % NKV), b = static_cast<int>(blockIdx.x % heads / NKV);
  const int k0 = kt * P::kBk, group = NH / NKV;
  bf16* Ks = reinterpret_cast<bf16*>(smem + P::kK);
  bf16* Vs = reinterpret_cast<bf16*>(smem + P::kV);
  bf16* Qs = reinterpret_cast<bf16*>(smem + P::kQ);
  bf16* dOs = reinterpret_cast<bf16*>(smem + P::kdO);
  bf16* Pt = reinterpret_cast<bf16*>(smem + P::kP);     // P^T [kBk][kLdP]
  bf16* dSt = reinterpret_cast<bf16*>(smem + P::kdS);   // dS^T [kBk][kLdP]
  float* Ls = reinterpret_cast<float*>(smem + P::kL);
  float* Ds = reinterpret_cast<float*>(smem + P::kD);

  AccMap map;
  acc_map(reinterpret_cast<float*>(smem + P::kQ) + warp * 256, map);
  load_rows<HD, P::kLdH>(Ks, k, b, k0, P::kBk, kvh, T, NKV);
  load_rows<HD, P::kLdH>(Vs, v, b, k0, P::kBk, kvh, T, NKV);
  // Scores: warp w computes the S^T and dP^T tiles of key rows 16*rb1.. and query columns
  // 16*cb1.. and 16*(cb1+1).. . Products: warps 0-3 accumulate dV rows 16*rb2.., warps 4-7 dK's.
  const int rb1 = warp / 2, cb1 = (warp % 2) * 2;
  const bool is_dv = warp < 4;
  const int rb2 = warp % 4;
  FragC acc[HD / 16];
  FSDPSIM_TC_UNROLL
  for (int nb = 0; nb < HD / 16; ++nb) wmma::fill_fragment(acc[nb], 0.0f);

  const int q_first = k0 / P::kBq * P::kBq;   // earlier query tiles see none of these keys
  for (int j = 0; j < group; ++j) {
    const int h = kvh * group + j;
    const float* lrow = lse + (static_cast<long>(b) * NH + h) * T;
    const float* drow = D + (static_cast<long>(b) * NH + h) * T;
    for (int q0 = q_first; q0 < T; q0 += P::kBq) {
      __syncthreads();   // the previous tile's Q, dO, P^T, dS^T (and the acc_map scratch) are done with
      load_rows<HD, P::kLdH>(Qs, q, b, q0, P::kBq, h, T, NH);
      load_rows<HD, P::kLdH>(dOs, dout, b, q0, P::kBq, h, T, NH);
      for (int i = threadIdx.x; i < P::kBq; i += blockDim.x) {
        const bool in = q0 + i < T;
        Ls[i] = in ? lrow[q0 + i] : 0.0f;
        Ds[i] = in ? drow[q0 + i] : 0.0f;
      }
      __syncthreads();
      FragC st[2], dpt[2];
      FSDPSIM_TC_UNROLL
      for (int c = 0; c < 2; ++c) {
        wmma::fill_fragment(st[c], 0.0f);
        wmma::fill_fragment(dpt[c], 0.0f);
      }
      FSDPSIM_TC_UNROLL
      for (int kk = 0; kk < HD / 16; ++kk) {
        FragA ka, va;
        wmma::load_matrix_sync(ka, nv(Ks + rb1 * 16 * P::kLdH + kk * 16), P::kLdH);
        wmma::load_matrix_sync(va, nv(Vs + rb1 * 16 * P::kLdH + kk * 16), P::kLdH);
        FSDPSIM_TC_UNROLL
        for (int c = 0; c < 2; ++c) {
          FragBT qb, ob;
          wmma::load_matrix_sync(qb, nv(Qs + (cb1 + c) * 16 * P::kLdH + kk * 16), P::kLdH);
          wmma::load_matrix_sync(ob, nv(dOs + (cb1 + c) * 16 * P::kLdH + kk * 16), P::kLdH);
          wmma::mma_sync(st[c], ka, qb, st[c]);
          wmma::mma_sync(dpt[c], va, ob, dpt[c]);
        }
      }
      // P^T = exp(S^T scale - lse), dS^T = P^T o (dP^T - D) scale where key <= query < T, else 0.
      FSDPSIM_TC_UNROLL
      for (int c = 0; c < 2; ++c) {
        FSDPSIM_TC_UNROLL
        for (int e = 0; e < kAccElems; ++e) {
          const int jl = rb1 * 16 + (map.rc[e] >> 4), il = (cb1 + c) * 16 + (map.rc[e] & 15);
          const bool vis = k0 + jl <= q0 + il && q0 + il < T;
          const float p = vis ? expf(st[c].x[e] * scale - Ls[il]) : 0.0f;
          const float ds = vis ? p * (dpt[c].x[e] - Ds[il]) * scale : 0.0f;
          Pt[jl * P::kLdP + il] = f2bf(p);
          dSt[jl * P::kLdP + il] = f2bf(ds);
        }
      }
      __syncthreads();
      // dV += P^T dO, dK += dS^T Q: rows 16*rb2.. of the block's keys, all HD columns.
      const bf16* A = is_dv ? Pt : dSt;
      const bf16* Bm = is_dv ? dOs : Qs;
      FSDPSIM_TC_UNROLL
      for (int kk = 0; kk < P::kBq / 16; ++kk) {
        FragA a;
        wmma::load_matrix_sync(a, nv(A + rb2 * 16 * P::kLdP + kk * 16), P::kLdP);
        FSDPSIM_TC_UNROLL
        for (int nb = 0; nb < HD / 16; ++nb) {
          FragB bb;
          wmma::load_matrix_sync(bb, nv(Bm + kk * 16 * P::kLdH + nb * 16), P::kLdH);
          wmma::mma_sync(acc[nb], a, bb, acc[nb]);
        }
      }
    }
  }
  __syncthreads();   // every tile done: Q + dO stage dV, K + V stage dK
  float* Os = reinterpret_cast<float*>(smem + (is_dv ? P::kOdV : P::kOdK));
  FSDPSIM_TC_UNROLL
  for (int nb = 0; nb < HD / 16; ++nb)
    wmma::store_matrix_sync(Os + rb2 * 16 * P::kLdO + nb * 16, acc[nb], P::kLdO, wmma::mem_row_major);
  __syncthreads();
  store_rows<HD, P::kLdO>(dv, reinterpret_cast<const float*>(smem + P::kOdV), nullptr, b, k0, P::kBk, kvh, T, NKV);
  store_rows<HD, P::kLdO>(dk, reinterpret_cast<const float*>(smem + P::kOdK), nullptr, b, k0, P::kBk, kvh, T, NKV);
}

// dQ: one block per (query tile, head, batch), the last (longest) query tiles first.
template <int HD>
__global__ void __launch_bounds__(BwdQPlan<HD>::kThreads)
    attn_bwd_q_tc_k(bf16* __restrict__ dq, const bf16* __restrict__ q, const bf16* __restrict__ k,
                    const bf16* __restrict__ v, const bf16* __restrict__ dout, const float* __restrict__ lse,
                    const float* __restrict__ D, int B, int T, int NH, int NKV, float scale) {
  using P = BwdQPlan<HD>;
  FSDPSIM_TC_DYNAMIC_SMEM(smem);
  const int warp = threadIdx.x / 32;
  const long heads = static_cast<long>(B) * NH;
  const int n_tiles = (T + P::kBq - 1) / P::kBq;
  const int qt = n_tiles - 1 - static_cast<int>(blockIdx.x / heads);
  const int h = static_cast<int>(blockIdx.x % heads % NH), b = static_cast<int>(blockIdx.x % heads / NH);
  const int q0 = qt * P::kBq, kvh = h / (NH / NKV);
  bf16* Qs = reinterpret_cast<bf16*>(smem + P::kQ);
  bf16* dOs = reinterpret_cast<bf16*>(smem + P::kdO);
  bf16* Ks = reinterpret_cast<bf16*>(smem + P::kK);
  bf16* Vs = reinterpret_cast<bf16*>(smem + P::kV);
  bf16* dS = reinterpret_cast<bf16*>(smem + P::kdS);   // [kBq][kLdS]
  float* Ls = reinterpret_cast<float*>(smem + P::kL);
  float* Ds = reinterpret_cast<float*>(smem + P::kD);

  AccMap map;
  acc_map(reinterpret_cast<float*>(smem + P::kK) + warp * 256, map);
  load_rows<HD, P::kLdH>(Qs, q, b, q0, P::kBq, h, T, NH);
  load_rows<HD, P::kLdH>(dOs, dout, b, q0, P::kBq, h, T, NH);
  const float* lrow = lse + (static_cast<long>(b) * NH + h) * T;
  const float* drow = D + (static_cast<long>(b) * NH + h) * T;
  for (int i = threadIdx.x; i < P::kBq; i += blockDim.x) {
    const bool in = q0 + i < T;
    Ls[i] = in ? lrow[q0 + i] : 0.0f;
    Ds[i] = in ? drow[q0 + i] : 0.0f;
  }
  // Scores: warp w computes the S and dP tiles of query rows 16*rb.. and key columns 16*cb1.. and
  // 16*(cb1+1).. ; product: dQ rows 16*rb.., column blocks nb0 .. nb0 + HD/32 - 1.
  const int rb = warp / 2, cb1 = (warp % 2) * 2, nb0 = (warp % 2) * (HD / 32);
  FragC acc[HD / 32];
  FSDPSIM_TC_UNROLL
  for (int n = 0; n < HD / 32; ++n) wmma::fill_fragment(acc[n], 0.0f);

  const int kend = imin(T, q0 + P::kBq);   // keys this block's queries can see
  for (int k0 = 0; k0 < kend; k0 += P::kBk) {
    __syncthreads();   // no warp still reads the previous K (nor dS, nor the acc_map scratch)
    load_rows<HD, P::kLdH>(Ks, k, b, k0, P::kBk, kvh, T, NKV);
    load_rows<HD, P::kLdH>(Vs, v, b, k0, P::kBk, kvh, T, NKV);
    __syncthreads();
    FragC s[2], dp[2];
    FSDPSIM_TC_UNROLL
    for (int c = 0; c < 2; ++c) {
      wmma::fill_fragment(s[c], 0.0f);
      wmma::fill_fragment(dp[c], 0.0f);
    }
    FSDPSIM_TC_UNROLL
    for (int kk = 0; kk < HD / 16; ++kk) {
      FragA qa, oa;
      wmma::load_matrix_sync(qa, nv(Qs + rb * 16 * P::kLdH + kk * 16), P::kLdH);
      wmma::load_matrix_sync(oa, nv(dOs + rb * 16 * P::kLdH + kk * 16), P::kLdH);
      FSDPSIM_TC_UNROLL
      for (int c = 0; c < 2; ++c) {
        FragBT kb, vb;
        wmma::load_matrix_sync(kb, nv(Ks + (cb1 + c) * 16 * P::kLdH + kk * 16), P::kLdH);
        wmma::load_matrix_sync(vb, nv(Vs + (cb1 + c) * 16 * P::kLdH + kk * 16), P::kLdH);
        wmma::mma_sync(s[c], qa, kb, s[c]);
        wmma::mma_sync(dp[c], oa, vb, dp[c]);
      }
    }
    // dS = P o (dP - D) scale, P = exp(S scale - lse), where key <= query < T, else 0.
    FSDPSIM_TC_UNROLL
    for (int c = 0; c < 2; ++c) {
      FSDPSIM_TC_UNROLL
      for (int e = 0; e < kAccElems; ++e) {
        const int il = rb * 16 + (map.rc[e] >> 4), jl = (cb1 + c) * 16 + (map.rc[e] & 15);
        const bool vis = k0 + jl <= q0 + il && q0 + il < T;
        const float p = vis ? expf(s[c].x[e] * scale - Ls[il]) : 0.0f;
        dS[il * P::kLdS + jl] = f2bf(vis ? p * (dp[c].x[e] - Ds[il]) * scale : 0.0f);
      }
    }
    __syncthreads();
    // dQ += dS K.
    FSDPSIM_TC_UNROLL
    for (int kk = 0; kk < P::kBk / 16; ++kk) {
      FragA a;
      wmma::load_matrix_sync(a, nv(dS + rb * 16 * P::kLdS + kk * 16), P::kLdS);
      FSDPSIM_TC_UNROLL
      for (int n = 0; n < HD / 32; ++n) {
        FragB kb;
        wmma::load_matrix_sync(kb, nv(Ks + kk * 16 * P::kLdH + (nb0 + n) * 16), P::kLdH);
        wmma::mma_sync(acc[n], a, kb, acc[n]);
      }
    }
  }
  __syncthreads();   // K and V are done with: they become the dQ staging
  float* Os = reinterpret_cast<float*>(smem + P::kO);
  FSDPSIM_TC_UNROLL
  for (int n = 0; n < HD / 32; ++n)
    wmma::store_matrix_sync(Os + rb * 16 * P::kLdO + (nb0 + n) * 16, acc[n], P::kLdO, wmma::mem_row_major);
  __syncthreads();
  store_rows<HD, P::kLdO>(dq, Os, nullptr, b, q0, P::kBq, h, T, NH);
}

// ---- launch arithmetic, shared by the GPU and the emulator ----
// launch(kernel, blocks (long), threads, dynamic shared bytes, args...) runs a 1-D grid.
inline float softmax_scale(int HD) { return 1.0f / std::sqrt(static_cast<float>(HD)); }   // as kernels.cu

template <int HD, class Launch>
void forward_run(Launch&& launch, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                 int NH, int NKV) {
  using P = FwdPlan<HD>;
  const long blocks = static_cast<long>((T + P::kBq - 1) / P::kBq) * NH * B;
  launch(attn_fwd_tc_k<HD>, blocks, P::kThreads, P::kBytes, out, lse, q, k, v, B, T, NH, NKV, softmax_scale(HD));
}

template <int HD, class Launch>
void backward_run(Launch&& launch, bf16* dq, bf16* dk, bf16* dv, float* D, const bf16* dout, const bf16* q,
                  const bf16* k, const bf16* v, const bf16* out, const float* lse, int B, int T, int NH, int NKV) {
  const long rows = static_cast<long>(B) * T * NH;
  launch(attn_bwd_D_tc_k<HD>, (rows + 7) / 8, 256, std::size_t{0}, D, dout, out, T, NH, rows);
  const float scale = softmax_scale(HD);
  using KV = BwdKvPlan<HD>;
  const long kv_blocks = static_cast<long>((T + KV::kBk - 1) / KV::kBk) * NKV * B;
  launch(attn_bwd_kv_tc_k<HD>, kv_blocks, KV::kThreads, KV::kBytes, dk, dv, q, k, v, dout,
         static_cast<const float*>(lse), static_cast<const float*>(D), B, T, NH, NKV, scale);
  using Q = BwdQPlan<HD>;
  const long q_blocks = static_cast<long>((T + Q::kBq - 1) / Q::kBq) * NH * B;
  launch(attn_bwd_q_tc_k<HD>, q_blocks, Q::kThreads, Q::kBytes, dq, q, k, v, dout, static_cast<const float*>(lse),
         static_cast<const float*>(D), B, T, NH, NKV, scale);
}

}  // namespace fsdpsim::runtime::cuda::tc
