// Diagnose (see diagnose.h for the checks). Every finding that proposes a change simulates the
// changed plan; what a problem costs is the simulated difference (memory_saved, gain), never a guess.
#include "planner/diagnose.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/context.h"
#include "common/errors.h"
#include "models/wrap_graph.h"
#include "models/zoo.h"
#include "planner/config_text.h"
#include "planner/diagnose_fixes.h"
#include "program/optimizer_state.h"
#include "planner/explain.h"
#include "planner/planner.h"
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

std::string gain_text(const sim::SimResult& a, const sim::SimResult& b, double margin) {
  double d = a.tokens_per_s_per_gpu > 0 ? b.tokens_per_s_per_gpu / a.tokens_per_s_per_gpu - 1 : 0;
  const MemoryVerdict vb = memory_verdict(b, margin);
  return "tokens/s per GPU " + fmt("%.0f", a.tokens_per_s_per_gpu) + " -> " + fmt("%.0f", b.tokens_per_s_per_gpu) + " (" +
         fmt("%+.1f", 100 * d) + "%), peak " + fmt("%.1f", to_gib(a.peak_total_device)) + " -> " +
         fmt("%.1f", to_gib(b.peak_total_device)) + " GiB per GPU" +
         (vb.fits ? "" : " (still does not fit: " + gib_text(-vb.headroom()) + " over the usable " + gib_text(vb.usable) + ")");
}

double exposed_fraction(const sim::SimResult& r) {
  return r.step_time_ns > 0 ? static_cast<double>(r.exposed_comm_ns) / static_cast<double>(r.step_time_ns) : 0.0;
}

Bytes breakdown(const sim::SimResult& r, const char* key) {
  auto it = r.breakdown_at_peak.find(key);
  return it == r.breakdown_at_peak.end() ? 0 : it->second;
}

Finding make(const char* id, const char* severity) {
  Finding f;
  f.id = id;
  f.severity = severity;
  return f;
}

// The simulated memory a fix frees, as the message's last clause.
std::string saving_text(const Finding& f, const sim::SimResult& base) {
  if (!f.simulated || f.memory_saved == 0) return "";
  return f.memory_saved > 0 ? "; it costs " + gib_text(f.memory_saved) + " per GPU (peak " + gib_text(base.peak_total_device) +
                                  " -> " + gib_text(f.fixed_result.peak_total_device) + " with the fix alone)"
                            : "; the fix needs " + gib_text(-f.memory_saved) + " more per GPU";
}

}  // namespace

