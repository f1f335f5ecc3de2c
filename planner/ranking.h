// Ranking and the Pareto front over simulated candidates (pure functions of the evaluations).
// Order: plans that fit with the memory margin by predicted tokens/s per GPU (descending), then
// lower peak device memory, then candidate index; then plans that fit only without the margin (same
// keys); then plans that do not fit, by peak memory ascending (closest to fitting first), then index.
// The recommendation (note "recommendation rule", copied into the README) is chosen among the plans
// that fit with the margin and comes first in the order:
//  * ties: plans within RankPolicy::tie_fraction of the fastest plan's tokens/s count as tied, and
//    walking them from the fastest, a plan that needs at least tie_min_saving less memory than the one
//    chosen so far replaces it (the most headroom, without trading speed for a few MiB) - a difference
//    smaller than the simulator's measured throughput error (README "How accurate is it": 5-8%
//    MAPE) is no reason to give up memory;
//  * CPU offload: a plan with CPU offload is recommended only when no plan without it fits, or when
//    it is faster than the best plan without offload by more than RankPolicy::offload_min_gain
//    (offload adds host-memory, PCIe and CPU contention that one step's simulation does not see).
// Pareto front: plans that fit with the margin and that no other such plan beats on both peak
// memory (<=) and throughput (>, or == with lower memory); listed by increasing memory.
#pragma once
#include <vector>

#include "planner/search.h"

namespace fsdpsim::planner {

struct RankPolicy {
  // 1%: well under the simulator's measured tokens/s error (5.1-7.6% MAPE, README), so "tied" never
  // hides a difference the simulator can resolve.
  double tie_fraction = 0.01;
  // A tied plan replaces a faster one only when it frees at least this much memory (1 GiB, the
  // threshold the explanations call a difference, sensitivity.h).
  Bytes tie_min_saving = kGiB;
  // 10%: more than the largest measured per-GPU-type throughput error (7.6%, README) - a gain the
  // prediction can vouch for.
  double offload_min_gain = 0.10;
  std::vector<bool> cpu_offload;   // per candidate (empty: no candidate offloads)
};

struct Ranking {
  std::vector<int> order;       // candidate indices of simulated plans, the recommendation first
  int recommended = -1;         // candidate index, -1 if nothing fits with the margin
  int fastest = -1;             // the fastest plan that fits with the margin (may differ from recommended)
  int fastest_without_offload = -1;
  std::vector<int> pareto;      // candidate indices, by increasing peak memory
};

Ranking rank_candidates(const std::vector<Evaluation>& evals, const RankPolicy& policy = {});

}  // namespace fsdpsim::planner
