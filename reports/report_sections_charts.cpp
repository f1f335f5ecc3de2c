// Chart and table sections of the report: the candidate scatter and table, the recommended plan's
// memory (breakdown bar, timeline) and stream timeline, and the predicted-vs-measured comparison.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "reports/charts.h"
#include "reports/format.h"
#include "reports/html_escape.h"
#include "reports/report_sections.h"

namespace fsdpsim::reports {

using nlohmann::json;

namespace {

// A table cell with a sort key: numbers sort numerically (data-v printed with full precision).
std::string num_cell(double sort_value, const std::string& shown) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", std::isfinite(sort_value) ? sort_value : 0.0);
  return "<td class=\"n\" data-v=\"" + std::string(buf) + "\">" + html_escape(shown) + "</td>";
}
std::string text_cell(const std::string& sort_value, const std::string& shown_html) {
  return "<td data-v=\"" + html_escape(sort_value) + "\">" + shown_html + "</td>";
}

}  // namespace

std::string section_scatter(const PlanDocView& doc, const SectionOptions& opt) {
  ScatterChart sc = scatter_chart(doc, opt.memory_margin);
  return "<section id=\"scatter\"><h2>Every candidate: memory against throughput</h2>"
         "<p class=\"note\">" + std::to_string(sc.candidates) + " candidates" +
         (sc.points < sc.candidates ? " drawn as " + std::to_string(sc.points) + " points (candidates with the same predicted memory and throughput share a point)"
                                    : ", one point each") +
         "; hover a point for its plan. Peak device memory = reserved + CUDA/NCCL context.</p>" +
         sc.svg + sc.legend_html + "</section>\n";
}

std::string section_candidates(const PlanDocView& doc) {
  const double usable = doc.usable_memory_bytes;
  const size_t shown = std::min(doc.candidates.size(), kMaxTableRows);
  std::string h = "<section id=\"candidates\"><h2>Ranked candidates</h2>"
                  "<p class=\"note\">Click a column header to sort. Plans that fit with the margin come first, by tokens/s per GPU." +
                  (shown < doc.candidates.size() ? " The top " + std::to_string(shown) + " of " + std::to_string(doc.candidates.size()) +
                                                       " candidates are listed; all are in plan.json."
                                                 : std::string()) +
                  "</p>"
                  "<div class=\"scroll\"><table id=\"candidate-table\" class=\"sortable\"><thead><tr>"
                  "<th class=\"n\" data-type=\"num\">rank</th><th data-type=\"text\">plan</th><th data-type=\"text\">family</th>"
                  "<th data-type=\"text\">fits</th>"
                  "<th class=\"n\" data-type=\"num\" title=\"peak device memory: reserved + CUDA/NCCL context\">device GiB</th>"
                  "<th class=\"n\" data-type=\"num\" title=\"peak allocated memory (live tensors)\">allocated GiB</th>"
                  "<th class=\"n\" data-type=\"num\" title=\"usable memory (capacity less the margin) minus peak device memory\">headroom GiB</th>"
                  "<th class=\"n\" data-type=\"num\" title=\"predicted optimizer step time\">step ms</th>"
                  "<th class=\"n\" data-type=\"num\">tokens/s/GPU</th>"
                  "<th class=\"n\" data-type=\"num\" title=\"model FLOPs utilization against the dense peak\">MFU %</th>"
                  "<th class=\"n\" data-type=\"num\" title=\"time the compute stream waits on communication\">exposed ms</th>"
                  "<th data-type=\"text\">Pareto</th></tr></thead><tbody>";
  for (size_t i = 0; i < shown; ++i) {
    const CandidateView& c = doc.candidates[i];
    const auto& r = c.result;
    const bool rec = doc.recommended && *doc.recommended == c.index;
    std::string cls = rec ? "rec" : (r.fits ? "" : "nofit");
    std::string fits = c.fits_with_margin ? "yes" : (r.fits ? "inside margin" : "no");
    std::string fits_cls = c.fits_with_margin ? "ok" : (r.fits ? "warn" : "bad");
    std::string label_html = "<span class=\"plan-label\">" + html_escape(c.label) + "</span>";
    if (!c.why.empty()) {
      label_html += "<details><summary>why</summary><ul>";
      for (const auto& w : c.why) label_html += "<li>" + html_escape(w) + "</li>";
      label_html += "</ul></details>";
    }
    double headroom = (usable > 0 ? usable : r.capacity_bytes) - r.peak_total_device_bytes;
    h += "<tr id=\"cand-" + html_token(c.id) + "\" data-index=\"" + std::to_string(c.index) + "\"" +
         (cls.empty() ? "" : " class=\"" + cls + "\"") + ">";
    h += num_cell(c.rank, std::to_string(c.rank));
    h += text_cell(c.label, label_html);
    h += text_cell(c.family, html_escape(c.family));
    h += text_cell(fits, "<span class=\"" + fits_cls + "\">" + html_escape(fits) + "</span>");
    h += num_cell(r.peak_total_device_bytes, fmt_fixed(r.peak_total_device_bytes / static_cast<double>(kGiB), 2));
    h += num_cell(r.peak_allocated_bytes, fmt_fixed(r.peak_allocated_bytes / static_cast<double>(kGiB), 2));
    h += num_cell(headroom, fmt_fixed(headroom / static_cast<double>(kGiB), 2));
    h += num_cell(r.step_time_s, fmt_fixed(r.step_time_s * 1e3, 1));
    h += num_cell(r.tokens_per_s_per_gpu, fmt_thousands(r.tokens_per_s_per_gpu));
    h += num_cell(r.mfu, fmt_fixed(r.mfu * 100, 1));
    h += num_cell(r.exposed_comm_s, fmt_fixed(r.exposed_comm_s * 1e3, 1));
    h += text_cell(c.pareto ? "1" : "0", c.pareto ? "yes" : "");
    h += "</tr>";
  }
  return h + "</tbody></table></div></section>\n";
}

