// When the CPU issued each GPU span of a trace. The simulator's trace records the CPU's issue of an op
// as a span on the "cpu" track (kind "cpu_issue", named like the op) that ends when the op is issued;
// the op itself is a span of the same name on its stream. The k-th issue of a name is paired with the
// k-th GPU span of that name in start order (exact for ops on one stream, which run in issue order;
// ops of one name on two streams are adjacent in the program, so a swap moves a time by one op).
// Allocations and frees happen at issue time (README "program semantics"), so the same pairing places
// memory samples on the GPU timeline (memory_align.h).
#pragma once
#include <vector>

#include "common/units.h"
#include "program/sim_result.h"

namespace fsdpsim::reports {

inline constexpr TimeNs kNoIssue = -1;

// Per span index: the CPU time at which that GPU span's op was issued, or kNoIssue (CPU spans, or a
// trace without issue spans).
std::vector<TimeNs> issue_times(const std::vector<sim::TraceSpan>& trace);

// The GPU stream that runs the model's compute: PyTorch's "default" stream, as the simulator names it
// (program/lower_fsdp*.cpp), or "compute".
bool is_compute_track(const std::string& track);
// A collective span: its op kind (the stream names differ between FSDP1 and FSDP2: "unshard",
// "post_backward" vs "all_gather", "reduce_scatter").
bool is_collective_kind(const std::string& kind);

}  // namespace fsdpsim::reports
