// Synthetic plan.json / simulate documents for the reports tests, built without the simulator so
// the report can be tested on its own. Numbers come from a tiny self-consistent step model (below),
// not from the simulator, and the documents say so ("fixture" in names and notes): they exercise
// every part of the report (candidates that fit, fit inside the margin, do not fit; a Pareto front;
// a trace on 4 streams; a memory timeline; exports; explanations; a measured section).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "program/sim_result.h"

namespace fsdpsim::reports::fixture {

struct FixtureOptions {
  int candidates = 8;                 // 1..8 plan variants
  std::string model_name = "fixture-llama-1b";
  bool nothing_fits = false;          // shrink the GPU so no candidate fits (recommended: null)
  bool with_measured = false;         // attach a "measured" section
  int grad_accum_scale = 1;           // multiplies micro-batches per step (more spans: big traces)
  int units = 8;                      // FSDP units (transformer blocks) in the model
};

// The step model of plan variant `v` (0..7) as a SimResult, with or without trace/timeline.
sim::SimResult fixture_result(int v, const FixtureOptions& opt, bool with_trace);
// A complete plan.json document ("fsdpsim.plan/1") with a fixed context block.
nlohmann::json fixture_plan_doc(const FixtureOptions& opt = {});
// A simulate --json document ("fsdpsim.simulate/1").
nlohmann::json fixture_simulate_doc();

// Path helpers: FSDPSIM_SOURCE_DIR / FSDPSIM_BINARY_DIR from the test's compile definitions.
std::string source_path(const std::string& rel);
std::string artifact_dir();   // <build>/test-artifacts (created)
std::string read_file(const std::string& path);
// Compares `actual` with the golden file; FSDPSIM_UPDATE_GOLDEN=1 rewrites it instead.
// Returns "" when equal, else a message naming the first differing byte.
std::string check_golden(const std::string& rel_path, const std::string& actual);

}  // namespace fsdpsim::reports::fixture
