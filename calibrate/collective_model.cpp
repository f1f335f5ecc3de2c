#include "calibrate/collective_model.h"

#include <algorithm>
#include <cmath>

#include "calibrate/hardware_profile.h"

namespace fsdpsim::calibrate {
namespace {

inline double ramp(const RampParams& r, double s) {
  return 1.0 / (1.0 + std::pow(r.half_size_bytes / s, r.exponent));
}

}  // namespace

double busbw_factor(CollectiveOp op, int n) {
  if (n <= 1) return 0.0;
  double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return op == CollectiveOp::AllReduce ? 2.0 * f : f;
}

double CollectiveModel::peak_busbw(CollectiveOp op, int group_size, int nodes_spanned) const {
  int k = std::max(nodes_spanned, 1);
  if (k == 1 || !has_inter) return intra.busbw[static_cast<int>(op)];
  // Across nodes NCCL runs rings through every GPU; NVLS (the single-node all-reduce) does not
  // apply, so the intra-node leg runs at the ring (all-gather) busbw.
  int per_node = (group_size + k - 1) / k;
  double intra_ring = per_node > 1 ? intra.busbw[static_cast<int>(CollectiveOp::AllGather)] : 1e300;
  int nics = std::max(1, std::min(per_node, nics_per_node));
  return std::min(intra_ring, nics * inter.busbw[0]);
}

TimeNs CollectiveModel::time(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const {
  if (group_size <= 1 || bytes <= 0) return 0;
  int n = group_size, k = std::max(1, std::min(nodes_spanned, n));
  bool net = k > 1 && has_inter;
  // Ring steps (N2): AG/RS n-1, AR 2(n-1); the inter-node ones: k-1 (AG/RS), 2(k-1) (AR).
  int steps = op == CollectiveOp::AllReduce ? 2 * (n - 1) : n - 1;
  int inter_steps = net ? (op == CollectiveOp::AllReduce ? 2 * (k - 1) : k - 1) : 0;
  double lat = intra.base_ns + (steps - inter_steps) * intra.step_ns + inter_steps * (net ? inter.step_ns : 0.0);
  const RampParams& r = net ? inter.ramp : intra.ramp;
  double s = static_cast<double>(bytes);
  double bw = peak_busbw(op, n, k) * ramp(r, s);
  double transfer_ns = s * busbw_factor(op, n) / bw * 1e9;
  return static_cast<TimeNs>(std::llround(lat + transfer_ns));
}

bool CollectiveModel::extrapolated(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const {
  bool net = nodes_spanned > 1 && has_inter;
  const RampParams& r = net ? inter.ramp : intra.ramp;
  double s = static_cast<double>(bytes);
  return s < r.min_bytes || s > r.max_bytes;
}

}  // namespace fsdpsim::calibrate
