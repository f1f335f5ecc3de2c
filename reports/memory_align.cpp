// Memory samples on the GPU clock (memory_align.h).
#include "reports/memory_align.h"

#include <algorithm>
#include <map>

#include "reports/span_issue.h"

namespace fsdpsim::reports {

std::vector<sim::MemorySample> gpu_aligned_memory(const std::vector<sim::TraceSpan>& trace,
                                                  const std::vector<sim::MemorySample>& timeline) {
  // Issue time -> the GPU start of the op issued then (the CPU issues one op at a time, so issue times
  // are distinct; a later GPU start wins on a tie, which cannot happen in a simulated trace).
  const std::vector<TimeNs> issued = issue_times(trace);
  std::map<TimeNs, TimeNs> gpu_start_at_issue;
  for (size_t i = 0; i < trace.size(); ++i)
    if (issued[i] != kNoIssue) {
      TimeNs& t = gpu_start_at_issue[issued[i]];
      t = std::max(t, trace[i].start_ns);
    }
  std::vector<sim::MemorySample> out = timeline;
  if (gpu_start_at_issue.empty()) return out;
  for (auto& s : out) {
    auto it = gpu_start_at_issue.find(s.t_ns);
    if (it != gpu_start_at_issue.end()) s.t_ns = it->second;
  }
  // A sample can only move later (an op starts after it is issued); later samples of ops that start
  // earlier keep their place in time order.
  std::stable_sort(out.begin(), out.end(), [](const sim::MemorySample& a, const sim::MemorySample& b) { return a.t_ns < b.t_ns; });
  return out;
}

std::vector<sim::MemorySample> steady_step_samples(const std::vector<sim::MemorySample>& timeline, TimeNs steady_start_ns) {
  if (steady_start_ns <= 0) return timeline;
  std::vector<sim::MemorySample> out;
  for (const auto& m : timeline)
    if (m.t_ns >= steady_start_ns) {
      out.push_back(m);
      out.back().t_ns -= steady_start_ns;
    }
  return out;
}

}  // namespace fsdpsim::reports
