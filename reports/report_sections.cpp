// Text sections of the report: header, recommendation card, inputs, exports, explanations, notes,
// footer. The chart sections are in report_sections_charts.cpp.
#include "reports/report_sections.h"

#include <algorithm>
#include <cmath>

#include "reports/format.h"
#include "reports/html_escape.h"

namespace fsdpsim::reports {

using nlohmann::json;

std::string json_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "null";
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

std::string str_or(const json& obj, const char* key, const std::string& dflt = "") {
  if (obj.is_object() && obj.contains(key) && !obj[key].is_null()) return json_text(obj[key]);
  return dflt;
}

std::string metric(const std::string& key, const std::string& value, const std::string& detail,
                   const std::string& value_class = "") {
  return "<div class=\"metric\"><div class=\"k\">" + html_escape(key) + "</div><div class=\"v" +
         (value_class.empty() ? "" : " " + value_class) + "\">" + html_escape(value) + "</div><div class=\"d\">" +
         html_escape(detail) + "</div></div>";
}

// A value for a key=value table: byte counts also in GiB, fractions named *_margin as percent.
std::string kv_value(const std::string& key, const json& v) {
  std::string s = json_text(v);
  auto ends_with = [&](const char* suf) {
    std::string x(suf);
    return key.size() >= x.size() && key.compare(key.size() - x.size(), x.size(), x) == 0;
  };
  if (v.is_number() && ends_with("_bytes")) s += " (" + fmt_gib(v.get<double>()) + ")";
  if (v.is_number() && key == "memory_margin") s = fmt_percent(v.get<double>(), 1) + " of capacity";
  if (v.is_number_integer() && (key == "params_total" || ends_with("_params")))
    s = fmt_count(v.get<double>()) + " (" + fmt_thousands(v.get<double>()) + ")";
  return html_escape(s);
}

// A long value (a sentence) gets a row of its own under its key instead of a narrow column.
std::string kv_row(const std::string& key, const json& v) {
  std::string val = kv_value(key, v);
  if (val.size() > 60)
    return "<tr><th colspan=\"2\">" + html_escape(key) + "</th></tr><tr><td colspan=\"2\" class=\"long\">" + val + "</td></tr>";
  return "<tr><th>" + html_escape(key) + "</th><td>" + val + "</td></tr>";
}

std::string kv_table(const json& obj, const std::vector<std::string>& skip = {}) {
  std::string h = "<table class=\"kv\"><tbody>";
  if (obj.is_object()) {
    // "name" first (it identifies the object), then the other keys in JSON (sorted) order.
    if (obj.contains("name") && std::find(skip.begin(), skip.end(), "name") == skip.end())
      h += kv_row("name", obj["name"]);
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (it.key() == "name") continue;
      bool skipped = false;
      for (const auto& s : skip) skipped = skipped || s == it.key();
      if (skipped) continue;
      h += kv_row(it.key(), it.value());
    }
  }
  return h + "</tbody></table>";
}

std::string bullet_list(const std::vector<std::string>& items, const std::string& cls = "") {
  if (items.empty()) return "";
  std::string h = "<ul" + (cls.empty() ? "" : " class=\"" + cls + "\"") + ">";
  for (const auto& s : items) h += "<li>" + html_escape(s) + "</li>";
  return h + "</ul>";
}

}  // namespace

std::string section_header(const PlanDocView& doc) {
  std::string model = str_or(doc.inputs["model"], "name"), cluster = str_or(doc.inputs["cluster"], "name");
  std::string h = "<header class=\"top\"><h1>fsdpsim plan: " + html_escape(model) + " on " + html_escape(cluster) + "</h1>";
  h += "<div class=\"sub\">";
  if (doc.search.is_object() && doc.search.contains("candidates_total"))
    h += html_escape(json_text(doc.search["candidates_total"])) + " candidate configurations considered, " +
         std::to_string(doc.candidates.size()) + " listed. ";
  h += "Predicted by the fsdpsim simulator for one rank; memory in GiB (2^30 bytes).</div></header>\n";
  return h;
}

