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
  std::vector<std::string> choices;                   // the recommendation's choices that matter (sensitivity.h)
  std::string ddp_baseline;                           // DDP (NO_SHARD) against the recommendation
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
  const sim::SimResult* detail = nullptr;             // the recommendation re-simulated with its trace
  double tie_fraction = 0.01;                         // RankPolicy's, for the words
  double offload_min_gain = 0.10;
};

Explanations explain(const ExplainInput& in);

// Helpers shared with diagnose.
std::string gib_text(Bytes b);                 // "12.3 GiB"
std::string pct_text(double fraction);          // "38%"

// Memory words, one definition for simulate, plan, diagnose, fit, compare and the report (note
// "headroom and margin", copied into the README):
//   capacity  the GPU's memory;
//   margin    a fraction of capacity kept free for what no model sees (allocator spikes, other
//             processes, driver growth); 5% unless --memory-margin says otherwise;
//   usable    capacity x (1 - margin): what a plan may use;
//   peak      the peak device memory: the caching allocator's reserved bytes + the CUDA/NCCL context
//             (what nvidia-smi shows);
//   headroom  usable - peak; a plan fits when headroom >= 0 and the simulator says it fits (SimResult::fits
//             also checks what is not on the GPU, e.g. host memory).
struct MemoryVerdict {
  Bytes capacity = 0, usable = 0, peak = 0;
  double margin = 0;
  bool fits = false;               // headroom >= 0 and the simulator's own verdict
  Bytes headroom() const { return usable - peak; }
};
MemoryVerdict memory_verdict(const sim::SimResult& r, double margin);
// "peak 70.2 GiB of 80.0 GiB: 5.8 GiB headroom under the 76.0 GiB usable (capacity less the 5% margin)",
// or "... 14.1 GiB over the 76.0 GiB usable (...)"; the simulator's own reason is appended when it says
// the plan does not fit for another reason.
std::string memory_text(const sim::SimResult& r, double margin);
// What makes result b differ from result a (b's figures first): the step-time component that
// changed most, in words ("exposed communication 2.1 s (30% of its step) vs 0.1 s").
std::string difference_text(const sim::SimResult& a, const sim::SimResult& b, const sim::Plan& pa, const sim::Plan& pb);
// One line of the headline numbers: tokens/s, MFU, step time, and memory_text.
std::string describe_result(const sim::SimResult& r, double margin);

}  // namespace fsdpsim::planner
