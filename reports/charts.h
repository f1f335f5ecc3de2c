// The report's charts, drawn as inline SVG in C++ (no JavaScript needed to see them). Colors come
// from CSS classes (report_assets.cpp) so one stream / memory category has one color in every chart
// and in both color schemes: "trk-<track>", "k-<kind>" for compute kinds, "cat-<category>".
#pragma once
#include <string>

#include "reports/plan_doc.h"
#include "reports/timeline_decimate.h"

namespace fsdpsim::reports {

// Geometry shared by the charts (px); the page's content column is 1140 px wide.
inline constexpr double kChartWidth = 1100;

std::string track_class(const std::string& track);         // "trk-compute", unknown -> "trk-other"
std::string kind_class(const std::string& kind);           // "k-forward", ..., unknown -> "k-other"
std::string category_class(const std::string& category);   // "cat-activations", unknown -> "cat-other"
std::string pretty_name(const std::string& snake);          // "all_gather" -> "all-gather", "sharded_params" -> "sharded params"

// Memory vs tokens/s/GPU: one circle.pt per candidate, except that candidates on the same pixel
// with the same fit class share one circle (its data-n counts them); capacity line, Pareto front.
struct ScatterChart {
  std::string svg, legend_html;
  int points = 0;       // circle.pt drawn
  int candidates = 0;   // sum of their data-n (== number of candidates)
};
ScatterChart scatter_chart(const PlanDocView& doc, double memory_margin);

// One horizontal stacked bar: one rect.seg per non-zero category, against capacity.
struct MemoryBarChart {
  std::string svg, legend_html;
  int segments = 0;
};
MemoryBarChart memory_bar_chart(const ResultView& r);

// Allocated and reserved over the step (step polylines) on the GPU's clock (memory_align.h), capacity
// lines, the peak marked as the headline states it (peak reserved + context = peak device memory).
// Beyond 4 samples per pixel, samples are reduced to per-pixel-column min/max (peaks kept exactly).
struct MemoryTimelineChart {
  std::string svg;
  int samples = 0;
  int points_per_series = 0;
  bool reduced = false;
  double t_end_ns = 0;           // the x axis ends here: the step's end (or the last span / sample)
  double last_sample_ns = 0;     // the last sample, on the GPU's clock
  double peak_reserved_bytes = 0, peak_allocated_bytes = 0;   // the peaks marked
};
MemoryTimelineChart memory_timeline_chart(const DetailView& d);

// Per-stream timeline of the step: one rect.span per decimated rect (timeline_decimate.h), plus a
// row of rect.exposed for the intervals where communication is exposed.
struct StreamTimelineChart {
  std::string svg, legend_html;
  int spans = 0;         // trace spans
  int rects = 0;         // rect.span drawn
  int merged_rects = 0;  // rects standing for more than one span
  int exposed_rects = 0;
  TimeNs exposed_ns = 0; // total of exposed_comm_intervals
};
StreamTimelineChart stream_timeline_chart(const DetailView& d, const std::string& id = "stream-timeline");

}  // namespace fsdpsim::reports
