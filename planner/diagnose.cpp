// Diagnose (see diagnose.h for the checks).
#include "planner/diagnose.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/context.h"
#include "common/errors.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "planner/explain.h"
#include "planner/search_space.h"
#include "sim/simulator.h"

namespace fsdpsim::planner {
namespace {

using AcMode = sim::ActivationCheckpointing::Mode;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

std::string gain_text(const sim::SimResult& a, const sim::SimResult& b) {
  double d = a.tokens_per_s_per_gpu > 0 ? b.tokens_per_s_per_gpu / a.tokens_per_s_per_gpu - 1 : 0;
  return "tokens/s per GPU " + fmt("%.0f", a.tokens_per_s_per_gpu) + " -> " + fmt("%.0f", b.tokens_per_s_per_gpu) + " (" +
         fmt("%+.1f", 100 * d) + "%), peak " + fmt("%.1f", to_gib(a.peak_total_device)) + " -> " +
         fmt("%.1f", to_gib(b.peak_total_device)) + " GiB per GPU" + (b.fits ? "" : " (still does not fit)");
}

double exposed_fraction(const sim::SimResult& r) {
  return r.step_time_ns > 0 ? static_cast<double>(r.exposed_comm_ns) / static_cast<double>(r.step_time_ns) : 0.0;
}

Bytes breakdown(const sim::SimResult& r, const char* key) {
  auto it = r.breakdown_at_peak.find(key);
  return it == r.breakdown_at_peak.end() ? 0 : it->second;
}

}  // namespace

Diagnosis diagnose(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const UserConfig& cfg_in,
                   double margin, const SimulateFn& sim_fn) {
  Diagnosis d;
  d.config = cfg_in;
  d.memory_margin = margin;
  const auto& cl = hw.cluster();
  const int world = cl.world(), gpn = cl.gpus_per_node;
  UserConfig& cfg = d.config;
  if ((cfg.nodes > 0 && cfg.nodes != cl.nodes) || (cfg.gpus_per_node > 0 && cfg.gpus_per_node != gpn))
    cfg.warnings.push_back("the config describes " + std::to_string(cfg.nodes > 0 ? cfg.nodes : cl.nodes) + " node(s) x " +
                           std::to_string(cfg.gpus_per_node > 0 ? cfg.gpus_per_node : gpn) + " GPUs; diagnosed on the cluster " +
                           cl.name + " (" + std::to_string(cl.nodes) + " x " + std::to_string(gpn) + ")");
  sim::Plan p = cfg.plan;
  if (p.mesh_shard < 0) p.mesh_shard = world / std::max(1, p.mesh_replicate);  // torchtitan "-1" = leftover ranks
  if (p.grad_accum < 0) {  // torchtitan global_batch_size
    std::int64_t gbs = -p.grad_accum, per = p.micro_batch * world;
    if (gbs % per != 0)
      throw InputError("training.global_batch_size", std::to_string(gbs),
                       "a multiple of local_batch_size x data-parallel degree = " + std::to_string(per));
    p.grad_accum = gbs / per;
  }
  if (!cfg.micro_batch_given) cfg.warnings.push_back("micro-batch not given: assumed 1 (use --micro-batch or `# fsdpsim: micro_batch=N`)");
  if (!cfg.seq_len_given) cfg.warnings.push_back("sequence length not given: assumed 2048 (use --seq-len or `# fsdpsim: seq_len=N`)");
  d.plan = sim::resolve_plan(p, world, gpn);
  SimulateFn run = sim_fn;
  if (!run) {
    sim::SimOptions o;
    o.record_trace = false;
    o.record_memory_timeline = false;
    run = [&model, &hw, o](const sim::Plan& q) { return sim::simulate(model, hw, q, o); };
  }
  d.usable = usable_capacity(hw.memory_capacity(), margin);
  d.result = run(d.plan);
  d.fits_with_margin = d.result.peak_total_device <= d.usable;
  const sim::SimResult& base = d.result;
  const sim::Plan& bp = d.plan;
  const auto strategy = strategy_of(bp);
  const bool v1 = bp.fsdp_version == sim::FsdpVersion::FSDP1;
  std::vector<std::function<void(sim::Plan&)>> problem_fixes;

  auto try_fix = [&](Finding& f, const std::function<void(sim::Plan&)>& change) {
    sim::Plan q = d.plan;
    change(q);
    try {
      q = sim::resolve_plan(q, world, gpn);
      f.fixed_plan = q;
      f.fixed_result = run(q);
      f.simulated = true;
      f.fixed_fits_with_margin = f.fixed_result.peak_total_device <= d.usable;
      f.gain = gain_text(base, f.fixed_result);
    } catch (const InputError& e) {
      f.gain = std::string("the fixed plan is not valid here: ") + e.what();
    }
  };
  auto better = [&](const Finding& f) {
    if (!f.simulated) return false;
    if (!d.fits_with_margin) return f.fixed_fits_with_margin || f.fixed_result.peak_total_device < base.peak_total_device;
    return f.fixed_fits_with_margin && f.fixed_result.tokens_per_s_per_gpu > base.tokens_per_s_per_gpu * 1.02;
  };

  // 1. The wrap policy.
  models::WrapGraph g = models::build_wrap_graph(model, bp.auto_wrap_policy);
  if (world > 1 && strategy != sim::ShardingStrategy::NO_SHARD && g.units.size() <= 1) {
    Finding f{"wrap_nothing", "problem", "", "", false, {}, {}, false, ""};
    std::string what = cfg.wrap_classes.empty() ? std::string("no auto_wrap_policy")
                                                : "auto_wrap_policy naming {" + [&] {
                                                    std::string s;
                                                    for (const auto& c : cfg.wrap_classes) s += (s.empty() ? "" : ", ") + c;
                                                    return s;
                                                  }() + "}";
    f.message = what + " wraps nothing in " + model.name + ": all " + fmt("%.2f", g.total_params / 1e9) +
                "B parameters form one FSDP unit, so every all-gather materialises the whole model (" +
                gib_text(g.total_params * dtype_bytes(bp.param_dtype)) +
                " in " + std::string(dtype_name(bp.param_dtype)) + ") and memory barely falls with more GPUs (K1)";
    f.fix = cfg.format == "accelerate" ? "fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP with fsdp_transformer_layer_cls_to_wrap: " + model.block_class
            : cfg.format == "torchtitan" || bp.fsdp_version == sim::FsdpVersion::FSDP2 ? "fully_shard each " + model.block_class
                                                                                      : "auto_wrap_policy={" + model.block_class + "}";
    auto change = [](sim::Plan& q) { q.auto_wrap_policy = models::WrapPolicy{}; };
    try_fix(f, change);
    problem_fixes.push_back(change);
    d.findings.push_back(f);
  } else if (bp.auto_wrap_policy.kind == models::WrapPolicy::Kind::Size &&
             static_cast<std::int64_t>(g.units.size()) > 2 * model.n_layers + 2) {
    Finding f{"wrap_too_fine", "problem", "", "", false, {}, {}, false, ""};
    f.message = "the size-based policy (min_num_params=" + std::to_string(bp.auto_wrap_policy.min_num_params) + ") makes " +
                std::to_string(g.units.size()) + " FSDP units for " + std::to_string(model.n_layers) +
                " blocks: many small all-gathers and Python hooks per step (D6)";
    f.fix = "wrap per " + model.block_class;
    auto change = [](sim::Plan& q) { q.auto_wrap_policy = models::WrapPolicy{}; };
    try_fix(f, change);
    if (better(f)) problem_fixes.push_back(change);
    else f.severity = "info";
    d.findings.push_back(f);
  }

  // 2. Precision.
  if (bp.param_dtype == Dtype::FP32) {
    Finding f{"precision", "problem", "", "", false, {}, {}, false, ""};
    f.message = "compute in fp32 (" + (cfg.precision.empty() ? std::string("no mixed precision") : "precision \"" + cfg.precision + "\"") +
                "): no bf16 tensor-core speed and fp32 all-gathers";
    f.fix = cfg.format == "accelerate" ? "mixed_precision: bf16" : cfg.format == "torchtitan" ? "mixed_precision_param = \"bfloat16\"" : "precision=\"bf16-mixed\"";
    auto change = [](sim::Plan& q) { q.param_dtype = Dtype::BF16; if (q.reduce_dtype == Dtype::FP32 && false) q.reduce_dtype = Dtype::BF16; };
    try_fix(f, change);
    if (better(f)) problem_fixes.push_back(change);
    else f.severity = "info";
    d.findings.push_back(f);
  } else if (bp.master_weights_dtype == Dtype::FP32) {
    Finding f{"precision", "info", "", "", false, {}, {}, false, ""};
    Bytes state = breakdown(base, "sharded_params") + breakdown(base, "sharded_grads") + breakdown(base, "optimizer_state");
    std::string how = cfg.precision.empty() ? std::string("mixed precision")
                      : cfg.format == "accelerate" ? "mixed_precision " + cfg.precision
                                                   : "precision \"" + cfg.precision + "\"";
    f.message = how +
                " keeps fp32 sharded params, grads and optimizer state (" + gib_text(state) +
                " per GPU at the peak); \"bf16-true\" keeps them in bf16, about half (K1: Lightning FSDP "
                "\"3x the memory\" reports)" + (bp.param_dtype == Dtype::FP16 ? "; fp16 also needs a ShardedGradScaler - bf16 does not" : "");
    f.fix = cfg.format == "torchtitan" ? "[training] dtype = \"bfloat16\"" : "precision=\"bf16-true\" (pure bf16: updates lose precision; keep fp32 masters if training is unstable)";
    auto change = [](sim::Plan& q) { q.param_dtype = q.reduce_dtype = q.master_weights_dtype = Dtype::BF16; };
    try_fix(f, change);
    bool tight = !d.fits_with_margin || base.peak_total_device > d.usable * 9 / 10;
    if (tight && f.simulated && (f.fixed_fits_with_margin || !d.fits_with_margin)) {
      f.severity = "problem";
      problem_fixes.push_back(change);
    }
    d.findings.push_back(f);
  }

  // 3. Activation checkpointing.
  Bytes acts = breakdown(base, "activations");
  bool act_heavy = base.peak_allocated > 0 && acts * 10 >= base.peak_allocated * 4;
  if (bp.activation_checkpointing.mode == AcMode::None && (!d.fits_with_margin || act_heavy)) {
    Finding f{"activation_checkpointing", "problem", "", "", false, {}, {}, false, ""};
    f.message = "no activation checkpointing at sequence length " + std::to_string(bp.seq_len) + " x micro-batch " +
                std::to_string(bp.micro_batch) + ": saved activations hold " + gib_text(acts) + " of the " +
                gib_text(base.peak_allocated) + " allocated at the peak" + (d.fits_with_margin ? "" : " and the plan does not fit");
    Finding best = f;
    std::string best_mode;
    for (const char* m : {"selective_op", "every_2", "full"}) {
      Finding t = f;
      sim::ActivationCheckpointing ac;
      ac.mode = std::string(m) == "full" ? AcMode::Full : std::string(m) == "every_2" ? AcMode::EveryK : AcMode::SelectiveOp;
      ac.every_k = 2;
      try_fix(t, [ac](sim::Plan& q) { q.activation_checkpointing = ac; });
      if (!t.simulated) continue;
      bool take = !best.simulated ||
                  (t.fixed_fits_with_margin && (!best.fixed_fits_with_margin || t.fixed_result.tokens_per_s_per_gpu > best.fixed_result.tokens_per_s_per_gpu)) ||
                  (!t.fixed_fits_with_margin && !best.fixed_fits_with_margin && t.fixed_result.peak_total_device < best.fixed_result.peak_total_device);
      if (take) { best = t; best_mode = m; }
    }
    f = best;
    if (cfg.format == "torchtitan")
      f.fix = best_mode == "selective_op" ? "[activation_checkpoint] mode = \"selective\", selective_ac_option = \"op\""
              : best_mode == "every_2" ? "[activation_checkpoint] mode = \"selective\", selective_ac_option = \"2\"" : "[activation_checkpoint] mode = \"full\"";
    else if (cfg.format == "accelerate") f.fix = "fsdp_activation_checkpointing: true";
    else if (cfg.format == "plan") f.fix = "\"activation_checkpointing\": \"" + best_mode + "\"";
    else f.fix = "activation_checkpointing_policy={" + model.block_class + "}";
    if (best_mode != "full" && cfg.format != "plan" && cfg.format != "torchtitan") f.fix += " (the simulation used " + best_mode + ")";
    if (better(f)) problem_fixes.push_back([ac = f.fixed_plan.activation_checkpointing](sim::Plan& q) { q.activation_checkpointing = ac; });
    else f.severity = "info";
    d.findings.push_back(f);
  }

  // 4. FULL_SHARD across nodes.
  if (cl.nodes > 1 && bp.mesh_shard > gpn && bp.mesh_shard % gpn == 0 &&
      (strategy == sim::ShardingStrategy::FULL_SHARD || strategy == sim::ShardingStrategy::SHARD_GRAD_OP)) {
    Finding f{"full_shard_across_nodes", "problem", "", "", false, {}, {}, false, ""};
    int r = world / gpn;
    f.message = strategy_text(strategy) + " shards over all " + std::to_string(bp.mesh_shard) + " GPUs across " +
                std::to_string(cl.nodes) + " nodes: exposed communication " + fmt("%.3f", to_seconds(base.exposed_comm_ns)) +
                " s = " + pct_text(exposed_fraction(base)) + " of the step over " + (cl.inter_node.empty() ? "the inter-node network" : cl.inter_node) + " (K2)";
    f.fix = v1 ? (cfg.format == "accelerate" ? "fsdp_sharding_strategy: HYBRID_SHARD"
                                              : "sharding_strategy=\"HYBRID_SHARD\", device_mesh=(" + std::to_string(r) + ", " + std::to_string(gpn) + ")")
               : (cfg.format == "torchtitan" ? "data_parallel_replicate_degree = " + std::to_string(r) + ", data_parallel_shard_degree = " + std::to_string(gpn)
                                             : "a 2-D mesh (" + std::to_string(r) + ", " + std::to_string(gpn) + ") (HSDP)");
    auto change = [r, gpn](sim::Plan& q) {
      q.mesh_replicate = r;
      q.mesh_shard = gpn;
      if (q.fsdp_version == sim::FsdpVersion::FSDP1)
        q.sharding_strategy = q.sharding_strategy == sim::ShardingStrategy::SHARD_GRAD_OP ? sim::ShardingStrategy::_HYBRID_SHARD_ZERO2
                                                                                         : sim::ShardingStrategy::HYBRID_SHARD;
      else if (q.reshard_after_forward > 1) q.reshard_after_forward = -1;
    };
    try_fix(f, change);
    if (better(f)) {
      f.message += "; HYBRID_SHARD (" + std::to_string(r) + ", " + std::to_string(gpn) + ") keeps the all-gathers inside a node: exposed " +
                   pct_text(exposed_fraction(f.fixed_result));
      problem_fixes.push_back(change);
    } else {
      f.severity = "info";
      if (f.simulated && !f.fixed_fits_with_margin) f.message += "; HYBRID_SHARD would not fit (" + gib_text(f.fixed_result.peak_total_device) + ")";
    }
    d.findings.push_back(f);
  }

  // 5. NO_SHARD vs FULL_SHARD for a model that fits either way.
  if (strategy == sim::ShardingStrategy::NO_SHARD && world > 1) {
    Finding f{"no_shard", d.fits_with_margin ? "ok" : "problem", "", "", false, {}, {}, false, ""};
    auto change = [world](sim::Plan& q) {
      q.mesh_replicate = 1;
      q.mesh_shard = world;
      q.sharding_strategy = sim::ShardingStrategy::FULL_SHARD;
      q.reshard_after_forward = -1;
    };
    try_fix(f, change);
    if (d.fits_with_margin) {
      f.message = "NO_SHARD (DDP-like) is fine for this model: it fits with " + gib_text(d.usable - base.peak_total_device) +
                  " headroom and needs no all-gathers";
      if (f.simulated)
        f.message += "; FULL_SHARD would reach " + fmt("%.0f", f.fixed_result.tokens_per_s_per_gpu) + " tokens/s per GPU (" +
                     fmt("%+.1f", 100 * (f.fixed_result.tokens_per_s_per_gpu / std::max(1e-9, base.tokens_per_s_per_gpu) - 1)) +
                     "%) with " + gib_text(f.fixed_result.peak_total_device);
      f.fix = "";
    } else {
      f.message = "NO_SHARD keeps full params, grads and optimizer state on every GPU (" +
                  gib_text(breakdown(base, "sharded_params") + breakdown(base, "sharded_grads") + breakdown(base, "optimizer_state")) +
                  "): it does not fit";
      f.fix = cfg.format == "accelerate" ? "fsdp_sharding_strategy: FULL_SHARD" : "sharding_strategy=\"FULL_SHARD\"";
      problem_fixes.push_back(change);
    }
    d.findings.push_back(f);
  } else if (world > 1 && strategy != sim::ShardingStrategy::NO_SHARD) {
    Finding f{"full_shard_overhead", "problem", "", "", false, {}, {}, false, ""};
    auto change = [world](sim::Plan& q) {
      q.mesh_replicate = world;
      q.mesh_shard = 1;
      q.sharding_strategy = sim::ShardingStrategy::NO_SHARD;
      q.reshard_after_forward = -1;
    };
    try_fix(f, change);
    if (f.simulated && f.fixed_fits_with_margin && f.fixed_result.tokens_per_s_per_gpu > base.tokens_per_s_per_gpu * 1.03) {
      f.message = strategy_text(strategy) + " on a model this small costs throughput: NO_SHARD (DDP-like) also fits (" +
                  gib_text(f.fixed_result.peak_total_device) + ") and skips the all-gathers (FULL_SHARD moves ~1.5x the bytes, K2)";
      f.fix = cfg.format == "accelerate" ? "fsdp_sharding_strategy: NO_SHARD" : cfg.format == "torchtitan" ? "data_parallel_replicate_degree = " + std::to_string(world) + ", data_parallel_shard_degree = 1"
                                                                           : "sharding_strategy=\"NO_SHARD\" (or DDP)";
      problem_fixes.push_back(change);
      d.findings.push_back(f);
    }
  }

  // 6. HF gradient checkpointing outside FSDP.
  if (bp.activation_checkpointing.mode != AcMode::None && bp.activation_checkpointing.outside_fsdp) {
    Finding f{"hf_gradient_checkpointing", "problem", "", "", false, {}, {}, false, ""};
    f.message = "checkpointing outside FSDP (checkpoint(FSDP(block)), HF gradient_checkpointing) all-gathers every unit a third "
                "time in backward (A2)";
    f.fix = "remove gradient_checkpointing_enable() and set activation_checkpointing_policy={" + model.block_class + "}";
    auto change = [](sim::Plan& q) { q.activation_checkpointing.outside_fsdp = false; };
    try_fix(f, change);
    problem_fixes.push_back(change);
    d.findings.push_back(f);
  }

  // 7. CPU offload that is not needed.
  if (bp.cpu_offload.params || bp.cpu_offload.optimizer) {
    Finding f{"cpu_offload", "problem", "", "", false, {}, {}, false, ""};
    auto change = [](sim::Plan& q) { q.cpu_offload = sim::CpuOffload{}; };
    try_fix(f, change);
    if (f.simulated && f.fixed_fits_with_margin) {
      f.message = "CPU offload although the plan fits without it (" + gib_text(f.fixed_result.peak_total_device) +
                  "): host copies and a CPU optimizer step slow every step";
      f.fix = cfg.format == "accelerate" ? "fsdp_offload_params: false" : cfg.format == "torchtitan" ? "enable_cpu_offload = false" : "cpu_offload=False";
      problem_fixes.push_back(change);
      d.findings.push_back(f);
    }
  }

  if (!d.fits_with_margin && problem_fixes.empty())
    d.findings.push_back({"does_not_fit", "problem",
                          "the configuration needs " + gib_text(base.peak_total_device) + " per GPU > " + gib_text(d.usable) +
                              " usable, and no single fix above makes it fit; run `fsdpsim plan` for a full search",
                          "", false, {}, {}, false, ""});
  if (problem_fixes.size() > 1) {
    sim::Plan q = d.plan;
    for (const auto& fx : problem_fixes) fx(q);
    try {
      d.combined_plan = sim::resolve_plan(q, world, gpn);
      d.combined_result = run(d.combined_plan);
      d.has_combined = true;
      d.combined_gain = gain_text(base, d.combined_result);
    } catch (const InputError&) {
    }
  }
  return d;
}

nlohmann::json diagnosis_to_json(const Diagnosis& d, const models::ModelSpec& model, const calibrate::Cluster& cluster) {
  using nlohmann::json;
  json f = json::array();
  for (const auto& x : d.findings) {
    json j = {{"id", x.id}, {"severity", x.severity}, {"message", x.message}, {"fix", x.fix}, {"gain", x.gain}};
    if (x.simulated) {
      j["fixed_plan"] = sim::plan_to_json(x.fixed_plan);
      j["fixed_result"] = sim::sim_result_to_json(x.fixed_result);
      j["fixed_fits_with_margin"] = x.fixed_fits_with_margin;
    }
    f.push_back(j);
  }
  json doc = {{"schema_version", "fsdpsim.diagnose/1"},
              {"context", context_block_with_profile(cluster.name)},
              {"inputs", {{"model", model.name}, {"cluster", cluster.name}, {"config", d.config.source},
                          {"format", d.config.format}, {"memory_margin", d.memory_margin}}},
              {"read", {{"facts", d.config.facts}, {"warnings", d.config.warnings}}},
              {"plan", sim::plan_to_json(d.plan)},
              {"result", sim::sim_result_to_json(d.result)},
              {"fits_with_margin", d.fits_with_margin},
              {"findings", f}};
  if (d.has_combined)
    doc["all_fixes"] = {{"plan", sim::plan_to_json(d.combined_plan)}, {"result", sim::sim_result_to_json(d.combined_result)},
                        {"gain", d.combined_gain}};
  return doc;
}

std::string diagnosis_text(const Diagnosis& d) {
  std::ostringstream os;
  os << "Read " << d.config.source << " as " << d.config.format << ":\n";
  for (const auto& f : d.config.facts) os << "  - " << f << "\n";
  for (const auto& w : d.config.warnings) os << "  ! " << w << "\n";
  os << "Plan: " << label_of(d.plan) << "\n"
     << "Predicted: " << describe_result(d.result, d.usable) << (d.fits_with_margin ? "" : "  -> DOES NOT FIT") << "\n";
  int n = 0;
  for (const auto& f : d.findings) {
    os << "\n[" << f.severity << "] " << f.id << ": " << f.message << "\n";
    if (!f.fix.empty()) os << "    fix: " << f.fix << "\n";
    if (!f.gain.empty()) os << "    predicted: " << f.gain << "\n";
    n += f.severity == "problem";
  }
  if (d.has_combined) os << "\nAll fixes together: " << d.combined_gain << "\n";
  if (n == 0) os << "\nNo problems found.\n";
  return os.str();
}

}  // namespace fsdpsim::planner
