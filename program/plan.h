// A plan: one candidate FSDP training configuration. JSON keys follow PyTorch's names (design.md,
// issue "simulator"); every key has a default documented in plan.cpp and README "Plan keys".
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/units.h"
#include "models/model_spec.h"
#include "models/wrap_graph.h"

namespace fsdpsim::sim {

enum class FsdpVersion { FSDP1 = 1, FSDP2 = 2 };
enum class ShardingStrategy { FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 };
enum class BackwardPrefetch { BACKWARD_PRE, BACKWARD_POST, NONE };
// SGD = with momentum (one state). The low-bit and paged AdamWs (program/optimizer_state.h): bitsandbytes'
// AdamW8bit, PagedAdamW (32-bit states) and PagedAdamW8bit; torchao.optim's AdamW8bit and AdamW4bit.
enum class Optimizer { AdamW, SGD, BnbAdamW8bit, BnbPagedAdamW, BnbPagedAdamW8bit, TorchaoAdamW8bit, TorchaoAdamW4bit };
// torch.optim's implementations: foreach (the default when neither flag is set) makes temporaries the
// size of the state lists it processes; fused runs one kernel per tensor group and makes none.
enum class OptimizerImpl { Foreach, Fused };

// PYTORCH_CUDA_ALLOC_CONF, the options the allocator model follows (c10/cuda/CUDAAllocatorConfig).
struct AllocConf {
  bool expandable_segments = false;   // one growing segment per stream instead of a cudaMalloc per large block
  Bytes max_split_size = 0;           // max_split_size_mb in bytes; 0 = no limit (PyTorch's default)
  bool operator==(const AllocConf&) const = default;
};

// FSDP2's reshard_after_forward (F2.4, F2.6, F2.12) for the whole model (Plan), one unit (ModuleOverride) or
// each unit as the lowering sees it (program/lower_context.h): true (reshard to the shard group after forward,
// FSDP2's default), false (keep the unsharded parameters until backward: the ZeRO-2 variant), a group size
// k > 1 (reshard to groups of k GPUs: hpZ), or unset (a ModuleOverride that leaves it alone; the lowering's
// root, whose reshard_after_forward is None). The JSON form is true, false or k; the text form text().
class ReshardAfterForward {
 public:
  static constexpr ReshardAfterForward yes() { return ReshardAfterForward(kTrue); }
  static constexpr ReshardAfterForward no() { return ReshardAfterForward(kFalse); }
  static constexpr ReshardAfterForward unset() { return ReshardAfterForward(kUnset); }
  static constexpr ReshardAfterForward of(bool reshard) { return reshard ? yes() : no(); }
  // k > 1 (std::invalid_argument otherwise); resolve_plan checks that it divides the shard size.
  static ReshardAfterForward group(int k);
  // What a sharding strategy means for it (F2.12): false for the ZeRO-2 strategies, true for the others.
  static constexpr ReshardAfterForward of_strategy(ShardingStrategy s) {
    return of(s != ShardingStrategy::SHARD_GRAD_OP && s != ShardingStrategy::_HYBRID_SHARD_ZERO2);
  }

  constexpr bool is_unset() const { return code_ == kUnset; }
  constexpr bool keeps() const { return code_ == kFalse; }   // the parameters stay unsharded until backward
  constexpr bool is_group() const { return code_ > 1; }
  constexpr int group_size() const { return is_group() ? code_ : 0; }   // k; 0 when not a group
  // "true", "false" or the group size ("8"): the text form (planner labels, --fix values); "unset".
  std::string text() const;
  bool operator==(const ReshardAfterForward&) const = default;

