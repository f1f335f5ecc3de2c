// The simulator's front door: (model, hardware profile of a cluster, plan) -> SimResult.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "sim/executor.h"
#include "program/lowering.h"
#include "program/plan.h"
#include "program/sim_result.h"

namespace fsdpsim::sim {

// The cluster and device a profile describes, as the lowering takes them (world, GPUs per node, the cuBLAS
// workspace, the SM count): what simulate() lowers with.
Topology topology_of(const calibrate::HardwareProfile& hw);

struct SimOptions {
  bool record_trace = true;          // per-op spans (off in the planner's inner loop)
  bool record_memory_timeline = true;
  double memory_margin = 0.0;        // fits requires peak_total_device <= capacity * (1 - margin)
  // Without a trace, lower a few transformer blocks (and micro-batches) and stretch the program to the
  // model's and the plan's (sim/stretch.h).
  // Exact: every figure is the one the whole lowering gives (off: lower every block, for checks).
  bool stretch = true;
};

// The simulator with its working storage: the wrap graphs and kernel lists of recent (model, plan
// shape) pairs, the lowering's recycled ops, the stretch's and the engine's arrays (sim/workspace.h).
// Reusing one across calls makes every call after the first allocate little; results are identical
// to a fresh Simulator's. Not thread-safe: give each thread its own (the planner does).
class Simulator {
 public:
  Simulator();
  ~Simulator();
  Simulator(Simulator&&) noexcept;
  Simulator& operator=(Simulator&&) noexcept;
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  // Throws InputError if the plan is invalid for the cluster. r.simulate_stats says how it ran.
  SimResult simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                     const SimOptions& opts = {});
  // The compiled program and op costs simulate() runs when it stretches (sim/stretch.h), for tests that
  // compare them with the whole lowering's; false (with the reason) when simulate() would lower every block.
  // *stats (if given) says how it was stretched, as SimResult::simulate_stats would.
  bool stretched_program(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                         CompiledProgram& program, OpCosts& costs, std::string* why = nullptr,
                         SimulateStats* stats = nullptr);

 private:
  struct Scratch;
  std::unique_ptr<Scratch> s_;
};

// Simulators shared by the threads of a search: simulate() borrows an idle one (or makes one) for the
// call, so each thread's calls reuse storage without any per-thread state. Thread-safe.
class SimulatorPool {
 public:
  SimResult simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                     const SimOptions& opts = {});

 private:
  std::mutex m_;
  std::vector<std::unique_ptr<Simulator>> idle_;
};

// Simulator::stretched_program on a fresh Simulator.
bool stretched_program(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                       CompiledProgram& program, OpCosts& costs, std::string* why = nullptr,
                       SimulateStats* stats = nullptr);

// Simulator::simulate on a fresh Simulator: for one-off calls (a caller simulating many plans keeps a
// Simulator). Throws InputError if the plan is invalid for the cluster. Thread-safe (no shared mutable state).
SimResult simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const Plan& plan,
                   const SimOptions& opts = {});

}  // namespace fsdpsim::sim