std::string section_memory(const PlanDocView& doc) {
  if (!doc.recommended) return "";
  const ResultView& r = doc.detail ? doc.detail->result : doc.candidates[*doc.recommended].result;
  MemoryBarChart bar = memory_bar_chart(r);
  std::string h = "<section id=\"memory\"><h2>Memory of the recommended plan</h2>";
  h += "<h3>Breakdown at the allocated peak, against capacity</h3>" + bar.svg + bar.legend_html;
  if (doc.detail && !doc.detail->memory_timeline.empty()) {
    MemoryTimelineChart tl = memory_timeline_chart(*doc.detail);
    h += "<h3>Over the step</h3>" + tl.svg +
         "<ul class=\"legend\"><li><span class=\"sw sw-line\" style=\"border-top-color:var(--accent);border-top-style:solid\"></span>allocated (live tensors)</li>"
         "<li><span class=\"sw sw-line\" style=\"border-top-color:var(--warn)\"></span>reserved (caching-allocator segments)</li>"
         "<li><span class=\"sw sw-line capacity\"></span>capacity</li></ul>";
    if (tl.reduced)
      h += "<p class=\"note\">" + std::to_string(tl.samples) +
           " memory samples are drawn as per-pixel minimum and maximum (peaks exact).</p>";
  } else {
    h += "<p class=\"note\">No memory timeline in this document.</p>";
  }
  if (doc.memory_accuracy) {
    const auto& a = *doc.memory_accuracy;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "<p class=\"note\" id=\"memory-accuracy\">How close: against PyTorch's own allocator on %d measured "
                  "plans, the predicted steady-state peak reserved was within %.0f%% on %d (mean absolute error "
                  "%.2f%%), and %d of %d fits/OOM calls were right.</p>",
                  a.plans, 100 * a.reserved_tolerance, a.reserved_within, 100 * a.reserved_mae, a.fits_agree,
                  a.fits_compared);
    h += buf;
  }
  return h + "</section>\n";
}

