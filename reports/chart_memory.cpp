#include <algorithm>
#include <cmath>
#include <cstdio>

#include "reports/charts.h"
#include "reports/format.h"
#include "reports/html_escape.h"
#include "reports/memory_align.h"
#include "reports/svg.h"

namespace fsdpsim::reports {

MemoryBarChart memory_bar_chart(const ResultView& r) {
  const double W = kChartWidth, H = 78, x0 = 10, x1 = W - 10, bar_y = 26, bar_h = 30;
  MemoryBarChart out;
  double total = 0;
  for (const auto& [k, v] : r.breakdown) total += v;
  const double domain = std::max({r.capacity_bytes, total, 1.0});
  LinearScale sx{0, domain, x0, x1};
  Svg svg(W, H, "memory-bar", "Memory per GPU at the allocated peak, by category, against capacity");
  svg.rect(x0, bar_y, x1 - x0, bar_h, "bar-track");
  double acc = 0;
  std::string legend = "<ul class=\"legend legend-table\">";
  for (const auto& [k, v] : r.breakdown) {
    if (v <= 0) continue;
    std::string pct = r.capacity_bytes > 0 ? fmt_percent(v / r.capacity_bytes) + " of capacity" : "";
    svg.rect(sx(acc), bar_y, sx(acc + v) - sx(acc), bar_h, "seg " + category_class(k),
             pretty_name(k) + ": " + fmt_gib(v) + (pct.empty() ? "" : " (" + pct + ")"), {{"data-cat", k}});
    acc += v;
    ++out.segments;
    legend += "<li><span class=\"sw " + category_class(k) + "\"></span><span class=\"lg-name\">" +
              html_escape(pretty_name(k)) + "</span><span class=\"lg-val\">" + fmt_gib(v) + "</span><span class=\"lg-pct\">" +
              html_escape(pct) + "</span></li>";
  }
  legend += "</ul>";
  if (r.capacity_bytes > 0) {
    double cx = sx(r.capacity_bytes);
    svg.line(cx, bar_y - 8, cx, bar_y + bar_h + 8, "capacity-line");
    svg.text(std::min(cx, x1) - 4, 14, "capacity " + fmt_gib(r.capacity_bytes, 1), "cap-label", "end");
  }
  svg.text(x0, 14, "total " + fmt_gib(total) + " at the allocated peak", "tick");
  svg.text(x0, H - 4, "0", "tick");
  out.svg = svg.str();
  out.legend_html = legend;
  return out;
}

namespace {

// Points of a step polyline for one series, at most ~4 per pixel column: a column holding many
// samples contributes its entry value, max, min and exit value (so peaks are drawn exactly).
std::vector<std::pair<double, double>> step_points(const std::vector<sim::MemorySample>& s, bool reserved,
                                                   const LinearScale& sx, const LinearScale& sy, bool reduce) {
  auto val = [&](size_t i) { return static_cast<double>(reserved ? s[i].reserved : s[i].allocated); };
  std::vector<std::pair<double, double>> pts;
  if (s.empty()) return pts;
  if (!reduce) {
    for (size_t i = 0; i < s.size(); ++i) {
      double x = sx(static_cast<double>(s[i].t_ns));
      if (i > 0) pts.emplace_back(x, sy(val(i - 1)));
      pts.emplace_back(x, sy(val(i)));
    }
    return pts;
  }
  size_t i = 0;
  double prev = 0;
  bool have_prev = false;
  while (i < s.size()) {
    long col = std::lround(std::floor(sx(static_cast<double>(s[i].t_ns))));
    double lo = val(i), hi = val(i), last = val(i);
    size_t j = i;
    while (j < s.size() && std::lround(std::floor(sx(static_cast<double>(s[j].t_ns)))) == col) {
      lo = std::min(lo, val(j));
      hi = std::max(hi, val(j));
      last = val(j);
      ++j;
    }
    double x = static_cast<double>(col);
    if (have_prev) pts.emplace_back(x, sy(prev));
    pts.emplace_back(x, sy(hi));
    pts.emplace_back(x, sy(lo));
    pts.emplace_back(x, sy(last));
    prev = last;
    have_prev = true;
    i = j;
  }
  return pts;
}

}  // namespace

MemoryTimelineChart memory_timeline_chart(const DetailView& d) {
  const double W = kChartWidth, H = 300, ml = 70, mr = 24, mt = 16, mb = 46;
  MemoryTimelineChart out;
  const std::vector<sim::MemorySample> s = gpu_aligned_memory(d.trace, d.memory_timeline);
  out.samples = static_cast<int>(s.size());
  double t_end = std::max(1.0, d.result.step_time_s * 1e9);
  for (const auto& x : d.trace) t_end = std::max(t_end, static_cast<double>(x.start_ns + x.dur_ns));
  double v_max = std::max(d.result.capacity_bytes, 1.0);
  size_t peak_a = 0, peak_r = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    t_end = std::max(t_end, static_cast<double>(s[i].t_ns));
    v_max = std::max(v_max, static_cast<double>(std::max(s[i].allocated, s[i].reserved)));
    if (s[i].allocated > s[peak_a].allocated) peak_a = i;
    if (s[i].reserved > s[peak_r].reserved) peak_r = i;
  }
  out.t_end_ns = t_end;
  out.last_sample_ns = s.empty() ? 0 : static_cast<double>(s.back().t_ns);
  const double y_hi_gib = nice_ceiling(v_max / static_cast<double>(kGiB) * 1.05, 6);
  const double unit_ns = t_end > 10e9 ? 1e9 : 1e6;   // ms, or s for steps longer than 10 s
  const double t_hi = t_end / unit_ns;
  LinearScale sx{0, t_end, ml, W - mr}, sy{0, y_hi_gib * static_cast<double>(kGiB), H - mb, mt};
  Svg svg(W, H, "memory-timeline", "Allocated and reserved memory over one step (GiB), on the GPU's clock");
  svg.open_group("grid");
  for (double t : nice_ticks(0, t_hi, 10)) {
    svg.line(sx(t * unit_ns), mt, sx(t * unit_ns), H - mb, "gridline");
    svg.text(sx(t * unit_ns), H - mb + 17, fmt_fixed(t, t == std::floor(t) ? 0 : 1), "tick", "middle");
  }
  for (double g : nice_ticks(0, y_hi_gib, 6)) {
    double y = sy(g * static_cast<double>(kGiB));
    svg.line(ml, y, W - mr, y, "gridline");
    svg.text(ml - 8, y + 4, fmt_fixed(g, g == std::floor(g) ? 0 : 1), "tick", "end");
  }
  svg.line(ml, H - mb, W - mr, H - mb, "axis");
  svg.line(ml, mt, ml, H - mb, "axis");
  svg.text((ml + W - mr) / 2, H - 8,
           std::string("time in the step (") + (unit_ns == 1e9 ? "s" : "ms") +
               "), each allocation and free placed where the op that made it starts on the GPU",
           "axis-label", "middle");
  svg.text(16, (mt + H - mb) / 2, "GiB", "axis-label axis-label-y", "middle");
  svg.close_group();

