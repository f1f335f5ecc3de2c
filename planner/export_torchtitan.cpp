// torchtitan job-config TOML export (ecosystem.md §2.4): the TOML-era keys (torchtitan before the
// config refactor 9810191bb, 2026-02-23; torchtitan/config/job_config.py). torchtitan is FSDP2-only.
#include <sstream>

#include "planner/export_fsdp2_body.h"
#include "planner/exports.h"
#include "planner/search_space.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {
namespace {

using AcMode = sim::ActivationCheckpointing::Mode;
const char* toml_bool(bool b) { return b ? "true" : "false"; }

std::string titan_dtype(Dtype d, std::vector<std::string>& unsupported, const char* key) {
  if (d == Dtype::BF16) return "bfloat16";
  if (d == Dtype::FP32) return "float32";
  unsupported.push_back(std::string(key) + "=" + std::string(dtype_name(d)) + ": torchtitan takes bfloat16 or float32");
  return "bfloat16";
}

}  // namespace

Export export_torchtitan(const ExportInput& in) {
  const sim::Plan& p = in.plan;
  Export e;
  e.format = "toml";
  e.target = "torchtitan TOML job config (keys of torchtitan/config/job_config.py before 9810191bb, 2026-02-23)";
  fsdp1_to_fsdp2_notes(p, e.unsupported);
  const int world = in.cluster.nodes * in.cluster.gpus_per_node;
  std::string model_name = in.model.model_type, flavor;
  if (in.model.name == "llama3-8b") { model_name = "llama3"; flavor = "8B"; }
  else if (in.model.name == "llama3-70b") { model_name = "llama3"; flavor = "70B"; }
  else e.unsupported.push_back("[model] " + in.model.name + ": set name/flavor to a torchtitan model definition of this shape");
  std::string param = titan_dtype(p.param_dtype, e.unsupported, "param_dtype");
  std::string reduce = titan_dtype(p.reduce_dtype, e.unsupported, "reduce_dtype");
  // "default": every block resharded after forward except the last (module_overrides last_block false);
  // "always": every block; "never": none.
  const bool last_kept = p.module_overrides.size() == 1 && p.module_overrides[0].module == "last_block" &&
                         p.module_overrides[0].reshard_after_forward.keeps();
  std::string raf = last_kept ? "default" : "always";
  if (p.fsdp_version == sim::FsdpVersion::FSDP2) {
    if (p.reshard_after_forward.keeps()) raf = "never";
    if (p.reshard_after_forward.is_group())
      e.unsupported.push_back("reshard_after_forward=" + p.reshard_after_forward.text() +
                              ": fsdp_reshard_after_forward is default/always/never; emitted as \"default\"");
    if (p.prefetch_depth > 1)
      e.unsupported.push_back("prefetch_depth=" + std::to_string(p.prefetch_depth) + ": no torchtitan key (default 1-ahead prefetch)");
  } else if (p.sharding_strategy == sim::ShardingStrategy::SHARD_GRAD_OP ||
             p.sharding_strategy == sim::ShardingStrategy::_HYBRID_SHARD_ZERO2) {
    raf = "never";
  }
  if (p.grad_accum > 1 && !p.grad_sync)
    e.unsupported.push_back("grad_sync=false (no_sync while accumulating): no key in this torchtitan key table");
  if (p.auto_wrap_policy.kind != models::WrapPolicy::Kind::TransformerBlock)
    e.unsupported.push_back("auto_wrap_policy: torchtitan always shards per transformer block (+ embeddings, [norm, output])");

  // Keys inside their sections as the plan-key table spells them for torchtitan (program/plan_keys.cpp).
  const auto key = [](const char* plan_key) { return sim::section_key(plan_key, sim::Framework::TorchTitan) + " = "; };
  std::ostringstream os;
  os << "# fsdpsim export: " << e.target << "\n"
     << "# plan: " << in.label << "\n"
     << "# launch: " << (alloc_conf_line(p).empty() ? "" : alloc_conf_line(p) + " ") << "torchrun --nnodes " << in.cluster.nodes
     << " --nproc_per_node " << in.cluster.gpus_per_node << " -m torchtitan.train --job.config_file this.toml\n\n"
     << "[model]\n"
     << "name = \"" << model_name << "\"\n"
     << "flavor = \"" << flavor << "\"\n";
  const bool fp8 = p.float8 != models::Float8Recipe::None || p.fp8_all_gather;
  if (fp8) os << "converters = [\"quantize.linear.float8\"]  # before 2025-09-26 (5b5d46856): [\"float8\"] and a [float8] section\n";
  os << "\n[optimizer]\n"
     << key("optimizer") << "\"AdamW\"\n"
     << key("optimizer_impl") << "\"" << (p.optimizer_impl == sim::OptimizerImpl::Fused ? "fused" : "foreach") << "\"\n";
  os << "\n[training]\n"
     << key("micro_batch") << p.micro_batch << "\n"
     << "global_batch_size = " << p.micro_batch * p.grad_accum * world << "  # gradient accumulation "
     << p.grad_accum << " = " << p.micro_batch * p.grad_accum * world << " / (" << p.micro_batch << " x " << world << ")\n"
     << key("seq_len") << p.seq_len << "\n"
     << key("param_dtype") << "\"" << param << "\"\n"
     << key("reduce_dtype") << "\"" << reduce << "\"\n";
  if (p.master_weights_dtype == p.param_dtype && p.param_dtype == Dtype::BF16)
    os << key("master_weights_dtype") << "\"bfloat16\"  # pure bf16: no fp32 master weights\n";
  os << key("cpu_offload") << toml_bool(p.cpu_offload.params) << "\n\n"
     << "[parallelism]\n"
     << "data_parallel_replicate_degree = " << p.mesh_replicate << "\n"
     << "data_parallel_shard_degree = " << p.mesh_shard << "\n"
     << key("reshard_after_forward") << "\"" << raf << "\"\n"
     << "tensor_parallel_degree = 1\n"
     << "pipeline_parallel_degree = 1\n"
     << "context_parallel_degree = 1\n\n"
     << "[activation_checkpoint]\n";
  const auto& ac = p.activation_checkpointing;
  switch (ac.mode) {
    case AcMode::None: os << key("activation_checkpointing") << "\"none\"\n"; break;
    case AcMode::Full: os << key("activation_checkpointing") << "\"full\"\n"; break;
    case AcMode::SelectiveOp: os << key("activation_checkpointing") << "\"selective\"\nselective_ac_option = \"op\"\n"; break;
    case AcMode::EveryK:
      os << key("activation_checkpointing") << "\"selective\"\nselective_ac_option = \"" << ac.every_k << "\"  # checkpoint one in " << ac.every_k
         << " blocks (block index % " << ac.every_k << " == 0)\n";
      break;
  }
  if (p.compile) os << "\n[compile]\n" << key("compile") << "true\ncomponents = [\"model\", \"loss\"]\n";
  if (fp8) {
    os << "\n[quantize.linear.float8]\n";
    if (p.float8 == models::Float8Recipe::Rowwise) os << key("float8") << "\"rowwise\"\n";
    if (p.fp8_all_gather)
      os << key("fp8_all_gather") << "true\n"
         << "precompute_float8_dynamic_scale_for_fsdp = true\n";
    os << "filter_fqns = [\"output\"]\n";
  }
  if (p.lora.on())
    e.unsupported.push_back("lora (rank " + std::to_string(p.lora.rank) +
                            "): torchtitan has no LoRA; this job trains every parameter (use torchtune's lora_* "
                            "recipes or PEFT for adapters)");
  if (!e.unsupported.empty()) os << "\n";
  for (const auto& u : e.unsupported) os << "# not expressible here: " << u << "\n";
  e.text = os.str();
  return e;
}

}  // namespace fsdpsim::planner
