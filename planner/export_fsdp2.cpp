// Raw FSDP2 export: fully_shard per block + root, MixedPrecisionPolicy, init_device_mesh,
// reshard_after_forward, explicit prefetch (ecosystem.md §2.5; torch/distributed/fsdp/_fully_shard).
#include <sstream>

#include "planner/export_fsdp2_body.h"
#include "planner/exports.h"
#include "planner/search_space.h"
#include "program/optimizer_state.h"

namespace fsdpsim::planner {

using sim::ActivationCheckpointing;
using AcMode = ActivationCheckpointing::Mode;

// Notes shared by every FSDP2-based export when the plan was simulated with FSDP1 semantics.
void fsdp1_to_fsdp2_notes(const sim::Plan& p, std::vector<std::string>& unsupported) {
  if (p.fsdp_version != sim::FsdpVersion::FSDP1) return;
  unsupported.push_back("fsdp_version=1: the plan was simulated with FSDP1 semantics; this is its FSDP2 translation "
                        "(sharding_strategy " + sim::strategy_name(p.sharding_strategy) + " -> mesh + reshard_after_forward)");
  if (p.backward_prefetch != sim::BackwardPrefetch::BACKWARD_PRE)
    unsupported.push_back("backward_prefetch=" + sim::prefetch_name(p.backward_prefetch) +
                          ": FSDP2 always prefetches one group ahead in backward (like BACKWARD_PRE)");
  if (p.forward_prefetch)
    unsupported.push_back("forward_prefetch=True: FSDP2 prefetches the next group implicitly; explicit lists are "
                          "set_modules_to_forward_prefetch");
  if (!p.limit_all_gathers)
    unsupported.push_back("limit_all_gathers=False: FSDP2 has no CPU rate limiter (memory is bounded by event waits)");
}

std::string float8_conversion_code(const sim::Plan& p, const std::string& ind, const std::string& root) {
  if (p.float8 == models::Float8Recipe::None && !p.fp8_all_gather) return "";
  // torchao.float8: Float8LinearConfig.from_recipe_name("tensorwise" | "rowwise"); the float8 all-gather is
  // a tensorwise option (enable_fsdp_float8_all_gather). The LM head stays in bf16, as torchtitan filters "output".
  std::string cfg = p.float8 == models::Float8Recipe::Rowwise ? "Float8LinearConfig.from_recipe_name(\"rowwise\")"
                    : p.fp8_all_gather ? "Float8LinearConfig(enable_fsdp_float8_all_gather=True)"
                                       : "Float8LinearConfig.from_recipe_name(\"tensorwise\")";
  return ind + "# float8 training (torchao Float8Linear), converted before sharding; the LM head stays bf16\n" + ind +
         "convert_to_float8_training(" + root + ", config=" + cfg + ", module_filter_fn=lambda mod, fqn: not fqn.endswith(\"lm_head\"))\n";
}

std::string reshard_overrides_code(const sim::Plan& p, const models::ModelSpec& m) {
  if (p.module_overrides.empty()) return "";
  std::string d = "{";
  for (const auto& o : p.module_overrides) {
    if (o.reshard_after_forward.is_unset()) continue;
    std::string idx;
    if (o.module == "last_block") idx = std::to_string(m.n_layers - 1);
    else if (auto dot = o.module.rfind('.'); dot != std::string::npos) idx = o.module.substr(dot + 1);
    if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos) continue;
    d += (d.size() > 1 ? ", " : "") + idx + ": " + (o.reshard_after_forward.keeps() ? "False" : "True");
  }
  return d.size() > 1 ? d + "}" : "";
}

std::string optimizer_code(const sim::Plan& p, const std::string& params) {
  // A low-bit or paged AdamW: its class (program/optimizer_state.h), imported by optimizer_import.
  if (sim::optimizer_is_low_bit(p.optimizer)) return sim::optimizer_class(p.optimizer) + "(" + params + ", lr=3e-4)";
  // torch.optim: foreach is the default implementation on CUDA; fused=True runs one kernel per group.
  const std::string impl = p.optimizer_impl == sim::OptimizerImpl::Fused ? ", fused=True" : "";
  if (p.optimizer == sim::Optimizer::SGD) return "torch.optim.SGD(" + params + ", lr=1e-2, momentum=0.9" + impl + ")";
  return "torch.optim.AdamW(" + params + ", lr=3e-4" + impl + ")";
}

