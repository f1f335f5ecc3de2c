// `fsdpsim compare A B`: two plans side by side ("my config vs the recommended one") with their
// differences explained (note "compare", copied into the README). The plan keys that differ are
// grouped by what they decide together (the sharding layout; precision; the micro-batch split;
// prefetching; every other key alone); for each group, A with B's values for that group is simulated,
// so each difference gets its own share of the tokens/s and memory change. The shares need not add
// up to the total: the groups interact (a larger micro-batch needs the checkpointing that makes it fit).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "program/plan.h"
#include "program/sim_result.h"

namespace fsdpsim::planner {

struct CompareSide {
  std::string name;              // "A", "B"
  std::string source;            // how it was given (a path, "plan.json recommended", inline JSON)
  sim::Plan plan;                // resolved
  sim::SimResult result;
  bool fits_with_margin = false;
};

struct GroupDiff {
  std::string group;             // "sharding layout", "precision", "micro-batch split", "prefetch", or the key
  std::vector<std::string> keys; // the plan keys that differ, "key: A -> B"
  bool simulated = false;
  sim::SimResult result;         // A with B's values for this group
  double tokens_gain = 0;        // vs A
  Bytes memory_delta = 0;        // vs A (peak device memory)
  bool fits_with_margin = false;
  std::string why;               // difference_text(A, A-with-this-group)
  std::string error;             // the mixed plan is not valid
};

struct Comparison {
  CompareSide a, b;
  double margin = 0.05;
  std::vector<GroupDiff> diffs;  // by |tokens_gain| descending
  std::string overall;           // difference_text(A, B)
};

using CompareSimulateFn = std::function<sim::SimResult(const sim::Plan&)>;

Comparison compare_plans(const calibrate::HardwareProfile& hw, CompareSide a, CompareSide b, double margin,
                         const CompareSimulateFn& simulate);
std::string compare_text(const Comparison& c);
nlohmann::json compare_json(const Comparison& c);

}  // namespace fsdpsim::planner