  const double cap = d.result.capacity_bytes;
  if (cap > 0) {
    svg.line(ml, sy(cap), W - mr, sy(cap), "capacity-line");
    svg.text(W - mr - 4, sy(cap) - 5, "capacity " + fmt_gib(cap, 1), "cap-label", "end");
    if (d.result.context_bytes > 0) {
      double budget = cap - d.result.context_bytes;
      svg.line(ml, sy(budget), W - mr, sy(budget), "margin-line");
      svg.text(W - mr - 4, sy(budget) + 14, "capacity - CUDA/NCCL context " + fmt_gib(budget, 1) + " (budget for reserved)",
               "cap-label", "end");
    }
  }
  out.reduced = s.size() > 4 * static_cast<size_t>(W - ml - mr);
  auto reserved = step_points(s, true, sx, sy, out.reduced);
  auto allocated = step_points(s, false, sx, sy, out.reduced);
  out.points_per_series = static_cast<int>(allocated.size());
  // Extend both series flat to the end of the step.
  if (!s.empty()) {
    reserved.emplace_back(sx(t_end), reserved.back().second);
    allocated.emplace_back(sx(t_end), allocated.back().second);
  }
  char ends[96];
  std::snprintf(ends, sizeof ends, "%.0f", t_end);
  std::string t_end_text = ends;
  std::snprintf(ends, sizeof ends, "%.0f", out.last_sample_ns);
  svg.open_group("memory-series", {{"data-t-end-ns", t_end_text}, {"data-last-sample-ns", ends}});
  svg.polyline(reserved, "series reserved");
  svg.polyline(allocated, "series allocated");
  svg.close_group();
  if (!s.empty()) {
    // The peak the headline reports: peak reserved + the CUDA/NCCL context = peak device memory.
    const double pr = static_cast<double>(s[peak_r].reserved);
    const double px = sx(static_cast<double>(s[peak_r].t_ns)), py = sy(pr);
    out.peak_reserved_bytes = pr;
    std::string what = "peak reserved " + fmt_gib(pr) +
                       (d.result.context_bytes > 0 ? " + context " + fmt_gib(d.result.context_bytes) + " = peak device memory " +
                                                         fmt_gib(pr + d.result.context_bytes)
                                                   : std::string());
    svg.circle(px, py, 4, "peak-marker", what + " at " + fmt_seconds(static_cast<double>(s[peak_r].t_ns) * 1e-9));
    svg.text(px > W * 0.6 ? px - 8 : px + 8, py - 6, what, "peak-label", px > W * 0.6 ? "end" : "start");
    const double qa = static_cast<double>(s[peak_a].allocated);
    out.peak_allocated_bytes = qa;
    svg.circle(sx(static_cast<double>(s[peak_a].t_ns)), sy(qa), 3, "peak-marker peak-allocated",
               "peak allocated " + fmt_gib(qa) + " at " + fmt_seconds(static_cast<double>(s[peak_a].t_ns) * 1e-9));
  }
  out.svg = svg.str();
  return out;
}

}  // namespace fsdpsim::reports
