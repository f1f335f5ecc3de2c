// The recommendation's choices, one at a time (note "choices that matter"): each knob of the
// recommended plan is changed alone - the sharding layout (FULL_SHARD over all GPUs vs HYBRID_SHARD,
// and DDP, whose FSDP spelling is NO_SHARD), prefetching, mixed precision, activation
// checkpointing, gradient sync while accumulating, CPU offload, the FSDP version - and the changed
// plan is simulated. A choice "matters" when changing it moves tokens/s by at least 1% or peak
// memory by at least 1 GiB, or changes whether the plan fits; those are explained with the simulated
// reason, the others are listed as making no difference. The DDP variant is the plan's DDP baseline.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "program/plan.h"
#include "program/sim_result.h"

namespace fsdpsim::planner {

struct Variation {
  std::string knob;            // "sharding", "backward_prefetch", "reduce_dtype", ...
  std::string change;          // "FULL_SHARD over all 16 GPUs", "backward_prefetch NONE", ...
  sim::Plan plan;
  bool simulated = false;
  sim::SimResult result;
  bool fits_with_margin = false;
  double tokens_gain = 0;      // result / recommendation - 1
  Bytes memory_delta = 0;      // result - recommendation (peak device memory)
  bool matters = false;
  std::string why;             // the simulated reason (difference_text, inter-node traffic)
  std::string error;           // the simulator refused the plan
};

using SimulateWithTrace = std::function<sim::SimResult(const sim::Plan&, bool trace)>;

// `rec_result` should carry its trace (the inter-node explanation reads the collectives' busy time).
std::vector<Variation> vary_plan(const sim::Plan& rec, const sim::SimResult& rec_result, const calibrate::Cluster& cl,
                                 double margin, const SimulateWithTrace& simulate);

// Lines for the explanations: the choices that matter, then one "no difference" line.
std::vector<std::string> variation_lines(const std::vector<Variation>& v, double margin);
// "DDP baseline (NO_SHARD is its FSDP spelling): ..." - when and why FSDP wins (or DDP does), or ""
// on one GPU.
std::string ddp_baseline_line(const std::vector<Variation>& v, const sim::Plan& rec, const sim::SimResult& rec_result,
                              double margin);

}  // namespace fsdpsim::planner
