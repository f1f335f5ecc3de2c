// The plan.json document (schema reports/schema/plan.schema.json, "fsdpsim.plan/1") read into typed
// views for rendering. Everything the report draws is checked here, once: a missing or mistyped
// field is InputError naming its path ("plan.candidates[2].result.step_time_s"), so the renderers
// below never meet bad data. Parts the report only prints (model keys, plan keys) stay JSON.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "program/sim_result.h"

namespace fsdpsim::reports {

inline constexpr const char* kPlanSchemaVersion = "fsdpsim.plan/1";
inline constexpr const char* kSimulateSchemaVersion = "fsdpsim.simulate/1";

// The headline numbers of one simulated plan (a subset of sim_result_to_json).
struct ResultView {
  double peak_allocated_bytes = 0, peak_reserved_bytes = 0, context_bytes = 0, peak_total_device_bytes = 0;
  double capacity_bytes = 0;
  // Reserved peaks before the steady step, when the result has them (0: absent): the first step's (the optimizer
  // creates its state in it) and FSDP1's construction; `fits` takes the largest.
  double first_step_peak_reserved_bytes = 0, construction_peak_reserved_bytes = 0;
  bool fits = false;
  std::vector<std::pair<std::string, double>> breakdown;  // in display order (mem_category order, then others)
  double step_time_s = 0, compute_s = 0, comm_s = 0, exposed_comm_s = 0;
  double tokens_per_s_per_gpu = 0, mfu = 0;
  double peak_flops_per_s = 0;
  std::string peak_flops_dtype;
  std::vector<std::string> notes;
};

struct CandidateView {
  int index = 0;             // position in "candidates"
  int rank = 0;
  std::string id, label, family;
  bool fits_with_margin = false;
  bool pareto = false;
  ResultView result;
  std::vector<std::string> why;
  nlohmann::json plan;       // plan_to_json of the resolved plan (printed as is)
  bool summary = false;      // from other_candidates: result holds the row's figures only, no plan
};

struct DetailView {
  ResultView result;
  std::vector<sim::TraceSpan> trace;
  std::vector<sim::MemorySample> memory_timeline;
};

struct ExportView {
  std::string key, format, target, text;
  std::vector<std::string> unsupported;
  bool same_as_recommended = true;
  std::string plan_label, source;
  std::vector<std::string> changed;   // what differs from the recommendation, and why
};

struct PlanDocView {
  nlohmann::json context;    // the context block (printed)
  nlohmann::json inputs;     // printed; model.name and cluster.name are required
  nlohmann::json search;     // may be empty
  std::optional<int> recommended;
  std::vector<CandidateView> candidates;
  std::vector<int> pareto_front;
  std::vector<std::pair<std::string, std::string>> rejected_families;  // family, reason
  std::vector<std::string> why_recommended;
  std::vector<std::vector<std::string>> runners_up;
  std::vector<std::string> choices;  // the recommendation's choices varied one at a time
  std::string ddp_baseline;
  std::vector<ExportView> exports;   // fsdp2, torchtitan, lightning, accelerate, then others by name
  std::optional<DetailView> detail;
  nlohmann::json measured;           // null when absent
  double usable_memory_bytes = 0;    // inputs.usable_memory_bytes, or capacity x (1 - margin)
  // accuracy.memory (sim/accuracy.h), when the document has it: the plans measured, the steady-state peak
  // reserved within its tolerance on how many (and the mean absolute error), the fits/OOM calls right.
  struct MemoryAccuracy {
    int plans = 0, reserved_within = 0, fits_agree = 0, fits_compared = 0;
    double reserved_tolerance = 0, reserved_mae = 0;
  };
  std::optional<MemoryAccuracy> memory_accuracy;
};

// Throws InputError(field, value, allowed) on the first problem, field rooted at `root` ("plan").
PlanDocView read_plan_doc(const nlohmann::json& doc, const std::string& root = "plan");
// A sim_result_to_json object (with or without trace) -> views; path names it in errors.
ResultView read_result(const nlohmann::json& j, const std::string& path);
DetailView read_detail(const nlohmann::json& j, const std::string& path);

}  // namespace fsdpsim::reports
