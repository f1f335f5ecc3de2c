// accelerate configs for `fsdpsim diagnose` (ecosystem.md §2.3; accelerate 16cb6eb, 2026-07):
// the `accelerate config` YAML's `fsdp_config:` keys, `parallelism_config:`, `mixed_precision`,
// `dynamo_config` and `fp8_config`. Facts from src/accelerate/utils/dataclasses.py
// (FullyShardedDataParallelPlugin.__post_init__):
//  * a missing fsdp_auto_wrap_policy is NO_WRAP (`os.environ.get("FSDP_AUTO_WRAP_POLICY", "NO_WRAP")`):
//    the whole model is one FSDP unit, the "3x the memory" pitfall (K1). A misspelled key inside
//    fsdp_config is never read by `accelerate launch`, so it is the same NO_WRAP;
//  * the policy value is compared in upper case and must be one of TRANSFORMER_BASED_WRAP,
//    SIZE_BASED_WRAP, NO_WRAP (else ValueError "Invalid auto wrap policy");
//  * TRANSFORMER_BASED_WRAP without fsdp_transformer_layer_cls_to_wrap wraps model._no_split_modules;
//  * SIZE_BASED_WRAP without fsdp_min_num_params: `accelerate launch` passes its default 1e8
//    (src/accelerate/commands/launch.py).
#include <algorithm>

