// The simulator's front door: (model, hardware profile of a cluster, plan) -> SimResult.
#pragma once
#include <string>

#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "sim/executor.h"
#include "sim/plan.h"
#include "sim/sim_result.h"

namespace fsdpsim::sim {

struct SimOptions {
  bool record_trace = true;          // per-op spans (off in the planner's inner loop)
  bool record_memory_timeline = true;
  double memory_margin = 0.0;        // fits requires peak_total_device <= capacity * (1 - margin)
  // Without a trace, lower a few transformer blocks (and micro-batches) and stretch the program to the
  // model's and the plan's (sim/stretch.h).
  // Exact: every figure is the one the whole lowering gives (off: lower every block, for checks).
  bool stretch = true;
};

// What the last simulate() call on this thread did (tests and benchmarks check that the stretch acted).
struct SimulateStats {
  bool stretched = false;            // the program was stretched from a shorter model's
  int source_layers = 0;             // that model's layers
  int source_micro_batches = 0;      // and micro-batches
  int sources = 0;                   // shorter models lowered and tried (refused ones included)
  std::string refused;               // why the stretch was not used ("" when it was, or was not tried)
};
const SimulateStats& last_simulate_stats();

// The compiled program and op costs simulate() runs when it stretches (sim/stretch.h), for tests that
// compare them with the whole lowering's; false (with the reason) when simulate() would lower every block.
bool stretched_program(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                       CompiledProgram& program, OpCosts& costs, std::string* why = nullptr);

// Throws InputError if the plan is invalid for the cluster. Thread-safe (no shared mutable state).
SimResult simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                   const SimOptions& opts = {});

}  // namespace fsdpsim::sim
