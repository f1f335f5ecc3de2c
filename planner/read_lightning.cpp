// PyTorch Lightning configs for `fsdpsim diagnose` (ecosystem.md §2.1; Lightning 7f0c343):
// src/lightning/pytorch/strategies/fsdp.py. The strategy is FSDPStrategy(...) (FSDP1 underneath) or
// one of its registered names: strategy="fsdp" is FSDPStrategy() with every default (no
// auto_wrap_policy: the whole model is one FSDP unit; no activation checkpointing; FULL_SHARD), and
// "fsdp_cpu_offload" the same with cpu_offload=True (FSDPStrategy.register_strategies).
#include <algorithm>
#include <regex>

#include "common/errors.h"
#include "planner/config_readers.h"
#include "planner/config_text.h"
#include "planner/search_space.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {
namespace {

using namespace config_text;
using AcMode = sim::ActivationCheckpointing::Mode;

void apply_precision_string(const std::string& key, const std::string& raw, UserConfig& cfg) {
  std::string s = lower(unquote(raw));
  auto& p = cfg.plan;
  cfg.precision = s;
  if (s == "32-true" || s == "32") { p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::FP32; }
  else if (s == "bf16-mixed" || s == "bf16") { p.param_dtype = p.reduce_dtype = Dtype::BF16; p.master_weights_dtype = Dtype::FP32; }
  else if (s == "16-mixed" || s == "16") { p.param_dtype = p.reduce_dtype = Dtype::FP16; p.master_weights_dtype = Dtype::FP32; }
  else if (s == "bf16-true") { p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::BF16; }
  else if (s == "16-true") { p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::FP16; }
  else throw InputError(key, raw, "32-true, bf16-mixed, 16-mixed, bf16-true or 16-true (Lightning's FSDP precision strings)");
  cfg.facts.push_back("precision \"" + s + "\" (Lightning >= 2.6): param_dtype " + std::string(dtype_name(p.param_dtype)) +
                      ", reduce_dtype " + std::string(dtype_name(p.reduce_dtype)) + ", master weights " +
                      std::string(dtype_name(p.master_weights_dtype)));
}

void apply_lightning(const KV& strategy, const KV& trainer, const std::string& prefix_s, const std::string& prefix_t,
                     const models::ModelSpec& model, UserConfig& cfg) {
  auto& p = cfg.plan;
  p.fsdp_version = sim::FsdpVersion::FSDP1;
  p.use_orig_params = true;  // Lightning's FSDPStrategy default
  p.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
  p.master_weights_dtype = Dtype::FP32;
  p.param_dtype = p.reduce_dtype = Dtype::FP32;  // Trainer default precision "32-true"
  const std::string block = block_class_for(model, p.implementation);
  static const std::vector<std::string> known = {
      "sharding_strategy", "device_mesh", "auto_wrap_policy", "activation_checkpointing_policy", "activation_checkpointing",
      "cpu_offload", "mixed_precision", "backward_prefetch", "forward_prefetch", "limit_all_gathers", "use_orig_params",
      "state_dict_type", "sync_module_states", "timeout", "process_group_backend", "checkpoint_io", "precision",
      "accelerator", "parallel_devices", "cluster_environment", "precision_plugin", "process_group", "fsdp_size"};
  for (const auto& [k, v] : strategy) {
    const std::string key = prefix_s + k;
    // FSDPStrategy's keyword for a plan key, as the plan-key table spells it (program/plan_keys.cpp).
    const auto is = [&name = k](const char* plan_key) { return name == sim::spelling(plan_key, sim::Framework::Lightning); };
    if (is("sharding_strategy")) {
      set_plan_key(p, "sharding_strategy", last_component(v), key);
    } else if (k == "device_mesh") {
      auto ints = as_ints(v);
      if (ints.size() != 2 || ints[0] < 1 || ints[1] < 1 || ints[0] > (1 << 20) || ints[1] > (1 << 20))
        throw InputError(key, v, "(replicate, shard), each in [1, 1048576], e.g. (2, 4)");
      p.mesh_replicate = static_cast<int>(ints[0]);
      p.mesh_shard = static_cast<int>(ints[1]);
      cfg.facts.push_back("device_mesh (" + std::to_string(ints[0]) + ", " + std::to_string(ints[1]) +
                          "): (replicate, shard), a 2-D mesh for HYBRID_SHARD");
    } else if (is("auto_wrap_policy")) {
      cfg.wrap_policy_given = true;
      std::string l = lower(v);
      if (l.find("size_based") != std::string::npos) {
        p.auto_wrap_policy.kind = models::WrapPolicy::Kind::Size;
        std::smatch m;
        if (std::regex_search(v, m, std::regex("min_num_params\\s*=\\s*([0-9eE.+_]+)")))
          p.auto_wrap_policy.min_num_params = as_int(key + ".min_num_params", m[1].str(), 1, std::int64_t{1} << 50);
        else
          p.auto_wrap_policy.min_num_params = 100'000'000;  // PyTorch's size_based_auto_wrap_policy default (1e8)
      } else if (l == "none" || l.empty()) {
        p.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
      } else {
        cfg.wrap_classes = as_names(v);
        bool hit = names_block(cfg.wrap_classes, model, p.implementation);
        p.auto_wrap_policy.kind = hit ? models::WrapPolicy::Kind::TransformerBlock : models::WrapPolicy::Kind::None;
        if (!hit)
          cfg.facts.push_back("auto_wrap_policy " + v + " names no module of " + model.name + " (its blocks are " + block +
                              "): nothing is wrapped");
      }
    } else if (is("activation_checkpointing") || k == "activation_checkpointing") {   // and the deprecated name
      // FSDPStrategy checkpoints every module the policy names (apply_activation_checkpointing): full
      // checkpointing of each block; there is no op-level form here.
      auto names = as_names(v);
      bool hit = names_block(names, model, p.implementation);
      if (hit) {
        p.activation_checkpointing.mode = AcMode::Full;
        cfg.facts.push_back(k + " " + v + ": every " + block + " is checkpointed (full activation checkpointing)");
      } else if (lower(unquote(v)) != "none") {
        cfg.facts.push_back(k + " " + v + " names no module of " + model.name + ": no block is checkpointed");
      }
    } else if (is("cpu_offload")) {
      p.cpu_offload.params = p.cpu_offload.optimizer = as_bool(key, v);
    } else if (k == "mixed_precision") {
      std::smatch m;
      if (std::regex_search(v, m, std::regex("param_dtype\\s*=\\s*([A-Za-z0-9_.]+)"))) p.param_dtype = parse_dtype(m[1].str(), key + ".param_dtype");
      if (std::regex_search(v, m, std::regex("reduce_dtype\\s*=\\s*([A-Za-z0-9_.]+)"))) p.reduce_dtype = parse_dtype(m[1].str(), key + ".reduce_dtype");
    } else if (is("backward_prefetch")) {
      set_plan_key(p, "backward_prefetch", last_component(v), key);
    } else if (is("forward_prefetch")) {
      p.forward_prefetch = as_bool(key, v);
    } else if (is("limit_all_gathers")) {
      p.limit_all_gathers = as_bool(key, v);
    } else if (is("use_orig_params")) {
      p.use_orig_params = as_bool(key, v);
    } else if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string near = closest_key(k, known);
      cfg.warnings.push_back("ignored " + key + " = " + v + (near.empty() ? "" : " (did you mean " + near + "?)"));
    }
  }
  if (!cfg.wrap_policy_given)
    cfg.facts.push_back("no auto_wrap_policy: FSDPStrategy wraps the whole model as one FSDP unit");
  if (!strategy.count("activation_checkpointing_policy") && !strategy.count("activation_checkpointing"))
    cfg.facts.push_back("no activation_checkpointing_policy: no block is checkpointed");
  bool precision_set = false;
  for (const auto& [k, v] : trainer) {
    const std::string key = prefix_t + k;
    if (k == "precision") { precision_set = true; continue; }
    if (k == "devices") { if (lower(unquote(v)) != "auto" && lower(unquote(v)) != "-1") cfg.gpus_per_node = static_cast<int>(as_int(key, v, 1, 1024)); }
    else if (k == "num_nodes") cfg.nodes = static_cast<int>(as_int(key, v, 1, 1 << 20));
    else if (k == sim::spelling("grad_accum", sim::Framework::Lightning)) p.grad_accum = as_int(key, v, 1, 65536);
  }
  // Precision after the strategy's mixed_precision? Lightning: an explicit MixedPrecision wins.
  if (precision_set) {
    Dtype pd = p.param_dtype, rd = p.reduce_dtype;
    bool mp = strategy.count("mixed_precision") > 0;
    apply_precision_string(prefix_t + "precision", trainer.at("precision"), cfg);
    if (mp) { p.param_dtype = pd; p.reduce_dtype = rd; }
  } else {
    cfg.precision = "32-true";
    cfg.facts.push_back("no Trainer precision: \"32-true\" (Lightning's default): fp32 params, gradients, all-gathers "
                        "and activations");
  }
}

