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

double CollectiveModel::nic_share(int group_size, int nodes_spanned, bool alone) const {
  const int k = std::max(nodes_spanned, 1);
  const int p = (group_size + k - 1) / k;   // ranks of the group per node
  const int K = std::max(nics_per_node, 1);
  if (alone) return std::min(p, K);
  // SPMD: the node's G GPUs run G/p groups of this shape at once on its K NICs (see the header).
  const int G = std::max(gpus_per_node, p);
  return static_cast<double>(p) * std::min(1.0, static_cast<double>(K) / static_cast<double>(G));
}

double CollectiveModel::peak(CollectiveOp op, int group_size, int nodes_spanned, bool alone) const {
  int k = std::max(nodes_spanned, 1);
  if (k == 1 || !has_inter) return intra.busbw[static_cast<int>(op)];
  // Across nodes NCCL runs rings through every GPU; NVLS (the single-node all-reduce) does not
  // apply, so the intra-node leg runs at the ring (all-gather) busbw. Within a node NVSwitch gives
  // every GPU its own links: the node's concurrent groups do not share the intra-node leg.
  int per_node = (group_size + k - 1) / k;
  double intra_ring = per_node > 1 ? intra.busbw[static_cast<int>(CollectiveOp::AllGather)] : 1e300;
  return std::min(intra_ring, nic_share(group_size, k, alone) * inter.busbw[0]);
}

double CollectiveModel::peak_busbw(CollectiveOp op, int group_size, int nodes_spanned) const {
  return peak(op, group_size, nodes_spanned, false);
}

double CollectiveModel::sharing_slowdown(CollectiveOp op, int group_size, int nodes_spanned) const {
  if (nodes_spanned <= 1 || !has_inter || group_size <= 1) return 1.0;
  return peak(op, group_size, nodes_spanned, true) / peak(op, group_size, nodes_spanned, false);
}

double CollectiveModel::latency_ns(CollectiveOp op, int group_size, int nodes_spanned) const {
  int n = group_size, k = std::max(1, std::min(nodes_spanned, n));
  bool net = k > 1 && has_inter;
  // Ring steps (N2): AG/RS n-1, AR 2(n-1); the inter-node ones: k-1 (AG/RS), 2(k-1) (AR).
  int steps = op == CollectiveOp::AllReduce ? 2 * (n - 1) : n - 1;
  int inter_steps = net ? (op == CollectiveOp::AllReduce ? 2 * (k - 1) : k - 1) : 0;
  return intra.base_ns + (steps - inter_steps) * intra.step_ns + inter_steps * (net ? inter.step_ns : 0.0);
}

TimeNs CollectiveModel::time(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const {
  if (group_size <= 1 || bytes <= 0) return 0;
  int n = group_size, k = std::max(1, std::min(nodes_spanned, n));
  bool net = k > 1 && has_inter;
  const RampParams& r = net ? inter.ramp : intra.ramp;
  double s = static_cast<double>(bytes);
  double bw = peak_busbw(op, n, k) * ramp(r, s);
  double transfer_ns = s * busbw_factor(op, n) / bw * 1e9;
  return static_cast<TimeNs>(std::llround(latency_ns(op, n, k) + transfer_ns));
}

bool CollectiveModel::extrapolated(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const {
  bool net = nodes_spanned > 1 && has_inter;
  const RampParams& r = net ? inter.ramp : intra.ramp;
  double s = static_cast<double>(bytes);
  return s < r.min_bytes || s > r.max_bytes;
}

}  // namespace fsdpsim::calibrate