std::string section_recommendation(const PlanDocView& doc, const SectionOptions& opt) {
  if (!doc.recommended) {
    std::string h = "<section id=\"recommendation\" class=\"card-none\"><h2>No candidate fits</h2>";
    h += "<p>None of the " + std::to_string(doc.candidates.size()) +
         " simulated configurations fits in GPU memory with the required margin.</p>";
    if (!doc.rejected_families.empty()) {
      h += "<h3>Why each family fails</h3><ul>";
      for (const auto& [f, reason] : doc.rejected_families)
        h += "<li><b>" + html_escape(f) + "</b>: " + html_escape(reason) + "</li>";
      h += "</ul>";
    }
    const CandidateView* best = nullptr;
    for (const auto& c : doc.candidates)
      if (!best || c.result.peak_total_device_bytes < best->result.peak_total_device_bytes) best = &c;
    if (best)
      h += "<p>Closest: <span class=\"plan-label\">" + html_escape(best->label) + "</span> needs " +
           fmt_gib(best->result.peak_total_device_bytes) + " of " + fmt_gib(best->result.capacity_bytes) + ".</p>";
    return h + "</section>\n";
  }
  const CandidateView& c = doc.candidates[*doc.recommended];
  const ResultView& r = doc.detail ? doc.detail->result : c.result;
  std::string h = "<section id=\"recommendation\" class=\"card-rec\"><h2>Recommended plan</h2>";
  h += "<div><span class=\"plan-label\">" + html_escape(c.label) + "</span><span class=\"badge\">" +
       html_escape(c.family) + "</span><span class=\"badge\">" + html_escape(c.id) + "</span></div>";
  h += "<div class=\"metrics\">";
  h += metric("Step time (predicted)", fmt_seconds(r.step_time_s), "one optimizer step");
  h += metric("Tokens/s per GPU", fmt_thousands(r.tokens_per_s_per_gpu), "tokens/s");
  std::string mfu_detail = "model FLOPs";
  if (r.peak_flops_per_s > 0)
    mfu_detail += " vs dense " + (r.peak_flops_dtype.empty() ? "" : r.peak_flops_dtype + " ") + "peak " +
                  fmt_fixed(r.peak_flops_per_s / 1e12, 1) + " TFLOP/s";
  h += metric("MFU", fmt_percent(r.mfu), mfu_detail);
  // Headroom as the planner defines it (planner/explain.h "headroom and margin"): what is left of the
  // usable memory (capacity less the margin) at the peak.
  const double usable = doc.usable_memory_bytes > 0 ? doc.usable_memory_bytes : r.capacity_bytes * (1.0 - opt.memory_margin);
  const double headroom = usable - r.peak_total_device_bytes;
  std::string mem_cls = headroom >= 0 && r.fits ? "ok" : (r.fits ? "warn" : "bad");
  // (the steady step's; a higher reserved peak before it, which fits also takes, is named)
  std::string before;
  if (r.first_step_peak_reserved_bytes > r.peak_reserved_bytes)
    before += "; first step " + fmt_gib(r.first_step_peak_reserved_bytes) + " reserved";
  if (r.construction_peak_reserved_bytes > std::max(r.peak_reserved_bytes, r.first_step_peak_reserved_bytes))
    before += "; FSDP1 construction " + fmt_gib(r.construction_peak_reserved_bytes) + " reserved";
  h += metric("Peak device memory", fmt_gib(r.peak_total_device_bytes) + " / " + fmt_gib(r.capacity_bytes, 1),
              "reserved " + fmt_gib(r.peak_reserved_bytes) + " + context " + fmt_gib(r.context_bytes) + "; allocated " +
                  fmt_gib(r.peak_allocated_bytes) + before,
              mem_cls);
  h += metric("Headroom", (headroom >= 0 ? "" : "-") + fmt_gib(std::fabs(headroom)),
              std::string(headroom >= 0 ? "left" : "over") + " of the " + fmt_gib(usable) + " usable (capacity less the " +
                  fmt_percent(opt.memory_margin, 0) + " margin) at the peak",
              mem_cls);
  h += metric("Exposed communication", fmt_seconds(r.exposed_comm_s),
              r.step_time_s > 0 ? fmt_percent(r.exposed_comm_s / r.step_time_s) + " of the step; comm busy " + fmt_seconds(r.comm_s)
                                : "");
  h += "</div>";
  if (!doc.why_recommended.empty()) h += "<h3>Why it wins</h3>" + bullet_list(doc.why_recommended);
  if (!doc.ddp_baseline.empty()) h += "<h3>Against DDP</h3><p id=\"ddp-baseline\">" + html_escape(doc.ddp_baseline) + "</p>";
  if (!doc.choices.empty())
    h += "<h3>Each choice changed alone (simulated)</h3><div id=\"choices\">" + bullet_list(doc.choices) + "</div>";
  if (c.plan.is_object() && !c.plan.empty())
    h += "<details><summary>All plan keys</summary>" + kv_table(c.plan) + "</details>";
  return h + "</section>\n";
}

std::string section_inputs(const PlanDocView& doc) {
  std::string h = "<section id=\"inputs\"><h2>Inputs</h2><div class=\"cols\">";
  // The model's headline shape first; every other key (models::model_to_json has many) folded.
  const json& model = doc.inputs["model"];
  const std::vector<std::string> main_keys = {"name", "model_type", "params_total", "hidden", "n_layers", "n_heads", "n_kv_heads",
                                              "ffn_hidden", "vocab_size", "n_experts"};
  json head = json::object(), rest = json::object();
  if (model.is_object())
    for (auto it = model.begin(); it != model.end(); ++it)
      (std::find(main_keys.begin(), main_keys.end(), it.key()) != main_keys.end() ? head : rest)[it.key()] = it.value();
  h += "<div><h3>Model</h3>" + kv_table(head);
  if (!rest.empty()) h += "<details><summary>all model keys</summary>" + kv_table(rest) + "</details>";
  h += "</div>";
  h += "<div><h3>Cluster</h3>" + kv_table(doc.inputs["cluster"]) + "</div>";
  h += "<div><h3>Targets</h3>" + kv_table(doc.inputs, {"model", "cluster"});
  if (doc.search.is_object() && !doc.search.empty()) h += "<h3>Search</h3>" + kv_table(doc.search);
  h += "</div></div></section>\n";
  return h;
}

