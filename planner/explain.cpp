// Explanations (see explain.h).
#include "planner/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace fsdpsim::planner {

std::string gib_text(Bytes b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", to_gib(b));
  return buf;
}
std::string pct_text(double f) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * f);
  return buf;
}
static std::string num(double v, const char* fmt = "%.0f") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

static double exposed_fraction(const sim::SimResult& r) {
  return r.step_time_ns > 0 ? static_cast<double>(r.exposed_comm_ns) / static_cast<double>(r.step_time_ns) : 0.0;
}
static double recompute_fraction(const sim::SimResult& r) {
  if (r.hardware_flops_per_step_per_gpu <= 0) return 0;
  return std::max(0.0, 1.0 - r.model_flops_per_step_per_gpu / r.hardware_flops_per_step_per_gpu);
}

MemoryVerdict memory_verdict(const sim::SimResult& r, double margin) {
  MemoryVerdict v;
  v.capacity = r.capacity;
  v.margin = margin;
  v.usable = usable_capacity(r.capacity, margin);
  v.peak = r.peak_total_device;
  v.fits = r.fits && v.peak <= v.usable;
  return v;
}

std::string memory_text(const sim::SimResult& r, double margin) {
  const MemoryVerdict v = memory_verdict(r, margin);
  std::string usable = gib_text(v.usable) + " usable (" +
                       (margin > 0 ? "capacity less the " + pct_text(margin) + " margin" : std::string("no margin")) + ")";
  std::string s = "peak " + gib_text(v.peak) + " of " + gib_text(v.capacity) + ": ";
  s += v.headroom() >= 0 ? gib_text(v.headroom()) + " headroom under the " + usable
                         : gib_text(-v.headroom()) + " over the " + usable;
  if (v.headroom() >= 0 && !r.fits) {
    // The simulator refused it for another reason (host memory, say): its note says which.
    for (const auto& n : r.notes)
      if (n.rfind("does not fit", 0) == 0) return s + "; " + n;
    return s + "; the simulator says it does not fit";
  }
  return s;
}

std::string describe_result(const sim::SimResult& r, double margin) {
  return num(r.tokens_per_s_per_gpu) + " tokens/s per GPU, MFU " + pct_text(r.mfu) + " (of " + num(r.peak_flops / 1e12) +
         " TFLOP/s dense " + r.peak_flops_dtype + "), step " + num(to_seconds(r.step_time_ns), "%.3f") + " s; " +
         memory_text(r, margin);
}

namespace {

// The largest difference between two results, in words. The step time splits into compute-stream
// busy time, exposed communication, and the rest (the GPU idle for other reasons: CPU issue, the rate
// limiter, offload syncs); the component that changed most is named.
std::string main_difference(const sim::SimResult& a, const sim::SimResult& b, const Candidate& ca, const Candidate& cb) {
  auto other = [](const sim::SimResult& r) { return r.step_time_ns - r.compute_ns - r.exposed_comm_ns; };
  double d_step = to_seconds(b.step_time_ns - a.step_time_ns);
  double d_exposed = to_seconds(b.exposed_comm_ns - a.exposed_comm_ns);
  double d_compute = to_seconds(b.compute_ns - a.compute_ns);
  double d_other = to_seconds(other(b) - other(a));
  if (a.step_time_ns > 0 && std::fabs(d_step) < 5e-4 * to_seconds(a.step_time_ns))
    return "the same predicted step time (" + num(to_seconds(b.step_time_ns), "%.3f") + " s): the settings that differ do not change this step";
  std::string why;
  if (std::fabs(d_exposed) >= std::fabs(d_compute) && std::fabs(d_exposed) >= std::fabs(d_other)) {
    why = "exposed communication " + num(to_seconds(b.exposed_comm_ns), "%.3f") + " s (" + pct_text(exposed_fraction(b)) +
          " of its step) vs " + num(to_seconds(a.exposed_comm_ns), "%.3f") + " s";
  } else if (std::fabs(d_compute) >= std::fabs(d_other)) {
    why = "compute " + num(to_seconds(b.compute_ns), "%.3f") + " s vs " + num(to_seconds(a.compute_ns), "%.3f") + " s";
    double rb = recompute_fraction(b), ra = recompute_fraction(a);
    if (std::fabs(rb - ra) > 0.01) why += " (recomputation " + pct_text(rb) + " vs " + pct_text(ra) + " of FLOPs)";
    else if (cb.plan.micro_batch != ca.plan.micro_batch)
      why += " (micro-batch " + std::to_string(cb.plan.micro_batch) + " vs " + std::to_string(ca.plan.micro_batch) + ")";
  } else {
    why = "GPU idle without waiting on communication " + num(to_seconds(other(b)), "%.3f") + " s vs " +
          num(to_seconds(other(a)), "%.3f") + " s (CPU issue: hooks, the rate limiter, offload copies and syncs)";
  }
  return why;
}

std::string fabric_of(const Candidate& c, const calibrate::Cluster& cl) {
  if (c.plan.mesh_shard > cl.gpus_per_node && !cl.inter_node.empty()) return cl.inter_node;
  if (c.plan.mesh_replicate > 1 && cl.nodes > 1 && !cl.inter_node.empty()) return cl.inter_node;
  return cl.intra_node.empty() ? "the intra-node fabric" : cl.intra_node;
}

}  // namespace

