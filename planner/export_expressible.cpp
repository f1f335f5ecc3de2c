// What each front-end can express (note in export_expressible.h).
#include "planner/export_expressible.h"

#include "planner/search_space.h"
#include "program/optimizer_state.h"

namespace fsdpsim::planner {
namespace {

using sim::ShardingStrategy;
using AcMode = sim::ActivationCheckpointing::Mode;

struct Translator {
  sim::Plan p;
  std::vector<std::string> changes;
  void note(const std::string& what) { changes.push_back(what); }

  void to_fsdp2(const std::string& why) {
    if (p.fsdp_version == sim::FsdpVersion::FSDP2) return;
    const ShardingStrategy s = p.sharding_strategy;
    p.fsdp_version = sim::FsdpVersion::FSDP2;
    p.reshard_after_forward = sim::ReshardAfterForward::of_strategy(s);
    p.backward_prefetch = sim::BackwardPrefetch::BACKWARD_PRE;
    p.forward_prefetch = false;
    p.limit_all_gathers = false;
    p.prefetch_depth = 1;
    note("fsdp_version 1 -> 2 (" + sim::strategy_name(s) + " as mesh + reshard_after_forward): " + why);
  }
  void full_checkpointing(const std::string& why) {
    const auto m = p.activation_checkpointing.mode;
    if (m != AcMode::SelectiveOp && m != AcMode::EveryK) return;
    note("activation_checkpointing " + sim::checkpointing_text(p.activation_checkpointing) + " -> full: " + why);
    p.activation_checkpointing.mode = AcMode::Full;
    p.activation_checkpointing.every_k = 1;
  }
  void no_fp8_all_gather(const std::string& why) {
    if (!p.fp8_all_gather) return;
    p.fp8_all_gather = false;
    note("fp8_all_gather true -> false: " + why);
  }
  void no_overrides(const std::string& why) {
    if (p.module_overrides.empty()) return;
    p.module_overrides.clear();
    note("module_overrides -> none: " + why);
  }
  void grad_sync(bool v, const std::string& why) {
    if (p.grad_accum <= 1 || p.grad_sync == v) return;
    p.grad_sync = v;
    note(std::string("grad_sync ") + (v ? "false -> true" : "true -> false") + ": " + why);
  }
  void reshard_bool(const std::string& why) {
    if (p.fsdp_version != sim::FsdpVersion::FSDP2 || !p.reshard_after_forward.is_group()) return;
    note("reshard_after_forward " + p.reshard_after_forward.text() + " -> true: " + why);
    p.reshard_after_forward = sim::ReshardAfterForward::yes();
  }
  // The framework's order of checkpoint and compile (activation_checkpointing.outside_compile): only a compiled plan
  // with whole-block checkpointing has one.
  void checkpoint_order(bool around, const std::string& why) {
    auto& ac = p.activation_checkpointing;
    if (ac.outside_compile == around) return;
    if (around && (!p.compile || ac.mode == AcMode::None || ac.mode == AcMode::SelectiveOp)) return;
    ac.outside_compile = around;
    note(std::string("activation_checkpointing.outside_compile ") + (around ? "false -> true: " : "true -> false: ") + why);
  }
  void depth_one(const std::string& why) {
    if (p.fsdp_version != sim::FsdpVersion::FSDP2 || p.prefetch_depth <= 1) return;
    note("prefetch_depth " + std::to_string(p.prefetch_depth) + " -> 1: " + why);
    p.prefetch_depth = 1;
  }
};

}  // namespace

const std::vector<std::string>& export_frameworks() {
  static const std::vector<std::string> f = {"fsdp2", "lightning", "accelerate", "torchtitan"};
  return f;
}

Expressed express_plan(const std::string& fw, const sim::Plan& in, const calibrate::Cluster& cl) {
  Translator t{in, {}};
  auto& p = t.p;
  const int gpn = cl.gpus_per_node, world = cl.world();
  if (fw == "fsdp2") {
    t.to_fsdp2("raw PyTorch code uses fully_shard");
    t.full_checkpointing("PyTorch has no ready-made op-level checkpoint policy (torchtitan's is its own code)");
  } else if (fw == "lightning") {
    t.full_checkpointing("FSDPStrategy's activation_checkpointing_policy checkpoints whole blocks");
    if (p.fsdp_version == sim::FsdpVersion::FSDP2 && p.mesh_replicate > 1 && p.mesh_shard > 1) {
      // ModelParallelStrategy has no replicate dimension (Lightning-AI/pytorch-lightning#21059): the same
      // layout in FSDPStrategy, HYBRID_SHARD with device_mesh.
      const bool zero2 = p.reshard_after_forward.keeps();
      p.fsdp_version = sim::FsdpVersion::FSDP1;
      p.sharding_strategy = zero2 ? ShardingStrategy::_HYBRID_SHARD_ZERO2 : ShardingStrategy::HYBRID_SHARD;
      p.reshard_after_forward = sim::ReshardAfterForward::of(!zero2);
      p.limit_all_gathers = true;
      p.prefetch_depth = 1;
      t.note("fsdp_version 2 -> 1 (" + sim::strategy_name(p.sharding_strategy) +
             " with device_mesh): ModelParallelStrategy (FSDP2) has no replicate dimension");
    }
    if (p.fsdp_version == sim::FsdpVersion::FSDP1) {
      t.no_fp8_all_gather("FSDP1 (FSDPStrategy) cannot all-gather in float8");
      t.checkpoint_order(true, "the export compiles each block in configure_model and FSDPStrategy's "
                               "activation_checkpointing_policy wraps the compiled blocks after it");
      t.no_overrides("FSDPStrategy wraps every block alike");
      t.grad_sync(false, "the Trainer accumulates inside FSDP's no_sync()");
    } else {
      t.reshard_bool("the export shards each block with a bool");
      t.grad_sync(true, "the Trainer has no no_sync for FSDP2 (ModelParallelStrategy): it reduces every micro-batch");
    }
  } else if (fw == "accelerate") {
    t.full_checkpointing("fsdp_activation_checkpointing checkpoints every wrapped block");
    t.checkpoint_order(false, "accelerate compiles the whole prepared model, its checkpoint wrappers inside");
    t.reshard_bool("fsdp_reshard_after_forward is true or false");
    t.depth_one("accelerate has no prefetch-depth key");
    t.no_overrides("accelerate has no per-unit key");
    if (p.fsdp_version == sim::FsdpVersion::FSDP1) {
      if (!p.limit_all_gathers) {
        p.limit_all_gathers = true;
        t.note("limit_all_gathers False -> True: no accelerate key for it");
      }
      if (p.mesh_replicate > 1 && p.mesh_shard > 1 && p.mesh_shard != gpn)
        t.to_fsdp2("FSDP1 HYBRID_SHARD in accelerate shards within one node; fsdp_version 2 takes any mesh");
    } else if (p.mesh_shard == 1 && p.mesh_replicate > 1) {
      p.fsdp_version = sim::FsdpVersion::FSDP1;
      p.sharding_strategy = ShardingStrategy::NO_SHARD;
      p.limit_all_gathers = true;
      t.note("fsdp_version 2 -> 1 (NO_SHARD): accelerate rejects dp_replicate_size > 1 with dp_shard_size 1");
    }
    if (p.param_dtype != Dtype::FP32 && p.reduce_dtype != p.param_dtype) {
      t.note("reduce_dtype " + std::string(dtype_name(p.reduce_dtype)) + " -> " + std::string(dtype_name(p.param_dtype)) +
             ": accelerate reduces in the mixed_precision dtype");
      p.reduce_dtype = p.param_dtype;
    }
    if (p.float8 != models::Float8Recipe::None) {
      if (p.float8 == models::Float8Recipe::Rowwise) {
        p.float8 = models::Float8Recipe::Tensorwise;
        t.note("float8 rowwise -> tensorwise: fp8_config backend AO uses torchao's default (tensorwise) recipe");
      }
      if (p.fsdp_version == sim::FsdpVersion::FSDP2 && !p.fp8_all_gather) {
        p.fp8_all_gather = true;
        t.note("fp8_all_gather false -> true: accelerate's AO recipe enables float8 all-gathers under FSDP2");
      }
    }
    if (p.fsdp_version == sim::FsdpVersion::FSDP1) t.no_fp8_all_gather("FSDP1 cannot all-gather in float8");
  } else if (fw == "torchtitan") {
    t.to_fsdp2("torchtitan is FSDP2 only");
    t.checkpoint_order(false, "torchtitan compiles each checkpointed block (apply_ac, then apply_compile)");
    t.reshard_bool("fsdp_reshard_after_forward is default, always or never");
    t.depth_one("torchtitan has no prefetch-depth key");
    t.grad_sync(true, "torchtitan's train loop reduces every micro-batch");
    if (p.auto_wrap_policy.kind != models::WrapPolicy::Kind::TransformerBlock) {
      p.auto_wrap_policy = models::WrapPolicy{};
      t.note("auto_wrap_policy -> transformer_block: torchtitan shards each block");
    }
    if (p.implementation != models::ModelImpl::TorchTitan) {
      t.note("implementation " + models::model_impl_name(p.implementation) +
             " -> torchtitan: torchtitan runs its own model code (what it saves for backward differs)");
      p.implementation = models::ModelImpl::TorchTitan;
      p.free_logits_before_backward.reset();   // torchtitan's default (resolve_plan)
    }
    if (p.param_dtype == Dtype::FP16) {
      p.param_dtype = Dtype::BF16;
      if (p.master_weights_dtype == Dtype::FP16) p.master_weights_dtype = Dtype::BF16;
      t.note("param_dtype fp16 -> bf16: mixed_precision_param is bfloat16 or float32");
    }
    if (p.reduce_dtype != Dtype::FP32) {
      t.note("reduce_dtype " + std::string(dtype_name(p.reduce_dtype)) + " -> fp32: mixed_precision_reduce takes float32 in these keys");
      p.reduce_dtype = Dtype::FP32;
    }
    if (p.optimizer != sim::Optimizer::AdamW) {
      t.note("optimizer " + sim::plan_to_json(p)["optimizer"].get<std::string>() +
             " -> adamw: torchtitan builds torch.optim's Adam or AdamW");
      p.optimizer = sim::Optimizer::AdamW;
    }
    // Reshard "default" keeps the last block; "always" reshards every block: another override is not expressible.
    bool last_only = p.module_overrides.size() == 1 && p.module_overrides[0].module == "last_block" &&
                     p.module_overrides[0].reshard_after_forward.keeps();
    if (!p.module_overrides.empty() && !last_only) t.no_overrides("torchtitan overrides only the last block (reshard \"default\")");
    if (p.lora.on()) {
      p.lora = sim::LoraPlan{};
      p.frozen_units.clear();
      t.note("lora -> none: torchtitan has no LoRA adapters; its job trains every parameter");
    }
  }
  // LoRA under FSDP1 without use_orig_params: the accelerate and Lightning exports wrap whole blocks, whose
  // FlatParameter would mix the frozen weights and the adapters, which FSDP1 refuses (_flat_param.py
  // FlatParamHandle._validate_tensors_to_flatten); torchtune's wrapping of each adapter linear apart is not
  // expressible in their keys.
  if (p.lora.on() && p.fsdp_version == sim::FsdpVersion::FSDP1 && !p.use_orig_params &&
      (fw == "accelerate" || fw == "lightning")) {
    p.use_orig_params = true;
    t.note("use_orig_params false -> true: LoRA adapters in a block's FSDP1 unit need use_orig_params (frozen and "
           "trainable tensors in one FlatParameter); each block's whole flat gradient is then kept (M13)");
  }
  // QLoRA: accelerate quantizes through transformers' BitsAndBytesConfig (bitsandbytes' Params4bit), modelled under
  // FSDP1 (models/nf4.h), not under fully_shard; Lightning's bitsandbytes precision plugin with its FSDP strategies
  // is not modelled. torchao's NF4Tensor under fully_shard (torchtune's QLoRA) is the fsdp2 export's.
  if (p.lora.quantize_nf4 && (fw == "lightning" || (fw == "accelerate" && p.fsdp_version == sim::FsdpVersion::FSDP2))) {
    p.lora.quantize_nf4 = false;
    t.note("lora.quantize_base nf4 -> none: " +
           std::string(fw == "lightning" ? "Lightning's bitsandbytes precision under its FSDP strategies"
                                         : "bitsandbytes' 4-bit parameters under accelerate's FSDP2") +
           " are not modelled (QLoRA is: torchao's NF4Tensor under fully_shard, the fsdp2 export; bitsandbytes under "
           "FSDP1, accelerate's fsdp_version 1)");
  }
  // torchtune's chunked loss needs its model code: CEWithChunkedOutputLoss takes the list of logits chunks that
  // TransformerDecoder.chunked_output returns (torchtune/modules/transformer.py); none of these front-ends runs
  // torchtune's TransformerDecoder (there is no torchtune export), so they compute the loss in one piece.
  if (p.cross_entropy == models::LossImpl::Chunked) {
    p.cross_entropy = models::LossImpl::Torch;
    p.cross_entropy_chunks = models::kDefaultLossChunks;
    t.note("cross_entropy chunked -> torch: torchtune's CEWithChunkedOutputLoss needs torchtune's TransformerDecoder "
           "(chunked_output); this front-end computes the cross-entropy over the whole logits");
  }
  // torchtune's activation offloading is torchtune's own saved-tensor hooks (training.OffloadActivations), which
  // none of these front-ends has; the export keeps the checkpointed blocks' inputs on the GPU.
  if (p.activation_offloading != sim::ActivationOffload::None) {
    t.note(std::string("activation_offloading ") +
           sim::activation_offload_name(p.activation_offloading) +
           " -> none: torchtune's OffloadActivations is torchtune's code (enable_activation_offloading); this "
           "front-end keeps each checkpointed block's input on the GPU");
    p.activation_offloading = sim::ActivationOffload::None;
  }
  // bitsandbytes' optimizers are modelled over FSDP1's plain-tensor parameters only (program/optimizer_state.h):
  // an export that moved the plan to FSDP2 takes torchao's AdamW of the same state width instead.
  if (sim::optimizer_is_bitsandbytes(p.optimizer) && p.fsdp_version == sim::FsdpVersion::FSDP2) {
    const std::string was = sim::plan_to_json(p)["optimizer"].get<std::string>();
    p.optimizer = p.optimizer == sim::Optimizer::BnbPagedAdamW ? sim::Optimizer::AdamW : sim::Optimizer::TorchaoAdamW8bit;
    t.note("optimizer " + was + " -> " + sim::plan_to_json(p)["optimizer"].get<std::string>() +
           ": bitsandbytes' optimizers over FSDP2's DTensor parameters are not modelled (torchao's low-bit AdamWs "
           "step their local shards)");
  }
  // FSDP1 with CPU offload accumulates only inside no_sync (PyTorch FSDP docs; semantics M11).
  if (p.fsdp_version == sim::FsdpVersion::FSDP1 && p.cpu_offload.params)
    t.grad_sync(false, "FSDP1 with CPU offload must accumulate inside no_sync (outside it the gradients are wrong)");
  Expressed e;
  e.changes = t.changes;
  e.plan = t.changes.empty() ? in : sim::resolve_plan(t.p, world, gpn);
  return e;
}

}  // namespace fsdpsim::planner
