// A CostModel with fixed, hand-chosen durations, for exact-nanosecond tests of the executor and of
// lowered programs (style.md lesson 10: astra-sim's exact-ns tests on tiny cases). Every duration is
// a sum of terms the test sets explicitly, so the expected step time can be derived by hand.
//
//   GPU time of an op     = per-kind base + per-byte / per-FLOP terms (below), or by_op[id] if set; 0 for
//                           a compute op with an empty shared kernel list (it runs no kernel)
//   CPU issue time of op  = cpu_issue_ns + cpu_hooks * cpu_hook_ns + kernel_launches * cpu_launch_ns
//   overlap slowdown      = slowdown (compute multiplier while any collective runs)
//   launch queue depth    = launch_queue_depth (kernels per stream before a launch blocks the CPU)
//
// Usage:
//   FixedCosts c;  c.forward_ns = 100;  c.all_gather_ns = 50;  c.cpu_issue_ns = 10;
//   FixedCostModel cost(c);  SimResult r = execute(program, cost);
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "models/kernels.h"
#include "sim/executor.h"

namespace fsdpsim::sim::testing {

struct FixedCosts {
  // ---- compute ops (Forward, Backward, Recompute): base + FLOPs of their kernels * ns_per_flop ----
  TimeNs forward_ns = 0;
  TimeNs backward_ns = 0;
  TimeNs recompute_ns = 0;
  double ns_per_flop = 0;          // 0: ignore the kernels' FLOPs
  // ---- collectives: base + comm_bytes * comm_ns_per_byte ----
  TimeNs all_gather_ns = 0;
  TimeNs reduce_scatter_ns = 0;
  TimeNs all_reduce_ns = 0;
  double comm_ns_per_byte = 0;
  // ---- memory-bound kernels (CopyIn, CopyOut, Cast, Pad, Divide) and the GPU optimizer step:
  //      base + copy_bytes * copy_ns_per_byte ----
  TimeNs copy_ns = 0;
  TimeNs optimizer_ns = 0;
  double copy_ns_per_byte = 0;
  // ---- host copies and the CPU optimizer: base + copy_bytes * host_ns_per_byte ----
  TimeNs h2d_ns = 0;
  TimeNs d2h_ns = 0;
  double host_ns_per_byte = 0;
  TimeNs cpu_optimizer_ns = 0;     // CpuOptimizerStep (on the CPU timeline)
  // ---- CPU issue ----
  TimeNs cpu_issue_ns = 0;         // per op
  TimeNs cpu_hook_ns = 0;          // per Op::cpu_hooks
  TimeNs cpu_launch_ns = 0;        // per Op::kernel_launches
  double slowdown = 1.0;
  int launch_queue_depth = calibrate::kDefaultLaunchQueueDepth;   // 0 = unbounded
  // Per-op overrides of the GPU time, indexed by op id (-1 or out of range = use the rules above).
  std::vector<TimeNs> by_op;
};

class FixedCostModel : public CostModel {
 public:
  explicit FixedCostModel(FixedCosts c = {}) : c_(std::move(c)) {}
  const FixedCosts& costs() const { return c_; }

  TimeNs op_time(const Op& op) const override {
    if (op.id >= 0 && op.id < static_cast<int>(c_.by_op.size()) && c_.by_op[op.id] >= 0) return c_.by_op[op.id];
    // A compute op that runs no kernels (the loss's memory-only ops, program/lower_walk.cpp) takes no time.
    if (op.shared_kernels && op.shared_kernels->empty()) return 0;
    switch (op.kind) {
      case OpKind::Forward: return c_.forward_ns + flops_term(op);
      case OpKind::Backward: return c_.backward_ns + flops_term(op);
      case OpKind::Recompute: return c_.recompute_ns + flops_term(op);
      case OpKind::AllGather: return c_.all_gather_ns + per_byte(op.comm_bytes, c_.comm_ns_per_byte);
      case OpKind::ReduceScatter: return c_.reduce_scatter_ns + per_byte(op.comm_bytes, c_.comm_ns_per_byte);
      case OpKind::AllReduce: return c_.all_reduce_ns + per_byte(op.comm_bytes, c_.comm_ns_per_byte);
      case OpKind::CopyIn:
      case OpKind::CopyOut:
      case OpKind::Cast:
      case OpKind::Pad:
      case OpKind::Divide: return c_.copy_ns + per_byte(op.copy_bytes, c_.copy_ns_per_byte);
      case OpKind::OptimizerStep: return c_.optimizer_ns + per_byte(op.copy_bytes, c_.copy_ns_per_byte);
      case OpKind::H2D: return c_.h2d_ns + per_byte(op.copy_bytes, c_.host_ns_per_byte);
      case OpKind::D2H: return c_.d2h_ns + per_byte(op.copy_bytes, c_.host_ns_per_byte);
      case OpKind::CpuOptimizerStep: return c_.cpu_optimizer_ns;
    }
    return 0;
  }
  TimeNs cpu_issue_time(const Op& op) const override {
    return c_.cpu_issue_ns + op.cpu_hooks * c_.cpu_hook_ns + op.kernel_launches * c_.cpu_launch_ns;
  }
  double overlap_slowdown() const override { return c_.slowdown; }
  int launch_queue_depth() const override { return c_.launch_queue_depth; }

 private:
  static TimeNs per_byte(Bytes b, double ns_per_byte) {
    return static_cast<TimeNs>(std::llround(static_cast<double>(b) * ns_per_byte));
  }
  TimeNs flops_term(const Op& op) const {
    if (c_.ns_per_flop == 0) return 0;
    double f = 0;
    for (const auto& k : op.kernel_list()) f += k.flops;
    return static_cast<TimeNs>(std::llround(f * c_.ns_per_flop));
  }
  FixedCosts c_;
};

}  // namespace fsdpsim::sim::testing