// Gradient accumulation: the Trainer's automatic optimization runs the micro-batches before the last
// under strategy.block_backward_sync(), which enters the module's no_sync() when it has one
// (ParallelStrategy.block_backward_sync; FSDPStrategy wraps the root in FullyShardedDataParallel):
// no_sync, grad_sync false. Fabric syncs every backward unless the script uses
// fabric.no_backward_sync(model).
void read_accumulation(const std::string& text, bool fabric, UserConfig& cfg) {
  auto& p = cfg.plan;
  p.grad_sync = fabric && text.find("no_backward_sync") == std::string::npos;
  if (p.grad_accum > 1)
    cfg.facts.push_back(fabric ? (p.grad_sync ? "Fabric without no_backward_sync: gradients reduced after every micro-batch"
                                              : "fabric.no_backward_sync: gradients reduced after the last micro-batch only")
                               : "accumulate_grad_batches " + std::to_string(p.grad_accum) +
                                     ": the Trainer accumulates inside FSDP's no_sync() and reduces after the last micro-batch");
}

// strategy="fsdp" / "fsdp_cpu_offload" (the registered names), any case. Returns false for another
// string; InputError when the strategy is a string that is not FSDP at all.
bool registered_fsdp_strategy(const std::string& key, const std::string& raw, KV& strategy, UserConfig& cfg) {
  std::string v = unquote(raw);
  if (v == raw && v.find('(') != std::string::npos) return false;   // an expression, e.g. FSDPStrategy(...)
  std::string l = lower(v);
  if (l == "fsdp" || l == "fsdp_cpu_offload") {
    if (l == "fsdp_cpu_offload") strategy["cpu_offload"] = "True";
    cfg.facts.push_back("strategy=\"" + v + "\": FSDPStrategy() with its defaults (FULL_SHARD, no auto_wrap_policy, no "
                        "activation checkpointing" + (l == "fsdp_cpu_offload" ? ", cpu_offload=True)" : ")"));
    return true;
  }
  if (v != raw || l == "ddp" || l == "auto")
    throw InputError(key, raw, "an FSDP strategy: \"fsdp\", \"fsdp_cpu_offload\" or FSDPStrategy(...)");
  return false;
}

