// Explanations from simulated numbers: why the recommendation wins, what each runner-up trades,
// and one reason per rejected family (note "explanations"). Every number quoted comes from a
// SimResult or a memory bound; nothing is asserted without one.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/hardware_profile.h"
#include "planner/bounds.h"
#include "planner/ranking.h"
#include "planner/search.h"
#include "planner/search_space.h"

namespace fsdpsim::planner {

struct FamilyVerdict {
  std::string family;
  std::string reason;
};

struct Explanations {
  std::vector<std::string> recommended;
  std::vector<std::vector<std::string>> runners_up;   // for ranking.order[1..top_k-1]
  std::vector<FamilyVerdict> rejected_families;
  std::vector<std::vector<std::string>> why;          // per candidate index (empty for most)
};

struct ExplainInput {
  const std::vector<Candidate>& cands;
  const std::vector<Evaluation>& evals;
  const Ranking& ranking;
  const std::vector<MemoryBound>& bounds;   // per candidate
  Bytes capacity = 0;
  double memory_margin = 0.05;
  const calibrate::Cluster& cluster;
  int top_k = 5;
};

Explanations explain(const ExplainInput& in);

// Helpers shared with diagnose.
std::string gib_text(Bytes b);                 // "12.3 GiB"
std::string pct_text(double fraction);          // "38%"
std::string describe_result(const sim::SimResult& r, Bytes usable);  // one line of the headline numbers

}  // namespace fsdpsim::planner
