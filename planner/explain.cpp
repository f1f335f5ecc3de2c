// Explanations (see explain.h).
#include "planner/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "planner/comm_words.h"

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

// The largest difference between two results, in words. The step time splits into compute-stream
// busy time, exposed communication, and the rest (the GPU idle for other reasons: CPU issue, the rate
// limiter, offload syncs); the component that changed most is named.
std::string difference_text(const sim::SimResult& a, const sim::SimResult& b, const sim::Plan& pa, const sim::Plan& pb) {
  auto other = [](const sim::SimResult& r) { return r.step_time_ns - r.compute_ns - r.exposed_comm_ns; };
  double d_step = to_seconds(b.step_time_ns - a.step_time_ns);
  double d_exposed = to_seconds(b.exposed_comm_ns - a.exposed_comm_ns);
  double d_compute = to_seconds(b.compute_ns - a.compute_ns);
  double d_other = to_seconds(other(b) - other(a));
  if (a.step_time_ns > 0 && std::fabs(d_step) < 5e-4 * to_seconds(a.step_time_ns)) {
    std::string s = "the same predicted step time (" + num(to_seconds(b.step_time_ns), "%.3f") + " s)";
    Bytes dm = b.peak_total_device - a.peak_total_device;
    if (dm != 0) s += " with " + gib_text(dm > 0 ? dm : -dm) + (dm > 0 ? " more" : " less") + " memory";
    return s;
  }
  std::string why;
  if (std::fabs(d_exposed) >= std::fabs(d_compute) && std::fabs(d_exposed) >= std::fabs(d_other)) {
    why = "exposed communication " + num(to_seconds(b.exposed_comm_ns), "%.3f") + " s (" + pct_text(exposed_fraction(b)) +
          " of its step) vs " + num(to_seconds(a.exposed_comm_ns), "%.3f") + " s";
  } else if (std::fabs(d_compute) >= std::fabs(d_other)) {
    why = "compute " + num(to_seconds(b.compute_ns), "%.3f") + " s vs " + num(to_seconds(a.compute_ns), "%.3f") + " s";
    double rb = recompute_fraction(b), ra = recompute_fraction(a);
    if (std::fabs(rb - ra) > 0.01) why += " (recomputation " + pct_text(rb) + " vs " + pct_text(ra) + " of FLOPs)";
    else if (pb.micro_batch != pa.micro_batch)
      why += " (micro-batch " + std::to_string(pb.micro_batch) + " vs " + std::to_string(pa.micro_batch) + ")";
    else if (pb.param_dtype != pa.param_dtype)
      why += " (matmuls in " + std::string(dtype_name(pb.param_dtype)) + " vs " + std::string(dtype_name(pa.param_dtype)) + ")";
  } else {
    why = "GPU idle without waiting on communication " + num(to_seconds(other(b)), "%.3f") + " s vs " +
          num(to_seconds(other(a)), "%.3f") + " s (CPU issue: hooks, the rate limiter, offload copies and syncs)";
  }
  return why;
}