// Which model code runs (plan key `implementation`): LitGPT's when the script imports litgpt and no
// transformers model; Hugging Face transformers' otherwise (Lightning trains whatever module it is given).
models::ModelImpl script_implementation(const std::string& text, UserConfig& cfg) {
  bool litgpt = std::regex_search(text, std::regex("(^|\\n)\\s*(from|import)\\s+litgpt\\b"));
  bool hf = std::regex_search(text, std::regex("(^|\\n)\\s*(from|import)\\s+transformers\\b"));
  if (litgpt && !hf) {
    cfg.facts.push_back("imports litgpt: LitGPT's model code (implementation \"litgpt\", blocks are litgpt.model.Block)");
    return models::ModelImpl::LitGPT;
  }
  return models::ModelImpl::HF;
}

// torch.compile and torchao float8 in a script: what Lightning / Fabric users write around their model.
void read_script_features(const std::string& text, UserConfig& cfg) {
  auto& p = cfg.plan;
  if (std::regex_search(text, std::regex("\\btorch\\.compile\\s*\\(|\\.compile\\s*\\(\\s*\\)"))) {
    p.compile = true;
    cfg.facts.push_back("torch.compile: compile true");
  }
  if (text.find("convert_to_float8_training") != std::string::npos) {
    p.float8 = text.find("rowwise") != std::string::npos ? models::Float8Recipe::Rowwise : models::Float8Recipe::Tensorwise;
    cfg.facts.push_back("convert_to_float8_training: torchao Float8Linear, float8 \"" + models::float8_recipe_name(p.float8) + "\"");
    if (std::regex_search(text, std::regex("enable_fsdp_float8_all_gather\\s*=\\s*True"))) {
      if (p.fsdp_version == sim::FsdpVersion::FSDP1)
        cfg.warnings.push_back("enable_fsdp_float8_all_gather=True needs FSDP2 (fully_shard); FSDPStrategy is FSDP1, "
                               "so the all-gathers stay in the parameter dtype");
      else
        p.fp8_all_gather = true;
    }
  }
}

}  // namespace

