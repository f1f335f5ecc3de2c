// The simulator's front door: (model, hardware profile of a cluster, plan) -> SimResult.
#pragma once
#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "sim/plan.h"
#include "sim/sim_result.h"

namespace fsdpsim::sim {

struct SimOptions {
  bool record_trace = true;          // per-op spans (off in the planner's inner loop)
  bool record_memory_timeline = true;
  double memory_margin = 0.0;        // fits requires peak_total_device <= capacity * (1 - margin)
};

// Throws InputError if the plan is invalid for the cluster. Thread-safe (no shared mutable state).
SimResult simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                   const SimOptions& opts = {});

}  // namespace fsdpsim::sim
