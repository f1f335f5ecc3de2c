// `fsdpsim fit` (note in fit.h).
#include "planner/fit.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/errors.h"
#include "planner/explain.h"
#include "planner/planner.h"
#include "planner/search_space.h"
#include "sim/simulator.h"

namespace fsdpsim::planner {
namespace {

using AcMode = sim::ActivationCheckpointing::Mode;

// The micro-batch search stops here: 4096 sequences per GPU per micro-batch is past any training
// setup the planner's batch targets produce (the default global batch is 4M tokens over all GPUs).
constexpr std::int64_t kMaxMicroBatch = 4096;

std::string num(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Sets checkpointing mode `m` in the plan's framework: full checkpointing keeps the plan's order of checkpoint and
// compile (activation_checkpointing.outside_compile: torchtune wraps its compiled layers) and its activation
// offloading (kept with every mode).
void set_ac(sim::Plan& q, const std::string& m) {
  sim::ActivationCheckpointing ac;
  if (m == "full") ac.mode = AcMode::Full;
  else if (m == "selective_op") ac.mode = AcMode::SelectiveOp;
  ac.outside_compile = ac.mode == AcMode::Full && q.activation_checkpointing.outside_compile;
  q.activation_checkpointing = ac;
}

}  // namespace

FitAnswer fit_plan(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const sim::Plan& plan_in, double margin,
                   const FitSimulateFn& sim_fn) {
  const auto& cl = hw.cluster();
  const EvalFn run = sim_fn ? sim_fn : fast_simulate(model, hw);
  auto resolve = [&](sim::Plan q) { return sim::resolve_plan(q, cl.world(), cl.gpus_per_node); };
  auto fits = [&](const sim::SimResult& r) { return memory_verdict(r, margin).fits; };
  FitAnswer a;
  a.margin = margin;
  a.plan = resolve(plan_in);
  a.result = run(a.plan);
  a.fits = fits(a.result);

  // Largest micro-batch per checkpointing mode.
  for (const char* mode : {"none", "selective_op", "full"}) {
    FitAnswer::LargestBatch lb;
    lb.checkpointing = mode;
    sim::Plan base = a.plan;
    set_ac(base, mode);
    auto try_mb = [&](std::int64_t mb, sim::SimResult& out) {
      sim::Plan q = base;
      q.micro_batch = mb;
      out = run(resolve(q));
      return fits(out);
    };
    sim::SimResult r;
    if (try_mb(1, r)) {
      std::int64_t lo = 1, hi = 2;
      sim::SimResult at_lo = r;
      while (hi <= kMaxMicroBatch && try_mb(hi, r)) {
        lo = hi;
        at_lo = r;
        hi *= 2;
      }
      if (hi > kMaxMicroBatch) {
        lb.capped = true;
      } else {
        while (hi - lo > 1) {   // lo fits, hi does not
          std::int64_t mid = lo + (hi - lo) / 2;
          if (try_mb(mid, r)) { lo = mid; at_lo = r; }
          else hi = mid;
        }
      }
      lb.micro_batch = lo;
      lb.result = at_lo;
    }
    a.largest.push_back(lb);
  }

  // Single changes.
  const sim::Plan& p = a.plan;
  std::vector<std::pair<std::string, sim::Plan>> cand;
  auto add = [&](const std::string& what, const std::function<void(sim::Plan&)>& f) {
    sim::Plan q = p;
    f(q);
    cand.emplace_back(what, q);
  };
  for (const char* mode : {"selective_op", "full"})
    if (sim::checkpointing_text(p.activation_checkpointing) != mode)
      add(std::string("activation_checkpointing \"") + mode + "\"",
          [mode](sim::Plan& q) { set_ac(q, mode); });
  for (const auto& lb : a.largest)
    if (lb.checkpointing == sim::checkpointing_text(p.activation_checkpointing) && lb.micro_batch > 0 && lb.micro_batch < p.micro_batch &&
        (p.micro_batch * p.grad_accum) % lb.micro_batch == 0) {
      std::int64_t mb = lb.micro_batch, ga = p.micro_batch * p.grad_accum / mb;
      add("micro_batch " + std::to_string(mb) + " with grad_accum " + std::to_string(ga) + " (the same sequences per step)",
          [mb, ga](sim::Plan& q) { q.micro_batch = mb; q.grad_accum = ga; });
    }
  if (p.mesh_shard > 1 && p.reshard_after_forward != sim::ReshardAfterForward::yes() && p.fsdp_version == sim::FsdpVersion::FSDP2)
    add("reshard_after_forward true", [](sim::Plan& q) { q.reshard_after_forward = sim::ReshardAfterForward::yes(); });
  if (p.fsdp_version == sim::FsdpVersion::FSDP1 && (p.sharding_strategy == sim::ShardingStrategy::SHARD_GRAD_OP ||
                                                    p.sharding_strategy == sim::ShardingStrategy::_HYBRID_SHARD_ZERO2))
    add(std::string("sharding_strategy ") + (p.mesh_replicate > 1 ? "HYBRID_SHARD" : "FULL_SHARD"), [](sim::Plan& q) {
      q.sharding_strategy = q.mesh_replicate > 1 ? sim::ShardingStrategy::HYBRID_SHARD : sim::ShardingStrategy::FULL_SHARD;
    });
  if (p.master_weights_dtype != p.param_dtype)
    add("master_weights_dtype \"" + std::string(dtype_name(p.param_dtype)) + "\" (pure low precision)",
        [](sim::Plan& q) { q.master_weights_dtype = q.param_dtype; });
  if (p.cross_entropy != models::LossImpl::FusedLinear)
    add("cross_entropy \"fused_linear\" (no full logits)", [](sim::Plan& q) { q.cross_entropy = models::LossImpl::FusedLinear; });
  if (p.optimizer_impl != sim::OptimizerImpl::Fused)
    add("optimizer_impl \"fused\"", [](sim::Plan& q) { q.optimizer_impl = sim::OptimizerImpl::Fused; });
  if (!p.alloc_conf.expandable_segments)
    add("alloc_conf \"expandable_segments:True\"", [](sim::Plan& q) { q.alloc_conf.expandable_segments = true; });
  if (p.grad_accum > 1 && !p.grad_sync) add("grad_sync true (no unsharded gradients kept across micro-batches)", [](sim::Plan& q) { q.grad_sync = true; });
  if (!p.cpu_offload.params && !(p.fsdp_version == sim::FsdpVersion::FSDP1 && p.grad_sync && p.grad_accum > 1))
    add("cpu_offload true", [](sim::Plan& q) { q.cpu_offload.params = q.cpu_offload.optimizer = true; });
  if (p.mesh_replicate > 1)
    add("mesh [1, " + std::to_string(cl.world()) + "] (shard over all GPUs)", [&](sim::Plan& q) {
      q.mesh_replicate = 1;
      q.mesh_shard = cl.world();
      q.sharding_strategy = q.sharding_strategy == sim::ShardingStrategy::_HYBRID_SHARD_ZERO2 ? sim::ShardingStrategy::SHARD_GRAD_OP
                                                                                             : sim::ShardingStrategy::FULL_SHARD;
      if (q.reshard_after_forward.is_group()) q.reshard_after_forward = sim::ReshardAfterForward::yes();
    });
  if (p.fsdp_version == sim::FsdpVersion::FSDP1)
    add("fsdp_version 2", [](sim::Plan& q) {
      q.fsdp_version = sim::FsdpVersion::FSDP2;
      q.reshard_after_forward = sim::ReshardAfterForward::of_strategy(q.sharding_strategy);
      q.limit_all_gathers = false;
    });
  for (auto& [what, q] : cand) {
    FitAnswer::Change c;
    c.what = what;
    try {
      c.plan = resolve(q);
      c.result = run(c.plan);
    } catch (const InputError&) {
      continue;   // not valid on this cluster
    }
    c.fits = fits(c.result);
    c.tokens_gain = a.result.tokens_per_s_per_gpu > 0 ? c.result.tokens_per_s_per_gpu / a.result.tokens_per_s_per_gpu - 1 : 0;
    a.changes.push_back(c);
  }
  std::stable_sort(a.changes.begin(), a.changes.end(), [](const FitAnswer::Change& x, const FitAnswer::Change& y) {
    if (x.fits != y.fits) return x.fits;
    if (x.fits) return x.result.tokens_per_s_per_gpu > y.result.tokens_per_s_per_gpu;
    return x.result.peak_total_device < y.result.peak_total_device;
  });
  return a;
}

std::string fit_text(const FitAnswer& a) {
  std::ostringstream os;
  os << "Plan: " << label_of(a.plan) << "\n";
  os << (a.fits ? "Fits: " : "Does not fit: ") << memory_text(a.result, a.margin) << ".\n";
  os << "\nLargest micro-batch that fits (sequences of " << a.plan.seq_len << " tokens per GPU; other settings as above):\n";
  for (const auto& lb : a.largest) {
    os << "  " << (lb.checkpointing == "none" ? "no checkpointing     " : lb.checkpointing == "full" ? "full checkpointing   "
                                                                                              : "selective checkpoints");
    if (lb.micro_batch == 0) {
      os << "  none - not even micro_batch 1\n";
      continue;
    }
    os << "  micro_batch " << lb.micro_batch << (lb.capped ? " or more (the search stops there)" : "") << ": peak "
       << gib_text(lb.result.peak_total_device) << ", " << num("%.0f", lb.result.tokens_per_s_per_gpu) << " tokens/s per GPU\n";
  }
  const FitAnswer::Change* best = nullptr;
  for (const auto& c : a.changes)
    if (c.fits) { best = &c; break; }
  if (!a.fits) {
    os << "\n";
    if (best)
      os << "Smallest change that makes it fit: " << best->what << " - " << memory_text(best->result, a.margin) << ", "
         << num("%.0f", best->result.tokens_per_s_per_gpu) << " tokens/s per GPU (" << num("%+.1f", 100 * best->tokens_gain) << "%).\n";
    else
      os << "No single change makes it fit; run `fsdpsim plan` to search the whole space.\n";
  }
  if (!a.changes.empty()) {
    os << "\nEach single change, simulated (" << (a.fits ? "for more headroom" : "fitting ones first, by tokens/s") << "):\n";
    for (const auto& c : a.changes)
      os << "  " << (c.fits ? "fits     " : "no fit   ") << c.what << ": peak " << gib_text(c.result.peak_total_device) << ", "
         << num("%.0f", c.result.tokens_per_s_per_gpu) << " tokens/s per GPU (" << num("%+.1f", 100 * c.tokens_gain) << "%)\n";
  }
  return os.str();
}

nlohmann::json fit_json(const FitAnswer& a) {
  using nlohmann::json;
  const MemoryVerdict v = memory_verdict(a.result, a.margin);
  json j = {{"plan", sim::plan_to_json(a.plan)},
            {"result", sim::sim_result_to_json(a.result)},
            {"fits_with_margin", a.fits},
            {"memory", {{"capacity_bytes", v.capacity}, {"usable_bytes", v.usable}, {"peak_bytes", v.peak},
                        {"headroom_bytes", v.headroom()}, {"memory_margin", a.margin}, {"text", memory_text(a.result, a.margin)}}}};
  json lbs = json::array();
  for (const auto& lb : a.largest) {
    json x = {{"activation_checkpointing", lb.checkpointing}, {"micro_batch", lb.micro_batch}, {"capped", lb.capped}};
    if (lb.micro_batch > 0)
      x["peak_total_device_bytes"] = lb.result.peak_total_device, x["tokens_per_s_per_gpu"] = lb.result.tokens_per_s_per_gpu;
    lbs.push_back(x);
  }
  j["largest_micro_batch"] = lbs;
  json ch = json::array();
  for (const auto& c : a.changes)
    ch.push_back({{"change", c.what}, {"fits_with_margin", c.fits}, {"plan", sim::plan_to_json(c.plan)},
                  {"peak_total_device_bytes", c.result.peak_total_device}, {"tokens_per_s_per_gpu", c.result.tokens_per_s_per_gpu},
                  {"tokens_gain", c.tokens_gain}});
  j["changes"] = ch;
  j["smallest_change"] = nullptr;
  for (const auto& c : a.changes)
    if (c.fits && !a.fits) { j["smallest_change"] = c.what; break; }
  return j;
}

}  // namespace fsdpsim::planner
