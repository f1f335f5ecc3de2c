// What each front-end can express (note "expressible plans", copied into the README). An export must
// train the plan it names, correctly: where a front-end cannot express a setting, the planner exports
// the best plan it CAN express - the nearest translation of the recommendation, or a better simulated
// candidate the front-end expresses as is - simulated like every other, and says what changed. The rules,
// with their sources (ecosystem.md §2 and the frameworks' code read there):
//  * raw FSDP2 (fully_shard): FSDP2 only (an FSDP1 plan is translated: mesh + reshard_after_forward);
//    op-level selective checkpointing becomes full (no ready-made policy in PyTorch itself).
//  * Lightning: FSDPStrategy (FSDP1) checkpoints whole blocks (activation_checkpointing_policy: full),
//    cannot all-gather in float8 nor override one unit, and its Trainer accumulates inside FSDP's no_sync()
//    (ParallelStrategy.block_backward_sync: grad_sync false, which is also what keeps FSDP1 CPU offload
//    correct - accumulating outside no_sync with offload gives wrong gradients, PyTorch FSDP docs).
//    ModelParallelStrategy (FSDP2) has no replicate dimension (an HSDP plan becomes FSDP1 HYBRID_SHARD)
//    and no no_sync in the Trainer (grad_sync true).
//  * accelerate: full checkpointing only; FSDP2 reshard_after_forward true/false, 1-ahead prefetch;
//    FSDP1 HYBRID_SHARD shards within a node; no pure replication under FSDP2 (NO_SHARD under FSDP1);
//    the reduce dtype follows mixed_precision; float8 through fp8_config backend AO (tensorwise, with
//    float8 all-gathers under FSDP2); no per-unit overrides; the rate limiter stays on.
//  * torchtitan (TOML keys before 9810191bb): FSDP2 only, its own model code (implementation
//    "torchtitan"), per-block wrapping, reshard "default" (the last block kept) / "always" / "never",
//    1-ahead prefetch, reduce in float32, bf16 or fp32 parameters, AdamW, gradients reduced every
//    micro-batch (train.py has no no_sync).
#pragma once
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "program/plan.h"

namespace fsdpsim::planner {

struct Expressed {
  sim::Plan plan;                     // resolved; == the input when nothing had to change
  std::vector<std::string> changes;   // "activation_checkpointing selective_op -> full (...why)"
};

// framework: "fsdp2", "lightning", "accelerate", "torchtitan".
Expressed express_plan(const std::string& framework, const sim::Plan& p, const calibrate::Cluster& cl);
const std::vector<std::string>& export_frameworks();

}  // namespace fsdpsim::planner
