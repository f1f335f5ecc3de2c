// accelerate config YAML export (ecosystem.md §2.3): `fsdp_config:` keys for FSDP1 and FSDP2 and the
// `parallelism_config:` block for an FSDP2 HSDP mesh, as in accelerate 16cb6eb (2026-07).
#include <sstream>

#include "planner/export_fsdp2_body.h"
#include "planner/exports.h"
#include "planner/search_space.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {
namespace {

using AcMode = sim::ActivationCheckpointing::Mode;
const char* yaml_bool(bool b) { return b ? "true" : "false"; }

}  // namespace

Export export_accelerate(const ExportInput& in) {
  const sim::Plan& p = in.plan;
  Export e;
  e.format = "yaml";
  const bool v1 = p.fsdp_version == sim::FsdpVersion::FSDP1;
  e.target = v1 ? "accelerate config keys as of accelerate 16cb6eb (2026-07), fsdp_version 1"
                : "accelerate config keys as of accelerate 16cb6eb (2026-07), fsdp_version 2 (needs torch >= 2.6)";
  // mixed_precision: the compute dtype. accelerate keeps fp32 master weights under bf16/fp16.
  std::string mixed = p.param_dtype == Dtype::BF16 ? "bf16" : p.param_dtype == Dtype::FP16 ? "fp16" : "'no'";
  bool pure_low = p.master_weights_dtype == p.param_dtype && p.param_dtype != Dtype::FP32;
  if (pure_low) {
    mixed = "'no'";
    e.unsupported.push_back("master_weights_dtype=" + std::string(dtype_name(p.master_weights_dtype)) +
                            " (pure low precision): no YAML key; mixed_precision 'no' is emitted - load the model in " +
                            torch_dtype(p.param_dtype) + " yourself");
  }
  if (!pure_low && p.param_dtype != Dtype::FP32 && p.reduce_dtype != p.param_dtype)
    e.unsupported.push_back("reduce_dtype=" + std::string(dtype_name(p.reduce_dtype)) +
                            ": no YAML key; set the plugin's mixed-precision policy in code "
                            "(FullyShardedDataParallelPlugin(mixed_precision_policy=...))");
  const bool fp8 = p.float8 != models::Float8Recipe::None || p.fp8_all_gather;
  if (fp8) mixed = "fp8";   // with fp8_config backend AO: torchao Float8Linear, bf16 elsewhere
  auto m = p.activation_checkpointing.mode;
  if (m == AcMode::EveryK || m == AcMode::SelectiveOp)
    e.unsupported.push_back("activation_checkpointing=" + sim::checkpointing_text(p.activation_checkpointing) +
                            ": fsdp_activation_checkpointing is on/off for every wrapped block; emitted as true (full)");
  if (!v1 && p.reshard_after_forward.is_group())
    e.unsupported.push_back("reshard_after_forward=" + p.reshard_after_forward.text() +
                            ": fsdp_reshard_after_forward is true/false under FSDP2; emitted as true");
  if (!v1 && p.prefetch_depth > 1)
    e.unsupported.push_back("prefetch_depth=" + std::to_string(p.prefetch_depth) +
                            ": no YAML key; call set_modules_to_forward_prefetch/backward_prefetch in code");
  if (v1 && !p.limit_all_gathers)
    e.unsupported.push_back("limit_all_gathers=False: no YAML key in this key table; set it on the plugin in code");
  if (v1 && p.mesh_replicate > 1 && p.mesh_shard > 1 && p.mesh_shard != in.cluster.gpus_per_node)
    e.unsupported.push_back("mesh (" + std::to_string(p.mesh_replicate) + ", " + std::to_string(p.mesh_shard) +
                            "): FSDP1 HYBRID_SHARD in accelerate shards within one node (" +
                            std::to_string(in.cluster.gpus_per_node) + " GPUs); use fsdp_version 2 for other shard sizes");

  std::string peft;
  if (p.lora.on()) {
    peft = peft_lora_config(in.model, p.lora, e.unsupported);
    if (v1 && !p.use_orig_params)
      e.unsupported.push_back("lora with fsdp_use_orig_params false: TRANSFORMER_BASED_WRAP puts the adapters in the "
                              "frozen block's FlatParameter, which FSDP1 refuses (mixed requires_grad); set "
                              "fsdp_use_orig_params: true (then each block's whole flat gradient is kept, M13) or wrap "
                              "the adapter linears apart with a lambda policy in code");
  }
  std::ostringstream os;
  os << "# fsdpsim export: accelerate config, " << e.target << "\n"
     << "# plan: " << in.label << "\n"
     << "# per-device batch size " << p.micro_batch << " (sequences of " << p.seq_len
     << " tokens) and Accelerator(gradient_accumulation_steps=" << p.grad_accum << ") belong to your script";
  if (p.grad_accum > 1)
    os << ";\n# " << (p.grad_sync ? "sync gradients every micro-batch: GradientAccumulationPlugin(sync_each_batch=True)"
                                  : "accelerator.accumulate(model) skips gradient sync until the last micro-batch (no_sync)");
  os << "\n";
  if (p.lora.on() && p.lora.quantize_nf4 && !v1)
    e.unsupported.push_back("lora.quantize_base nf4 with fsdp_version 2: bitsandbytes' 4-bit parameters under fully_shard "
                            "are not modelled (use fsdp_version 1 here, or torchao's NF4 in the fsdp2 export)");
  if (p.lora.on() && p.lora.quantize_nf4 && v1) {
    // QLoRA under FSDP1: bitsandbytes' 4-bit weights stored in the flat parameter's dtype (models/nf4.h)
    const std::string dt = torch_dtype(p.param_dtype);
    os << "# QLoRA base weights in your script: AutoModelForCausalLM.from_pretrained(..., torch_dtype=" << dt << ",\n"
       << "#   quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\",\n"
       << "#   bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=" << dt << ", bnb_4bit_quant_storage=" << dt << "))\n";
  }
  if (p.lora.on())
    os << "# LoRA in your script (PEFT), before accelerator.prepare: from peft import LoraConfig, get_peft_model;\n"
       << "#   model = get_peft_model(model, " << peft << ")  # lora_alpha scales the update only: yours\n";
  os << "# optimizer in your script: " << optimizer_code(p, "model.parameters()")
     << (optimizer_import(p).empty() ? "" : "  # " + optimizer_import(p).substr(0, optimizer_import(p).size() - 1)) << "\n";
  if (!alloc_conf_line(p).empty()) os << "# launch: " << alloc_conf_line(p) << " accelerate launch --config_file this.yaml train.py\n";
  os << "compute_environment: LOCAL_MACHINE\n"
     << "distributed_type: FSDP\n"
     << "mixed_precision: " << mixed << "\n"
     << "num_machines: " << in.cluster.nodes << "\n"
     << "num_processes: " << in.cluster.nodes * in.cluster.gpus_per_node << "  # total across machines\n"
     << "machine_rank: 0  # set per node\n";
  if (fp8) os << "fp8_config:\n  backend: AO  # torchao float8 (tensorwise; float8 all-gathers under FSDP2)\n";
  if (p.compile) os << "dynamo_config:\n  dynamo_backend: INDUCTOR  # torch.compile\n";
  if (in.cluster.nodes > 1)
    os << "main_process_ip: 10.0.0.1  # replace with node 0's address\n"
       << "main_process_port: 29500\n"
       << "rdzv_backend: static\n"
       << "same_network: true\n";
  // fsdp_config's keys as the plan-key table spells them for accelerate (program/plan_keys.cpp).
  const auto key = [](const char* plan_key) { return "  " + sim::section_key(plan_key, sim::Framework::Accelerate) + ": "; };
  os << "fsdp_config:\n"
     << key("fsdp_version") << (v1 ? 1 : 2) << "\n";
  if (v1) {
    std::string st = sim::strategy_name(p.sharding_strategy);
    if (st == "_HYBRID_SHARD_ZERO2") st = "HYBRID_SHARD_ZERO2";
    os << key("sharding_strategy") << st << "\n";
  } else {
    os << key("reshard_after_forward") << yaml_bool(!p.reshard_after_forward.keeps()) << "\n";
  }
  switch (p.auto_wrap_policy.kind) {
    case models::WrapPolicy::Kind::TransformerBlock:
    case models::WrapPolicy::Kind::Modules:
      os << key("auto_wrap_policy") << "TRANSFORMER_BASED_WRAP\n"
         << "  fsdp_transformer_layer_cls_to_wrap: " << block_class_name(in.model) << "\n";
      break;
    case models::WrapPolicy::Kind::Size:
      os << key("auto_wrap_policy") << "SIZE_BASED_WRAP\n"
         << "  fsdp_min_num_params: " << p.auto_wrap_policy.min_num_params << "\n";
      break;
    case models::WrapPolicy::Kind::None: os << key("auto_wrap_policy") << "NO_WRAP\n"; break;
  }
  if (v1)
    os << key("backward_prefetch")
       << (p.backward_prefetch == sim::BackwardPrefetch::NONE ? "NO_PREFETCH" : sim::prefetch_name(p.backward_prefetch)) << "\n"
       << key("forward_prefetch") << yaml_bool(p.forward_prefetch) << "\n"
       << key("use_orig_params") << yaml_bool(p.use_orig_params) << "\n"
       << "  fsdp_sync_module_states: true\n";
  os << key("activation_checkpointing") << yaml_bool(m != AcMode::None) << "\n"
     << key("cpu_offload") << yaml_bool(p.cpu_offload.params) << "\n"
     << "  fsdp_cpu_ram_efficient_loading: true\n"
     << "  fsdp_state_dict_type: SHARDED_STATE_DICT\n";
  if (!v1 && p.mesh_replicate > 1) {
    if (p.mesh_shard == 1)
      e.unsupported.push_back("mesh (" + std::to_string(p.mesh_replicate) +
                              ", 1): accelerate rejects dp_replicate_size > 1 with dp_shard_size 1; use DDP "
                              "(distributed_type: MULTI_GPU) for pure replication");
    else
      os << "parallelism_config:\n"
         << "  parallelism_config_dp_replicate_size: " << p.mesh_replicate << "\n"
         << "  parallelism_config_dp_shard_size: " << p.mesh_shard << "\n"
         << "  parallelism_config_tp_size: 1\n"
         << "  parallelism_config_cp_size: 1\n";
  }
  for (const auto& u : e.unsupported) os << "# not expressible here: " << u << "\n";
  e.text = os.str();
  return e;
}

}  // namespace fsdpsim::planner
