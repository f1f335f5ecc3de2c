#include "calibrate/compute_model.h"

#include <algorithm>
#include <cmath>

namespace fsdpsim::calibrate {
namespace {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline TimeNs seconds_to_ns(double s) { return static_cast<TimeNs>(std::llround(s * 1e9)); }

}  // namespace

double gemm_wave_efficiency(const ComputeParams& p, std::int64_t m, std::int64_t n) {
  // A dimension smaller than the tile gets a smaller tile (rounded up to 16, the MMA granularity):
  // cuBLAS has narrow tiles (and GEMV kernels) for skinny problems.
  m = std::max<std::int64_t>(m, 1), n = std::max<std::int64_t>(n, 1);
  std::int64_t tm = std::min(p.tile_m, ceil_div(m, 16) * 16), tn = std::min(p.tile_n, ceil_div(n, 16) * 16);
  if (p.tile_m < 16) tm = p.tile_m;
  if (p.tile_n < 16) tn = p.tile_n;
  std::int64_t tiles = ceil_div(m, tm) * ceil_div(n, tn);
  std::int64_t waves = ceil_div(tiles, p.sm_count);
  // Partial tiles at the edges also waste work: count the useful fraction of the tiled area.
  double area = static_cast<double>(m) * static_cast<double>(n);
  double tiled = static_cast<double>(ceil_div(m, tm) * tm) * static_cast<double>(ceil_div(n, tn) * tn);
  return (static_cast<double>(tiles) / static_cast<double>(waves * p.sm_count)) * (area / tiled);
}

double gemm_k_efficiency(const ComputeParams& p, std::int64_t k) {
  double kk = static_cast<double>(std::max<std::int64_t>(k, 1));
  return kk / (kk + p.k_half);
}

double gemm_core_efficiency_from_point(const ComputeParams& p, double flops_per_s, double peak, std::int64_t m,
                                       std::int64_t n, std::int64_t k) {
  double shape = gemm_wave_efficiency(p, m, n) * gemm_k_efficiency(p, k);
  double e = flops_per_s / (peak * shape);
  return std::clamp(e, 1e-3, 1.0);
}

TimeNs model_gemm_time(const ComputeParams& p, std::int64_t m, std::int64_t n, std::int64_t k, Dtype dtype) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  double peak = p.peak_flops[static_cast<int>(dtype)];
  double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  double eff = p.gemm_core_eff * gemm_wave_efficiency(p, m, n) * gemm_k_efficiency(p, k);
  double compute_s = flops / (peak * eff);
  double bytes = static_cast<double>(dtype_bytes(dtype)) *
                 (static_cast<double>(m) * k + static_cast<double>(k) * n + static_cast<double>(m) * n);
  double memory_s = bytes / p.mem_bw;
  return seconds_to_ns(std::max(compute_s, memory_s)) + p.min_kernel_ns;
}

double attention_shape_factor(const ComputeParams& p, std::int64_t seq, std::int64_t head_dim) {
  auto f = [&](double s, double d) {
    return s / (s + p.attn_seq_half) * s / (s + p.attn_causal_half) * d / (d + p.attn_head_dim_half);
  };
  if (p.attn_ref_seq <= 0 || p.attn_ref_head_dim <= 0) return 1.0;
  return f(static_cast<double>(seq), static_cast<double>(head_dim)) / f(p.attn_ref_seq, p.attn_ref_head_dim);
}

TimeNs model_attention_time(const ComputeParams& p, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                            std::int64_t kv_heads, std::int64_t head_dim, Dtype dtype, bool backward) {
  if (batch <= 0 || seq <= 0 || heads <= 0 || head_dim <= 0) return 0;
  double peak = p.peak_flops[static_cast<int>(dtype)];
  double b = static_cast<double>(batch), s = static_cast<double>(seq), d = static_cast<double>(head_dim);
  double fwd_flops = 2.0 * b * s * s * static_cast<double>(heads) * d;   // causal: half of 4 b s^2 h d
  double flops = backward ? 2.5 * fwd_flops : fwd_flops;                // 5 vs 2 matmuls per tile (FA2 paper)
  double eff = std::min(1.0, (backward ? p.attn_bwd_eff : p.attn_fwd_eff) * attention_shape_factor(p, seq, head_dim));
  double qo = b * s * static_cast<double>(heads) * d, kv = b * s * static_cast<double>(std::max<std::int64_t>(kv_heads, 1)) * d;
  double bytes = static_cast<double>(dtype_bytes(dtype)) * (backward ? 2.0 * (2 * qo + 2 * kv) : (2 * qo + 2 * kv));
  double t = std::max(flops / (peak * eff), bytes / p.mem_bw);
  return seconds_to_ns(t) + p.min_kernel_ns;
}

TimeNs model_memory_bound_time(const ComputeParams& p, Bytes bytes_moved, MemoryClass cls) {
  if (bytes_moved <= 0) return 0;
  const double bw = p.class_bw[static_cast<int>(cls)] > 0 ? p.class_bw[static_cast<int>(cls)] : p.mem_bw;
  return seconds_to_ns(static_cast<double>(bytes_moved) / bw) + p.min_kernel_ns;
}

}  // namespace fsdpsim::calibrate