void read_lightning_script(const std::string& raw_text, const std::string& source, const models::ModelSpec& model,
                           UserConfig& cfg) {
  const std::string text = strip_python_comments(raw_text);
  cfg.plan.implementation = script_implementation(text, cfg);
  std::string sargs, targs;
  bool has_strategy = call_arguments(text, "FSDPStrategy", sargs);
  const bool is_trainer = call_arguments(text, "Trainer", targs);
  const bool has_trainer = is_trainer || call_arguments(text, "Fabric", targs);
  const bool fabric = has_trainer && !is_trainer;
  if (is_trainer && !cfg.plan.free_logits_before_backward) {
    // Automatic optimization: the closure calls training_step, which returns the loss, and runs backward
    // on it after training_step has returned: the step's local logits are gone by then. A Fabric loop
    // (`logits = model(x)`, the loss, fabric.backward) keeps them through backward, the plan's default.
    cfg.plan.free_logits_before_backward = true;
    cfg.facts.push_back("Trainer: training_step returns the loss and backward runs after it returns, so the "
                        "logits are freed before backward (free_logits_before_backward)");
  }
  KV strategy = has_strategy ? keyword_arguments(sargs) : KV{};
  KV trainer = keyword_arguments(targs);
  if (!has_strategy) {
    auto it = trainer.find("strategy");
    if (it == trainer.end() || !registered_fsdp_strategy("Trainer.strategy", it->second, strategy, cfg))
      throw InputError(source, has_trainer ? "<Trainer without an FSDP strategy>" : "<no FSDPStrategy(...)>",
                       "a Lightning script with FSDPStrategy(...) or Trainer/Fabric(strategy=\"fsdp\")");
  }
  apply_lightning(strategy, trainer, "FSDPStrategy.", fabric ? "Fabric." : "Trainer.", model, cfg);
  read_accumulation(text, fabric, cfg);
  std::smatch m;
  if (std::regex_search(text, m, std::regex("\\bbatch_size\\s*=\\s*([0-9]+)"))) {
    cfg.plan.micro_batch = as_int("batch_size", m[1].str(), 1, 65536);
    cfg.micro_batch_given = true;
  }
  read_sequence_length(text, cfg);
  read_script_features(text, cfg);
  if (text.find("gradient_checkpointing_enable") != std::string::npos) {
    cfg.hf_gradient_checkpointing = true;
    cfg.plan.activation_checkpointing.mode = AcMode::Full;
    cfg.plan.activation_checkpointing.outside_fsdp = true;
    cfg.facts.push_back("model.gradient_checkpointing_enable(): HF checkpointing outside FSDP, checkpoint(FSDP(block))");
  }
  // Module.compile() compiles a module in place (a block in configure_model, as Lightning's docs do it); the
  // checkpointing read above is applied after configure_model (FSDPStrategy's activation_checkpointing_policy) or
  // inside the model's forward around each layer's call (HF): either way around the compiled block.
  cfg.checkpoint_wraps_compiled = cfg.plan.compile && std::regex_search(text, std::regex("\\.compile\\s*\\(\\s*\\)"));
  if (cfg.checkpoint_wraps_compiled && cfg.plan.activation_checkpointing.mode != AcMode::None) {
    cfg.plan.activation_checkpointing.outside_compile = true;
    cfg.facts.push_back(".compile() on modules the checkpointing then wraps: checkpoint(compile(block)) "
                        "(activation_checkpointing.outside_compile)");
  }
}

void read_lightning_yaml(const YAML::Node& root, const models::ModelSpec& model, UserConfig& cfg) {
  // Subscripting a scalar or sequence throws in yaml-cpp: only maps are looked into.
  auto in_map = [](const YAML::Node& n, const char* key) { return n && n.IsMap() ? n[key] : YAML::Node(); };
  YAML::Node tr = root["trainer"];
  KV trainer = yaml_map(tr);
  KV strategy;
  YAML::Node st = in_map(tr, "strategy");
  if (st.IsMap()) strategy = yaml_map(in_map(st, "init_args"));
  else if (st && st.IsScalar() && !registered_fsdp_strategy("trainer.strategy", st.Scalar(), strategy, cfg))
    throw InputError("trainer.strategy", st.Scalar(), "an FSDP strategy: fsdp, fsdp_cpu_offload or a FSDPStrategy class_path");
  trainer.erase("strategy");
  apply_lightning(strategy, trainer, "trainer.strategy.init_args.", "trainer.", model, cfg);
  read_accumulation("", false, cfg);
  const YAML::Node data_node = root["data"];
  const YAML::Node data_args = in_map(data_node, "init_args") ? in_map(data_node, "init_args") : data_node;
  KV data = yaml_map(data_args);
  if (data.count("batch_size")) {
    cfg.plan.micro_batch = as_int("data.batch_size", data["batch_size"], 1, 65536);
    cfg.micro_batch_given = true;
  }
  for (const char* k : {"max_seq_length", "seq_length", "seq_len", "max_length", "block_size"})
    if (data.count(k)) {
      cfg.plan.seq_len = as_int(std::string("data.") + k, data[k], 1, 1 << 22);
      cfg.seq_len_given = true;
      cfg.facts.push_back("sequence length " + std::to_string(cfg.plan.seq_len) + " read from data." + k);
      break;
    }
}

}  // namespace fsdpsim::planner