Explanations explain(const ExplainInput& in) {
  Explanations ex;
  ex.why.resize(in.cands.size());
  const Bytes usable = usable_capacity(in.capacity, in.memory_margin);
  const auto& order = in.ranking.order;
  const int rec = in.ranking.recommended;

  if (rec >= 0) {
    const auto& r = in.evals[static_cast<size_t>(rec)].result;
    const auto& c = in.cands[static_cast<size_t>(rec)];
    ex.recommended.push_back("Predicted " + describe_result(r, in.memory_margin) + ".");
    ex.recommended.push_back("Exposed communication " + num(to_seconds(r.exposed_comm_ns), "%.3f") + " s = " +
                             pct_text(exposed_fraction(r)) + " of the step (collectives busy " +
                             num(to_seconds(r.comm_ns), "%.3f") + " s, the rest hidden behind compute) over " +
                             fabric_of(c, in.cluster) + ".");
    double rf = recompute_fraction(r);
    ex.recommended.push_back(rf > 0.005 ? "Activation checkpointing (" + checkpointing_text(c.plan.activation_checkpointing) +
                                              ") recomputes " + pct_text(rf) + " of the step's FLOPs."
                                        : "No recomputation: activations fit without checkpointing.");
    if (order.size() > 1 && in.evals[static_cast<size_t>(order[1])].fits_with_margin) {
      const auto& r2 = in.evals[static_cast<size_t>(order[1])].result;
      const auto& c2 = in.cands[static_cast<size_t>(order[1])];
      double gain = r2.tokens_per_s_per_gpu > 0 ? r.tokens_per_s_per_gpu / r2.tokens_per_s_per_gpu - 1.0 : 0.0;
      ex.recommended.push_back("Beats the runner-up " + c2.id + " (" + c2.label + ") by " + num(100 * gain, "%.1f") +
                               "% tokens/s: " + main_difference(r, r2, c, c2) + ".");
    }
    ex.why[static_cast<size_t>(rec)] = ex.recommended;
  }

  // Runners-up: the next top_k - 1 plans of the ranking.
  for (size_t k = 1; k < order.size() && static_cast<int>(k) < in.top_k; ++k) {
    int i = order[k];
    const auto& e = in.evals[static_cast<size_t>(i)];
    const auto& c = in.cands[static_cast<size_t>(i)];
    std::vector<std::string> lines;
    lines.push_back(describe_result(e.result, in.memory_margin) + ".");
    if (rec >= 0) {
      const auto& r = in.evals[static_cast<size_t>(rec)].result;
      double d = r.tokens_per_s_per_gpu > 0 ? e.result.tokens_per_s_per_gpu / r.tokens_per_s_per_gpu - 1.0 : 0;
      Bytes dm = e.result.peak_total_device - r.peak_total_device;
      lines.push_back(num(100 * d, "%+.1f") + "% tokens/s and " + (dm >= 0 ? "+" : "-") + gib_text(dm >= 0 ? dm : -dm) +
                      " memory vs the recommendation: " +
                      main_difference(r, e.result, in.cands[static_cast<size_t>(rec)], c) + ".");
    }
    if (!e.fits_with_margin)
      lines.push_back(e.result.fits ? "Fits only inside the safety margin." : "Does not fit.");
    ex.runners_up.push_back(lines);
    ex.why[static_cast<size_t>(i)] = lines;
  }

  // Families: best fitting plan per family, else the smallest memory lower bound / simulated peak.
  std::map<std::string, int> best_fit, smallest;
  for (size_t i = 0; i < in.cands.size(); ++i) {
    const auto& f = in.cands[i].family;
    const auto& e = in.evals[i];
    if (e.status == EvalStatus::Simulated && e.fits_with_margin) {
      auto it = best_fit.find(f);
      if (it == best_fit.end() ||
          e.result.tokens_per_s_per_gpu > in.evals[static_cast<size_t>(it->second)].result.tokens_per_s_per_gpu)
        best_fit[f] = static_cast<int>(i);
    }
    auto mem = [&](size_t j) {
      const auto& ej = in.evals[j];
      return ej.status == EvalStatus::Simulated ? ej.result.peak_total_device : in.bounds[j].total();
    };
    auto it = smallest.find(f);
    if (it == smallest.end() || mem(i) < mem(static_cast<size_t>(it->second))) smallest[f] = static_cast<int>(i);
  }
  const std::string rec_family = rec >= 0 ? in.cands[static_cast<size_t>(rec)].family : "";
  for (const auto& [fam, idx] : smallest) {
    if (fam == rec_family) continue;
    FamilyVerdict v{fam, ""};
    auto bf = best_fit.find(fam);
    if (bf == best_fit.end()) {
      const auto& b = in.bounds[static_cast<size_t>(idx)];
      Bytes persistent = b.context + b.sharded_params + b.sharded_grads + b.optimizer_state;
      auto [what, bytes] = b.largest_component();
      if (b.optimizer_state > usable)
        v.reason = "optimizer state alone needs " + gib_text(b.optimizer_state) + " > " + gib_text(usable) +
                   " usable per GPU";
      else if (persistent > usable)
        v.reason = "sharded params + grads + optimizer state need " + gib_text(persistent) + " > " + gib_text(usable) +
                   " usable per GPU";
      else {
        const auto& e = in.evals[static_cast<size_t>(idx)];
        Bytes need = e.status == EvalStatus::Simulated ? e.result.peak_total_device : b.total();
        v.reason = "its smallest plan (" + in.cands[static_cast<size_t>(idx)].label + ") needs " +
                   (e.status == EvalStatus::Simulated ? "" : "at least ") + gib_text(need) + " > " + gib_text(usable) +
                   " usable per GPU; largest part: " + what + " " + gib_text(bytes);
      }
    } else if (rec >= 0) {
      int i = bf->second;
      const auto& r = in.evals[static_cast<size_t>(rec)].result;
      const auto& e = in.evals[static_cast<size_t>(i)].result;
      const auto& cr = in.cands[static_cast<size_t>(rec)];
      double d = r.tokens_per_s_per_gpu > 0 ? 1.0 - e.tokens_per_s_per_gpu / r.tokens_per_s_per_gpu : 0;
      v.reason = "best plan " + in.cands[static_cast<size_t>(i)].id + " (" + in.cands[static_cast<size_t>(i)].label +
                 ") reaches " + num(e.tokens_per_s_per_gpu) + " tokens/s per GPU, " + num(100 * d, "%.1f") +
                 "% below the recommendation: " + main_difference(r, e, cr, in.cands[static_cast<size_t>(i)]);
      if (exposed_fraction(e) > exposed_fraction(r) + 0.05)
        v.reason += " over " + fabric_of(in.cands[static_cast<size_t>(i)], in.cluster) + " - " + strategy_text(strategy_of(cr.plan)) +
                    " mesh (" + std::to_string(cr.plan.mesh_replicate) + ", " + std::to_string(cr.plan.mesh_shard) +
                    ") hides it";
    } else {
      continue;
    }
    ex.rejected_families.push_back(v);
  }
  return ex;
}

}  // namespace fsdpsim::planner
