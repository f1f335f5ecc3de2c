// Reading a user's existing FSDP configuration for `fsdpsim diagnose`, `fit` and `compare` (note
// "diagnose input forms", copied into the README). Accepted forms, one reader each (planner/read_*.cpp):
//  * lightning (.py): a script with `FSDPStrategy(...)`, or `Trainer(strategy="fsdp")` /
//    "fsdp_cpu_offload" (FSDPStrategy() with its defaults: no wrap policy, no checkpointing), and
//    `Trainer(...)` or `Fabric(...)`. A tolerant keyword scanner (comments skipped) reads the keyword
//    arguments of those calls: sharding_strategy, device_mesh, auto_wrap_policy, activation_checkpointing_policy
//    (full checkpointing of the named blocks) or the deprecated activation_checkpointing, cpu_offload,
//    mixed_precision=MixedPrecision(...), backward_prefetch, forward_prefetch, limit_all_gathers,
//    use_orig_params; Trainer precision (default "32-true"), devices, num_nodes, accumulate_grad_batches
//    (the Trainer accumulates inside FSDP's no_sync(); Fabric only with fabric.no_backward_sync).
//    Also read: `batch_size=N` (a DataLoader) as the micro-batch; the sequence length where the script
//    assigns it (seq_len, max_seq_length, block_size, max_length, ...); torch.compile; torchao's
//    convert_to_float8_training; `gradient_checkpointing_enable()` (HF checkpointing outside FSDP, A2);
//    a litgpt import without transformers means LitGPT's model code (implementation "litgpt", block `Block`).
//  * lightning-yaml (.yaml with a `trainer:` key): LightningCLI form, trainer.precision/devices/num_nodes/
//    accumulate_grad_batches, trainer.strategy (a name or init_args with the keys above), data batch size
//    and sequence length.
//  * accelerate (.yaml with `fsdp_config:` or `distributed_type:`): ecosystem.md §2.3 keys, FSDP1 and 2;
//    a missing or misspelled fsdp_auto_wrap_policy is accelerate's default NO_WRAP (one FSDP unit);
//    dynamo_config (INDUCTOR: compile) and fp8_config (backend AO: torchao float8).
//  * torchtune (.yaml with `_component_: torchtune.`): a recipe config of full_finetune_distributed or
//    lora_finetune_distributed: FSDP2 on each layer, pure `dtype`, batch_size, gradient_accumulation_steps (reduced
//    every micro-batch), enable_activation_checkpointing around the layers compile_model compiled
//    (activation_checkpointing.outside_compile), fsdp_cpu_offload, fsdp_reshard_after_forward,
//    custom_sharded_layers, data_parallel_{replicate,shard}_dim, the loss component, tokenizer / dataset
//    max_seq_len (exact when packed); LoRA trains the adapters alone (the root frozen).
//  * torchtitan (.toml): [training], [parallelism], [activation_checkpoint], [compile], [model] converters
//    with [float8] or [quantize.linear.float8], [optimizer] (ecosystem.md §2.4); other sections are named
//    in a warning; implementation "torchtitan"; reshard "default" keeps the last block.
//  * plan (.json): our plan JSON (sim::load_plan).
// Any form may carry a comment line `# fsdpsim: micro_batch=2 seq_len=8192 grad_accum=4` for what it
// cannot say; command-line options override both. Precision strings follow Lightning >= 2.6.
// A value of the wrong kind is InputError naming the key ("fsdp_config.fsdp_sharding_strategy").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "program/plan.h"

namespace fsdpsim::planner {

struct UserConfig {
  std::string format;                 // lightning | lightning-yaml | accelerate | torchtune | torchtitan | plan
  std::string source;
  sim::Plan plan;                     // mesh 0 = let resolve_plan derive it
  std::vector<std::string> facts;     // how the config was read, in the user's words -> ours
  std::vector<std::string> warnings;  // ignored keys, assumptions
  std::string precision;              // the precision string as written ("" if none)
  std::vector<std::string> wrap_classes;
  bool wrap_policy_given = false;
  bool wraps_nothing = false;         // the policy names no module of the model, or there is none
  bool hf_gradient_checkpointing = false;
  // The framework wraps compiled blocks in its checkpoints (torchtune's recipes; Lightning with block.compile()):
  // checkpointing that diagnose adds goes around the compiled blocks too (activation_checkpointing.outside_compile).
  bool checkpoint_wraps_compiled = false;
  int nodes = 0;                      // from the config (0 = not said)
  int gpus_per_node = 0;
  bool micro_batch_given = false;
  bool seq_len_given = false;
};

struct ReadOptions {
  std::string format;                 // "" = from the extension / content
  std::int64_t micro_batch = 0;       // 0 = from the config (default 1)
  std::int64_t seq_len = 0;           // 0 = from the config (default 2048)
  std::int64_t grad_accum = 0;
};

// The form of a .yaml config from its text: "accelerate" (fsdp_config / distributed_type), "torchtune" (a
// `_component_: torchtune.` entry) or "lightning-yaml".
std::string yaml_format_of(const std::string& text);
UserConfig read_user_config(const std::string& path, const ReadOptions& opts, const models::ModelSpec& model);
// From text (tests; read_user_config dispatches here).
UserConfig parse_user_config_text(const std::string& text, const std::string& format, const std::string& source,
                                  const models::ModelSpec& model);

}  // namespace fsdpsim::planner
