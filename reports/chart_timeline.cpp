#include <algorithm>
#include <cmath>

#include "reports/charts.h"
#include "reports/format.h"
#include "reports/html_escape.h"
#include "reports/span_issue.h"
#include "reports/svg.h"

namespace fsdpsim::reports {

namespace {

std::string span_tooltip(const TimelineRect& r) {
  std::string t = r.name;
  if (!r.kind.empty()) t += "\n" + r.kind;
  if (r.unit >= 0) t += ", unit " + std::to_string(r.unit);
  t += "\n" + fmt_fixed(static_cast<double>(r.start_ns) * 1e-6, 3) + " - " +
       fmt_fixed(static_cast<double>(r.end_ns) * 1e-6, 3) + " ms (" +
       fmt_seconds(static_cast<double>(r.count > 1 ? r.busy_ns : r.end_ns - r.start_ns) * 1e-9) +
       (r.count > 1 ? " busy" : "") + ")";
  if (r.bytes > 0) t += "\n" + fmt_bytes_auto(static_cast<double>(r.bytes));
  return t;
}

}  // namespace

StreamTimelineChart stream_timeline_chart(const DetailView& d, const std::string& id) {
  const double W = kChartWidth, label_w = 150, mr = 20, mt = 10, row_h = 22, row_gap = 8, axis_h = 40;
  const double x0 = label_w, x1 = W - mr;
  StreamTimelineChart out;
  const auto& trace = d.trace;
  out.spans = static_cast<int>(trace.size());
  TimeNs t_begin = trace.empty() ? 0 : trace.front().start_ns, t_end = 0;
  for (const auto& s : trace) {
    t_begin = std::min(t_begin, s.start_ns);
    t_end = std::max(t_end, s.start_ns + s.dur_ns);
  }
  t_begin = std::min<TimeNs>(t_begin, 0);
  t_end = std::max<TimeNs>({t_end, static_cast<TimeNs>(std::llround(d.result.step_time_s * 1e9)), 1});
  const double ns_per_px = static_cast<double>(t_end - t_begin) / (x1 - x0);

  const std::vector<std::string> tracks = track_order(trace);
  const auto exposed = exposed_comm_intervals(trace);
  const int rows = static_cast<int>(tracks.size()) + 1;  // + the exposed-communication row
  const double H = mt + rows * (row_h + row_gap) + axis_h;
  LinearScale sx{static_cast<double>(t_begin), static_cast<double>(t_end), x0, x1};
  Svg svg(W, H, id, "Per-stream timeline of one training step");

  // Axis and grid first, so spans paint over the grid lines.
  const double plot_bottom = mt + rows * (row_h + row_gap) - row_gap / 2;
  svg.open_group("grid");
  // Milliseconds, or seconds for steps longer than 10 s.
  const double unit_ns = t_end > 10'000'000'000 ? 1e9 : 1e6;
  for (double t : nice_ticks(static_cast<double>(t_begin) / unit_ns, static_cast<double>(t_end) / unit_ns, 10)) {
    double x = sx(t * unit_ns);
    svg.line(x, mt, x, plot_bottom, "gridline");
    svg.text(x, plot_bottom + 16, fmt_fixed(t, t == std::floor(t) ? 0 : 1), "tick", "middle");
  }
  svg.text((x0 + x1) / 2, H - 6, unit_ns == 1e9 ? "time in the step (s)" : "time in the step (ms)", "axis-label", "middle");
  svg.close_group();

  DecimateOptions opt;
  opt.ns_per_px = ns_per_px;
  const std::vector<TimelineRect> rects = decimate_trace(trace, opt);
  for (size_t row = 0; row < tracks.size(); ++row) {
    const double y = mt + static_cast<double>(row) * (row_h + row_gap);
    svg.rect(x0, y, x1 - x0, row_h, "lane");
    svg.text(x0 - 10, y + row_h / 2 + 4, pretty_name(tracks[row]), "lane-label", "end");
    svg.open_group("spans " + track_class(tracks[row]), {{"data-track", tracks[row]}});
    for (const auto& r : rects) {
      if (r.track != tracks[row]) continue;
      std::string cls = "span " + track_class(r.track);
      if (is_compute_track(r.track)) cls += " " + kind_class(r.kind);
      if (r.count > 1) cls += " merged";
      // At least 1 px wide so a very short span stays visible.
      double xa = sx(static_cast<double>(r.start_ns)), xb = sx(static_cast<double>(r.end_ns));
      svg.rect(xa, y + 1, std::max(1.0, xb - xa), row_h - 2, cls, span_tooltip(r), {{"data-n", std::to_string(r.count)}});
      ++out.rects;
      if (r.count > 1) ++out.merged_rects;
    }
    svg.close_group();
  }

  // Exposed communication: drawn in its own row, merged with the same decimation rule.
  const double ey = mt + static_cast<double>(tracks.size()) * (row_h + row_gap);
  svg.rect(x0, ey, x1 - x0, row_h, "lane");
  svg.text(x0 - 10, ey + row_h / 2 + 4, "exposed comm", "lane-label lane-label-exposed", "end");
  std::vector<sim::TraceSpan> ex_spans;
  for (const auto& [a, b] : exposed) {
    ex_spans.push_back(sim::TraceSpan{"exposed communication", "exposed", "exposed", -1, a, b - a, 0});
    out.exposed_ns += b - a;
  }
  svg.open_group("exposed-spans");
  for (const auto& r : decimate_trace(ex_spans, opt)) {
    double xa = sx(static_cast<double>(r.start_ns)), xb = sx(static_cast<double>(r.end_ns));
    std::string tip = "compute idle while a collective runs\n" + fmt_fixed(static_cast<double>(r.start_ns) * 1e-6, 3) +
                      " - " + fmt_fixed(static_cast<double>(r.end_ns) * 1e-6, 3) + " ms (" +
                      fmt_seconds(static_cast<double>(r.busy_ns) * 1e-9) + ")";
    svg.rect(xa, ey + 1, std::max(1.0, xb - xa), row_h - 2, "exposed", tip,
             {{"data-n", std::to_string(r.count)}, {"data-busy-ns", std::to_string(r.busy_ns)}});
    ++out.exposed_rects;
  }
  svg.close_group();
  out.svg = svg.str();

  std::string legend = "<ul class=\"legend\">";
  for (const auto& t : tracks) {
    if (is_compute_track(t)) {
      for (const char* k : {"forward", "backward", "recompute", "optimizer"}) {
        bool present = std::any_of(trace.begin(), trace.end(), [&](const sim::TraceSpan& s) {
          return s.track == t && kind_class(s.kind) == kind_class(k);
        });
        if (present)
          legend += "<li><span class=\"sw trk-compute " + kind_class(k) + "\"></span>compute: " + std::string(k) + "</li>";
      }
      bool other = std::any_of(trace.begin(), trace.end(), [&](const sim::TraceSpan& s) {
        return s.track == t && kind_class(s.kind) == "k-other";
      });
      if (other) legend += "<li><span class=\"sw trk-compute k-other\"></span>compute: other kernels</li>";
      continue;
    }
    legend += "<li><span class=\"sw " + track_class(t) + "\"></span>" + html_escape(pretty_name(t)) + "</li>";
  }
  legend += "<li><span class=\"sw exposed\"></span>exposed communication (compute idle while a collective runs)</li></ul>";
  out.legend_html = legend;
  return out;
}

}  // namespace fsdpsim::reports
