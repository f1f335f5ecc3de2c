// The reference engine (issue 22 stage 3): a plain reading of the execution semantics written at the top of
// program/step_program.h and sim/executor.cpp, op by op, with none of the executor's fast paths — no
// compiled program, no fast-forward over repeated periods, no memory fold, no
// stretch (it runs the program it is given) — and with the memory replayed after the timing, from the ops'
// issue and completion times. It exists to be compared with: the differential tests
// (tests/sim/test_reference_engine.cpp) run simulate() and execute() with every fast path on against it and
// expect the same nanoseconds and bytes. It is slow on purpose (a std::set of events, linear scans).
#pragma once
#include "program/sim_result.h"
#include "program/step_program.h"
#include <vector>

#include "memory/caching_allocator.h"
#include "sim/executor.h"

namespace fsdpsim::sim {

// The timing and memory figures of `program` run with `costs` (sized like its ops) under `opts`' memory
// options (memory_capacity, expandable_segments, max_split_size; the trace, the memory timeline, the
// fast-forward and the workspace are ignored): step_time_ns, compute_ns, comm_ns, exposed_comm_ns,
// cpu_blocked_ns, alloc_retries, and both steps' peak allocated and reserved (the steady step's in
// peak_*, the first's in first_step_peak_*) with the ops where they were reached. Other fields stay at
// their defaults. InputError for an ill-formed program, as execute().
SimResult reference_execute(const StepProgram& program, const OpCosts& costs, const ExecOptions& opts = {});

// What happens before the first step, call by call on `a` (StepProgram::init_flatten_world, init_scratch): the
// persistent buffers (block[id] = their blocks; first_step_lazy ones left alone), FSDP1's construction, the
// after_construction buffers (the batch, the rotary tables), FSDP1's empty_cache and peak reset, then the lazy init's
// requests. reference_execute's; the sim_segments tool's.
void allocate_before_first_step(const StepProgram& program, CachingAllocator& a, std::vector<int>& block);

}  // namespace fsdpsim::sim
