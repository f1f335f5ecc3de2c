// The planner's front door: (model, cluster, profile, batch target, constraints) -> ranked plans,
// explanations, exports, and the plan.json document (schema "fsdpsim.plan/1", reports/schema/).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "planner/bounds.h"
#include "planner/explain.h"
#include "planner/ranking.h"
#include "planner/search.h"
#include "planner/search_space.h"
#include "planner/sensitivity.h"
#include "program/sim_result.h"

namespace fsdpsim::planner {

struct PlanRequest {
  models::ModelSpec model;
  calibrate::Cluster cluster;
  calibrate::HardwareProfile hw;
  std::string profile_name;          // "builtin: ..." or the --profile file
  SpaceOptions space;
  double memory_margin = 0.05;
  int threads = 1;
  bool progress = false;
  int top_k = 5;
  std::string table_format = "text";   // the printed ranked table: text, markdown or csv
};

// The plan one front-end's export carries (export_expressible.h): the recommendation when the front-end
// expresses it, else the best plan it can express.
struct FrameworkPlan {
  std::string framework;             // "fsdp2", "lightning", "accelerate", "torchtitan"
  sim::Plan plan;
  std::string label;
  sim::SimResult result;
  bool fits_with_margin = false;
  bool same_as_recommended = true;
  std::vector<std::string> changes;  // what differs from the recommendation, and why
  std::string source;                // "the recommendation", "its nearest translation", "candidate c0123"
};

struct PlanOutcome {
  std::vector<Candidate> candidates;
  std::vector<MemoryBound> bounds;   // per candidate
  SearchOutcome search;
  Ranking ranking;
  Explanations explanations;
  bool has_detail = false;
  sim::SimResult recommended_detail; // the recommendation re-simulated with trace + memory timeline
  std::vector<Variation> variations; // the recommendation's choices changed one at a time (sensitivity.h)
  std::vector<FrameworkPlan> framework_plans;   // one per export, when there is a recommendation
};

// sim::simulate of `model` on `hw` without a trace or memory timeline (the figures a comparison needs,
// at the fast path's speed); model and hw must outlive it.
EvalFn fast_simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw);

// Runs the search with sim::simulate (or `eval` when given, e.g. in tests). Throws InputError for
// bad input. When interrupted (SIGINT), returns with search.stats.interrupted set.
PlanOutcome run_planner(const PlanRequest& req, const EvalFn* eval = nullptr);

// The plan.json document (the contract with reports/).
nlohmann::json plan_document(const PlanRequest& req, const PlanOutcome& out);
// plan.json's text: indented, one line per summary row.
std::string plan_document_text(const nlohmann::json& doc);
nlohmann::json cluster_json(const calibrate::Cluster& c, Bytes gpu_memory);

// The ranked table of the top K: "text" (fixed-width columns), "markdown" (a GitHub table) or "csv"
// (RFC 4180, one header line).
std::string ranked_table(const PlanRequest& req, const PlanOutcome& out, const std::string& format);
// What `fsdpsim plan` prints: search statistics, the ranked table in req.table_format and the
// explanations; with csv, the table alone (for scripts).
std::string summary_table(const PlanRequest& req, const PlanOutcome& out);

}  // namespace fsdpsim::planner
