#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "reports/charts.h"
#include "reports/format.h"
#include "reports/html_escape.h"
#include "reports/svg.h"

namespace fsdpsim::reports {

namespace {
const char* const kKnownTracks[] = {"compute", "all_gather", "reduce_scatter", "all_reduce", "copy_in",
                                    "copy_out", "h2d", "d2h", "optimizer", "cpu"};
const char* const kKnownKinds[] = {"forward", "backward", "recompute", "optimizer"};

template <size_t N>
std::string classed(const char* prefix, const std::string& v, const char* const (&known)[N]) {
  for (const char* k : known)
    if (v == k) return std::string(prefix) + v;
  return std::string(prefix) + "other";
}
}  // namespace

std::string track_class(const std::string& track) {
  // The simulator's stream names, by the role their color shows (program/lower_fsdp1.cpp, lower_fsdp2.cpp).
  static const std::pair<const char*, const char*> alias[] = {
      {"default", "compute"}, {"unshard", "all_gather"}, {"post_backward", "reduce_scatter"},
      {"pre_unshard", "copy_in"}, {"all_gather_copy_in", "copy_in"}};
  for (const auto& [from, to] : alias)
    if (track == from) return std::string("trk-") + to;
  return classed("trk-", track, kKnownTracks);
}
std::string kind_class(const std::string& kind) {
  return classed("k-", kind == "optimizer_step" ? std::string("optimizer") : kind, kKnownKinds);
}

std::string category_class(const std::string& category) {
  for (int c = 0; c < sim::kNumMemCategories; ++c)
    if (category == sim::mem_category_name(static_cast<sim::MemCategory>(c))) return "cat-" + category;
  return "cat-other";
}

std::string pretty_name(const std::string& snake) {
  static const std::pair<const char*, const char*> special[] = {
      {"all_gather", "all-gather"}, {"reduce_scatter", "reduce-scatter"}, {"all_reduce", "all-reduce"},
      {"cpu", "CPU issue"},         {"h2d", "H2D copy"},                  {"d2h", "D2H copy"},
      {"cuda_context", "CUDA/NCCL context"}, {"default", "compute (default)"},
      {"unshard", "all-gather (unshard)"}, {"post_backward", "post_backward (RS)"},
      {"pre_unshard", "copy (pre_unshard)"}, {"all_gather_copy_in", "all-gather copy-in"}};
  for (const auto& [k, v] : special)
    if (snake == k) return v;
  std::string s = snake;
  std::replace(s.begin(), s.end(), '_', ' ');
  return s;
}

ScatterChart scatter_chart(const PlanDocView& doc, double memory_margin) {
  // Two panels sharing the y axis: plans that fit (with or without the margin) on a linear memory axis
  // up to a little past capacity, and plans that do not fit in a narrow panel of their own on a log
  // axis from capacity up - so one runaway plan (a simulated peak of thousands of GiB) neither hides
  // among the others nor squeezes them into the left edge.
  const double W = kChartWidth, H = 420, ml = 92, mr = 24, mt = 20, mb = 52, gap = 34;
  ScatterChart out;
  double max_fit_x = 0, max_nofit_x = 0, max_y = 0, capacity = 0;
  bool any_nofit = false;
  for (const auto& c : doc.candidates) capacity = std::max(capacity, c.result.capacity_bytes);
  const double cap_gib = capacity / static_cast<double>(kGiB);
  auto gib_of = [](const CandidateView& c) { return to_gib(static_cast<Bytes>(c.result.peak_total_device_bytes)); };
  auto nofit = [&](const CandidateView& c) { return !c.result.fits && (cap_gib <= 0 || gib_of(c) > cap_gib); };
  for (const auto& c : doc.candidates) {
    max_y = std::max(max_y, c.result.tokens_per_s_per_gpu);
    if (nofit(c)) {
      any_nofit = true;
      max_nofit_x = std::max(max_nofit_x, gib_of(c));
    } else {
      max_fit_x = std::max(max_fit_x, gib_of(c));
    }
  }
  const double panel_w = any_nofit && cap_gib > 0 ? 190 : 0;
  const double x_main_end = W - mr - (panel_w > 0 ? panel_w + gap : 0);
  const double x_hi = nice_ceiling(std::max(max_fit_x, cap_gib) * 1.05, 8);
  const double y_hi = nice_ceiling(std::max(max_y, 1.0) * 1.08, 6);
  LinearScale sx{0, x_hi, ml, x_main_end}, sy{0, y_hi, H - mb, mt};
  // The no-fit panel: log10 of peak / capacity, from 0 (capacity) to the largest such peak.
  const double px0 = x_main_end + gap, px1 = W - mr;
  const double log_hi = any_nofit && cap_gib > 0 ? std::max(std::log10(std::max(max_nofit_x, cap_gib) / cap_gib) * 1.05, 0.05) : 1.0;
  auto nx = [&](double gib) { return px0 + (px1 - px0) * std::log10(std::max(gib, cap_gib) / cap_gib) / log_hi; };
  auto x_of = [&](const CandidateView& c) { return nofit(c) && panel_w > 0 ? nx(gib_of(c)) : sx(gib_of(c)); };

  Svg svg(W, H, "scatter-chart", "Every candidate: peak device memory (GiB) against tokens/s per GPU");
  svg.open_group("grid");
  for (double t : nice_ticks(0, x_hi, 8)) {
    svg.line(sx(t), mt, sx(t), H - mb, "gridline");
    svg.text(sx(t), H - mb + 18, fmt_fixed(t, t == std::floor(t) ? 0 : 1), "tick", "middle");
  }
  for (double t : nice_ticks(0, y_hi, 6)) {
    svg.line(ml, sy(t), x_main_end, sy(t), "gridline");
    if (panel_w > 0) svg.line(px0, sy(t), px1, sy(t), "gridline");
    svg.text(ml - 8, sy(t) + 4, fmt_thousands(t), "tick", "end");
  }
  svg.line(ml, H - mb, x_main_end, H - mb, "axis");
  svg.line(ml, mt, ml, H - mb, "axis");
  svg.text((ml + x_main_end) / 2, H - 10, "peak device memory per GPU (GiB, reserved + CUDA/NCCL context)", "axis-label", "middle");
  svg.text(16, (mt + H - mb) / 2, "tokens/s per GPU", "axis-label axis-label-y", "middle");
  if (panel_w > 0) {
    svg.line(px0, H - mb, px1, H - mb, "axis");
    svg.line(px0, mt, px0, H - mb, "axis");
    for (double m : {1.0, 2.0, 5.0, 10.0, 100.0, 1000.0}) {
      if (std::log10(m) > log_hi) break;
      svg.line(nx(cap_gib * m), H - mb, nx(cap_gib * m), H - mb + 4, "axis");
      svg.text(nx(cap_gib * m), H - mb + 18, fmt_fixed(cap_gib * m, 0), "tick", "middle");
    }
    svg.text((px0 + px1) / 2, H - 10, "does not fit (GiB, log scale)", "axis-label", "middle");
    svg.text((px0 + px1) / 2, mt - 6, "over capacity", "cap-label", "middle");
  }
  svg.close_group();

  if (capacity > 0) {
    svg.line(sx(cap_gib), mt, sx(cap_gib), H - mb, "capacity-line");
    svg.text(sx(cap_gib) - 6, mt + 14, "capacity " + fmt_gib(capacity, 1), "cap-label", "end");
    if (memory_margin > 0) {
      double usable = cap_gib * (1.0 - memory_margin);
      svg.line(sx(usable), mt, sx(usable), H - mb, "margin-line");
      svg.text(sx(usable) - 6, mt + 30, "usable (" + fmt_percent(memory_margin, 0) + " margin)", "cap-label", "end");
    }
  }

  // Pareto front: the given indices, joined in order of increasing memory.
  std::vector<int> front = doc.pareto_front;
  std::stable_sort(front.begin(), front.end(), [&](int a, int b) {
    return doc.candidates[a].result.peak_total_device_bytes < doc.candidates[b].result.peak_total_device_bytes;
  });
  std::vector<std::pair<double, double>> pts;
  for (int i : front) pts.emplace_back(x_of(doc.candidates[i]), sy(doc.candidates[i].result.tokens_per_s_per_gpu));
  if (pts.size() >= 2) svg.polyline(pts, "pareto-line");

  auto in_front = [&](int i) { return std::find(front.begin(), front.end(), i) != front.end(); };
  // Candidates that land on the same pixel with the same fit class share one circle (data-n = how
  // many): a search of thousands of plans gives many identical predictions. Groups are keyed by
  // (rounded x, rounded y, fit class) and drawn in rank order of their best member, the
  // recommended one last so it sits on top.
  struct Group {
    int best = -1, n = 0;
    bool pareto = false, rec = false;
    double x = 0, y = 0;
    std::string fit;
  };
  std::map<std::tuple<long, long, std::string>, size_t> key_to_group;
  std::vector<Group> groups;
  for (const auto& c : doc.candidates) {
    const auto& r = c.result;
    double x = x_of(c), y = sy(r.tokens_per_s_per_gpu);
    std::string fit = c.fits_with_margin ? "fit" : (r.fits ? "tight" : "nofit");
    auto key = std::make_tuple(std::lround(x), std::lround(y), fit);
    auto it = key_to_group.find(key);
    if (it == key_to_group.end()) {
      it = key_to_group.emplace(key, groups.size()).first;
      groups.push_back(Group{c.index, 0, false, false, x, y, fit});
    }
    Group& g = groups[it->second];
    g.n += 1;
    g.pareto = g.pareto || c.pareto || in_front(c.index);
    g.rec = g.rec || (doc.recommended && *doc.recommended == c.index);
  }
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return !a.rec && b.rec; });
  svg.open_group("points");
  for (const Group& g : groups) {
    const CandidateView& c = doc.candidates[g.best];
    const auto& r = c.result;
    std::string cls = "pt " + g.fit;
    if (g.pareto) cls += " pareto";
    if (g.rec) cls += " rec";
    std::string tip = "#" + std::to_string(c.rank) + " " + c.label;
    if (g.n > 1) tip += "\n(+" + std::to_string(g.n - 1) + " more candidates at this point)";
    tip += "\n" + fmt_gib(r.peak_total_device_bytes) + " peak device memory, " + fmt_tokens_per_s(r.tokens_per_s_per_gpu) +
           " per GPU, step " + fmt_seconds(r.step_time_s) + (r.fits ? "" : " (does not fit)");
    if (g.rec) {
      svg.circle(g.x, g.y, 10, "rec-ring");
      svg.text(g.x + (g.x > x_main_end * 0.7 ? -14 : 14), g.y - 12, "recommended", "rec-label", g.x > x_main_end * 0.7 ? "end" : "start");
    }
    svg.circle(g.x, g.y, g.rec ? 6.5 : 5, cls, tip, {{"data-cand", c.id}, {"data-n", std::to_string(g.n)}});
    ++out.points;
    out.candidates += g.n;
  }
  svg.close_group();
  out.svg = svg.str();
  out.legend_html =
      "<ul class=\"legend\">"
      "<li><span class=\"sw sw-dot fit\"></span>fits with margin</li>"
      "<li><span class=\"sw sw-dot tight\"></span>fits, inside the margin</li>"
      "<li><span class=\"sw sw-dot nofit\"></span>does not fit (own panel, log scale)</li>"
      "<li><span class=\"sw sw-dot pareto\"></span>Pareto front (memory vs tokens/s)</li>"
      "<li><span class=\"sw sw-ring\"></span>recommended</li>"
      "<li><span class=\"sw sw-line capacity\"></span>GPU memory capacity</li></ul>";
  return out;
}

}  // namespace fsdpsim::reports
