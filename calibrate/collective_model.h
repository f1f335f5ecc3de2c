// Analytic collective model for the built-in fabrics (profiles/README.md "Collective model"):
//   t = latency + S * factor(op, n) / busbw(S)
// with S the nccl-tests size (the full buffer), factor = (n-1)/n for all-gather / reduce-scatter and
// 2(n-1)/n for all-reduce (nccl-tests doc/PERFORMANCE.md, fsdp-semantics.md N1), busbw(S) =
// peak / (1 + (S_half/S)^gamma) (the message-size ramp fitted on published nccl-tests sweeps), and the
// ring latency of NCCL's tuning model (N2). Across nodes the ring is bottlenecked by the NICs a node
// drives (N8), and a node's NICs are shared: every rank runs the same collective at the same time
// (SPMD), so a node with G GPUs and K NICs runs G/p groups of p ranks per node at once, and each gets
// p x min(1, K/G) NICs' worth (with rail-aligned NICs, K = G: one NIC per rank, N8; with one NIC per node
// the node's 8 replicate groups share it):
//   peak = min(intra-node ring busbw, p x min(1, K/G) x per-NIC busbw)      (p = ceil(n / nodes))
// For a group of whole nodes (p = G) this is min(p, K) NICs, as a ring over every GPU of the node uses.
// Not modelled: different collectives on the same NICs at the same time (a cross-node shard group's
// all-gather and reduce-scatter in backward, or the shard group's reduce-scatter beside the replicate
// group's all-reduce) each get the share above as if alone; PCIe switches shared by GPUs and NICs;
// NCCL's tree and NVLS-tree algorithms (ring only).
#pragma once
#include <cstdint>

#include "common/units.h"

namespace fsdpsim::calibrate {

enum class CollectiveOp;

struct RampParams {
  double half_size_bytes = 16.0 * 1024 * 1024;
  double exponent = 0.9;
  double min_bytes = 32768, max_bytes = 17179869184.0;   // the range the ramp was fitted on
};

struct LinkParams {
  double busbw[3] = {0, 0, 0};   // peak bus bandwidth (bytes/s) by CollectiveOp (AG, RS, AR); inter-node: per NIC in [0]
  double base_ns = 6600, step_ns = 600;
  RampParams ramp;
};

struct CollectiveModel {
  LinkParams intra;
  LinkParams inter;               // unused when has_inter is false
  bool has_inter = false;
  int nics_per_node = 0;
  int gpus_per_node = 0;          // ranks per node (the cluster's); 0 = unknown: no sharing among groups

  TimeNs time(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const;
  bool extrapolated(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const;
  // The peak bus bandwidth the model uses for this group (bytes/s), before the size ramp, with every
  // group of this shape running at once (SPMD).
  double peak_busbw(CollectiveOp op, int group_size, int nodes_spanned) const;
  // NICs' worth of bandwidth one such group gets: p x min(1, K/G) under SPMD, min(p, K) alone.
  double nic_share(int group_size, int nodes_spanned, bool alone = false) const;
  // How much longer the transfer of this group takes under SPMD than alone (>= 1): a measured sweep
  // (one group at a time, `fsdpsim calibrate`) is scaled by it.
  double sharing_slowdown(CollectiveOp op, int group_size, int nodes_spanned) const;
  // The ring latency of the model (N2), in ns.
  double latency_ns(CollectiveOp op, int group_size, int nodes_spanned) const;

 private:
  double peak(CollectiveOp op, int group_size, int nodes_spanned, bool alone) const;
};

// nccl-tests bus-bandwidth factor: busbw = algbw * factor (N1).
double busbw_factor(CollectiveOp op, int n);

}  // namespace fsdpsim::calibrate
