#include "reports/html_report.h"

#include "reports/memory_align.h"

#include "common/json_reader.h"
#include "common/output_file.h"
#include "reports/html_escape.h"
#include "reports/plan_doc.h"
#include "reports/report_assets.h"
#include "reports/report_sections.h"

namespace fsdpsim::reports {

namespace {
// An HTML comment may not contain "--" (nor "<!--"): the context's command line ("--model ...") is
// escaped and its dashes spaced (the exact text is in the page footer).
std::string comment_safe(std::string s) {
  for (size_t p = s.find("--"); p != std::string::npos; p = s.find("--", p)) s.replace(p, 2, "- -");
  return s;
}
}  // namespace

std::string render_html(const nlohmann::json& plan_doc, const HtmlOptions& opt) {
  PlanDocView doc = read_plan_doc(plan_doc);
  if (opt.detail && doc.recommended) {
    if (!doc.detail) doc.detail = DetailView{doc.candidates[*doc.recommended].result, {}, {}};
    doc.detail->trace = opt.detail->trace;
    doc.detail->memory_timeline = steady_step_samples(opt.detail->memory_timeline, opt.detail->steady_step_start_ns);
  }
  SectionOptions so;
  so.trace_href = opt.trace_href;
  so.memory_margin = JsonReader(doc.inputs, "plan.inputs").get_double("memory_margin", 0.0, 0.99, 0.0);

  const std::string model = json_text(doc.inputs["model"]["name"]);
  const std::string cluster = json_text(doc.inputs["cluster"]["name"]);
  std::string h;
  h.reserve(256 * 1024);
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n";
  h += "<!-- context: " + comment_safe(html_escape(doc.context.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))) + " -->\n";
  h += "<head>\n<meta charset=\"utf-8\">\n";
  h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += "<meta name=\"color-scheme\" content=\"light dark\">\n";
  h += "<meta name=\"generator\" content=\"fsdpsim " + html_escape(json_text(doc.context.value("version", nlohmann::json("")))) + "\">\n";
  h += "<title>fsdpsim plan: " + html_escape(model) + " on " + html_escape(cluster) + "</title>\n";
  h += "<style>" + std::string(report_css()) + "</style>\n";
  h += "<script>" + std::string(report_head_script()) + "</script>\n";
  h += "</head>\n<body data-errors=\"0\" data-ready=\"0\">\n<main>\n";
  h += section_header(doc);
  h += section_recommendation(doc, so);
  h += section_inputs(doc);
  h += section_exports(doc);
  h += section_scatter(doc, so);
  h += section_candidates(doc);
  h += section_memory(doc);
  h += section_timeline(doc, so);
  h += section_explanations(doc);
  h += section_measured(doc);
  h += section_notes(doc);
  h += section_footer(doc);
  h += "</main>\n<script>" + std::string(report_body_script()) + "</script>\n</body>\n</html>\n";
  return h;
}

void write_html(const std::string& path, const nlohmann::json& plan_doc, const HtmlOptions& opt,
                const std::string& field) {
  write_file_atomic(path, render_html(plan_doc, opt), field);
}

}  // namespace fsdpsim::reports