sim::Plan user_plan(const UserConfig& cfg, const calibrate::Cluster& cl) {
  const int world = cl.world();
  sim::Plan p = cfg.plan;
  if (p.mesh_shard < 0) p.mesh_shard = world / std::max(1, p.mesh_replicate);  // torchtitan "-1" = leftover ranks
  if (p.grad_accum < 0) {  // torchtitan global_batch_size
    std::int64_t gbs = -p.grad_accum, per = p.micro_batch * world;
    if (gbs % per != 0)
      throw InputError("training.global_batch_size", std::to_string(gbs),
                       "a multiple of local_batch_size x data-parallel degree = " + std::to_string(per));
    p.grad_accum = gbs / per;
  }
  return sim::resolve_plan(p, world, cl.gpus_per_node);
}

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
  sim::Plan p = user_plan(cfg, cl);
  if (!cfg.micro_batch_given) cfg.warnings.push_back("micro-batch not given: assumed 1 (use --micro-batch or `# fsdpsim: micro_batch=N`)");
  if (!cfg.seq_len_given) cfg.warnings.push_back("sequence length not given: assumed 2048 (use --seq-len or `# fsdpsim: seq_len=N`)");
  d.plan = sim::resolve_plan(p, world, gpn);
  const EvalFn run = sim_fn ? sim_fn : fast_simulate(model, hw);
  d.usable = usable_capacity(hw.memory_capacity(), margin);
  d.result = run(d.plan);
  d.fits_with_margin = memory_verdict(d.result, margin).fits;
  const sim::SimResult& base = d.result;
  const sim::Plan& bp = d.plan;
  const auto strategy = sim::effective_strategy(bp);
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
      f.fixed_fits_with_margin = memory_verdict(f.fixed_result, margin).fits;
      f.memory_saved = base.peak_total_device - f.fixed_result.peak_total_device;
      f.gain = gain_text(base, f.fixed_result, margin);
    } catch (const InputError& e) {
      f.gain = std::string("the fixed plan is not valid here: ") + e.what();
    }
  };
  // A fix is worth proposing when it makes a plan that does not fit fit (or shrink), or speeds up
  // one that fits by more than 2% without losing the fit.
  auto better = [&](const Finding& f) {
    if (!f.simulated) return false;
    if (!d.fits_with_margin) return f.fixed_fits_with_margin || f.fixed_result.peak_total_device < base.peak_total_device;
    return f.fixed_fits_with_margin && f.fixed_result.tokens_per_s_per_gpu > base.tokens_per_s_per_gpu * 1.02;
  };
  // Saving at least a tenth of the peak counts as a memory problem when the plan is tight or over.
  auto saves_much = [&](const Finding& f) { return f.simulated && f.memory_saved * 10 >= base.peak_total_device; };
  const bool tight = !d.fits_with_margin || base.peak_total_device * 10 > d.usable * 9;

  // 1. The wrap policy (K1: one FSDP unit all-gathers the whole model at once).
  models::WrapGraph g = models::build_wrap_graph(model, bp.auto_wrap_policy);
  if (world > 1 && strategy != sim::ShardingStrategy::NO_SHARD && g.units.size() <= 1) {
    Finding f = make("wrap_nothing", "problem");
    std::string what = cfg.wrap_classes.empty() ? std::string(cfg.format == "accelerate" ? "accelerate's NO_WRAP policy"
                                                                                        : "no auto_wrap_policy")
                                                : "an auto-wrap policy naming {" + [&] {
                                                    std::string s;
                                                    for (const auto& c : cfg.wrap_classes) s += (s.empty() ? "" : ", ") + c;
                                                    return s;
                                                  }() + "}";
    f.message = what + " wraps nothing in " + model.name + ": all " + fmt("%.2f", g.total_params / 1e9) +
                "B parameters form one FSDP unit, so forward and backward all-gather the whole model (" +
                gib_text(g.total_params * dtype_bytes(bp.param_dtype)) + " in " + std::string(dtype_name(bp.param_dtype)) +
                ") and memory barely falls with more GPUs (pitfall K1: a missing or wrong auto-wrap policy)";
    f.fix = fix_words::wrap_blocks(cfg, model);
    auto change = [](sim::Plan& q) { q.auto_wrap_policy = models::WrapPolicy{}; };
    try_fix(f, change);
    f.message += saving_text(f, base);
    problem_fixes.push_back(change);
    d.findings.push_back(f);
  } else if (bp.auto_wrap_policy.kind == models::WrapPolicy::Kind::Size &&
             static_cast<std::int64_t>(g.units.size()) > 2 * model.n_layers + 2) {
    Finding f = make("wrap_too_fine", "problem");
    f.message = "the size-based policy (min_num_params=" + std::to_string(bp.auto_wrap_policy.min_num_params) + ") makes " +
                std::to_string(g.units.size()) + " FSDP units for " + std::to_string(model.n_layers) +
                " blocks: many small all-gathers and Python hooks per step (D6)";
    f.fix = fix_words::wrap_blocks(cfg, model);
    auto change = [](sim::Plan& q) { q.auto_wrap_policy = models::WrapPolicy{}; };
    try_fix(f, change);
    if (better(f)) problem_fixes.push_back(change);
    else f.severity = "info";
    d.findings.push_back(f);
  }

  // 2. Precision.
  if (bp.param_dtype == Dtype::FP32) {
    Finding f = make("precision", "problem");
    f.message = "compute in fp32 (" +
                (cfg.precision.empty() ? std::string("no mixed precision")
                 : cfg.format == "accelerate" ? "mixed_precision " + cfg.precision
                 : cfg.format == "torchtitan" ? "mixed_precision_param float32"
                                              : "precision \"" + cfg.precision + "\"") +
                "): activations, all-gathered parameters and gradients are twice the size of bf16, and matmuls miss "
                "the bf16 tensor-core rate";
    f.fix = fix_words::bf16_compute(cfg);
    // What the fix means in each framework: Lightning >= 2.6 "bf16-mixed" reduces in bf16 too; the
    // others keep their reduce dtype.
    const bool lightning = cfg.format == "lightning" || cfg.format == "lightning-yaml";
    auto change = [lightning](sim::Plan& q) {
      q.param_dtype = Dtype::BF16;
      if (lightning) q.reduce_dtype = Dtype::BF16;
    };
    try_fix(f, change);
    f.message += saving_text(f, base);
    if (better(f) || (tight && saves_much(f))) problem_fixes.push_back(change);
    else f.severity = "info";
    d.findings.push_back(f);
  } else if (bp.master_weights_dtype == Dtype::FP32) {
    Finding f = make("precision", "info");
    Bytes state = breakdown(base, "sharded_params") + breakdown(base, "sharded_grads") + breakdown(base, "optimizer_state");
    std::string how = cfg.format == "torchtitan"  ? std::string("[training] dtype float32 (torchtitan's default)")
                      : cfg.precision.empty()       ? std::string("mixed precision")
                      : cfg.format == "accelerate" ? "mixed_precision " + cfg.precision
                                                   : "precision \"" + cfg.precision + "\"";
    f.message = how + " keeps fp32 sharded params, grads and optimizer state (" + gib_text(state) +
                " per GPU at the peak); pure bf16 keeps them in bf16, about half" +
                (cfg.format == "lightning" || cfg.format == "lightning-yaml"
                     ? " (Lightning-AI/pytorch-lightning#18717: bf16-true peaks near 4 x the bf16 model bytes)"
                     : "") +
                (bp.param_dtype == Dtype::FP16 ? "; fp16 also needs a ShardedGradScaler - bf16 does not" : "");
    f.fix = fix_words::pure_bf16(cfg);
    auto change = [](sim::Plan& q) { q.param_dtype = q.reduce_dtype = q.master_weights_dtype = Dtype::BF16; };
    try_fix(f, change);
    f.message += saving_text(f, base);
    if (tight && f.simulated && (f.fixed_fits_with_margin || !d.fits_with_margin)) {
      f.severity = "problem";
      problem_fixes.push_back(change);
    }
    d.findings.push_back(f);
  }

  // 2b. The optimizer state: torch.optim's AdamW keeps two states per trainable element in the master dtype; an
  // 8-bit AdamW (program/optimizer_state.h: bitsandbytes' under FSDP1, torchao's under FSDP2) a byte each. Proposed
  // when the plan is tight and the state is a fifth of its peak or more; torchtitan builds torch.optim's only, and
  // neither is modelled with CPU offload.
  const Bytes optim_state = breakdown(base, "optimizer_state");
  if (tight && bp.optimizer == sim::Optimizer::AdamW && !bp.cpu_offload.params && !bp.cpu_offload.optimizer &&
      cfg.format != "torchtitan" && optim_state * 5 >= base.peak_total_device) {
    Finding f = make("optimizer_state", "info");
    const sim::Optimizer eight = v1 ? sim::Optimizer::BnbAdamW8bit : sim::Optimizer::TorchaoAdamW8bit;
    f.message = "torch.optim's AdamW keeps " + gib_text(optim_state) + " of optimizer state per GPU at the peak (two " +
                std::string(dtype_name(bp.master_weights_dtype)) + " states per trainable element); " + sim::optimizer_class(eight) +
                " keeps about a byte per element and state (block-quantized moments: compare its loss curve with "
                "AdamW's)";
    f.fix = fix_words::eight_bit_adamw(cfg, eight);
    auto change = [eight](sim::Plan& q) { q.optimizer = eight; };
    try_fix(f, change);
    f.message += saving_text(f, base);
    if (f.simulated && (f.fixed_fits_with_margin || !d.fits_with_margin) && saves_much(f)) {
      f.severity = "problem";
      problem_fixes.push_back(change);
    }
    d.findings.push_back(f);
  }

  // 2c. QLoRA compiled under activation checkpointing (torchao's NF4 under FSDP2): PyTorch 2.11 keeps every
  // checkpointed block's dequantized NF4 weights and NF4 GEMM outputs to its backward (LinearNF4's ops escape the
  // checkpoint: models/autograd_tape.h TapeOp::escapes_checkpoint; measured, reports/validation/
  // torch-memory-2026-11-27-torchao). Eager, the block keeps its input alone, and so does an eager checkpoint
  // around the compiled block (checkpoint(compile(block)): derived from torch.utils.checkpoint's hooks, unmeasured).
  const bool full_ac = bp.activation_checkpointing.mode == AcMode::Full || bp.activation_checkpointing.mode == AcMode::EveryK;
  if (bp.lora.on() && bp.lora.quantize_nf4 && !v1 && bp.compile && full_ac && !bp.activation_checkpointing.outside_compile) {
    Finding f = make("qlora_compile_checkpointing", "info");
    f.message = "torch.compile with activation checkpointing and NF4 base weights: in PyTorch 2.11's compiled graph the "
                "NF4 linears' dequantization and GEMMs are not recomputed, so every checkpointed block keeps its "
                "weights in " + std::string(dtype_name(bp.param_dtype)) + " and those GEMMs' outputs until its backward "
                "(measured: Llama-3-8B QLoRA at 2 x 2048 tokens held 27.4 GiB compiled against 5.5 eager)";
    // Two fixes: compile off (measured), or the checkpoint moved around the compiled block, which keeps
    // compile's speed (derived, not measured): the latter where the framework can say it, it fits and is faster.
    f.fix = fix_words::no_compile(cfg);
    std::function<void(sim::Plan&)> change = [](sim::Plan& q) { q.compile = false; };
    try_fix(f, change);
    if (const std::string around = fix_words::checkpoint_around_compile(cfg); !around.empty()) {
      Finding t = f;
      t.fix = around;
      t.simulated = false;   // (not compile off's result, should this one be refused)
      const auto wrap = [](sim::Plan& q) { q.activation_checkpointing.outside_compile = true; };
      try_fix(t, wrap);
      if (t.simulated && (t.fixed_fits_with_margin || !f.fixed_fits_with_margin) &&
          (!f.simulated || t.fixed_result.tokens_per_s_per_gpu > f.fixed_result.tokens_per_s_per_gpu)) {
        t.message += "; with the checkpoint around each compiled block (torchtune's order) the block keeps its input "
                     "alone and compile's speed stays (derived from torch.utils.checkpoint's saved-tensor hooks, not "
                     "measured against PyTorch; " + fix_words::no_compile(cfg) + " is the measured alternative)";
        f = t;
        change = wrap;
      }
    }
    f.message += saving_text(f, base);
    if (f.simulated && (f.fixed_fits_with_margin || !d.fits_with_margin) && saves_much(f)) {   // (as 2b's rule)
      f.severity = "problem";
      problem_fixes.push_back(change);
    }
    d.findings.push_back(f);
  }

  // 3. Activation checkpointing: the modes the framework can express, the best simulated one.
  Bytes acts = breakdown(base, "activations");
  if (bp.activation_checkpointing.mode == AcMode::None) {
    Finding f = make("activation_checkpointing", "problem");
    f.message = "no activation checkpointing at sequence length " + std::to_string(bp.seq_len) + " x micro-batch " +
                std::to_string(bp.micro_batch) + ": saved activations hold " + gib_text(acts) + " of the " +
                gib_text(base.peak_allocated) + " allocated at the peak" + (d.fits_with_margin ? "" : " and the plan does not fit");
    Finding best = f;
    std::string best_mode;
    for (const auto& m : fix_words::checkpointing_modes(cfg)) {
      Finding t = f;
      sim::ActivationCheckpointing ac;
      ac.mode = m == "full" ? AcMode::Full : m == "every_2" ? AcMode::EveryK : AcMode::SelectiveOp;
      ac.every_k = m == "every_2" ? 2 : 1;
      ac.outside_compile = cfg.checkpoint_wraps_compiled && bp.compile && m != "selective_op";
      try_fix(t, [ac](sim::Plan& q) { q.activation_checkpointing = ac; });   // (the config's offloading stays)
      if (!t.simulated) continue;
      bool take = !best.simulated ||
                  (t.fixed_fits_with_margin && (!best.fixed_fits_with_margin || t.fixed_result.tokens_per_s_per_gpu > best.fixed_result.tokens_per_s_per_gpu)) ||
                  (!t.fixed_fits_with_margin && !best.fixed_fits_with_margin && t.fixed_result.peak_total_device < best.fixed_result.peak_total_device);
      if (take) { best = t; best_mode = m; }
    }
    f = best;
    f.fix = fix_words::activation_checkpointing(cfg, model, best_mode.empty() ? "full" : best_mode);
    if (f.simulated && f.fixed_plan.activation_offloading != sim::ActivationOffload::None)
      f.message += "; the config's enable_activation_offloading then moves each checkpointed layer's input to pinned "
                   "CPU memory instead of every tensor it saves (simulated with it)";
    const bool act_heavy = base.peak_allocated > 0 && acts * 10 >= base.peak_allocated * 4;
    const auto set_ac = [ac = f.fixed_plan.activation_checkpointing, off = f.fixed_plan.activation_offloading](sim::Plan& q) {
      q.activation_checkpointing = ac;
      q.activation_offloading = off;
    };
    // Alone, checkpointing may barely move a peak that another problem sets (a whole-model unit's flat
    // gradient at the end of the backward, which no activation adds to); after the fixes above it may be
    // what the plan needs. Then what it costs is measured on top of them.
    bool after_others = false, needed_after = false;
    if (f.simulated && !(better(f) || (tight && saves_much(f))) && !problem_fixes.empty()) {
      try {
        sim::Plan q = d.plan;
        for (const auto& fix : problem_fixes) fix(q);
        q = sim::resolve_plan(q, world, gpn);
        const sim::SimResult without = run(q);
        set_ac(q);
        q = sim::resolve_plan(q, world, gpn);
        const sim::SimResult with = run(q);
        const Bytes saved = without.peak_total_device - with.peak_total_device;
        const bool fits_before = memory_verdict(without, margin).fits, fits_after = memory_verdict(with, margin).fits;
        const bool tight_before = !fits_before || without.peak_total_device * 10 > d.usable * 9;
        if (saved * 10 >= without.peak_total_device || (!fits_before && fits_after)) {
          after_others = true;
          needed_after = (!fits_before && fits_after) || (tight_before && saved * 10 >= without.peak_total_device);
          f.fixed_plan = q;
          f.fixed_result = with;
          f.fixed_fits_with_margin = fits_after;
          f.memory_saved = saved;
          f.gain = gain_text(without, with, margin);
          f.message += "; with the fixes above applied it costs " + gib_text(saved) + " per GPU (peak " +
                       gib_text(without.peak_total_device) + " -> " + gib_text(with.peak_total_device) + ")" +
                       (needed_after ? "" : ", which the plan does not need: it fits with them alone");
        }
      } catch (const InputError&) {
      }
    }
    if (!after_others) f.message += saving_text(f, base);
    if (f.simulated && (needed_after || (!after_others && (better(f) || (tight && saves_much(f)))))) {
      problem_fixes.push_back(set_ac);
      d.findings.push_back(f);
    } else if (act_heavy || after_others) {
      f.severity = "info";
      d.findings.push_back(f);
    }
  }

  // 3b. torchtune's activation offloading (a key of its recipes): with every layer checkpointed, each layer's input
  // can live in pinned CPU memory instead of the GPU (program/lower_walk.cpp "activation offloading": derived from
  // torchtune's OffloadActivations, not measured). Proposed when the plan does not fit or is tight and it helps.
  if (cfg.format == "torchtune" && bp.activation_checkpointing.mode == AcMode::Full && !bp.activation_checkpointing.outside_fsdp &&
      bp.activation_offloading == sim::ActivationOffload::None && tight) {
    Finding f = make("activation_offloading", "problem");
    f.message = "every layer is checkpointed and its input stays on the GPU until its backward (" +
                std::to_string(bp.micro_batch) + " x " + std::to_string(bp.seq_len) + " tokens x hidden " +
                std::to_string(model.hidden) + " per layer, " + std::to_string(model.n_layers) +
                " layers); torchtune's activation offloading keeps them in pinned CPU memory and brings each back "
                "before its layer's recompute (torchtune's OffloadActivations as its source runs it; measured on PyTorch 2.11 "
                "within 0.1% of the allocated peak with HF's blocks)";
    f.fix = "enable_activation_offloading: True";
    const auto change = [](sim::Plan& q) { q.activation_offloading = sim::ActivationOffload::Streams; };
    try_fix(f, change);
    f.message += saving_text(f, base);
    if (f.simulated && (better(f) || saves_much(f))) {
      problem_fixes.push_back(change);
      d.findings.push_back(f);
    }
  }

  // 4. FULL_SHARD across nodes (K2).
  if (cl.nodes > 1 && bp.mesh_shard > gpn && bp.mesh_shard % gpn == 0 &&
      (strategy == sim::ShardingStrategy::FULL_SHARD || strategy == sim::ShardingStrategy::SHARD_GRAD_OP)) {
    Finding f = make("full_shard_across_nodes", "problem");
    int r = world / gpn;
    f.message = sim::strategy_name(strategy) + " shards over all " + std::to_string(bp.mesh_shard) + " GPUs across " +
                std::to_string(cl.nodes) + " nodes: exposed communication " + fmt("%.3f", to_seconds(base.exposed_comm_ns)) +
                " s = " + pct_text(exposed_fraction(base)) + " of the step over " +
                (cl.inter_node.empty() ? "the inter-node network" : cl.inter_node) + " (pitfall K2)";
    f.fix = fix_words::hybrid_shard(cfg, v1, r, gpn);
    auto change = [r, gpn](sim::Plan& q) {
      q.mesh_replicate = r;
      q.mesh_shard = gpn;
      if (q.reshard_after_forward.is_group()) q.reshard_after_forward = sim::ReshardAfterForward::yes();
      const bool zero2 = q.fsdp_version == sim::FsdpVersion::FSDP1 ? q.sharding_strategy == sim::ShardingStrategy::SHARD_GRAD_OP
                                                                   : q.reshard_after_forward.keeps();
      q.sharding_strategy = zero2 ? sim::ShardingStrategy::_HYBRID_SHARD_ZERO2 : sim::ShardingStrategy::HYBRID_SHARD;
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

  // 5. NO_SHARD (DDP's FSDP spelling) vs FULL_SHARD for a model that fits either way (K2).
  if (strategy == sim::ShardingStrategy::NO_SHARD && world > 1) {
    Finding f = make("no_shard", d.fits_with_margin ? "ok" : "problem");
    auto change = [world](sim::Plan& q) {
      q.mesh_replicate = 1;
      q.mesh_shard = world;
      q.sharding_strategy = sim::ShardingStrategy::FULL_SHARD;
      q.reshard_after_forward = sim::ReshardAfterForward::yes();
    };
    try_fix(f, change);
    if (d.fits_with_margin) {
      f.message = "NO_SHARD (DDP-like) is fine for this model: it fits (" + memory_text(base, margin) + ") and needs no all-gathers";
      if (f.simulated)
        f.message += "; FULL_SHARD would reach " + fmt("%.0f", f.fixed_result.tokens_per_s_per_gpu) + " tokens/s per GPU (" +
                     fmt("%+.1f", 100 * (f.fixed_result.tokens_per_s_per_gpu / std::max(1e-9, base.tokens_per_s_per_gpu) - 1)) +
                     "%) with " + gib_text(f.fixed_result.peak_total_device);
      f.fix = "";
    } else {
      f.message = "NO_SHARD keeps full params, grads and optimizer state on every GPU (" +
                  gib_text(breakdown(base, "sharded_params") + breakdown(base, "sharded_grads") + breakdown(base, "optimizer_state")) +
                  "): it does not fit";
      f.fix = fix_words::full_shard(cfg);
      problem_fixes.push_back(change);
    }
    d.findings.push_back(f);
  } else if (world > 1 && strategy != sim::ShardingStrategy::NO_SHARD) {
    Finding f = make("full_shard_overhead", "problem");
    auto change = [world](sim::Plan& q) {
      q.mesh_replicate = world;
      q.mesh_shard = 1;
      q.sharding_strategy = sim::ShardingStrategy::NO_SHARD;
      q.reshard_after_forward = sim::ReshardAfterForward::yes();
    };
    try_fix(f, change);
    if (f.simulated && f.fixed_fits_with_margin && f.fixed_result.tokens_per_s_per_gpu > base.tokens_per_s_per_gpu * 1.03) {
      f.message = sim::strategy_name(strategy) + " on a model this small costs throughput: NO_SHARD (DDP-like) also fits (" +
                  gib_text(f.fixed_result.peak_total_device) + ") and skips the all-gathers (FULL_SHARD moves ~1.5x the bytes, pitfall K2)";
      f.fix = fix_words::no_shard(cfg, world);
      problem_fixes.push_back(change);
      d.findings.push_back(f);
    }
  }

  // 6. HF gradient checkpointing outside FSDP.
  if (bp.activation_checkpointing.mode != AcMode::None && bp.activation_checkpointing.outside_fsdp) {
    Finding f = make("hf_gradient_checkpointing", "problem");
    f.message = "checkpointing outside FSDP (checkpoint(FSDP(block)), HF gradient_checkpointing) all-gathers every unit a third "
                "time in backward (A2)";
    f.fix = fix_words::fsdp_checkpointing_instead_of_hf(cfg, model);
    auto change = [](sim::Plan& q) { q.activation_checkpointing.outside_fsdp = false; };
    try_fix(f, change);
    problem_fixes.push_back(change);
    d.findings.push_back(f);
  }

  // 7. CPU offload: not needed, or accumulating gradients outside no_sync (FSDP1: wrong gradients).
  if (bp.cpu_offload.params || bp.cpu_offload.optimizer) {
    if (v1 && bp.cpu_offload.params && bp.grad_accum > 1 && bp.grad_sync) {
      Finding f = make("offload_accumulation", "problem");
      f.message = "FSDP1 with CPU offload accumulates " + std::to_string(bp.grad_accum) +
                  " micro-batches outside no_sync(): PyTorch's FSDP documents this as unsupported - the newly reduced "
                  "gradient replaces the accumulated one, so the gradients are wrong";
      f.fix = cfg.format == "lightning" ? "with Fabric, run every micro-batch but the last under `with fabric.no_backward_sync(model):` "
                                          "(the Trainer does this itself)"
                                        : "accumulate inside no_sync() (or set_requires_gradient_sync(False)) until the last micro-batch";
      auto change = [](sim::Plan& q) { q.grad_sync = false; };
      try_fix(f, change);
      problem_fixes.push_back(change);
      d.findings.push_back(f);
    }
    Finding f = make("cpu_offload", "problem");
    auto change = [](sim::Plan& q) { q.cpu_offload = sim::CpuOffload{}; };
    try_fix(f, change);
    if (f.simulated && f.fixed_fits_with_margin) {
      f.message = "CPU offload although the plan fits without it (" + memory_text(f.fixed_result, margin) +
                  "): host copies and a CPU optimizer step slow every step";
      f.fix = fix_words::no_cpu_offload(cfg);
      problem_fixes.push_back(change);
      d.findings.push_back(f);
    }
  }

  // 8. A CPU-bound step (the CPU issues eager ops and hooks for nearly all of it; sim/simulator.cpp's note): twice
  // the micro-batch in half the micro-batches keeps the global batch and issues half the ops per token.
  if (d.fits_with_margin && sim::cpu_bound(base)) {
    Finding f = make("cpu_bound", "info");
    const bool halve = bp.grad_accum >= 2 && bp.grad_accum % 2 == 0;
    const std::int64_t mb = 2 * bp.micro_batch;
    const int ga = halve ? bp.grad_accum / 2 : bp.grad_accum;
    auto change = [mb, ga](sim::Plan& q) {
      q.micro_batch = mb;
      q.grad_accum = ga;
    };
    try_fix(f, change);
    f.message = "the step is CPU-bound: the CPU issues its ops for " + fmt("%.3f", to_seconds(base.cpu_issue_ns)) +
                " of its " + fmt("%.3f", to_seconds(base.step_time_ns)) + " s while the GPU computes for " +
                fmt("%.3f", to_seconds(base.compute_ns)) + " s (eager PyTorch's CPU cost per op, fitted on PyTorch 2.11: "
                "it depends on the host and the PyTorch version more than the GPU)";
    if (better(f)) {
      f.severity = "problem";
      f.message += std::string("; a micro-batch of ") + std::to_string(mb) + (halve ? " in half the micro-batches" : "") +
                   " issues half the ops per token" + (halve ? "" : " (the global batch doubles)");
      f.fix = fix_words::micro_batch(cfg, mb, ga);
      problem_fixes.push_back(change);
    } else {
      f.message += "; torch.compile or CUDA graphs cut the ops the CPU issues" +
                   std::string(f.simulated && !f.fixed_fits_with_margin ? " (twice the micro-batch does not fit)" : "");
    }
    d.findings.push_back(f);
  }

  if (!d.fits_with_margin && problem_fixes.empty())
    d.findings.push_back({"does_not_fit", "problem",
                          "the configuration does not fit (" + memory_text(base, margin) +
                              "), and no single fix above makes it fit; run `fsdpsim plan` or `fsdpsim fit` for a full search",
                          "", false, {}, {}, false, "", 0});
  if (problem_fixes.size() > 1) {
    sim::Plan q = d.plan;
    for (const auto& fx : problem_fixes) fx(q);
    try {
      d.combined_plan = sim::resolve_plan(q, world, gpn);
      d.combined_result = run(d.combined_plan);
      d.has_combined = true;
      d.combined_gain = gain_text(base, d.combined_result, margin);
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
      j["memory_saved_bytes"] = x.memory_saved;
    }
    f.push_back(j);
  }
  const MemoryVerdict v = memory_verdict(d.result, d.memory_margin);
  json doc = {{"schema_version", "fsdpsim.diagnose/1"},
              {"context", context_block_with_profile(cluster.name)},
              {"inputs", {{"model", model.name}, {"cluster", cluster.name}, {"config", d.config.source},
                          {"format", d.config.format}, {"memory_margin", d.memory_margin}}},
              {"read", {{"facts", d.config.facts}, {"warnings", d.config.warnings}}},
              {"plan", sim::plan_to_json(d.plan)},
              {"result", sim::sim_result_to_json(d.result)},
              {"memory", {{"capacity_bytes", v.capacity}, {"usable_bytes", v.usable}, {"peak_bytes", v.peak},
                          {"headroom_bytes", v.headroom()}, {"text", memory_text(d.result, d.memory_margin)}}},
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
     << "Predicted: " << describe_result(d.result, d.memory_margin) << (d.fits_with_margin ? "" : "  -> DOES NOT FIT") << "\n";
  int n = 0;
  for (const auto& f : d.findings) {
    os << "\n[" << f.severity << "] " << f.id << ": " << f.message << "\n";
    if (!f.fix.empty()) os << "    fix: " << f.fix << "\n";
    if (!f.gain.empty()) os << "    predicted with the fix: " << f.gain << "\n";
    n += f.severity == "problem";
  }
  if (d.has_combined) os << "\nAll fixes together: " << d.combined_gain << "\n";
  if (n == 0) os << "\nNo problems found.\n";
  return os.str();
}

}  // namespace fsdpsim::planner