std::string section_timeline(const PlanDocView& doc, const SectionOptions& opt) {
  if (!doc.recommended) return "";
  std::string h = "<section id=\"timeline\"><h2>One step of the recommended plan, per stream</h2>";
  if (!doc.detail || doc.detail->trace.empty())
    return h + "<p class=\"note\">No trace in this document.</p></section>\n";
  StreamTimelineChart tc = stream_timeline_chart(*doc.detail);
  h += tc.svg + tc.legend_html;
  h += "<p class=\"note\">" + std::to_string(tc.spans) + " trace spans drawn as " + std::to_string(tc.rects) + " rects";
  if (tc.merged_rects > 0)
    h += " (" + std::to_string(tc.merged_rects) + (tc.merged_rects == 1 ? " rect merges" : " rects merge") +
         " adjacent spans narrower than a pixel on the same stream; hover for their count)";
  h += ". Exposed communication from the trace: " + fmt_seconds(static_cast<double>(tc.exposed_ns) * 1e-9) +
       " (simulator's figure: " + fmt_seconds(doc.detail->result.exposed_comm_s) + ").";
  h += " Full trace: <a href=\"" + html_escape(opt.trace_href) + "\">" + html_escape(opt.trace_href) +
       "</a> (open it in Perfetto, ui.perfetto.dev, or chrome://tracing).</p>";
  return h + "</section>\n";
}