std::string optimizer_import(const sim::Plan& p) {
  if (sim::optimizer_is_bitsandbytes(p.optimizer)) return "import bitsandbytes\n";
  if (sim::optimizer_is_torchao(p.optimizer)) return "import torchao.optim\n";
  return "";
}

// The sharding code, indented by `ind`, sharding `root` over the mesh variable `mesh_var`.
std::string fsdp2_sharding_code(const ExportInput& in, const std::string& ind, const std::string& root,
                                const std::string& mesh_var, std::vector<std::string>& unsupported) {
  const sim::Plan& p = in.plan;
  std::ostringstream os;
  const std::string blocks = block_list_path(in.model);
  const std::string blocks_expr = root == "model" ? blocks : root + blocks.substr(5);  // "self.model.layers"
  bool pure_low = p.master_weights_dtype == p.param_dtype;
  os << float8_conversion_code(p, ind, root);
  if (pure_low) {
    os << ind << "# pure " << dtype_name(p.param_dtype) << " training: no fp32 master copy (master_weights_dtype == param_dtype)\n"
       << ind << root << ".to(" << torch_dtype(p.param_dtype) << ")\n";
    if (p.reduce_dtype != p.param_dtype)
      os << ind << "mp_policy = MixedPrecisionPolicy(reduce_dtype=" << torch_dtype(p.reduce_dtype) << ")\n";
    else
      os << ind << "mp_policy = MixedPrecisionPolicy()\n";
  } else {
    os << ind << "mp_policy = MixedPrecisionPolicy(param_dtype=" << torch_dtype(p.param_dtype)
       << ", reduce_dtype=" << torch_dtype(p.reduce_dtype) << ")\n";
  }
  os << ind << "fsdp_kwargs = dict(mesh=" << mesh_var << ", mp_policy=mp_policy, offload_policy="
     << (p.cpu_offload.params ? "CPUOffloadPolicy()" : "OffloadPolicy()") << ")\n";
  if (p.cpu_offload.optimizer && !p.cpu_offload.params)
    unsupported.push_back("cpu_offload.optimizer only: FSDP2's CPUOffloadPolicy offloads params, grads and optimizer together");

  const auto& ac = p.activation_checkpointing;
  std::string raf = p.reshard_after_forward.text();
  if (p.fsdp_version == sim::FsdpVersion::FSDP1) {
    auto s = p.sharding_strategy;
    raf = (s == sim::ShardingStrategy::FULL_SHARD || s == sim::ShardingStrategy::HYBRID_SHARD) ? "true" : "false";
  }
  std::string raf_py = raf == "true" ? "True" : raf == "false" ? "False" : raf;
  auto wrap = p.auto_wrap_policy.kind;
  if (wrap == models::WrapPolicy::Kind::None) {
    os << ind << "# auto_wrap_policy none: only the root is an FSDP unit (the whole model is all-gathered at once)\n";
  } else {
    if (wrap != models::WrapPolicy::Kind::TransformerBlock)
      unsupported.push_back("auto_wrap_policy by size or module names: FSDP2 has no auto-wrap; this export wraps each " +
                            block_class_name(in.model) + " (adapt the loop to your grouping)");
    os << ind << "blocks = " << blocks_expr << "  # the " << block_class_name(in.model) << " modules\n"
       << ind << "for i, block in enumerate(blocks):\n";
    const bool compile_first = p.compile && ac.outside_compile && (ac.mode == AcMode::Full || ac.mode == AcMode::EveryK);
    if (compile_first)
      os << ind << "    block.compile()  # torch.compile (inductor) of each block, inside its checkpoint: AC(compile(block))\n";
    if (ac.mode == AcMode::Full) {
      os << ind << "    blocks[i] = block = checkpoint_wrapper(block)  # activation checkpointing: FSDP(AC(block))\n";
    } else if (ac.mode == AcMode::EveryK) {
      os << ind << "    if i % " << ac.every_k << " == 0:  # activation checkpointing on one block in " << ac.every_k
         << ": FSDP(AC(block))\n"
         << ind << "        blocks[i] = block = checkpoint_wrapper(block)\n";
    } else if (ac.mode == AcMode::SelectiveOp) {
      os << ind << "    # selective (op-level) activation checkpointing: wrap `block` with torchtitan's op-SAC policy here\n";
      unsupported.push_back("activation_checkpointing=selective_op: raw PyTorch needs a selective-checkpoint policy "
                            "(torch.utils.checkpoint.create_selective_checkpoint_contexts, as torchtitan's op SAC); "
                            "not reproduced here");
    }
    if (p.compile && !compile_first)
      os << ind << "    block.compile()  # torch.compile (inductor) of each block, as torchtitan does\n";
    const std::string overrides = reshard_overrides_code(p, in.model);
    if (overrides.empty()) {
      os << ind << "    fully_shard(block, reshard_after_forward=" << raf_py << ", **fsdp_kwargs)\n";
    } else {
      os << ind << "    fully_shard(block, reshard_after_forward=" << overrides << ".get(i, " << raf_py << "), **fsdp_kwargs)\n";
      if (p.fsdp_version == sim::FsdpVersion::FSDP1) unsupported.push_back("module_overrides: FSDP1 has no per-unit reshard; shown in FSDP2 form");
    }
  }
  os << ind << "fully_shard(" << root << ", **fsdp_kwargs)  # root (embedding, final norm, LM head): kept unsharded after forward\n";
  if (p.prefetch_depth > 1 && wrap != models::WrapPolicy::Kind::None) {
    int d = p.prefetch_depth;
    os << ind << "# explicit prefetch, " << d << " blocks ahead (more overlap, more reserved memory)\n"
       << ind << "for i, block in enumerate(blocks):\n"
       << ind << "    block.set_modules_to_forward_prefetch(list(blocks[i + 1:i + " << d + 1 << "]))\n"
       << ind << "    block.set_modules_to_backward_prefetch(list(reversed(blocks[max(0, i - " << d << "):i])))\n";
  } else if (p.fsdp_version == sim::FsdpVersion::FSDP1 && p.forward_prefetch && wrap != models::WrapPolicy::Kind::None) {
    os << ind << "for i, block in enumerate(blocks):  # forward_prefetch: the next block, issued early\n"
       << ind << "    block.set_modules_to_forward_prefetch(list(blocks[i + 1:i + 2]))\n";
  }
  return os.str();
}

