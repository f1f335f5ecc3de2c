#include "reports/timeline_decimate.h"

#include <algorithm>
#include <map>

#include "reports/span_issue.h"

namespace fsdpsim::reports {

namespace {

const std::vector<std::string>& known_tracks() {
  // The simulator's stream names (FSDP2: default, all_gather_copy_in, all_gather, reduce_scatter,
  // all_reduce; FSDP1: default, pre_unshard, unshard, post_backward, all_reduce), then the names other
  // traces use.
  static const std::vector<std::string> k = {"default",   "compute",  "all_gather_copy_in", "pre_unshard",
                                             "all_gather", "unshard",  "reduce_scatter",     "post_backward",
                                             "all_reduce", "copy_in",  "copy_out",           "h2d",
                                             "d2h",        "optimizer", "cpu"};
  return k;
}

using Interval = std::pair<TimeNs, TimeNs>;

// Sorted, merged union of intervals.
std::vector<Interval> merged(std::vector<Interval> iv) {
  std::sort(iv.begin(), iv.end());
  std::vector<Interval> out;
  for (const auto& x : iv) {
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

}  // namespace

bool is_collective_track(const std::string& t) {
  return t == "all_gather" || t == "reduce_scatter" || t == "all_reduce" || t == "unshard" || t == "post_backward";
}

std::vector<std::string> track_order(const std::vector<sim::TraceSpan>& trace) {
  std::vector<std::string> present;
  for (const auto& s : trace)
    if (std::find(present.begin(), present.end(), s.track) == present.end()) present.push_back(s.track);
  std::vector<std::string> out;
  for (const auto& k : known_tracks())
    if (std::find(present.begin(), present.end(), k) != present.end()) out.push_back(k);
  std::vector<std::string> rest;
  for (const auto& p : present)
    if (std::find(known_tracks().begin(), known_tracks().end(), p) == known_tracks().end()) rest.push_back(p);
  std::sort(rest.begin(), rest.end());
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

std::vector<TimelineRect> decimate_trace(const std::vector<sim::TraceSpan>& trace, const DecimateOptions& opt) {
  const double tiny = opt.min_px * opt.ns_per_px;
  const double max_w = opt.max_merge_px * opt.ns_per_px;
  std::map<std::string, std::vector<size_t>> by_track;
  for (size_t i = 0; i < trace.size(); ++i) by_track[trace[i].track].push_back(i);

  std::vector<TimelineRect> out;
  for (const auto& track : track_order(trace)) {
    std::vector<size_t>& ids = by_track[track];
    std::stable_sort(ids.begin(), ids.end(),
                     [&](size_t a, size_t b) { return trace[a].start_ns < trace[b].start_ns; });
    bool open = false, open_tiny = false;
    TimelineRect g;
    std::string last_name;
    auto emit = [&] {
      if (!open) return;
      if (g.count > 1) {
        g.name = std::to_string(g.count) + " spans merged: " + g.name + " .. " + last_name;
        g.unit = -1;
      }
      out.push_back(g);
      open = false;
    };
    for (size_t i : ids) {
      const sim::TraceSpan& s = trace[i];
      const TimeNs end = s.start_ns + s.dur_ns;
      const bool s_tiny = static_cast<double>(s.dur_ns) < tiny;
      const bool join = open && open_tiny && s_tiny && static_cast<double>(s.start_ns - g.end_ns) <= tiny &&
                        static_cast<double>(std::max(end, g.end_ns) - g.start_ns) <= max_w;
      if (join) {
        g.end_ns = std::max(g.end_ns, end);
        g.busy_ns += s.dur_ns;
        g.bytes += s.bytes;
        g.count += 1;
        if (g.kind != s.kind) g.kind = "mixed";
        last_name = s.name;
        continue;
      }
      emit();
      g = TimelineRect{track, s.start_ns, end, s.dur_ns, 1, s.name, s.kind, s.unit, s.bytes};
      last_name = s.name;
      open = true;
      open_tiny = s_tiny;
    }
    emit();
  }
  return out;
}

std::vector<std::pair<TimeNs, TimeNs>> exposed_comm_intervals(const std::vector<sim::TraceSpan>& trace) {
  // The simulator's definition (sim/executor.cpp "exposed_comm_ns"): before each compute-stream op X
  // the stream is idle on another stream's work during [ready(X), start(X)), ready(X) = max(end of the
  // previous compute op, X's issue time); exposed communication is the union of those gaps that a
  // collective is running in.
  std::vector<Interval> comm_iv, gaps;
  std::vector<size_t> compute;
  for (size_t i = 0; i < trace.size(); ++i) {
    const auto& s = trace[i];
    if (s.track != "cpu" && is_collective_kind(s.kind) && s.dur_ns > 0) comm_iv.emplace_back(s.start_ns, s.start_ns + s.dur_ns);
    if (is_compute_track(s.track)) compute.push_back(i);
  }
  std::vector<Interval> comm = merged(comm_iv);
  const std::vector<TimeNs> issued = issue_times(trace);
  std::stable_sort(compute.begin(), compute.end(), [&](size_t a, size_t b) { return trace[a].start_ns < trace[b].start_ns; });
  TimeNs prev_end = 0;
  for (size_t i : compute) {
    TimeNs ready = std::max(prev_end, issued[i] == kNoIssue ? TimeNs{0} : issued[i]);
    if (trace[i].start_ns > ready) gaps.emplace_back(ready, trace[i].start_ns);
    prev_end = std::max(prev_end, trace[i].start_ns + trace[i].dur_ns);
  }
  gaps = merged(gaps);
  std::vector<Interval> out;
  size_t j = 0;
  for (auto [a, b] : gaps) {
    while (j < comm.size() && comm[j].second <= a) ++j;
    for (size_t k = j; k < comm.size() && comm[k].first < b; ++k) {
      TimeNs lo = std::max(a, comm[k].first), hi = std::min(b, comm[k].second);
      if (hi > lo) out.emplace_back(lo, hi);
    }
  }
  return out;
}

}  // namespace fsdpsim::reports