namespace {

// A predicted-vs-measured row; error = (predicted - measured) / measured.
std::string compare_row(const std::string& name, const json& pred, const json& meas, std::string (*fmt)(double)) {
  if (!pred.is_number() || !meas.is_number()) return "";
  double p = pred.get<double>(), m = meas.get<double>();
  std::string err = m != 0 ? fmt_signed_percent((p - m) / m) : "n/a";
  return "<tr><th>" + html_escape(name) + "</th><td class=\"n\">" + html_escape(fmt(p)) + "</td><td class=\"n\">" +
         html_escape(fmt(m)) + "</td><td class=\"n\">" + html_escape(err) + "</td></tr>";
}
std::string gib2(double b) { return fmt_gib(b); }
std::string secs(double s) { return fmt_seconds(s); }
std::string tps(double v) { return fmt_tokens_per_s(v); }
std::string pct(double v) { return fmt_percent(v); }

const json& at_path(const json& j, std::initializer_list<const char*> keys) {
  static const json kNull;
  const json* cur = &j;
  for (const char* k : keys) {
    if (!cur->is_object() || !cur->contains(k)) return kNull;
    cur = &(*cur)[k];
  }
  return *cur;
}
// The first of several spellings that is present: the comparison's flat keys
// ("peak_allocated_bytes") or sim_result_to_json's nested ones ("peak_memory_bytes.allocated").
const json& either(const json& j, std::initializer_list<const char*> flat, std::initializer_list<const char*> nested) {
  const json& a = at_path(j, flat);
  return a.is_null() ? at_path(j, nested) : a;
}

// A cell of a generic table: errors as signed percent, seconds / bytes by their key's unit.
std::string cell_text(const std::string& key, const json& v) {
  auto ends = [&](const char* suf) {
    std::string x(suf);
    return key.size() >= x.size() && key.compare(key.size() - x.size(), x.size(), x) == 0;
  };
  if (v.is_null()) return key.find("error") != std::string::npos ? "n/a" : "";
  if (v.is_number() && key.find("error") != std::string::npos) return fmt_signed_percent(v.get<double>());
  if (v.is_number() && ends("_s")) return fmt_seconds(v.get<double>());
  if (v.is_number() && ends("_bytes")) return fmt_bytes_auto(v.get<double>());
  return json_text(v);
}

// Rows of flat objects as a sortable table; columns in first-seen order; long lists folded and cut.
std::string rows_table(const std::string& name, const std::vector<std::pair<std::string, const json*>>& rows,
                       const std::string& first_col) {
  constexpr size_t kMaxRows = 300, kOpen = 30;
  std::vector<std::string> cols;
  if (!first_col.empty()) cols.push_back(first_col);
  for (const auto& [label, r] : rows)
    if (r->is_object())
      for (auto it = r->begin(); it != r->end(); ++it)
        if (std::find(cols.begin(), cols.end(), it.key()) == cols.end()) cols.push_back(it.key());
  // Identity columns first, then predicted, measured, the error last (JSON gives them sorted by name).
  auto col_rank = [](const std::string& c) {
    if (c == "name" || c == "track" || c == "stream" || c == "kind" || c == "unit" || c == "count") return 0;
    if (c.rfind("predicted", 0) == 0) return 1;
    if (c.rfind("measured", 0) == 0) return 2;
    if (c.find("error") != std::string::npos) return 4;
    return 3;
  };
  std::stable_sort(cols.begin(), cols.end(), [&](const std::string& a, const std::string& b) { return col_rank(a) < col_rank(b); });
  std::string h = "<table class=\"sortable measured-rows\"><thead><tr>";
  for (const auto& c : cols) h += "<th data-type=\"text\">" + html_escape(c) + "</th>";
  h += "</tr></thead><tbody>";
  for (size_t i = 0; i < rows.size() && i < kMaxRows; ++i) {
    h += "<tr data-index=\"" + std::to_string(i) + "\">";
    for (const auto& c : cols) {
      json v = !first_col.empty() && c == first_col ? json(rows[i].first)
                                                   : (rows[i].second->is_object() && rows[i].second->contains(c) ? (*rows[i].second)[c] : json());
      std::string sort = v.is_number() ? json_text(v) : (v.is_null() ? "" : json_text(v));
      h += "<td data-v=\"" + html_escape(sort) + "\">" + html_escape(cell_text(c, v)) + "</td>";
    }
    h += "</tr>";
  }
  h += "</tbody></table>";
  std::string title = html_escape(name) + " (" + std::to_string(rows.size()) + ")";
  if (rows.size() > kMaxRows) h += "<p class=\"note\">First " + std::to_string(kMaxRows) + " of " + std::to_string(rows.size()) + " rows; all are in plan.json.</p>";
  if (rows.size() > kOpen) return "<details><summary>" + title + "</summary><div class=\"scroll\">" + h + "</div></details>";
  return "<h3>" + title + "</h3><div class=\"scroll\">" + h + "</div>";
}

}  // namespace

