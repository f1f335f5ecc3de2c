// Issue times of GPU spans (span_issue.h).
#include "reports/span_issue.h"

#include <algorithm>
#include <map>

namespace fsdpsim::reports {

bool is_compute_track(const std::string& t) { return t == "default" || t == "compute"; }

bool is_collective_kind(const std::string& k) { return k == "all_gather" || k == "reduce_scatter" || k == "all_reduce"; }

std::vector<TimeNs> issue_times(const std::vector<sim::TraceSpan>& trace) {
  std::vector<TimeNs> out(trace.size(), kNoIssue);
  std::map<std::string, std::vector<size_t>> issues, gpu;
  for (size_t i = 0; i < trace.size(); ++i) {
    const auto& s = trace[i];
    if (s.track == "cpu") {
      if (s.kind == "cpu_issue") issues[s.name].push_back(i);
    } else {
      gpu[s.name].push_back(i);
    }
  }
  auto by_start = [&](size_t a, size_t b) {
    return trace[a].start_ns != trace[b].start_ns ? trace[a].start_ns < trace[b].start_ns : a < b;
  };
  for (auto& [name, is] : issues) {
    auto it = gpu.find(name);
    if (it == gpu.end()) continue;
    std::vector<size_t>& gs = it->second;
    std::sort(is.begin(), is.end(), by_start);
    std::sort(gs.begin(), gs.end(), by_start);
    for (size_t k = 0; k < is.size() && k < gs.size(); ++k) out[gs[k]] = trace[is[k]].start_ns + trace[is[k]].dur_ns;
  }
  return out;
}

}  // namespace fsdpsim::reports
