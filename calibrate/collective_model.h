// Analytic collective model for the built-in fabrics (profiles/README.md "Collective model"):
//   t = latency + S * factor(op, n) / busbw(S)
// with S the nccl-tests size (the full buffer), factor = (n-1)/n for all-gather / reduce-scatter and
// 2(n-1)/n for all-reduce (nccl-tests doc/PERFORMANCE.md, fsdp-semantics.md N1), busbw(S) =
// peak / (1 + (S_half/S)^gamma) (the message-size ramp fitted on published nccl-tests sweeps), and the
// ring latency of NCCL's tuning model (N2). Across nodes the ring is bottlenecked by the NICs a node
// drives: peak = min(intra-node ring busbw, min(ranks per node, NICs per node) x per-NIC busbw) (N8).
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

  TimeNs time(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const;
  bool extrapolated(CollectiveOp op, Bytes bytes, int group_size, int nodes_spanned) const;
  // The peak bus bandwidth the model uses for this group (bytes/s), before the size ramp.
  double peak_busbw(CollectiveOp op, int group_size, int nodes_spanned) const;
};

// nccl-tests bus-bandwidth factor: busbw = algbw * factor (N1).
double busbw_factor(CollectiveOp op, int n);

}  // namespace fsdpsim::calibrate
