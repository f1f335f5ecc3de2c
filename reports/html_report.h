// report.html: one self-contained page (inline CSS, inline SVG drawn in C++, a small inline script
// for sorting and copy buttons; no network, no external fonts) rendered from a plan.json document
// (reports/schema/plan.schema.json). Deterministic: the same document gives the same bytes.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "program/sim_result.h"

namespace fsdpsim::reports {

struct HtmlOptions {
  std::string trace_href = "trace.json";   // the Perfetto trace written next to report.html
  // The recommendation re-simulated with its trace and memory timeline (plan.json does not carry
  // them); when null, whatever recommended_detail in the document carries is drawn.
  const sim::SimResult* detail = nullptr;
};

// Throws InputError naming the field when the document lacks something the report shows.
std::string render_html(const nlohmann::json& plan_doc, const HtmlOptions& opt = {});
// render_html + write_file_atomic; InputError(field, path) when the file cannot be written.
void write_html(const std::string& path, const nlohmann::json& plan_doc, const HtmlOptions& opt = {},
                const std::string& field = "--out");

}  // namespace fsdpsim::reports
