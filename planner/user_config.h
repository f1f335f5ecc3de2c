// Reading a user's existing FSDP configuration for `fsdpsim diagnose` (note "diagnose input forms",
// copied into the README). Accepted forms:
//  * lightning (.py): a Python snippet containing `FSDPStrategy(...)` and `Trainer(...)` (or
//    `Fabric(...)`). A tolerant keyword scanner reads the keyword arguments at the top level of
//    those calls: sharding_strategy, device_mesh, auto_wrap_policy, activation_checkpointing_policy
//    (or the deprecated activation_checkpointing), cpu_offload, mixed_precision=MixedPrecision(...),
//    backward_prefetch, forward_prefetch, limit_all_gathers, use_orig_params; Trainer precision,
//    devices, num_nodes, accumulate_grad_batches. `batch_size=N` anywhere (a DataLoader) gives the
//    micro-batch, `gradient_checkpointing_enable()` means HF checkpointing outside FSDP (semantics A2).
//    Anything else is ignored (listed as a warning).
//  * lightning-yaml (.yaml with a `trainer:` key): LightningCLI form, trainer.precision/devices/
//    num_nodes/accumulate_grad_batches and trainer.strategy.init_args with the same keys.
//  * accelerate (.yaml with `fsdp_config:` or `distributed_type:`): ecosystem.md §2.3 keys, FSDP1 and 2.
//  * torchtitan (.toml): [training], [parallelism], [activation_checkpoint] (ecosystem.md §2.4).
//  * plan (.json): our plan JSON (sim::load_plan).
// Any form may carry a comment line `# fsdpsim: micro_batch=2 seq_len=8192 grad_accum=4` for what it
// cannot say; command-line options override both. Precision strings follow Lightning >= 2.6.
// A value of the wrong kind is InputError naming the key ("fsdp_config.fsdp_sharding_strategy").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "sim/plan.h"

namespace fsdpsim::planner {

struct UserConfig {
  std::string format;                 // lightning | lightning-yaml | accelerate | torchtitan | plan
  std::string source;
  sim::Plan plan;                     // mesh 0 = let resolve_plan derive it
  std::vector<std::string> facts;     // how the config was read, in the user's words -> ours
  std::vector<std::string> warnings;  // ignored keys, assumptions
  std::string precision;              // the precision string as written ("" if none)
  std::vector<std::string> wrap_classes;
  bool wrap_policy_given = false;
  bool wraps_nothing = false;         // the policy names no module of the model, or there is none
  bool hf_gradient_checkpointing = false;
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

UserConfig read_user_config(const std::string& path, const ReadOptions& opts, const models::ModelSpec& model);
// From text (tests; read_user_config dispatches here).
UserConfig parse_user_config_text(const std::string& text, const std::string& format, const std::string& source,
                                  const models::ModelSpec& model);

}  // namespace fsdpsim::planner
