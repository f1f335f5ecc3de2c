// The sections of report.html, each a function from the typed plan document to an HTML fragment.
// Every string from the document is escaped here (html_escape); numbers carry units.
#pragma once
#include <string>

#include "reports/plan_doc.h"

namespace fsdpsim::reports {

// The candidate table lists the top candidates by rank (a search may simulate thousands; plan.json
// has them all); the scatter draws every one.
inline constexpr size_t kMaxTableRows = 200;

struct SectionOptions {
  double memory_margin = 0;           // inputs.memory_margin (fraction of capacity)
  std::string trace_href = "trace.json";
};

std::string section_header(const PlanDocView& doc);
std::string section_recommendation(const PlanDocView& doc, const SectionOptions& opt);
std::string section_inputs(const PlanDocView& doc);
std::string section_exports(const PlanDocView& doc);
std::string section_scatter(const PlanDocView& doc, const SectionOptions& opt);
std::string section_candidates(const PlanDocView& doc);
std::string section_memory(const PlanDocView& doc);
std::string section_timeline(const PlanDocView& doc, const SectionOptions& opt);
std::string section_explanations(const PlanDocView& doc);
std::string section_measured(const PlanDocView& doc);   // "" when no measured run is attached
std::string section_notes(const PlanDocView& doc);
std::string section_footer(const PlanDocView& doc);

// A JSON value as report text: strings as is, numbers as JSON prints them, containers compact.
std::string json_text(const nlohmann::json& v);

}  // namespace fsdpsim::reports
