// The discrete-event executor: runs a StepProgram against a cost model and replays the caching
// allocator. Deterministic: events ordered by (time, sequence).
#pragma once
#include "sim/workspace.h"
#include <utility>
#include <vector>

#include "calibrate/launch_queue.h"
#include "common/units.h"
#include "sim/compiled_program.h"
#include "program/program_check.h"
#include "program/step_program.h"
#include "program/sim_result.h"

namespace fsdpsim::sim {

// What the executor needs to time ops. sim/profile_cost_model.h adapts a HardwareProfile;
// tests use fixed costs to check exact nanoseconds.
class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual TimeNs op_time(const Op& op) const = 0;         // GPU duration of the op, alone
  virtual TimeNs cpu_issue_time(const Op& op) const = 0;  // CPU time to issue it (hooks + launches)
  virtual double overlap_slowdown() const = 0;            // compute multiplier while a collective runs
  // Kernels one stream's launch queue holds before the CPU blocks on a launch (sim/executor.cpp "Launch
  // queue"); 0 = unbounded. The default is an assumption (calibrate/launch_queue.h).
  virtual int launch_queue_depth() const { return calibrate::kDefaultLaunchQueueDepth; }
};

// What the fast-forward (ExecOptions::fast_forward) did in one execute().
struct ExecStats {
  int jumps = 0;                 // times the engine skipped ahead
  int ops_fast_forwarded = 0;    // ops whose start and completion were not simulated one by one
  int jumps_while_issuing = 0;   // jumps made while the CPU was still issuing (sim/executor.cpp)
  int memory_jumps = 0;          // times the memory replay skipped repeated periods (sim/memory_fold.cpp)
  int memory_periods_skipped = 0;
  // With memory replayed with the issues (record_stream): jumps that moved the memory too, and the
  // steady step's skips of the same periods (sim/memory_shift.cpp).
  int memory_shift_jumps = 0;
  int steady_periods_shifted = 0;
};

struct ExecOptions {
  bool record_trace = true;
  bool record_memory_timeline = true;
  // Bytes the caching allocator may cudaMalloc (GPU memory minus the CUDA/NCCL context); beyond it
  // the allocator releases its cache and retries (SimResult::alloc_retries). 0 = unlimited.
  Bytes memory_capacity = 0;
  // PYTORCH_CUDA_ALLOC_CONF (memory/caching_allocator.h): expandable_segments, and max_split_size_mb in
  // bytes (0: PyTorch's default, no limit).
  bool expandable_segments = false;
  Bytes max_split_size = 0;
  // The memory timeline is decimated to at most this many samples (the peaks are kept). 0 = all.
  int max_timeline_samples = 4096;
  // Skip repeated blocks of the timing once they are proven periodic (see "Fast-forward" at the top of
  // sim/executor.cpp), and of the memory replay (sim/memory_fold.cpp). Exact: every result is identical
  // with it off; only runs without a trace use it.
  bool fast_forward = true;
  // If set, receives what the fast-forward did (tests check that it acted).
  ExecStats* stats = nullptr;
  // Storage reused from one call to the next (sim/workspace.h); null: this call allocates its own.
  Workspace* workspace = nullptr;
};

// Every op's durations, computed once from a cost model (the executor's hot path never calls the
// cost model). gpu_ns[i] is op i's duration alone on the GPU (for CpuOptimizerStep: on the CPU),
// cpu_ns[i] its CPU issue cost.
struct OpCosts {
  std::vector<TimeNs> gpu_ns;
  std::vector<TimeNs> cpu_ns;
  double overlap_slowdown = 1.0;
  int launch_queue_depth = calibrate::kDefaultLaunchQueueDepth;   // (CostModel::launch_queue_depth; 0 = unbounded)
};
// InputError if the cost model returns a negative time, a slowdown < 1 (or not finite) or a negative
// launch queue depth.
OpCosts compute_op_costs(const StepProgram& program, const CostModel& cost);
// The CPU's issue time over all the ops (SimResult::cpu_issue_ns).
inline TimeNs cpu_issue_total(const OpCosts& costs) {
  TimeNs t = 0;
  for (TimeNs c : costs.cpu_ns) t += c;
  return t;
}
// The same into `costs`, keeping its vectors' storage.
void fill_op_costs(const StepProgram& program, const CostModel& cost, OpCosts& costs);

// Fills the memory (allocated/reserved/breakdown), timing (step, compute, comm, exposed) and trace
// fields of SimResult; capacity/fits/MFU are filled by simulate(). Memory is replayed for two steps on
// one allocator (note "first and steady step", sim/memory_tracker.h): the first, then a steady-state
// step whose ops are issued and complete as the first's, shifted by the step time (the timing is the
// same for both steps and simulated once). peak_* are the steady step's, first_step_peak_* the first's;
// the peaks' PeakLocation::op is set, and described when the StepProgram is at hand (execute(program,
// ...); execute_compiled leaves the rest to the caller).
// Throws InputError naming the field (e.g. "program.ops[7].waits") for an ill-formed program: ids out
// of range, a wait on a later op, a buffer allocated twice or freed while not allocated.
SimResult execute(const StepProgram& program, const CostModel& cost, const ExecOptions& opts = {});

// intersect_length (exposed communication), which the runtimes measure the same way: program/sim_result.h.
// The same with precomputed costs (costs.gpu_ns/cpu_ns sized like program.ops).
SimResult execute(const StepProgram& program, const OpCosts& costs, const ExecOptions& opts = {});
// The ill-formed-program checks of execute() alone: validate_program, program/program_check.h.

// The engine's form of `program` (sim/compiled_program.h), after validate_program's checks (the same
// InputErrors); `out` keeps its storage. execute(program, ...) is compile_program + execute_compiled.
void compile_program(const StepProgram& program, CompiledProgram& out);
// Runs a compiled program (its records' run state is overwritten: compile once, run many times). No
// trace (there are no op names): opts.record_trace must be false. costs sized like its ops.
SimResult execute_compiled(CompiledProgram& program, const OpCosts& costs, const ExecOptions& opts);

}  // namespace fsdpsim::sim
