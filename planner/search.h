// The search engine: prune by the memory lower bound, order by the throughput upper bound, skip
// dominated candidates, simulate the rest in parallel (note "dominance in order").
//
// Dominance in order: candidates are taken in order of decreasing throughput upper bound (ties:
// candidate index). A candidate is skipped when a plan BEFORE it in that order, itself kept, fits with
// the margin, needs no more memory than the candidate's lower bound and is strictly faster than the
// candidate's upper bound (a plan with CPU offload dominates only plans with offload, see ranking.h):
// the candidate can be neither the recommendation nor on the Pareto front. On one thread every plan
// before a candidate has finished when it is taken, so nothing is simulated that is then skipped; on
// more, a worker decides with the plans finished so far and the search drops afterwards the results of
// candidates that a plan still running then dominates. The set of simulated plans is the same for any
// thread count and timing.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "common/units.h"
#include "planner/search_space.h"
#include "program/sim_result.h"

namespace fsdpsim::planner {

enum class EvalStatus { Simulated, PrunedMemory, SkippedDominated, Invalid, NotRun };
const char* eval_status_name(EvalStatus s);

struct Evaluation {
  EvalStatus status = EvalStatus::NotRun;
  Bytes memory_lower_bound = 0;
  double tokens_per_s_upper_bound = 0;
  sim::SimResult result;         // Simulated only
  bool fits_with_margin = false; // Simulated: result.fits and peak_total_device <= capacity * (1 - margin)
  std::string error;             // Invalid: why the simulator refused the plan
};

struct SearchOptions {
  int threads = 1;
  double memory_margin = 0.05;
  Bytes capacity = 0;            // per-GPU memory
  bool progress = false;         // draw a progress bar on stderr
};

struct SearchStats {
  int candidates_total = 0;
  int simulated = 0;
  int pruned_memory = 0;
  int skipped_dominated = 0;
  int invalid = 0;
  double seconds = 0;
  int threads = 1;
  bool interrupted = false;
};

using EvalFn = std::function<sim::SimResult(const sim::Plan&)>;  // must be thread-safe

struct SearchOutcome {
  std::vector<Evaluation> evals;  // indexed like the candidates
  SearchStats stats;
};

// usable capacity = capacity * (1 - margin); fits_with_margin compares peak_total_device with it.
Bytes usable_capacity(Bytes capacity, double margin);

SearchOutcome run_search(const std::vector<Candidate>& cands, const std::vector<Bytes>& memory_lower_bounds,
                         const std::vector<double>& tokens_per_s_upper_bounds, const EvalFn& eval,
                         const SearchOptions& opts);

}  // namespace fsdpsim::planner
