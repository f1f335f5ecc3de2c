#include "reports/timeline_decimate.h"

#include <algorithm>
#include <map>

namespace fsdpsim::reports {

namespace {

const std::vector<std::string>& known_tracks() {
  static const std::vector<std::string> k = {"compute",  "all_gather", "reduce_scatter", "all_reduce",
                                             "copy_in",  "copy_out",   "h2d",            "d2h",
                                             "optimizer", "cpu"};
  return k;
}

using Interval = std::pair<TimeNs, TimeNs>;

// Union of [start, start+dur) over spans of the given tracks, sorted and merged.
std::vector<Interval> busy_union(const std::vector<sim::TraceSpan>& trace, bool (*pick)(const std::string&)) {
  std::vector<Interval> iv;
  for (const auto& s : trace)
    if (pick(s.track) && s.dur_ns > 0) iv.emplace_back(s.start_ns, s.start_ns + s.dur_ns);
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

bool is_compute(const std::string& t) { return t == "compute"; }

}  // namespace

bool is_collective_track(const std::string& t) {
  return t == "all_gather" || t == "reduce_scatter" || t == "all_reduce";
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
  std::vector<Interval> comm = busy_union(trace, is_collective_track);
  std::vector<Interval> comp = busy_union(trace, is_compute);
  std::vector<Interval> out;
  size_t j = 0;
  for (auto [a, b] : comm) {
    // Subtract every compute interval overlapping [a, b).
    while (j < comp.size() && comp[j].second <= a) ++j;
    TimeNs cur = a;
    for (size_t k = j; k < comp.size() && comp[k].first < b; ++k) {
      if (comp[k].first > cur) out.emplace_back(cur, comp[k].first);
      cur = std::max(cur, comp[k].second);
    }
    if (cur < b) out.emplace_back(cur, b);
  }
  return out;
}

}  // namespace fsdpsim::reports
