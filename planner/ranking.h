// Ranking and the Pareto front over simulated candidates (pure functions of the evaluations).
// Order: plans that fit with the memory margin by predicted tokens/s per GPU (descending), then
// lower peak device memory, then candidate index; then plans that fit only without the margin (same
// keys); then plans that do not fit, by peak memory ascending (closest to fitting first), then index.
// The recommendation is the first plan that fits with the margin (none: -1).
// Pareto front: plans that fit with the margin and that no other such plan beats on both peak
// memory (<=) and throughput (>, or == with lower memory); listed by increasing memory.
#pragma once
#include <vector>

#include "planner/search.h"

namespace fsdpsim::planner {

struct Ranking {
  std::vector<int> order;       // candidate indices of simulated plans, best first
  int recommended = -1;         // candidate index, -1 if nothing fits with the margin
  std::vector<int> pareto;      // candidate indices, by increasing peak memory
};

Ranking rank_candidates(const std::vector<Evaluation>& evals);

}  // namespace fsdpsim::planner