std::string mesh_code(const sim::Plan& p) {
  std::ostringstream os;
  if (p.mesh_replicate == 1)
    os << "mesh = init_device_mesh(\"cuda\", (" << p.mesh_shard << ",), mesh_dim_names=(\"dp_shard\",))\n";
  else
    os << "mesh = init_device_mesh(\"cuda\", (" << p.mesh_replicate << ", " << p.mesh_shard
       << "), mesh_dim_names=(\"dp_replicate\", \"dp_shard\"))  # (replicate, shard)"
       << (p.mesh_shard == 1 ? ": pure replication (DDP-like)" : ": HSDP") << "\n";
  return os.str();
}

std::string accumulation_loop(const sim::Plan& p, const std::string& model) {
  std::ostringstream os;
  os << "# training step: " << p.grad_accum << " micro-batch(es) of " << p.micro_batch << " sequence(s) x " << p.seq_len
     << " tokens per GPU\n"
     << "optimizer = " << optimizer_code(p, model + ".parameters()") << "  # your learning rate\n"
     << "for micro_batches in loader:  # lists of GRAD_ACCUM micro-batches\n"
     << "    for k, batch in enumerate(micro_batches):\n";
  if (p.grad_accum > 1 && !p.grad_sync)
    os << "        " << model << ".set_requires_gradient_sync(k == GRAD_ACCUM - 1)  # no_sync until the last micro-batch\n";
  else if (p.grad_accum > 1)
    os << "        # reduce-scatter after every micro-batch (the default; less memory than no_sync)\n";
  if (p.free_logits_before_backward.value_or(false))
    os << "        out = " << model << "(**batch)\n"
       << "        loss = out.loss / GRAD_ACCUM\n"
       << "        del out  # free the logits before backward (free_logits_before_backward)\n";
  else
    os << "        loss = " << model << "(**batch).loss / GRAD_ACCUM\n";
  os << "        loss.backward()\n"
     << "    optimizer.step()\n"
     << "    optimizer.zero_grad()\n";
  return os.str();
}

