// run_planner: enumerate -> bounds -> search (prune, order, skip, simulate in parallel) -> rank ->
// explain -> re-simulate the recommendation with its trace.
#include "planner/planner.h"

#include <cstdio>
#include <sstream>

#include "planner/sensitivity.h"
#include "sim/simulator.h"

namespace fsdpsim::planner {

PlanOutcome run_planner(const PlanRequest& req, const EvalFn* eval) {
  PlanOutcome out;
  const auto& cl = req.cluster;
  out.candidates = enumerate_candidates(req.space, cl.nodes, cl.gpus_per_node);
  Bounds bounds(req.model, req.hw, req.space.base.auto_wrap_policy);
  std::vector<Bytes> lb;
  std::vector<double> ub;
  out.bounds.reserve(out.candidates.size());
  for (const auto& c : out.candidates) {
    out.bounds.push_back(bounds.memory(c.plan));
    lb.push_back(out.bounds.back().total());
    ub.push_back(bounds.tokens_per_s_per_gpu_upper(c.plan));
  }
  sim::SimOptions fast;
  fast.record_trace = false;
  fast.record_memory_timeline = false;
  EvalFn simulate_fn = [&](const sim::Plan& p) { return sim::simulate(req.model, req.hw, p, fast); };
  SearchOptions so;
  so.threads = req.threads;
  so.memory_margin = req.memory_margin;
  so.capacity = req.hw.memory_capacity();
  so.progress = req.progress;
  out.search = run_search(out.candidates, lb, ub, eval ? *eval : simulate_fn, so);
  if (out.search.stats.interrupted) return out;
  RankPolicy policy;
  for (const auto& c : out.candidates) policy.cpu_offload.push_back(c.plan.cpu_offload.params || c.plan.cpu_offload.optimizer);
  out.ranking = rank_candidates(out.search.evals, policy);
  ExplainInput ei{out.candidates, out.search.evals, out.ranking, out.bounds, so.capacity, req.memory_margin, cl, req.top_k};
  ei.tie_fraction = policy.tie_fraction;
  ei.offload_min_gain = policy.offload_min_gain;
  if (out.ranking.recommended >= 0) {
    const sim::Plan& rp = out.candidates[static_cast<size_t>(out.ranking.recommended)].plan;
    SimulateWithTrace vary_sim;
    if (!eval) {
      out.recommended_detail = sim::simulate(req.model, req.hw, rp, sim::SimOptions{});
      vary_sim = [&](const sim::Plan& p, bool trace) {
        sim::SimOptions o = fast;
        o.record_trace = trace;
        return sim::simulate(req.model, req.hw, p, o);
      };
    } else {
      out.recommended_detail = out.search.evals[static_cast<size_t>(out.ranking.recommended)].result;
      vary_sim = [eval](const sim::Plan& p, bool) { return (*eval)(p); };
    }
    out.has_detail = true;
    ei.detail = &out.recommended_detail;
    out.variations = vary_plan(rp, out.recommended_detail, cl, req.memory_margin, vary_sim);
  }
  out.explanations = explain(ei);
  if (out.ranking.recommended >= 0) {
    const sim::Plan& rp = out.candidates[static_cast<size_t>(out.ranking.recommended)].plan;
    out.explanations.choices = variation_lines(out.variations, req.memory_margin);
    out.explanations.ddp_baseline = ddp_baseline_line(out.variations, rp, out.recommended_detail, req.memory_margin);
  }
  return out;
}

std::string summary_table(const PlanRequest& req, const PlanOutcome& out) {
  std::ostringstream os;
  const auto& st = out.search.stats;
  char line[512];
  std::snprintf(line, sizeof(line),
                "%d candidates: %d simulated, %d pruned by the memory bound, %d skipped as dominated, %d invalid "
                "(%.2f s, %d threads)\n",
                st.candidates_total, st.simulated, st.pruned_memory, st.skipped_dominated, st.invalid, st.seconds, st.threads);
  os << line;
  if (!req.space.batch.note.empty()) os << "note: " << req.space.batch.note << "\n";
  std::snprintf(line, sizeof(line), "%-4s %-6s %-78s %10s %6s %9s %9s\n", "rank", "id", "plan", "tok/s/GPU", "MFU",
                "peak GiB", "step s");
  os << line;
  int k = 0;
  for (int i : out.ranking.order) {
    if (k >= req.top_k) break;
    const auto& e = out.search.evals[static_cast<size_t>(i)];
    const auto& c = out.candidates[static_cast<size_t>(i)];
    std::snprintf(line, sizeof(line), "%-4d %-6s %-78s %10.0f %5.1f%% %9.1f %9.3f%s\n", k + 1, c.id.c_str(),
                  c.label.substr(0, 78).c_str(), e.result.tokens_per_s_per_gpu, 100 * e.result.mfu,
                  to_gib(e.result.peak_total_device), to_seconds(e.result.step_time_ns),
                  e.fits_with_margin ? "" : (e.result.fits ? "  (inside margin)" : "  (does not fit)"));
    os << line;
    ++k;
  }
  if (out.ranking.recommended < 0) {
    os << "No plan fits in " << gib_text(req.hw.memory_capacity()) << " per GPU with a "
       << pct_text(req.memory_margin) << " margin.\n";
    for (const auto& f : out.explanations.rejected_families) os << "  " << f.family << ": " << f.reason << "\n";
  } else {
    os << "Recommended: " << out.candidates[static_cast<size_t>(out.ranking.recommended)].label << "\n";
    for (const auto& l : out.explanations.recommended) os << "  " << l << "\n";
    if (!out.explanations.ddp_baseline.empty()) os << out.explanations.ddp_baseline << "\n";
    if (!out.explanations.choices.empty()) {
      os << "Each choice of the recommendation changed alone (simulated):\n";
      for (const auto& l : out.explanations.choices) os << "  - " << l << "\n";
    }
  }
  return os.str();
}

}  // namespace fsdpsim::planner
