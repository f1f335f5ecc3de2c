// Compute cost model: the time of one kernel alone on the GPU, from the profile's peak rates and
// efficiency figures (profiles/README.md "Compute model"). Plain arithmetic on precomputed
// parameters: no allocation, no lookup (the simulator calls these millions of times).
#pragma once
#include <cstdint>

#include "common/dtype.h"
#include "common/memory_class.h"
#include "common/units.h"

namespace fsdpsim::calibrate {

struct ComputeParams {
  double peak_flops[4] = {0, 0, 0, 0};  // dense FLOP/s indexed by Dtype (FP32, BF16, FP16, FP8); 0 = unsupported
  double gemm_core_eff = 0.8;     // GEMM efficiency at whole waves and deep K; set so the curve passes through the MAMF point
  std::int64_t sm_count = 132;    // CTAs that run at once (one output tile per SM)
  std::int64_t tile_m = 128, tile_n = 128;  // output tile per CTA (wave quantization); smaller for skinny dims
  double k_half = 64;             // K at which the K loop runs at half efficiency
  TimeNs min_kernel_ns = 4000;    // fixed cost of any kernel on the GPU
  double attn_fwd_eff = 0.35, attn_bwd_eff = 0.30;  // flash attention, fraction of peak at the reference shape
  // Attention efficiency by shape (profiles/README.md "Compute model"): the efficiencies above hold at
  // (attn_ref_seq, attn_ref_head_dim); elsewhere they scale by F(s, d) / F(ref), with
  // F = s/(s + attn_seq_half) * s/(s + attn_causal_half) * d/(d + attn_head_dim_half). 0 = no dependence.
  double attn_seq_half = 0, attn_causal_half = 0, attn_head_dim_half = 0;
  double attn_ref_seq = 0, attn_ref_head_dim = 0;
  double mem_bw = 2.0e12;         // achieved HBM bytes/s (bandwidth x efficiency)
  // Per class of memory-bound kernel (common/memory_class.h), bytes/s; 0 = mem_bw. Only a calibrated
  // CPU profile sets them (its scalar kernels run at very different rates per element).
  double class_bw[kMemoryClasses] = {0, 0, 0, 0, 0, 0, 0, 0};
};

// Fraction of the SMs busy, averaged over the waves of ceil(m/tile_m) x ceil(n/tile_n) tiles.
double gemm_wave_efficiency(const ComputeParams& p, std::int64_t m, std::int64_t n);
double gemm_k_efficiency(const ComputeParams& p, std::int64_t k);
// The core efficiency that makes the curve reproduce a measured rate `flops_per_s` at (m, n, k).
double gemm_core_efficiency_from_point(const ComputeParams& p, double flops_per_s, double peak, std::int64_t m,
                                       std::int64_t n, std::int64_t k);

// C[m,n] = A[m,k] B[k,n]: max(compute at the shape's efficiency, HBM roofline on A+B+C) + fixed cost.
TimeNs model_gemm_time(const ComputeParams& p, std::int64_t m, std::int64_t n, std::int64_t k, Dtype dtype);
// The attention efficiency factor F(s, d) / F(ref) of a causal kernel (1 when the profile gives no shape data).
double attention_shape_factor(const ComputeParams& p, std::int64_t seq, std::int64_t head_dim);
// Causal flash attention: forward 2*b*s^2*h*d FLOPs (4 b s^2 h d halved by the causal mask, as the
// FlashAttention papers count), backward 2.5x the forward; HBM floor on q, k, v, o (and grads).
TimeNs model_attention_time(const ComputeParams& p, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                            std::int64_t kv_heads, std::int64_t head_dim, Dtype dtype, bool backward);
TimeNs model_memory_bound_time(const ComputeParams& p, Bytes bytes_moved, MemoryClass cls = MemoryClass::Copy);

}  // namespace fsdpsim::calibrate