#include "common/errors.h"
#include "planner/config_readers.h"
#include "planner/config_text.h"
#include "planner/search_space.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {
namespace {

using namespace config_text;
using AcMode = sim::ActivationCheckpointing::Mode;

const std::vector<std::string>& known_fsdp_keys() {
  static const std::vector<std::string> k = {
      "fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy",
      "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params", "fsdp_backward_prefetch", "fsdp_backward_prefetch_policy",
      "fsdp_forward_prefetch", "fsdp_offload_params", "fsdp_state_dict_type", "fsdp_use_orig_params",
      "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "fsdp_activation_checkpointing", "fsdp_ignored_modules",
      "fsdp_activation_checkpointing_offload"};
  return k;
}

// fsdp_sharding_strategy: a name or the wizard's number (1 = FULL_SHARD ... 5 = _HYBRID_SHARD_ZERO2).
void read_strategy(const std::string& key, const std::string& v, sim::Plan& p) {
  static const char* nums[] = {"", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"};
  std::string s = unquote(v);
  if (s.size() == 1 && s[0] >= '1' && s[0] <= '5') s = nums[s[0] - '0'];
  set_plan_key(p, "sharding_strategy", s, key);
}

// fsdp_config's key for a plan key (the table's accelerate spelling, program/plan_keys.h), and its field.
std::string fsdp_key(const char* plan_key) { return sim::section_key(plan_key, sim::Framework::Accelerate); }
std::string fsdp_field(const char* plan_key) { return sim::spelling(plan_key, sim::Framework::Accelerate); }

void read_wrap_policy(KV& f, const models::ModelSpec& model, UserConfig& cfg) {
  auto& p = cfg.plan;
  const std::string key = fsdp_key("auto_wrap_policy");
  cfg.wrap_policy_given = f.count(key) > 0;
  if (!cfg.wrap_policy_given) {
    p.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
    std::string misspelled;
    for (const auto& [k, v] : f)
      if (closest_key(k, {key}) == key) misspelled = k;
    cfg.facts.push_back(misspelled.empty()
                            ? "no " + key + ": accelerate's default is NO_WRAP, so the whole model is one FSDP unit"
                            : "fsdp_config." + misspelled + " is not a key accelerate reads (" + key + " is), so "
                              "the policy is accelerate's default NO_WRAP: the whole model is one FSDP unit");
    return;
  }
  const std::string wrap = upper(unquote(f[key]));
  if (wrap == "TRANSFORMER_BASED_WRAP") {
    if (f.count("fsdp_transformer_layer_cls_to_wrap")) {
      cfg.wrap_classes = as_names(f["fsdp_transformer_layer_cls_to_wrap"]);
      bool hit = names_block(cfg.wrap_classes, model, p.implementation);
      p.auto_wrap_policy.kind = hit ? models::WrapPolicy::Kind::TransformerBlock : models::WrapPolicy::Kind::None;
      if (!hit)
        cfg.facts.push_back("fsdp_transformer_layer_cls_to_wrap " + f["fsdp_transformer_layer_cls_to_wrap"] + " names no module of " +
                            model.name + " (its blocks are " + model.block_class + "): nothing is wrapped");
    } else {
      p.auto_wrap_policy.kind = models::WrapPolicy::Kind::TransformerBlock;
      cfg.facts.push_back("no fsdp_transformer_layer_cls_to_wrap: accelerate uses model._no_split_modules (" + model.block_class + ")");
    }
  } else if (wrap == "SIZE_BASED_WRAP") {
    p.auto_wrap_policy.kind = models::WrapPolicy::Kind::Size;
    p.auto_wrap_policy.min_num_params =
        f.count("fsdp_min_num_params") ? as_int("fsdp_config.fsdp_min_num_params", f["fsdp_min_num_params"], 1, std::int64_t{1} << 50)
                                       : 100'000'000;   // `accelerate launch --fsdp_min_num_params` default int(1e8)
  } else if (wrap == "NO_WRAP") {
    p.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
    cfg.facts.push_back("fsdp_auto_wrap_policy NO_WRAP: the whole model is one FSDP unit");
  } else {
    throw InputError(fsdp_field("auto_wrap_policy"), f[key],
                     "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP (accelerate raises \"Invalid auto wrap policy\")");
  }
}

void read_precision(KV& top, const YAML::Node& root, UserConfig& cfg) {
  auto& p = cfg.plan;
  // mixed_precision: accelerate keeps fp32 master weights (FSDP2 upcasts, ecosystem.md §2.3); the
  // reduce dtype follows the compute dtype (assumed: no YAML key for it).
  std::string mp = top.count("mixed_precision") ? lower(unquote(top["mixed_precision"])) : "no";
  cfg.precision = mp;
  p.master_weights_dtype = Dtype::FP32;
  if (mp == "bf16") p.param_dtype = p.reduce_dtype = Dtype::BF16;
  else if (mp == "fp16") p.param_dtype = p.reduce_dtype = Dtype::FP16;
  else if (mp == "no") p.param_dtype = p.reduce_dtype = Dtype::FP32;
  else if (mp == "fp8") {
    p.param_dtype = p.reduce_dtype = Dtype::BF16;
    KV fp8 = yaml_map(root["fp8_config"]);
    std::string backend = fp8.count("backend") ? upper(unquote(fp8["backend"])) : "";
    if (backend == "AO") {
      // AORecipeKwargs: a default Float8LinearConfig (tensorwise) with enable_fsdp_float8_all_gather=True.
      p.float8 = models::Float8Recipe::Tensorwise;
      p.fp8_all_gather = p.fsdp_version == sim::FsdpVersion::FSDP2;
      cfg.facts.push_back("mixed_precision fp8 with fp8_config.backend AO: torchao Float8Linear, tensorwise scaling" +
                          std::string(p.fp8_all_gather ? ", float8 all-gathers (FSDP2)" : ""));
    } else {
      cfg.warnings.push_back("mixed_precision fp8 with backend " + (backend.empty() ? std::string("(not given)") : backend) +
                             ": simulated as bf16 (only torchao's float8, fp8_config.backend AO, is modelled)");
    }
  } else {
    throw InputError("mixed_precision", mp, "no, fp16, bf16 or fp8");
  }
  cfg.facts.push_back("mixed_precision " + mp + ": param/reduce " + std::string(dtype_name(p.param_dtype)) +
                      ", fp32 master weights (assumed: accelerate has no reduce-dtype key)");
}

}  // namespace

void read_accelerate(const YAML::Node& root, const models::ModelSpec& model, UserConfig& cfg) {
  auto& p = cfg.plan;
  KV top = yaml_map(root);
  KV f = yaml_map(root["fsdp_config"]);
  if (top.count("distributed_type") && top["distributed_type"] != "FSDP")
    throw InputError("distributed_type", top["distributed_type"], "FSDP (this diagnoses FSDP configurations)");
  p.implementation = models::ModelImpl::HF;   // accelerate trains transformers models
  // The keys the plan-key table spells for accelerate (program/plan_keys.cpp): the value given, or nullptr.
  const auto given = [&f](const char* plan_key) -> const std::string* {
    const auto it = f.find(fsdp_key(plan_key));
    return it == f.end() ? nullptr : &it->second;
  };
  const int version = given("fsdp_version") ? static_cast<int>(as_int(fsdp_field("fsdp_version"), *given("fsdp_version"), 1, 2)) : 1;
  p.fsdp_version = version == 1 ? sim::FsdpVersion::FSDP1 : sim::FsdpVersion::FSDP2;
  if (const std::string* v = given("sharding_strategy")) read_strategy(fsdp_field("sharding_strategy"), *v, p);
  if (const std::string* given_raf = given("reshard_after_forward")) {
    const std::string key = fsdp_field("reshard_after_forward"), v = *given_raf;
    std::string l = lower(v);
    if (version == 2 || l == "true" || l == "false") {
      bool r = as_bool(key, v);
      p.reshard_after_forward = sim::ReshardAfterForward::of(r);
      if (version == 1) p.sharding_strategy = r ? sim::ShardingStrategy::FULL_SHARD : sim::ShardingStrategy::SHARD_GRAD_OP;
    } else {
      read_strategy(key, v, p);  // the wizard writes the FSDP1 strategy under this key
    }
  }
  read_wrap_policy(f, model, cfg);
  for (const std::string& k : {fsdp_key("backward_prefetch"), std::string("fsdp_backward_prefetch_policy")})
    if (f.count(k)) {
      set_plan_key(p, "backward_prefetch", unquote(f[k]), std::string("fsdp_config.") + k);
    }
  if (const std::string* v = given("forward_prefetch")) p.forward_prefetch = as_bool(fsdp_field("forward_prefetch"), *v);
  if (const std::string* v = given("cpu_offload")) p.cpu_offload.params = p.cpu_offload.optimizer = as_bool(fsdp_field("cpu_offload"), *v);
  if (const std::string* v = given("use_orig_params")) p.use_orig_params = as_bool(fsdp_field("use_orig_params"), *v);
  if (const std::string* v = given("activation_checkpointing"); v && as_bool(fsdp_field("activation_checkpointing"), *v))
    p.activation_checkpointing.mode = AcMode::Full;
  read_precision(top, root, cfg);
  KV dyn = yaml_map(root["dynamo_config"]);
  if (dyn.count("dynamo_backend")) {
    std::string b = upper(unquote(dyn["dynamo_backend"]));
    if (b == "INDUCTOR") {
      p.compile = true;
      cfg.facts.push_back("dynamo_config.dynamo_backend INDUCTOR: torch.compile, compile true");
    } else if (b != "NO") {
      cfg.warnings.push_back("dynamo_config.dynamo_backend " + b + ": only the inductor backend is modelled; simulated without compile");
    }
  }
  if (top.count("num_machines")) cfg.nodes = static_cast<int>(as_int("num_machines", top["num_machines"], 1, 1 << 20));
  if (top.count("num_processes")) {
    long long np = as_int("num_processes", top["num_processes"], 1, 1 << 24);
    int nodes = cfg.nodes > 0 ? cfg.nodes : 1;
    if (np % nodes != 0) throw InputError("num_processes", top["num_processes"], "a multiple of num_machines (it counts all machines)");
    cfg.gpus_per_node = static_cast<int>(np / nodes);
  }
  KV pc = yaml_map(root["parallelism_config"]);
  if (pc.count("parallelism_config_dp_replicate_size") || pc.count("parallelism_config_dp_shard_size")) {
    p.mesh_replicate = pc.count("parallelism_config_dp_replicate_size")
                           ? static_cast<int>(as_int("parallelism_config.parallelism_config_dp_replicate_size", pc["parallelism_config_dp_replicate_size"], 1, 1 << 20)) : 1;
    p.mesh_shard = pc.count("parallelism_config_dp_shard_size")
                       ? static_cast<int>(as_int("parallelism_config.parallelism_config_dp_shard_size", pc["parallelism_config_dp_shard_size"], 1, 1 << 20)) : 0;
    if (p.mesh_shard == 0) p.mesh_replicate = 0;
  }
  // accelerator.accumulate() skips the sync until the last micro-batch.
  p.grad_sync = false;
  for (const auto& [k, v] : f)
    if (std::find(known_fsdp_keys().begin(), known_fsdp_keys().end(), k) == known_fsdp_keys().end()) {
      std::string near = closest_key(k, known_fsdp_keys());
      if (near == "fsdp_auto_wrap_policy" && !cfg.wrap_policy_given) continue;   // said in the wrap policy's fact
      cfg.warnings.push_back("fsdp_config." + k + " is not an accelerate key; accelerate ignores it" +
                             (near.empty() ? "" : " (did you mean " + near + "?)"));
    }
}

}  // namespace fsdpsim::planner
