// run_planner: enumerate -> bounds -> search (prune, order, skip, simulate in parallel) -> rank ->
// explain -> re-simulate the recommendation with its trace.
#include "planner/planner.h"

#include <cstdio>
#include <memory>
#include <sstream>

#include "common/errors.h"
#include "planner/export_expressible.h"
#include "planner/sensitivity.h"
#include "sim/simulator.h"

namespace fsdpsim::planner {

namespace {

// Each front-end's plan: the recommendation when it expresses it; otherwise the better of its nearest
// translation (simulated) and the fastest simulated candidate the front-end expresses unchanged, both
// judged like the ranking (fits with the margin first, then tokens/s).
std::vector<FrameworkPlan> framework_plans(const PlanRequest& req, const PlanOutcome& out, const EvalFn& simulate) {
  std::vector<FrameworkPlan> fps;
  const int rec = out.ranking.recommended;
  const Candidate& rc = out.candidates[static_cast<size_t>(rec)];
  for (const auto& fw : export_frameworks()) {
    FrameworkPlan f;
    f.framework = fw;
    Expressed e;
    try {
      e = express_plan(fw, rc.plan, req.cluster);
    } catch (const InputError& err) {   // the translation is not a valid plan here: carry the candidates' best
      e.plan = rc.plan;
      e.changes = {std::string("no valid translation of the recommendation (") + err.what() + ")"};
    }
    if (e.changes.empty()) {
      f.plan = rc.plan;
      f.label = rc.label;
      f.result = out.recommended_detail;
      f.fits_with_margin = true;
      f.source = "the recommendation";
      fps.push_back(f);
      continue;
    }
    f.same_as_recommended = false;
    f.plan = e.plan;
    f.label = label_of(e.plan);
    f.changes = e.changes;
    f.source = "its nearest translation";
    try {
      f.result = simulate(e.plan);
      f.fits_with_margin = memory_verdict(f.result, req.memory_margin).fits;
    } catch (const InputError&) {
      f.fits_with_margin = false;
    }
    for (int i : out.ranking.order) {
      const auto& ev = out.search.evals[static_cast<size_t>(i)];
      if (!ev.fits_with_margin) break;   // the order lists fitting plans first
      const Candidate& c = out.candidates[static_cast<size_t>(i)];
      bool as_is = false;
      try {
        as_is = express_plan(fw, c.plan, req.cluster).changes.empty();
      } catch (const InputError&) {
      }
      if (!as_is) continue;
      if (!f.fits_with_margin || ev.result.tokens_per_s_per_gpu > f.result.tokens_per_s_per_gpu) {
        f.plan = c.plan;
        f.label = c.label;
        f.result = ev.result;
        f.fits_with_margin = true;
        f.source = "candidate " + c.id + ", the fastest plan it expresses as is";
      }
      break;
    }
    fps.push_back(f);
  }
  return fps;
}

}  // namespace

EvalFn fast_simulate(const models::ModelSpec& model, const calibrate::HardwareProfile& hw) {
  sim::SimOptions o;
  o.record_trace = false;
  o.record_memory_timeline = false;
  // One Simulator per concurrent call (the search's threads), reused by later calls.
  auto pool = std::make_shared<sim::SimulatorPool>();
  return [&model, &hw, o, pool](const sim::Plan& p) { return pool->simulate(model, hw, p, o); };
}

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
  EvalFn simulate_fn = fast_simulate(req.model, req.hw);
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
      auto pool = std::make_shared<sim::SimulatorPool>();
      vary_sim = [&, pool](const sim::Plan& p, bool trace) {
        sim::SimOptions o = fast;
        o.record_trace = trace;
        return pool->simulate(req.model, req.hw, p, o);
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
  if (out.ranking.recommended >= 0) out.framework_plans = framework_plans(req, out, eval ? *eval : simulate_fn);
  if (out.ranking.recommended >= 0) {
    const sim::Plan& rp = out.candidates[static_cast<size_t>(out.ranking.recommended)].plan;
    out.explanations.choices = variation_lines(out.variations, req.memory_margin);
    out.explanations.ddp_baseline = ddp_baseline_line(out.variations, rp, out.recommended_detail, req.memory_margin);
  }
  return out;
}

std::string ranked_table(const PlanRequest& req, const PlanOutcome& out, const std::string& format) {
  std::ostringstream os;
  std::vector<int> rows;
  for (int i : out.ranking.order) {
    if (static_cast<int>(rows.size()) >= req.top_k) break;
    rows.push_back(i);
  }
  auto fits_word = [&](const Evaluation& e) { return e.fits_with_margin ? "yes" : (e.result.fits ? "inside margin" : "no"); };
  char line[768];
  if (format == "csv") {
    // RFC 4180: fields with a comma or a quote are quoted (labels have neither, families may not).
    auto q = [](const std::string& s) {
      if (s.find_first_of(",\"\n") == std::string::npos) return s;
      std::string r = "\"";
      for (char c : s) r += c == '"' ? std::string("\"\"") : std::string(1, c);
      return r + "\"";
    };
    os << "rank,id,plan,family,tokens_per_s_per_gpu,mfu,peak_total_device_gib,headroom_gib,step_time_s,exposed_comm_s,fits\n";
    for (size_t k = 0; k < rows.size(); ++k) {
      const auto& e = out.search.evals[static_cast<size_t>(rows[k])];
      const auto& c = out.candidates[static_cast<size_t>(rows[k])];
      const MemoryVerdict v = memory_verdict(e.result, req.memory_margin);
      std::snprintf(line, sizeof(line), "%zu,%s,%s,%s,%.1f,%.4f,%.3f,%.3f,%.4f,%.4f,%s\n", k + 1, c.id.c_str(), q(c.label).c_str(),
                    q(c.family).c_str(), e.result.tokens_per_s_per_gpu, e.result.mfu, to_gib(e.result.peak_total_device),
                    to_gib(v.headroom()), to_seconds(e.result.step_time_ns), to_seconds(e.result.exposed_comm_ns), fits_word(e));
      os << line;
    }
    return os.str();
  }
  if (format == "markdown") {
    os << "| rank | id | plan | tokens/s per GPU | MFU | peak GiB | headroom GiB | step s | fits |\n"
          "|---:|---|---|---:|---:|---:|---:|---:|---|\n";
    for (size_t k = 0; k < rows.size(); ++k) {
      const auto& e = out.search.evals[static_cast<size_t>(rows[k])];
      const auto& c = out.candidates[static_cast<size_t>(rows[k])];
      const MemoryVerdict v = memory_verdict(e.result, req.memory_margin);
      std::snprintf(line, sizeof(line), "| %zu | %s | `%s` | %.0f | %.1f%% | %.1f | %.1f | %.3f | %s |\n", k + 1, c.id.c_str(),
                    c.label.c_str(), e.result.tokens_per_s_per_gpu, 100 * e.result.mfu, to_gib(e.result.peak_total_device),
                    to_gib(v.headroom()), to_seconds(e.result.step_time_ns), fits_word(e));
      os << line;
    }
    return os.str();
  }
  size_t w = 4;
  for (int i : rows) w = std::max(w, out.candidates[static_cast<size_t>(i)].label.size());
  const int lw = static_cast<int>(w);
  std::snprintf(line, sizeof(line), "%-4s %-6s %-*s %10s %6s %9s %9s\n", "rank", "id", lw, "plan", "tok/s/GPU", "MFU", "peak GiB", "step s");
  os << line;
  for (size_t k = 0; k < rows.size(); ++k) {
    const auto& e = out.search.evals[static_cast<size_t>(rows[k])];
    const auto& c = out.candidates[static_cast<size_t>(rows[k])];
    std::snprintf(line, sizeof(line), "%-4zu %-6s %-*s %10.0f %5.1f%% %9.1f %9.3f%s\n", k + 1, c.id.c_str(), lw, c.label.c_str(),
                  e.result.tokens_per_s_per_gpu, 100 * e.result.mfu, to_gib(e.result.peak_total_device),
                  to_seconds(e.result.step_time_ns), e.fits_with_margin ? "" : (e.result.fits ? "  (inside margin)" : "  (does not fit)"));
    os << line;
  }
  return os.str();
}

std::string summary_table(const PlanRequest& req, const PlanOutcome& out) {
  std::ostringstream os;
  const auto& st = out.search.stats;
  if (req.table_format == "csv") return ranked_table(req, out, "csv");
  char line[512];
  std::snprintf(line, sizeof(line),
                "%d candidates: %d simulated, %d pruned by the memory bound, %d skipped as dominated, %d invalid "
                "(%.2f s, %d threads)\n",
                st.candidates_total, st.simulated, st.pruned_memory, st.skipped_dominated, st.invalid, st.seconds, st.threads);
  os << line;
  if (!req.space.batch.note.empty()) os << "note: " << req.space.batch.note << "\n";
  if (req.table_format == "markdown") os << "\n";
  os << ranked_table(req, out, req.table_format);
  if (req.table_format == "markdown") os << "\n";
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
