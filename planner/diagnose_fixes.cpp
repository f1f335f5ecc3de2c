// Fix spellings per framework (diagnose_fixes.h). Sources: ecosystem.md §2.1 (Lightning
// FSDPStrategy, Trainer precision strings), §2.3 (accelerate fsdp_config keys), §2.4 (torchtitan TOML).
#include "planner/diagnose_fixes.h"

#include "planner/config_text.h"
#include "program/optimizer_state.h"

namespace fsdpsim::planner::fix_words {
namespace {

bool lightning(const UserConfig& c) { return c.format == "lightning" || c.format == "lightning-yaml"; }
bool yaml_cli(const UserConfig& c) { return c.format == "lightning-yaml"; }

}  // namespace

std::string wrap_blocks(const UserConfig& cfg, const models::ModelSpec& model) {
  const std::string cls = config_text::block_class_for(model, cfg.plan.implementation);
  if (cfg.format == "accelerate")
    return "fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP and fsdp_transformer_layer_cls_to_wrap: " + cls;
  if (cfg.format == "torchtitan") return "fully_shard each " + cls + " (torchtitan's parallelize.py does)";
  if (cfg.format == "torchtune") return "shard each layer (the recipe's shard_model does: drop custom_sharded_layers)";
  if (cfg.format == "plan") return "\"auto_wrap_policy\": \"transformer_block\"";
  if (yaml_cli(cfg)) return "trainer.strategy.init_args.auto_wrap_policy naming " + cls + " (a class set is easiest in Python: FSDPStrategy(auto_wrap_policy={" + cls + "}))";
  return "FSDPStrategy(auto_wrap_policy={" + cls + "})";
}

std::string bf16_compute(const UserConfig& cfg) {
  if (cfg.format == "accelerate") return "mixed_precision: bf16";
  if (cfg.format == "torchtitan") return "[training] mixed_precision_param = \"bfloat16\"";
  if (cfg.format == "torchtune") return "dtype: bf16";
  if (cfg.format == "plan") return "\"param_dtype\": \"bf16\"";
  if (yaml_cli(cfg)) return "trainer.precision: bf16-mixed";
  return "Trainer(precision=\"bf16-mixed\")";
}

std::string pure_bf16(const UserConfig& cfg) {
  if (cfg.format == "accelerate")
    return "load the model in bfloat16 (from_pretrained(..., torch_dtype=torch.bfloat16)) and set mixed_precision: 'no' "
           "(accelerate's bf16 mode keeps fp32 master weights; there is no YAML key for pure bf16)";
  if (cfg.format == "torchtitan") return "[training] dtype = \"bfloat16\"";
  if (cfg.format == "torchtune") return "dtype: bf16";
  if (cfg.format == "plan") return "\"master_weights_dtype\": \"bf16\"";
  const std::string s = yaml_cli(cfg) ? "trainer.precision: bf16-true" : "Trainer(precision=\"bf16-true\")";
  return s + " (pure bf16: updates lose precision; keep fp32 master weights if training is unstable)";
}

std::vector<std::string> checkpointing_modes(const UserConfig& cfg) {
  // Lightning's activation_checkpointing_policy and accelerate's fsdp_activation_checkpointing check-
  // point whole blocks (apply_activation_checkpointing): full only. torchtitan has op-level SAC and
  // every-k-th block; a plan JSON takes any mode.
  if (lightning(cfg) || cfg.format == "accelerate" || cfg.format == "torchtune") return {"full"};
  return {"selective_op", "every_2", "full"};
}

std::string activation_checkpointing(const UserConfig& cfg, const models::ModelSpec& model, const std::string& mode) {
  const std::string cls = config_text::block_class_for(model, cfg.plan.implementation);
  if (cfg.format == "accelerate") return "fsdp_activation_checkpointing: true";
  if (cfg.format == "torchtune") return "enable_activation_checkpointing: True";
  if (cfg.format == "torchtitan")
    return mode == "selective_op" ? "[activation_checkpoint] mode = \"selective\", selective_ac_option = \"op\""
           : mode == "every_2"    ? "[activation_checkpoint] mode = \"selective\", selective_ac_option = \"2\""
                                  : "[activation_checkpoint] mode = \"full\"";
  if (cfg.format == "plan") return "\"activation_checkpointing\": \"" + mode + "\"";
  if (yaml_cli(cfg)) return "trainer.strategy.init_args.activation_checkpointing_policy naming " + cls;
  return "FSDPStrategy(activation_checkpointing_policy={" + cls + "}) (checkpoints every " + cls + ")";
}

std::string hybrid_shard(const UserConfig& cfg, bool fsdp1, int replicate, int shard) {
  const std::string r = std::to_string(replicate), s = std::to_string(shard);
  if (cfg.format == "accelerate")
    return fsdp1 ? "fsdp_sharding_strategy: HYBRID_SHARD"
                 : "parallelism_config: parallelism_config_dp_replicate_size: " + r + ", parallelism_config_dp_shard_size: " + s;
  if (cfg.format == "torchtitan") return "[parallelism] data_parallel_replicate_degree = " + r + ", data_parallel_shard_degree = " + s;
  if (cfg.format == "torchtune") return "data_parallel_replicate_dim: " + r + " and data_parallel_shard_dim: " + s;
  if (cfg.format == "plan") return "\"mesh\": [" + r + ", " + s + "]" + (fsdp1 ? ", \"sharding_strategy\": \"HYBRID_SHARD\"" : "");
  if (yaml_cli(cfg)) return "trainer.strategy.init_args: sharding_strategy: HYBRID_SHARD, device_mesh: [" + r + ", " + s + "]";
  return "FSDPStrategy(sharding_strategy=\"HYBRID_SHARD\", device_mesh=(" + r + ", " + s + "))";
}

std::string no_shard(const UserConfig& cfg, int world) {
  if (cfg.format == "accelerate") return "fsdp_sharding_strategy: NO_SHARD (or distributed_type: MULTI_GPU for DDP)";
  if (cfg.format == "torchtitan")
    return "[parallelism] data_parallel_replicate_degree = " + std::to_string(world) + ", data_parallel_shard_degree = 1";
  if (cfg.format == "torchtune")
    return "data_parallel_replicate_dim: " + std::to_string(world) + " and data_parallel_shard_dim: 1";
  if (cfg.format == "plan") return "\"sharding_strategy\": \"NO_SHARD\"";
  if (yaml_cli(cfg)) return "trainer.strategy: ddp (DDP; NO_SHARD is its FSDP spelling)";
  return "Trainer(strategy=\"ddp\") (DDP; FSDPStrategy(sharding_strategy=\"NO_SHARD\") is its FSDP spelling)";
}

std::string full_shard(const UserConfig& cfg) {
  if (cfg.format == "accelerate") return "fsdp_sharding_strategy: FULL_SHARD";
  if (cfg.format == "torchtune") return "fsdp_reshard_after_forward: True";
  if (cfg.format == "torchtitan") return "[parallelism] data_parallel_replicate_degree = 1, data_parallel_shard_degree = -1";
  if (cfg.format == "plan") return "\"sharding_strategy\": \"FULL_SHARD\"";
  if (yaml_cli(cfg)) return "trainer.strategy.init_args.sharding_strategy: FULL_SHARD";
  return "FSDPStrategy(sharding_strategy=\"FULL_SHARD\")";
}

std::string no_cpu_offload(const UserConfig& cfg) {
  if (cfg.format == "accelerate") return "fsdp_offload_params: false";
  if (cfg.format == "torchtune") return "fsdp_cpu_offload: False";
  if (cfg.format == "torchtitan") return "[training] enable_cpu_offload = false";
  if (cfg.format == "plan") return "\"cpu_offload\": false";
  if (yaml_cli(cfg)) return "trainer.strategy.init_args.cpu_offload: false";
  return "FSDPStrategy(cpu_offload=False)";
}

std::string eight_bit_adamw(const UserConfig& cfg, sim::Optimizer o) {
  const std::string cls = sim::optimizer_class(o);
  const std::string hf = o == sim::Optimizer::BnbAdamW8bit ? "adamw_bnb_8bit" : "adamw_torch_8bit";
  if (cfg.format == "plan") {
    sim::Plan p;
    p.optimizer = o;
    return "\"optimizer\": " + sim::plan_to_json(p)["optimizer"].dump();   // (the key's spelling, program/plan_keys.cpp)
  }
  if (yaml_cli(cfg)) return "optimizer.class_path: " + cls;
  if (cfg.format == "torchtune") return "optimizer: _component_: " + cls;
  if (cfg.format == "accelerate")
    return "build " + cls + "(model.parameters(), ...) in your script (the Hugging Face Trainer: optim=\"" + hf + "\")";
  return "configure_optimizers returning " + cls + "(self.parameters(), ...)";
}

std::string fsdp_checkpointing_instead_of_hf(const UserConfig& cfg, const models::ModelSpec& model) {
  return "remove gradient_checkpointing_enable() and use " + activation_checkpointing(cfg, model, "full");
}

std::string no_compile(const UserConfig& cfg) {
  if (cfg.format == "plan") return "\"compile\": false";
  if (cfg.format == "torchtitan") return "[compile] enable = false";
  if (cfg.format == "accelerate") return "dynamo_config: dynamo_backend: \"NO\"";
  if (cfg.format == "torchtune") return "compile: False";
  return "drop the torch.compile(...) call";
}

std::string micro_batch(const UserConfig& cfg, std::int64_t micro_batch, int grad_accum) {
  const std::string mb = std::to_string(micro_batch), ga = std::to_string(grad_accum);
  if (cfg.format == "plan") return "\"micro_batch\": " + mb + ", \"grad_accum\": " + ga;
  if (cfg.format == "torchtitan")
    return "[training] " + sim::section_key("micro_batch", sim::Framework::TorchTitan) + " = " + mb +
           " (the same global_batch_size: " + ga + " micro-batches per step)";
  if (cfg.format == "torchtune") return "batch_size: " + mb + " and gradient_accumulation_steps: " + ga;
  if (cfg.format == "accelerate")
    return "a per-device batch of " + mb + " (the DataLoader's batch_size; the Hugging Face Trainer: "
           "per_device_train_batch_size=" + mb + ") with gradient_accumulation_steps " + ga;
  if (yaml_cli(cfg)) return "data.batch_size: " + mb + " and trainer.accumulate_grad_batches: " + ga;
  return "DataLoader(batch_size=" + mb + ") and Trainer(accumulate_grad_batches=" + ga + ")";
}

std::string checkpoint_around_compile(const UserConfig& cfg) {
  const auto& ac = cfg.plan.activation_checkpointing;
  if (cfg.format == "plan") {
    std::string mode = ac.mode == sim::ActivationCheckpointing::Mode::EveryK
                           ? "\"every_k\", \"every_k\": " + std::to_string(ac.every_k)
                           : "\"full\"";
    return "\"activation_checkpointing\": {\"mode\": " + mode + (ac.outside_fsdp ? ", \"outside_fsdp\": true" : "") +
           ", \"outside_compile\": true}";
  }
  // torchtitan and accelerate compile around the checkpoint; torchtune's recipes already wrap compiled layers
  if (cfg.format == "torchtitan" || cfg.format == "accelerate" || cfg.format == "torchtune") return "";
  return "call block.compile() on each block before it is wrapped for checkpointing (checkpoint_wrapper, or "
         "FSDPStrategy's activation_checkpointing_policy after configure_model): checkpoint(compile(block)), "
         "torchtune's order";
}

}  // namespace fsdpsim::planner::fix_words
