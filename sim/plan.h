// A plan: one candidate FSDP training configuration. JSON keys follow PyTorch's names (design.md,
// issue "simulator"); every key has a default documented in plan.cpp and README "Plan keys".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "models/model_spec.h"
#include "models/wrap_graph.h"

namespace fsdpsim::sim {

enum class FsdpVersion { FSDP1 = 1, FSDP2 = 2 };
enum class ShardingStrategy { FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 };
enum class BackwardPrefetch { BACKWARD_PRE, BACKWARD_POST, NONE };
enum class Optimizer { AdamW, SGD };   // SGD = with momentum (one state)

struct ActivationCheckpointing {
  enum class Mode { None, Full, EveryK, SelectiveOp } mode = Mode::None;
  int every_k = 1;               // EveryK: blocks with index % k == 0 are fully checkpointed
  // false: FSDP(checkpoint(block)) (torchtitan, Lightning, apply_activation_checkpointing) — no extra AG.
  // true: checkpoint(FSDP(block)) (HF gradient_checkpointing, reentrant) — one extra AG per unit (semantics A2).
  bool outside_fsdp = false;
};

struct CpuOffload {
  bool params = false;           // FSDP1 CPUOffload(offload_params=True) / FSDP2 CPUOffloadPolicy: params+grads+optimizer on CPU
  bool optimizer = false;        // optimizer state (and step) on CPU only
};

struct Plan {
  FsdpVersion fsdp_version = FsdpVersion::FSDP2;
  // Mesh (replicate, shard) — always in that order. 0 = derive: replicate 1, shard = all GPUs.
  int mesh_replicate = 0;
  int mesh_shard = 0;
  // FSDP1: the strategy. FSDP2: derived from reshard_after_forward + mesh (semantics F2.12).
  ShardingStrategy sharding_strategy = ShardingStrategy::FULL_SHARD;
  // FSDP2 reshard_after_forward: -1 = true, 0 = false, k>1 = int (reshard to groups of k after forward).
  int reshard_after_forward = -1;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;     // FSDP1 rate limiter (2 in flight)
  int prefetch_depth = 1;            // FSDP2 explicit prefetch: modules prefetched ahead (1 = the implicit/default)
  ActivationCheckpointing activation_checkpointing;
  Dtype param_dtype = Dtype::BF16;
  Dtype reduce_dtype = Dtype::FP32;
  // fp32 = fp32 master weights (sharded params/grads/optimizer in fp32: Lightning "bf16-mixed");
  // equal to param_dtype = pure low-precision training (Lightning "bf16-true").
  Dtype master_weights_dtype = Dtype::FP32;
  std::int64_t micro_batch = 1;      // sequences per rank per micro-batch
  std::int64_t seq_len = 2048;
  std::int64_t grad_accum = 1;       // micro-batches per optimizer step
  bool grad_sync = false;            // with grad_accum>1: true = reduce every micro-batch; false = no_sync until the last
  CpuOffload cpu_offload;
  bool fp8_all_gather = false;       // FSDP2 + torchao float8: all-gather in fp8
  double trainable_fraction = 1.0;   // frozen params (LoRA): the fraction that trains
  Optimizer optimizer = Optimizer::AdamW;
  models::WrapPolicy auto_wrap_policy;  // default: per transformer block
  bool use_orig_params = true;       // FSDP1 only (16-byte alignment padding; frozen params -> full grads)
  models::LossImpl cross_entropy = models::LossImpl::Torch;   // how the loss is computed (logits memory)
};

// Parses a plan object (all keys optional; unknown keys rejected). Field names in errors are "plan.<key>".
Plan parse_plan(const nlohmann::json& j);
// Plan text: a path to a JSON file or an inline JSON object ("{...}").
Plan load_plan(const std::string& file_or_inline, const std::string& field = "--plan");
nlohmann::json plan_to_json(const Plan& p);

// Fills mesh defaults and checks the plan against a world of `gpus` GPUs with `gpus_per_node` each
// (mesh product, divisibility, strategy/mesh consistency); InputError naming the field.
Plan resolve_plan(const Plan& p, int gpus, int gpus_per_node);

// The effective strategy (FSDP2 maps reshard_after_forward + mesh onto it, semantics F2.12).
ShardingStrategy effective_strategy(const Plan& p);
std::string strategy_name(ShardingStrategy s);
std::string prefetch_name(BackwardPrefetch b);
std::string checkpointing_name(const ActivationCheckpointing& ac);

}  // namespace fsdpsim::sim