Export export_fsdp2(const ExportInput& in) {
  const sim::Plan& p = in.plan;
  Export e;
  e.format = "python";
  e.target = "PyTorch >= 2.6 (torch.distributed.fsdp.fully_shard)";
  fsdp1_to_fsdp2_notes(p, e.unsupported);
  std::ostringstream os;
  os << "# fsdpsim export: raw FSDP2 (fully_shard), target " << e.target << "\n"
     << "# plan: " << in.label << "\n"
     << "# launch: " << (alloc_conf_line(p).empty() ? "" : alloc_conf_line(p) + " ") << "torchrun --nnodes " << in.cluster.nodes
     << " --nproc_per_node " << in.cluster.gpus_per_node << " train.py\n"
     << "import torch\n"
     << "from torch.distributed.device_mesh import init_device_mesh\n"
     << "from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard\n"
     << optimizer_import(p);
  auto m = p.activation_checkpointing.mode;
  if (m == AcMode::Full || m == AcMode::EveryK)
    os << "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper\n";
  if (p.fp8_all_gather || p.float8 != models::Float8Recipe::None)
    os << "from torchao.float8 import Float8LinearConfig, convert_to_float8_training\n";
  os << "\n"
     << "MICRO_BATCH = " << p.micro_batch << "  # sequences per GPU per micro-batch\n"
     << "GRAD_ACCUM = " << p.grad_accum << "  # micro-batches per optimizer step\n"
     << "SEQ_LEN = " << p.seq_len << "\n\n"
     << "model = build_model()  # your " << in.model.name << " module (e.g. on the meta device)\n";
  if (p.lora.on()) {
    // fully_shard has no LoRA of its own: the adapters are modules of the model it shards
    e.unsupported.push_back("lora: FSDP2 (fully_shard) has no LoRA; add the adapters to the model before sharding "
                            "(the PEFT lines above, or torchtune's lora_* builders), then every trainable tensor is an "
                            "adapter and FSDP2 keeps gradients and optimizer state for those alone");
    os << "# LoRA adapters (plan.lora), added before fully_shard:\n"
       << "from peft import LoraConfig, get_peft_model\n"
       << "model = get_peft_model(model, " << peft_lora_config(in.model, p.lora, e.unsupported)
       << ")  # lora_alpha: yours\n";
    if (p.lora.quantize_nf4)
      os << "# QLoRA (plan.lora.quantize_base nf4): each block linear's frozen weight as torchao's NF4Tensor before\n"
         << "# fully_shard, as torchtune's qlora_* builders make them (not your LM head: it stays bf16)\n"
         << "from torchao.dtypes.nf4tensor import linear_nf4, to_nf4\n"
         << "for block in transformer_blocks(model):  # your blocks\n"
         << "    for lin in [m for m in block.modules() if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad]:\n"
         << "        lin.weight = torch.nn.Parameter(to_nf4(lin.weight.detach()), requires_grad=False)\n"
         << "        lin.forward = lambda x, lin=lin: linear_nf4(x, lin.weight)\n";
  }
  os << mesh_code(p);
  std::vector<std::string> body_notes;
  os << fsdp2_sharding_code(in, "", "model", "mesh", body_notes);
  for (auto& n : body_notes) e.unsupported.push_back(n);
  os << "\n" << accumulation_loop(p, "model");
  for (const auto& u : e.unsupported) os << "# not expressible here: " << u << "\n";
  e.text = os.str();
  return e;
}

}  // namespace fsdpsim::planner
