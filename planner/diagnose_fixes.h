// Internal to diagnose: each fix in the user's framework's own spelling (ecosystem.md §2), so a
// Lightning user is told about FSDPStrategy arguments and Trainer precision strings, an accelerate
// user about `fsdp_config:` keys, a torchtitan user about TOML keys, and nobody about another
// framework's flags. `plan` configs get plan JSON keys.
#pragma once
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "planner/user_config.h"

namespace fsdpsim::planner::fix_words {

// Wrap each transformer block in its own FSDP unit.
std::string wrap_blocks(const UserConfig& cfg, const models::ModelSpec& model);
// fp32 compute -> bf16 compute with fp32 master weights (Lightning "bf16-mixed").
std::string bf16_compute(const UserConfig& cfg);
// fp32 master weights -> pure bf16 (Lightning "bf16-true").
std::string pure_bf16(const UserConfig& cfg);
// Activation checkpointing in `mode` ("full", "selective_op", "every_2"): what the framework can say.
std::string activation_checkpointing(const UserConfig& cfg, const models::ModelSpec& model, const std::string& mode);
// The checkpointing modes the framework can express, most memory-saving last.
std::vector<std::string> checkpointing_modes(const UserConfig& cfg);
std::string hybrid_shard(const UserConfig& cfg, bool fsdp1, int replicate, int shard);
std::string no_shard(const UserConfig& cfg, int world);
std::string full_shard(const UserConfig& cfg);
std::string no_cpu_offload(const UserConfig& cfg);
// Constructing 8-bit AdamW `o` (bitsandbytes' or torchao's, program/optimizer_state.h) in the user's front-end.
std::string eight_bit_adamw(const UserConfig& cfg, sim::Optimizer o);
std::string fsdp_checkpointing_instead_of_hf(const UserConfig& cfg, const models::ModelSpec& model);
// Run the model eagerly (no torch.compile) in the user's front-end.
std::string no_compile(const UserConfig& cfg);
// The same checkpointing, its eager wrapper around each compiled block (checkpoint(compile(block)),
// activation_checkpointing.outside_compile); "" where the framework cannot say it (torchtitan compiles each
// checkpointed block, accelerate the whole prepared model; torchtune's recipes already do it).
std::string checkpoint_around_compile(const UserConfig& cfg);
// `micro_batch` sequences per GPU per micro-batch and `grad_accum` micro-batches per step, in the user's keys.
std::string micro_batch(const UserConfig& cfg, std::int64_t micro_batch, int grad_accum);

}  // namespace fsdpsim::planner::fix_words