 private:
  static constexpr int kTrue = -1, kFalse = 0, kUnset = -2;   // else the group size
  constexpr explicit ReshardAfterForward(int code) : code_(code) {}
  int code_;
};

// A setting for one FSDP unit (param group) by its module name, as `fsdpsim model-info` lists the units
// (e.g. "model.layers.31"), or the alias "last_block". torchtitan's default reshard policy keeps the last
// block unsharded after forward (its parameters are needed again at once in backward).
struct ModuleOverride {
  std::string module;
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::unset();   // yes or no (FSDP2 only)
  bool operator==(const ModuleOverride&) const = default;
};

// LoRA adapters (plan key `lora`, issue 19): rank-`rank` pairs A, B beside the targeted linears of every
// block (and the LM head), base weights frozen, adapters trained (models/trainable.h LoraShape). Targets are
// canonical names, in this order: q, k, v, o, gate, up, down, head ("mlp" in the plan = gate, up, down; a
// plain MLP's first linear is "up").
struct LoraPlan {
  std::int64_t rank = 0;              // 0: no `lora` key
  std::vector<std::string> targets;
  double dropout = 0.0;               // lora_dropout
  // QLoRA (`quantize_base: "nf4"`): the frozen base weights of the blocks' linears are stored as 4-bit NormalFloat
  // with double-quantized scales (torchao NF4Tensor, torchtune's qlora_* builders) and dequantized to the
  // compute dtype by each linear (models/nf4.h); under FSDP1, bitsandbytes' Params4bit layout instead.
  bool quantize_nf4 = false;
  bool on() const { return rank > 0; }
  bool adapts(const std::string& target) const {
    for (const std::string& t : targets)
      if (t == target) return true;
    return false;
  }
  bool operator==(const LoraPlan&) const = default;
};
// The canonical target names.
const std::vector<std::string>& lora_target_names();
// Parses a `lora` object (InputError naming `field` + ".rank" / ".targets" / ".dropout").
LoraPlan parse_lora(const nlohmann::json& v, const std::string& field);

struct ActivationCheckpointing {
  enum class Mode { None, Full, EveryK, SelectiveOp } mode = Mode::None;
  int every_k = 1;               // EveryK: blocks with index % k == 0 are fully checkpointed
  // false: FSDP(checkpoint(block)) (torchtitan, Lightning, apply_activation_checkpointing) — no extra AG.
  // true: checkpoint(FSDP(block)) (HF gradient_checkpointing, reentrant) — one extra AG per unit (semantics A2).
  bool outside_fsdp = false;
  // Under compile: false: compile(checkpoint(block)) (torchtitan's apply_ac then apply_compile, accelerate and a
  // compiled whole model): dynamo traces the checkpoint and AOTAutograd's partitioner decides what the block saves
  // and reruns. true: checkpoint(compile(block)) (torchtune's compile_model before set_activation_checkpointing,
  // Lightning's FSDPStrategy wrapping blocks compiled in configure_model): an eager non-reentrant checkpoint
  // around the compiled block, whose saved tensors its hooks drop and whose whole compiled forward reruns.
  bool outside_compile = false;
};

// torchtune's activation offloading (training.OffloadActivations, torchtune/training/_activation_offloading.py;
// the recipes' enable_activation_offloading and activation_offloading_use_streams): saved-tensor hooks around the
// model's forward (not its output projection, NoOpManager) copy every saved tensor of at least 1 KiB that is no
// parameter to pinned CPU memory and bring it back in the backward. Modelled with whole-block checkpointing of
// every block (what the blocks then save is each checkpoint's input): program/lower_walk.cpp "activation offloading".
enum class ActivationOffload {
  None,
  Streams,   // use_streams true (torchtune's default): copies on a side stream, a stash of 5 in the forward
  Sync,      // use_streams false: copies on the compute stream, the GPU tensor dropped at once
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
  // FSDP2 reshard_after_forward: true, false, or an int k > 1 (reshard to groups of k).
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::yes();
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;     // FSDP1 rate limiter (2 in flight)
  int prefetch_depth = 1;            // FSDP2 explicit prefetch: modules prefetched ahead (1 = the implicit/default)
  ActivationCheckpointing activation_checkpointing;
  ActivationOffload activation_offloading = ActivationOffload::None;
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
  int cross_entropy_chunks = models::kDefaultLossChunks;      // cross_entropy "chunked": num_output_chunks
  models::ModelImpl implementation = models::ModelImpl::HF;   // whose block code runs (saved tensors)
  bool compile = false;                                        // torch.compile (inductor) on each block
  models::Float8Recipe float8 = models::Float8Recipe::None;   // torchao Float8Linear compute
  AllocConf alloc_conf;                                  // PYTORCH_CUDA_ALLOC_CONF
  // The training loop frees the model output before loss.backward() (torchtitan's `del pred`); most loops
  // keep it. Unset: true for implementation torchtitan, false otherwise (resolve_plan fills it).
  std::optional<bool> free_logits_before_backward;
  // The loss is computed in the model's forward (a Hugging Face model given labels: inside FSDP's root forward and
  // inside anything that wraps the forward, such as torchtune's activation offloading) rather than by the loop on
  // the model's output. Unset: true for implementation hf unless the loss is torchtune's chunked output
  // (lowering::loss_memory); torchtune's recipes (planner/read_torchtune.cpp) set false.
  std::optional<bool> loss_in_model_forward;
  OptimizerImpl optimizer_impl = OptimizerImpl::Foreach;
  std::vector<ModuleOverride> module_overrides;
  // FSDP units whose parameters are all frozen (LoRA leaves embedding and head untouched): no gradient
  // and no optimizer state. FSDP1's FlatParameter requires grad only if one of its parameters does (the
  // OR in FlatParamHandle._validate_tensors_to_flatten), so such a unit has no flat grad even with
  // use_orig_params. trainable_fraction (< 1) stays the whole model's: it is spread over the other units.
  std::vector<std::string> frozen_units;
  LoraPlan lora;
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
std::string activation_offload_name(ActivationOffload o);   // "none", "streams", "sync" (the plan key's values)
// PYTORCH_CUDA_ALLOC_CONF text: parse ("expandable_segments:True,max_split_size_mb:512"; InputError naming
// `field` for an unknown or unmodelled option) and print ("" for the defaults).
AllocConf parse_alloc_conf(const std::string& text, const std::string& field);
std::string alloc_conf_text(const AllocConf& a);

}  // namespace fsdpsim::sim
