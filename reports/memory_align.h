// The memory timeline on the GPU's clock. The simulator samples the caching allocator when the CPU
// allocates or frees (README "program semantics": at issue time), and the CPU runs ahead of the GPU:
// in a communication-bound step it issues everything in the first second of a minute-long step, so
// a chart on the CPU's clock squeezes the whole step into its first pixels. Here every sample moves to
// the GPU start of the op whose issue made it (span_issue.h), so memory lines up with the stream
// timeline and spans the whole step. The values (and so the peaks) are the simulator's, unchanged;
// only their times move. A sample with no matching GPU op (a CPU op, a trace without issue spans)
// keeps its time.
#pragma once
#include <vector>

#include "program/sim_result.h"

namespace fsdpsim::reports {

std::vector<sim::MemorySample> gpu_aligned_memory(const std::vector<sim::TraceSpan>& trace,
                                                  const std::vector<sim::MemorySample>& timeline);

// The samples of the steady-state step (the step the headline peaks describe), on that step's own clock:
// a timeline of a first and a steady step (SimResult::memory_timeline_steps "first_and_steady") has the
// steady step from steady_start_ns on. With steady_start_ns 0 (a first step only) the timeline as is.
std::vector<sim::MemorySample> steady_step_samples(const std::vector<sim::MemorySample>& timeline, TimeNs steady_start_ns);

}  // namespace fsdpsim::reports
