// The recommendation's choices, one at a time (note in sensitivity.h).
#include "planner/sensitivity.h"

#include <cmath>
#include <cstdio>

#include "common/errors.h"
#include "planner/comm_words.h"
#include "planner/explain.h"
#include "planner/search_space.h"

namespace fsdpsim::planner {
namespace {

using sim::ShardingStrategy;
using AcMode = sim::ActivationCheckpointing::Mode;

// "Matters": a tokens/s change of 1% (the ranking's tie window, ranking.h) or 1 GiB of peak memory.
constexpr double kMattersFraction = 0.01;
constexpr Bytes kMattersBytes = kGiB;

std::string pct(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", 100 * f);
  return b;
}

struct Change {
  std::string knob, text;
  sim::Plan plan;
  bool trace = false;   // explain its inter-node traffic
};

void set_strategy(sim::Plan& q, ShardingStrategy fsdp1_strategy, int replicate, int shard) {
  q.mesh_replicate = replicate;
  q.mesh_shard = shard;
  q.sharding_strategy = fsdp1_strategy;   // FSDP2 plans carry their derived strategy too; resolve_plan checks it
  const int k = q.reshard_after_forward.group_size();   // 0: not a group
  if (q.fsdp_version == sim::FsdpVersion::FSDP2 && k > 0 && (k >= shard || shard % k != 0))
    q.reshard_after_forward = sim::ReshardAfterForward::yes();
}

std::vector<Change> changes_of(const sim::Plan& p, const calibrate::Cluster& cl) {
  std::vector<Change> out;
  const int world = cl.world(), gpn = cl.gpus_per_node;
  const bool v1 = p.fsdp_version == sim::FsdpVersion::FSDP1;
  const ShardingStrategy st = sim::effective_strategy(p);
  const bool zero2 = st == ShardingStrategy::SHARD_GRAD_OP || st == ShardingStrategy::_HYBRID_SHARD_ZERO2;
  auto add = [&](const std::string& knob, const std::string& text, const std::function<void(sim::Plan&)>& f, bool trace = false) {
    sim::Plan q = p;
    f(q);
    out.push_back({knob, text, q, trace});
  };
  // Sharding layout.
  if (p.mesh_replicate > 1 && p.mesh_shard > 1)
    add("sharding", std::string(zero2 ? "SHARD_GRAD_OP" : "FULL_SHARD") + " over all " + std::to_string(world) + " GPUs",
        [&](sim::Plan& q) { set_strategy(q, zero2 ? ShardingStrategy::SHARD_GRAD_OP : ShardingStrategy::FULL_SHARD, 1, world); }, true);
  if (cl.nodes > 1 && p.mesh_shard > gpn)
    add("sharding", std::string(zero2 ? "_HYBRID_SHARD_ZERO2" : "HYBRID_SHARD") + " (" + std::to_string(world / gpn) + ", " +
                        std::to_string(gpn) + "): shard inside each node, replicate across nodes",
        [&](sim::Plan& q) { set_strategy(q, zero2 ? ShardingStrategy::_HYBRID_SHARD_ZERO2 : ShardingStrategy::HYBRID_SHARD, world / gpn, gpn); }, true);
  if (p.mesh_shard > 1 && world > 1)
    add("ddp", "DDP (NO_SHARD: every GPU holds the whole model, gradients all-reduced)",
        [&](sim::Plan& q) { set_strategy(q, ShardingStrategy::NO_SHARD, world, 1); }, cl.nodes > 1);
  if (p.mesh_shard > 1) {
    if (v1)
      add("reshard_after_forward", zero2 ? "reshard after forward (FULL_SHARD / HYBRID_SHARD)" : "keep parameters after forward (SHARD_GRAD_OP)",
          [&](sim::Plan& q) {
            q.sharding_strategy = p.mesh_replicate > 1 ? (zero2 ? ShardingStrategy::HYBRID_SHARD : ShardingStrategy::_HYBRID_SHARD_ZERO2)
                                                       : (zero2 ? ShardingStrategy::FULL_SHARD : ShardingStrategy::SHARD_GRAD_OP);
          });
    else
      add("reshard_after_forward", p.reshard_after_forward.keeps() ? "reshard_after_forward true" : "reshard_after_forward false",
          [&](sim::Plan& q) { q.reshard_after_forward = sim::ReshardAfterForward::of(p.reshard_after_forward.keeps()); });
  }
  // Prefetching.
  if (v1 && p.mesh_shard > 1) {
    for (auto bp : {sim::BackwardPrefetch::BACKWARD_PRE, sim::BackwardPrefetch::BACKWARD_POST, sim::BackwardPrefetch::NONE})
      if (bp != p.backward_prefetch)
        add("backward_prefetch", "backward_prefetch " + sim::prefetch_name(bp), [bp](sim::Plan& q) { q.backward_prefetch = bp; });
    add("forward_prefetch", std::string("forward_prefetch ") + (p.forward_prefetch ? "False" : "True"),
        [](sim::Plan& q) { q.forward_prefetch = !q.forward_prefetch; });
    add("limit_all_gathers", std::string("limit_all_gathers ") + (p.limit_all_gathers ? "False" : "True"),
        [](sim::Plan& q) { q.limit_all_gathers = !q.limit_all_gathers; });
  } else if (!v1 && p.mesh_shard > 1) {
    int d = p.prefetch_depth == 1 ? 2 : 1;
    add("prefetch", "prefetch " + std::to_string(d) + " module" + (d == 1 ? "" : "s") + " ahead",
        [d](sim::Plan& q) { q.prefetch_depth = d; });
  }
  // Mixed precision.
  if (p.param_dtype != Dtype::FP32) {
    Dtype other = p.reduce_dtype == Dtype::FP32 ? p.param_dtype : Dtype::FP32;
    add("reduce_dtype", "reduce_dtype " + std::string(dtype_name(other)) +
                            (other == Dtype::FP32 ? " (gradients reduced in fp32)" : " (gradients reduced in the compute dtype)"),
        [other](sim::Plan& q) { q.reduce_dtype = other; });
    add("param_dtype", "no mixed precision (fp32 compute and communication)", [](sim::Plan& q) {
      q.param_dtype = q.reduce_dtype = q.master_weights_dtype = Dtype::FP32;
      q.fp8_all_gather = false;
      q.float8 = models::Float8Recipe::None;
    });
  }
  if (p.master_weights_dtype == Dtype::FP32 && p.param_dtype != Dtype::FP32)
    add("master_weights_dtype", "pure " + std::string(dtype_name(p.param_dtype)) + " (no fp32 master weights)",
        [](sim::Plan& q) { q.master_weights_dtype = q.param_dtype; });
  // Activation checkpointing.
  if (p.activation_checkpointing.mode == AcMode::None)
    add("activation_checkpointing", "full activation checkpointing",
        [](sim::Plan& q) { q.activation_checkpointing = sim::ActivationCheckpointing{AcMode::Full, 1, false}; });
  else
    add("activation_checkpointing", "no activation checkpointing", [](sim::Plan& q) { q.activation_checkpointing = {}; });
  // Accumulation and offload (FSDP1 cannot offload while reducing every micro-batch, semantics M11).
  if (p.grad_accum > 1 && !(v1 && p.cpu_offload.params && !p.grad_sync))
    add("grad_sync", p.grad_sync ? "no_sync until the last micro-batch" : "reduce gradients every micro-batch",
        [](sim::Plan& q) { q.grad_sync = !q.grad_sync; });
  if (!(v1 && !p.cpu_offload.params && p.grad_sync && p.grad_accum > 1))
    add("cpu_offload", p.cpu_offload.params ? "no CPU offload" : "CPU offload (params, grads, optimizer state)", [](sim::Plan& q) {
      bool on = !q.cpu_offload.params;
      q.cpu_offload.params = q.cpu_offload.optimizer = on;
    });
  // The FSDP version (the same layout in the other API).
  if (v1)
    add("fsdp_version", "FSDP2 (fully_shard)", [&](sim::Plan& q) {
      q.fsdp_version = sim::FsdpVersion::FSDP2;
      q.reshard_after_forward = sim::ReshardAfterForward::of(!zero2);
      q.limit_all_gathers = false;
      q.forward_prefetch = false;
      q.backward_prefetch = sim::BackwardPrefetch::BACKWARD_PRE;
    });
  else if (!p.reshard_after_forward.is_group() && !p.fp8_all_gather)
    add("fsdp_version", "FSDP1 (FullyShardedDataParallel)", [&](sim::Plan& q) {
      q.fsdp_version = sim::FsdpVersion::FSDP1;
      q.sharding_strategy = st;
      q.limit_all_gathers = true;
      q.prefetch_depth = 1;
      q.module_overrides.clear();
    });
  return out;
}

}  // namespace

std::vector<Variation> vary_plan(const sim::Plan& rec, const sim::SimResult& rr, const calibrate::Cluster& cl, double margin,
                                 const SimulateWithTrace& simulate) {
  std::vector<Variation> out;
  for (auto& c : changes_of(rec, cl)) {
    Variation v;
    v.knob = c.knob;
    v.change = c.text;
    try {
      v.plan = sim::resolve_plan(c.plan, cl.world(), cl.gpus_per_node);
      v.result = simulate(v.plan, c.trace);
      v.simulated = true;
    } catch (const InputError& e) {
      v.error = e.what();
      out.push_back(v);
      continue;
    }
    v.fits_with_margin = memory_verdict(v.result, margin).fits;
    v.tokens_gain = rr.tokens_per_s_per_gpu > 0 ? v.result.tokens_per_s_per_gpu / rr.tokens_per_s_per_gpu - 1.0 : 0.0;
    v.memory_delta = v.result.peak_total_device - rr.peak_total_device;
    v.matters = std::fabs(v.tokens_gain) >= kMattersFraction || std::llabs(v.memory_delta) >= kMattersBytes || !v.fits_with_margin;
    v.why = difference_text(rr, v.result, rec, v.plan);
    if (c.trace) {
      std::string mine = inter_node_text(rec, rr, cl), theirs = inter_node_text(v.plan, v.result, cl);
      if (!theirs.empty()) v.why += "; across nodes it sends " + theirs;
      else if (!mine.empty()) v.why += "; nothing crosses nodes";
    }
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> variation_lines(const std::vector<Variation>& vs, double margin) {
  std::vector<std::string> lines;
  std::string none;
  for (const auto& v : vs) {
    if (!v.simulated) continue;
    if (!v.matters) {
      none += (none.empty() ? "" : ", ") + v.change;
      continue;
    }
    std::string l = v.change + ": " + pct(v.tokens_gain) + " tokens/s, ";
    if (v.result.peak_total_device > v.result.capacity)
      l += "does not fit (its peak is beyond the " + gib_text(v.result.capacity) + " of the GPU)";
    else
      l += std::string(v.memory_delta >= 0 ? "+" : "-") + gib_text(std::llabs(v.memory_delta)) + " peak memory" +
           (v.fits_with_margin ? "" : " and does not fit (" + memory_text(v.result, margin) + ")");
    l += " - " + v.why + ".";
    lines.push_back(l);
  }
  if (!none.empty()) lines.push_back("No difference (under 1% tokens/s and 1 GiB): " + none + ".");
  return lines;
}

std::string ddp_baseline_line(const std::vector<Variation>& vs, const sim::Plan& rec, const sim::SimResult& rr, double margin) {
  if (rec.mesh_shard == 1 && rec.mesh_replicate > 1)
    return "The recommendation is DDP (NO_SHARD is its FSDP spelling): the model fits on every GPU unsharded, so "
           "sharding would only add all-gathers.";
  for (const auto& v : vs) {
    if (v.knob != "ddp" || !v.simulated) continue;
    std::string head = "DDP baseline (NO_SHARD is its FSDP spelling; simulated as FSDP NO_SHARD with the recommendation's "
                       "other settings): ";
    if (!v.fits_with_margin) {
      Bytes state = 0;
      for (const char* k : {"sharded_params", "sharded_grads", "optimizer_state"}) {
        auto it = v.result.breakdown_at_peak.find(k);
        if (it != v.result.breakdown_at_peak.end()) state += it->second;
      }
      const MemoryVerdict mv = memory_verdict(v.result, margin);
      return head + "does not fit: every GPU holds the full parameters, gradients and optimizer state (" + gib_text(state) +
             (state > mv.usable ? ", more than the " + gib_text(mv.usable) + " usable by themselves" : "") +
             "), which FSDP shards " + std::to_string(rec.mesh_shard) + " ways.";
    }
    char b[64];
    std::snprintf(b, sizeof b, "%.0f tokens/s per GPU", v.result.tokens_per_s_per_gpu);
    const std::string s = head + b + ", peak " + gib_text(v.result.peak_total_device) + ". ";
    if (v.tokens_gain < -kMattersFraction)
      return s + "FSDP wins by " + pct(-v.tokens_gain).substr(1) + ": " + difference_text(v.result, rr, v.plan, rec) +
             " (FSDP's sharded state leaves room for this plan's micro-batch and checkpointing choices).";
    if (v.tokens_gain > kMattersFraction)
      return s + "DDP is " + pct(v.tokens_gain).substr(1) + " faster with these settings (" + v.why + "), and needs " +
             gib_text(std::llabs(v.memory_delta)) + (v.memory_delta > 0 ? " more" : " less") + " memory per GPU.";
    return s + "It is as fast (within 1%); FSDP needs " + gib_text(std::llabs(v.memory_delta)) + (v.memory_delta > 0 ? " less" : " more") +
           " memory per GPU.";
  }
  return "";
}

}  // namespace fsdpsim::planner
