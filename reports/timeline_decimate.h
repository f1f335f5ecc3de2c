// Decimating a trace for the report's per-stream timeline (issue #6: the HTML stays < ~2 MB for
// thousands of spans). The rule is exact so the browser test can count rects:
//   per track, spans sorted by (start_ns, input order); with px = ns_per_px,
//   a span is "tiny" when dur_ns < min_px * px;
//   a tiny span joins the open group when the group holds only tiny spans, the gap from the group's
//   end to the span's start is <= min_px * px, and the group would span <= max_merge_px * px;
//   otherwise the group is emitted as one rect and the span opens a new group.
// So every span wider than a pixel is drawn as itself, sum(count) over rects == number of spans, and a
// merged rect is at most max_merge_px wide. The page says how many spans were merged.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "common/units.h"
#include "program/sim_result.h"

namespace fsdpsim::reports {

struct TimelineRect {
  std::string track;
  TimeNs start_ns = 0;
  TimeNs end_ns = 0;       // max end of the members
  TimeNs busy_ns = 0;      // sum of member durations
  int count = 0;           // spans drawn by this rect (1 = an original span)
  std::string name;        // the span's name, or "N spans: first .. last" when merged
  std::string kind;        // the members' kind, or "mixed"
  int unit = -1;           // the span's FSDP unit (-1 when merged or none)
  Bytes bytes = 0;         // sum of member bytes
};

struct DecimateOptions {
  double ns_per_px = 1.0;
  double min_px = 1.0;        // narrower than this (in pixels) is tiny
  double max_merge_px = 4.0;  // a merged rect never exceeds this width
};

// Tracks in display order: compute, all_gather, reduce_scatter, all_reduce, copy/H2D/D2H streams,
// cpu, then any other track by name.
std::vector<std::string> track_order(const std::vector<sim::TraceSpan>& trace);

// The decimated rects of every track, tracks in track_order(), rects by start within a track.
std::vector<TimelineRect> decimate_trace(const std::vector<sim::TraceSpan>& trace, const DecimateOptions& opt);

// Exposed communication as the simulator defines it (sim/executor.cpp): the compute stream idle before
// an op that was issued and whose predecessor finished, while a collective (by span kind) runs.
// Issue times come from the trace's cpu_issue spans (span_issue.h). Sorted, disjoint, [start, end).
std::vector<std::pair<TimeNs, TimeNs>> exposed_comm_intervals(const std::vector<sim::TraceSpan>& trace);

bool is_collective_track(const std::string& track);

}  // namespace fsdpsim::reports