namespace {

std::string main_difference(const sim::SimResult& a, const sim::SimResult& b, const Candidate& ca, const Candidate& cb) {
  return difference_text(a, b, ca.plan, cb.plan);
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
    const sim::SimResult& d = in.detail ? *in.detail : r;
    ex.recommended.push_back("Predicted " + describe_result(r, in.memory_margin) + ".");
    std::string comm = "Exposed communication " + num(to_seconds(r.exposed_comm_ns), "%.3f") + " s = " +
                       pct_text(exposed_fraction(r)) + " of the step (collectives busy " + num(to_seconds(r.comm_ns), "%.3f") +
                       " s, the rest hidden behind compute) over " + fabric_of(c, in.cluster) + ".";
    const std::string across = inter_node_text(c.plan, d, in.cluster);
    if (!across.empty()) comm += " Across nodes (" + in.cluster.inter_node + "): " + across + ".";
    else if (in.cluster.nodes > 1) comm += " No collective crosses nodes except what the mesh needs.";
    ex.recommended.push_back(comm);
    // (simulate's note says the same at length, sim/simulator.cpp)
    if (sim::cpu_bound(r))
      ex.recommended.push_back("CPU-bound: the CPU issues eager ops for " + num(to_seconds(r.cpu_issue_ns), "%.3f") +
                               " s of the step against " + num(to_seconds(r.compute_ns), "%.3f") +
                               " s of GPU compute; this step time rests on the host and the PyTorch version (the "
                               "profile's fitted CPU cost per op) more than on the GPU.");
    const double rf = recompute_fraction(r);
    const auto& ac = c.plan.activation_checkpointing;
    const std::string ac_name = "Activation checkpointing (" + sim::checkpointing_text(ac) + ")";
    if (ac.mode == sim::ActivationCheckpointing::Mode::None)
      ex.recommended.push_back("No recomputation: activations fit without checkpointing.");
    else if (rf > 0.005)
      ex.recommended.push_back(ac_name + " recomputes " + pct_text(rf) + " of the step's FLOPs.");
    else   // selective op AC saves the matmul and attention outputs: what it recomputes is elementwise
      ex.recommended.push_back(ac_name + " recomputes under 0.5% of the step's FLOPs (the ops it does not save "
                               "are cheap) and frees their activations.");
    const int fast = in.ranking.fastest, fast_no = in.ranking.fastest_without_offload;
    auto label = [&](int i) { return in.cands[static_cast<size_t>(i)].id + " (" + in.cands[static_cast<size_t>(i)].label + ")"; };
    auto tps = [&](int i) { return in.evals[static_cast<size_t>(i)].result.tokens_per_s_per_gpu; };
    auto peak = [&](int i) { return in.evals[static_cast<size_t>(i)].result.peak_total_device; };
    if (fast >= 0 && fast != rec && fast != fast_no && in.cands[static_cast<size_t>(fast)].plan.cpu_offload.params &&
        !c.plan.cpu_offload.params)
      ex.recommended.push_back("The fastest plan " + label(fast) + " offloads to the CPU and is only " +
                               num(100 * (tps(fast) / std::max(1e-9, tps(fast_no)) - 1), "%.1f") +
                               "% faster than the best plan without offload; CPU offload is recommended only when nothing "
                               "else fits or it is " + pct_text(in.offload_min_gain) + " faster.");
    const int lead = (fast >= 0 && fast != rec && !(in.cands[static_cast<size_t>(fast)].plan.cpu_offload.params && !c.plan.cpu_offload.params))
                         ? fast : (fast_no >= 0 && fast_no != rec ? fast_no : -1);
    if (lead >= 0 && tps(lead) >= tps(rec))
      ex.recommended.push_back("Recommended over the faster " + label(lead) + ": " + num(tps(lead)) + " vs " + num(tps(rec)) +
                               " tokens/s per GPU is inside the " + pct_text(in.tie_fraction) + " tie window, and this plan needs " +
                               gib_text(peak(lead) - peak(rec)) + " less memory.");
    else if (order.size() > 1 && in.evals[static_cast<size_t>(order[1])].fits_with_margin &&
             in.evals[static_cast<size_t>(order[1])].result.tokens_per_s_per_gpu <= r.tokens_per_s_per_gpu) {
      const auto& r2 = in.evals[static_cast<size_t>(order[1])].result;
      const auto& c2 = in.cands[static_cast<size_t>(order[1])];
      double gain = r2.tokens_per_s_per_gpu > 0 ? r.tokens_per_s_per_gpu / r2.tokens_per_s_per_gpu - 1.0 : 0.0;
      if (gain < in.tie_fraction)
        ex.recommended.push_back("Ties with the runner-up " + c2.id + " (" + c2.label + "; within " + pct_text(in.tie_fraction) +
                                 " of its tokens/s), which has " + main_difference(r, r2, c, c2) + ".");
      else
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

  // Families: the best fitting plan per family, compared with the recommendation; a family with none
  // gets the reason its plans were left out, each reason true of what was done to them: simulated and
  // too large, pruned by the memory lower bound, skipped as dominated, or refused by the simulator.
  struct Fam {
    int best_fit = -1, smallest_sim = -1, smallest_pruned = -1, dominated = 0, invalid = 0, first_invalid = -1;
    double best_bound = 0;   // highest tokens/s upper bound among the dominated
  };
  std::map<std::string, Fam> fams;
  for (size_t i = 0; i < in.cands.size(); ++i) {
    Fam& f = fams[in.cands[i].family];
    const auto& e = in.evals[i];
    const int ii = static_cast<int>(i);
    switch (e.status) {
      case EvalStatus::Simulated:
        if (e.fits_with_margin && (f.best_fit < 0 || e.result.tokens_per_s_per_gpu >
                                                         in.evals[static_cast<size_t>(f.best_fit)].result.tokens_per_s_per_gpu))
          f.best_fit = ii;
        if (f.smallest_sim < 0 || e.result.peak_total_device < in.evals[static_cast<size_t>(f.smallest_sim)].result.peak_total_device)
          f.smallest_sim = ii;
        break;
      case EvalStatus::PrunedMemory:
        if (f.smallest_pruned < 0 || in.bounds[i].total() < in.bounds[static_cast<size_t>(f.smallest_pruned)].total()) f.smallest_pruned = ii;
        break;
      case EvalStatus::SkippedDominated:
        ++f.dominated;
        f.best_bound = std::max(f.best_bound, e.tokens_per_s_upper_bound);
        break;
      case EvalStatus::Invalid:
        if (f.invalid++ == 0) f.first_invalid = ii;
        break;
      case EvalStatus::NotRun: break;
    }
  }
  const std::string rec_family = rec >= 0 ? in.cands[static_cast<size_t>(rec)].family : "";
  const double rec_tps = rec >= 0 ? in.evals[static_cast<size_t>(rec)].result.tokens_per_s_per_gpu : 0;
  for (const auto& [fam, f] : fams) {
    if (fam == rec_family) continue;
    FamilyVerdict v{fam, ""};
    if (f.best_fit >= 0) {
      if (rec < 0) continue;
      const int i = f.best_fit;
      const auto& r = in.evals[static_cast<size_t>(rec)].result;
      const auto& e = in.evals[static_cast<size_t>(i)].result;
      const auto& cr = in.cands[static_cast<size_t>(rec)];
      double d = r.tokens_per_s_per_gpu > 0 ? 1.0 - e.tokens_per_s_per_gpu / r.tokens_per_s_per_gpu : 0;
      v.reason = "best plan " + in.cands[static_cast<size_t>(i)].id + " (" + in.cands[static_cast<size_t>(i)].label + ") reaches " +
                 num(e.tokens_per_s_per_gpu) + " tokens/s per GPU, " +
                 (d >= 0 ? num(100 * d, "%.1f") + "% below" : num(-100 * d, "%.1f") + "% above") + " the recommendation: " +
                 main_difference(r, e, cr, in.cands[static_cast<size_t>(i)]);
      if (exposed_fraction(e) > exposed_fraction(r) + 0.05)
        v.reason += " over " + fabric_of(in.cands[static_cast<size_t>(i)], in.cluster) + " - " + sim::strategy_name(sim::effective_strategy(cr.plan)) +
                    " mesh (" + std::to_string(cr.plan.mesh_replicate) + ", " + std::to_string(cr.plan.mesh_shard) + ") hides it";
      if (d < 0) v.reason += " (the recommendation needs less memory or avoids CPU offload: see why it was chosen)";
    } else if (f.smallest_sim >= 0) {
      const auto& e = in.evals[static_cast<size_t>(f.smallest_sim)].result;
      std::string what;
      Bytes most = -1;
      for (const auto& [k, b] : e.breakdown_at_peak)
        if (b > most) { most = b; what = k; }
      v.reason = "none of its simulated plans fits; the smallest (" + in.cands[static_cast<size_t>(f.smallest_sim)].label + ") has " +
                 memory_text(e, in.memory_margin) + "; largest part at the peak: " + what + " " + gib_text(most);
      if (f.dominated > 0)
        v.reason += "; " + std::to_string(f.dominated) + " more were not simulated (at most " + num(f.best_bound) +
                    " tokens/s per GPU, beaten by a simulated plan that fits in less memory)";
    } else if (f.smallest_pruned >= 0 && f.dominated == 0) {
      const auto& b = in.bounds[static_cast<size_t>(f.smallest_pruned)];
      Bytes persistent = b.context + b.sharded_params + b.sharded_grads + b.optimizer_state;
      auto [what, bytes] = b.largest_component();
      if (b.optimizer_state > usable)
        v.reason = "optimizer state alone needs " + gib_text(b.optimizer_state) + ", more than the " + gib_text(usable) + " usable per GPU";
      else if (persistent > usable)
        v.reason = "sharded params + grads + optimizer state need " + gib_text(persistent) + ", more than the " + gib_text(usable) +
                   " usable per GPU";
      else
        v.reason = "even its smallest plan (" + in.cands[static_cast<size_t>(f.smallest_pruned)].label + ") needs at least " +
                   gib_text(b.total()) + " (a lower bound), more than the " + gib_text(usable) + " usable per GPU; largest part: " +
                   what + " " + gib_text(bytes);
    } else if (f.dominated > 0) {
      v.reason = std::to_string(f.dominated) + " plan" + (f.dominated == 1 ? " was" : "s were") +
                 " not simulated: at most " + num(f.best_bound) + " tokens/s per GPU (an upper bound), and an already simulated "
                 "plan that fits in less memory is faster" +
                 (rec >= 0 ? " (the recommendation reaches " + num(rec_tps) + ")" : "");
    } else if (f.invalid > 0) {
      v.reason = "the simulator refused its plans: " + in.evals[static_cast<size_t>(f.first_invalid)].error;
    } else {
      continue;
    }
    ex.rejected_families.push_back(v);
  }
  return ex;
}

}  // namespace fsdpsim::planner