std::string section_measured(const PlanDocView& doc) {
  const json& m = doc.measured;
  if (!m.is_object()) return "";
  std::string h = "<section id=\"measured\"><h2>Predicted vs measured</h2><div class=\"metrics\">";
  const std::vector<std::pair<std::string, std::string>> headline = {
      {"step_time_error", "Step time error"}, {"peak_allocated_error", "Peak allocated error"}, {"peak_reserved_error", "Peak reserved error"}};
  for (const auto& [key, label] : headline) {
    if (!m.contains(key)) continue;
    const json& v = m[key];
    std::string shown = v.is_number() ? fmt_signed_percent(v.get<double>()) : "n/a";
    std::string cls = !v.is_number() ? "" : (std::fabs(v.get<double>()) <= 0.05 ? "ok" : (std::fabs(v.get<double>()) <= 0.15 ? "warn" : "bad"));
    h += "<div class=\"metric\"><div class=\"k\">" + html_escape(label) + "</div><div class=\"v " + cls + "\">" + shown +
         "</div><div class=\"d\">(predicted - measured) / measured</div></div>";
  }
  h += "</div>";
  const json& pred = m.contains("predicted") ? m["predicted"] : json();
  const json& meas = m.contains("measured") ? m["measured"] : json();
  if (pred.is_object() && meas.is_object()) {
    std::string rows;
    rows += compare_row("step time", either(pred, {"step_time_s"}, {}), either(meas, {"step_time_s"}, {}), secs);
    rows += compare_row("peak allocated", either(pred, {"peak_allocated_bytes"}, {"peak_memory_bytes", "allocated"}),
                        either(meas, {"peak_allocated_bytes"}, {"peak_memory_bytes", "allocated"}), gib2);
    rows += compare_row("peak reserved", either(pred, {"peak_reserved_bytes"}, {"peak_memory_bytes", "reserved"}),
                        either(meas, {"peak_reserved_bytes"}, {"peak_memory_bytes", "reserved"}), gib2);
    rows += compare_row("compute busy", either(pred, {"compute_s"}, {}), either(meas, {"compute_s"}, {}), secs);
    rows += compare_row("communication busy", either(pred, {"comm_s"}, {}), either(meas, {"comm_s"}, {}), secs);
    rows += compare_row("exposed communication", either(pred, {"exposed_comm_s"}, {}), either(meas, {"exposed_comm_s"}, {}), secs);
    rows += compare_row("CPU blocked", either(pred, {"cpu_blocked_s"}, {}), either(meas, {"cpu_blocked_s"}, {}), secs);
    rows += compare_row("tokens/s per GPU", either(pred, {"tokens_per_s_per_gpu"}, {}), either(meas, {"tokens_per_s_per_gpu"}, {}), tps);
    rows += compare_row("MFU", either(pred, {"mfu"}, {}), either(meas, {"mfu"}, {}), pct);
    h += "<table id=\"measured-table\" class=\"kv\"><thead><tr><th></th><th class=\"n\">predicted</th><th class=\"n\">measured</th>"
         "<th class=\"n\">error</th></tr></thead><tbody>" + rows + "</tbody></table>";
  }
  // The measured step's own timeline, when the run's trace is attached.
  const json& mr = m.contains("measured_result") ? m["measured_result"] : json();
  if (mr.is_object() && mr.contains("trace") && mr["trace"].is_array() && !mr["trace"].empty()) {
    DetailView md = read_detail(mr, "plan.measured.measured_result");
    StreamTimelineChart tc = stream_timeline_chart(md, "measured-timeline");
    h += "<h3>Measured step, per stream</h3>" + tc.svg + tc.legend_html;
  }
  // Everything else of the comparison, generically: lists of rows, maps of rows, key/value groups.
  std::vector<std::string> scalars;
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "predicted" || k == "measured" || k == "measured_result" || (k.size() > 6 && k.compare(k.size() - 6, 6, "_error") == 0)) continue;
    if (v.is_array() && !v.empty() && v[0].is_object()) {
      std::vector<std::pair<std::string, const json*>> rows;
      for (const auto& r : v) rows.emplace_back("", &r);
      h += rows_table(pretty_name(k), rows, "");
    } else if (v.is_object() && !v.empty() && std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_object(); })) {
      std::vector<std::pair<std::string, const json*>> rows;
      for (auto r = v.begin(); r != v.end(); ++r) rows.emplace_back(r.key(), &r.value());
      h += rows_table(pretty_name(k), rows, "name");
    } else if (v.is_object()) {
      h += "<h3>" + html_escape(pretty_name(k)) + "</h3><table class=\"kv\"><tbody>";
      for (auto r = v.begin(); r != v.end(); ++r)
        h += "<tr><th>" + html_escape(r.key()) + "</th><td>" + html_escape(cell_text(r.key(), r.value())) + "</td></tr>";
      h += "</tbody></table>";
    } else if (!v.is_array()) {
      scalars.push_back(k + ": " + json_text(v));
    }
  }
  if (!scalars.empty()) {
    h += "<ul class=\"note\">";
    for (const auto& s : scalars) h += "<li>" + html_escape(s) + "</li>";
    h += "</ul>";
  }
  return h + "</section>\n";
}

}  // namespace fsdpsim::reports
