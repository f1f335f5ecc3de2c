// Where `fsdpsim fit` and `fsdpsim compare` take a plan from: an inline plan JSON object, a plan
// JSON file, the output of `fsdpsim plan` (plan.json: its recommendation, or FILE#N for rank N),
// of `fsdpsim diagnose --json` or `fsdpsim simulate --json` (their plan), or a framework config that
// `fsdpsim diagnose` reads (.py Lightning, .yaml accelerate / LightningCLI, .toml torchtitan).
#pragma once
#include <string>

#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "planner/user_config.h"
#include "program/plan.h"

namespace fsdpsim::cli {

struct PlanSource {
  sim::Plan plan;          // resolved on the cluster
  std::string described;   // "plan.json: the recommendation (rank 1)", "lightning config train.py", ...
};

// `field` names the argument in errors; `ro` fills what a framework config does not say.
PlanSource load_plan_source(const std::string& spec, const models::ModelSpec& model, const calibrate::Cluster& cluster,
                            const planner::ReadOptions& ro, const std::string& field);

}  // namespace fsdpsim::cli
