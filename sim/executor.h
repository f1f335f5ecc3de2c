// The discrete-event executor: runs a StepProgram against a cost model and replays the caching
// allocator. Deterministic: events ordered by (time, sequence).
#pragma once
#include "common/units.h"
#include "sim/step_program.h"
#include "sim/sim_result.h"

namespace fsdpsim::sim {

// What the executor needs to time ops. sim/profile_cost_model.h adapts a HardwareProfile;
// tests use fixed costs to check exact nanoseconds.
class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual TimeNs op_time(const Op& op) const = 0;         // GPU duration of the op, alone
  virtual TimeNs cpu_issue_time(const Op& op) const = 0;  // CPU time to issue it (hooks + launches)
  virtual double overlap_slowdown() const = 0;            // compute multiplier while a collective runs
};

struct ExecOptions {
  bool record_trace = true;
  bool record_memory_timeline = true;
};

// Fills the memory (allocated/reserved/breakdown), timing (step, compute, comm, exposed) and trace
// fields of SimResult; capacity/fits/MFU are filled by simulate().
SimResult execute(const StepProgram& program, const CostModel& cost, const ExecOptions& opts = {});

}  // namespace fsdpsim::sim