std::string section_exports(const PlanDocView& doc) {
  if (doc.exports.empty()) return "";
  std::string h = "<section id=\"exports\"><h2>Ready-to-paste configuration</h2>"
                  "<p class=\"note\">The recommended plan in each framework's own form.</p>";
  // One block per framework; the first open, the others folded (they are long), all copyable.
  bool first = true;
  for (const auto& e : doc.exports) {
    std::string id = "export-" + html_token(e.key);
    h += std::string("<details class=\"export\"") + (first ? " open" : "") + "><summary><h3>" + html_escape(e.key) +
         "</h3><span class=\"badge\">" + html_escape(e.format) + "</span>";
    if (!e.target.empty()) h += "<span class=\"badge\">" + html_escape(e.target) + "</span>";
    if (!e.unsupported.empty()) h += "<span class=\"badge warn\">" + std::to_string(e.unsupported.size()) + " not expressible</span>";
    if (!e.same_as_recommended) h += "<span class=\"badge warn\">another plan</span>";
    h += "</summary>";
    if (!e.same_as_recommended)
      h += "<div class=\"unsupported\">" + html_escape(e.key) + " cannot express the recommended plan as is; this export carries " +
           html_escape(e.source) + " (<span class=\"plan-label\">" + html_escape(e.plan_label) + "</span>), simulated:" +
           bullet_list(e.changed) + "</div>";
    h += "<button type=\"button\" class=\"copy\" data-target=\"" + id + "\">Copy</button>";
    h += "<pre id=\"" + id + "\"><code>" + html_escape(e.text) + "</code></pre>";
    if (!e.unsupported.empty())
      h += "<div class=\"unsupported\">Not expressible in " + html_escape(e.key) + ":" + bullet_list(e.unsupported) + "</div>";
    h += "</details>";
    first = false;
  }
  return h + "</section>\n";
}

std::string section_explanations(const PlanDocView& doc) {
  if (doc.runners_up.empty() && doc.rejected_families.empty()) return "";
  std::string h = "<section id=\"explanations\"><h2>Why the others lost</h2>";
  if (!doc.runners_up.empty()) {
    // The first few in full; a long tail (the planner may explain every candidate) folded away.
    constexpr size_t kShown = 5;
    auto item = [&](size_t i) {
      size_t ci = i + 1;
      std::string label = ci < doc.candidates.size() ? doc.candidates[ci].label : "candidate " + std::to_string(ci);
      return "<li><span class=\"plan-label\">" + html_escape(label) + "</span>" + bullet_list(doc.runners_up[i]) + "</li>";
    };
    h += "<h3>Runners-up</h3><ol class=\"runners-up\" start=\"2\">";
    for (size_t i = 0; i < doc.runners_up.size() && i < kShown; ++i) h += item(i);
    h += "</ol>";
    if (doc.runners_up.size() > kShown) {
      h += "<details><summary>" + std::to_string(doc.runners_up.size() - kShown) + " more</summary><ol class=\"runners-up\" start=\"" +
           std::to_string(kShown + 2) + "\">";
      for (size_t i = kShown; i < doc.runners_up.size(); ++i) h += item(i);
      h += "</ol></details>";
    }
  }
  if (!doc.rejected_families.empty()) {
    h += "<h3>Families that lost</h3><table id=\"rejected-table\"><thead><tr><th>family</th><th>reason</th></tr></thead><tbody>";
    for (const auto& [f, reason] : doc.rejected_families)
      h += "<tr><td>" + html_escape(f) + "</td><td>" + html_escape(reason) + "</td></tr>";
    h += "</tbody></table>";
  }
  return h + "</section>\n";
}

std::string section_notes(const PlanDocView& doc) {
  std::vector<std::string> notes;
  if (doc.detail) notes = doc.detail->result.notes;
  else if (doc.recommended) notes = doc.candidates[*doc.recommended].result.notes;
  if (notes.empty()) return "";
  return "<section id=\"notes\"><h2>Approximations and warnings</h2>" + bullet_list(notes) + "</section>\n";
}

std::string section_footer(const PlanDocView& doc) {
  std::string h = "<footer id=\"context\"><dl>";
  for (const char* k : {"tool", "version", "git_sha", "date", "host", "command", "profile"})
    if (doc.context.contains(k)) h += "<dt>" + std::string(k) + "</dt><dd>" + html_escape(json_text(doc.context[k])) + "</dd>";
  h += "<dt>schema</dt><dd>" + std::string(kPlanSchemaVersion) + "</dd>";
  return h + "</dl></footer>\n";
}

}  // namespace fsdpsim::reports
