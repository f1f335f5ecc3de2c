// PyTorch Lightning export (ecosystem.md §2.1): FSDPStrategy (FSDP1 underneath) + Trainer for FSDP1
// plans; ModelParallelStrategy + configure_model(fully_shard) for FSDP2 plans. Precision strings as
// Lightning >= 2.6 defines them (PR #21361): "bf16-mixed" = bf16 params and reduction with fp32
// master weights, "bf16-true" = everything bf16, "32-true" = fp32.
#include <sstream>

#include "planner/export_fsdp2_body.h"
#include "planner/exports.h"
#include "planner/search_space.h"

namespace fsdpsim::planner {
namespace {

using AcMode = sim::ActivationCheckpointing::Mode;

// The Trainer precision string and, when it does not pin the dtypes, a MixedPrecision(...) override.
std::pair<std::string, std::string> lightning_precision(const sim::Plan& p, std::vector<std::string>& unsupported) {
  auto half = [](Dtype d) { return d == Dtype::BF16 ? std::string("bf16") : std::string("16"); };
  if (p.param_dtype == Dtype::FP32) return {"32-true", ""};
  if (p.param_dtype == Dtype::FP8) {
    unsupported.push_back("param_dtype=fp8: no Lightning precision string");
    return {"bf16-mixed", ""};
  }
  if (p.master_weights_dtype == p.param_dtype) {
    if (p.reduce_dtype != p.param_dtype)
      return {half(p.param_dtype) + "-true",
              "MixedPrecision(param_dtype=" + torch_dtype(p.param_dtype) + ", reduce_dtype=" + torch_dtype(p.reduce_dtype) +
                  ", buffer_dtype=" + torch_dtype(p.param_dtype) + ")"};
    return {half(p.param_dtype) + "-true", ""};
  }
  std::string s = half(p.param_dtype) + "-mixed";
  if (p.reduce_dtype == p.param_dtype) return {s, ""};
  return {s, "MixedPrecision(param_dtype=" + torch_dtype(p.param_dtype) + ", reduce_dtype=" + torch_dtype(p.reduce_dtype) +
                 ", buffer_dtype=" + torch_dtype(p.param_dtype) + ")"};
}

std::string py_bool(bool b) { return b ? "True" : "False"; }

// The LightningModule parts the plan needs with FSDPStrategy: float8 conversion and per-block compile
// in configure_model (FSDPStrategy wraps after it), and the optimizer (its implementation).
std::string lightning_module_code(const ExportInput& in) {
  const sim::Plan& p = in.plan;
  std::ostringstream os;
  os << "\n\nclass LitModel(L.LightningModule):\n"
     << "    def __init__(self, model):\n"
     << "        super().__init__()\n"
     << "        self.model = model  # your " << in.model.name << " module\n";
  const std::string f8 = float8_conversion_code(p, "        ", "self.model");
  if (!f8.empty() || p.compile) {
    os << "\n    def configure_model(self):\n" << f8;
    if (p.compile)
      os << "        for block in self." << block_list_path(in.model) << ":  # torch.compile (inductor) of each block"
         << (p.activation_checkpointing.mode != AcMode::None ? " (checkpointed around it after this: AC(compile(block)))" : "")
         << "\n"
         << "            block.compile()\n";
  }
  os << "\n    def configure_optimizers(self):\n"
     << "        return " << optimizer_code(p, "self.parameters()") << "  # your learning rate\n\n";
  if (p.cpu_offload.params && p.grad_accum > 1)
    os << "# CPU offload with accumulate_grad_batches: the Trainer runs the micro-batches inside FSDP's no_sync(), which\n"
          "# FSDP1 needs - accumulating outside no_sync() with CPU offload gives wrong gradients (PyTorch FSDP docs).\n"
          "# In a Fabric loop, wrap every micro-batch but the last in `with fabric.no_backward_sync(model):`.\n";
  return os.str();
}

void ac_class_set_notes(const sim::Plan& p, const std::string& cls, std::vector<std::string>& unsupported) {
  auto m = p.activation_checkpointing.mode;
  if (m == AcMode::EveryK)
    unsupported.push_back("activation_checkpointing=" + sim::checkpointing_text(p.activation_checkpointing) +
                          ": activation_checkpointing_policy={" + cls +
                          "} checkpoints every block; emitted as full checkpointing (less memory, slower than planned)");
  if (m == AcMode::SelectiveOp)
    unsupported.push_back("activation_checkpointing=selective_op: FSDPStrategy has no op-level policy; emitted as full "
                          "checkpointing (less memory, slower than planned)");
}

}  // namespace

Export export_lightning(const ExportInput& in) {
  const sim::Plan& p = in.plan;
  Export e;
  e.format = "python";
  const std::string cls = block_class_name(in.model);
  const bool v1 = p.fsdp_version == sim::FsdpVersion::FSDP1;
  auto [precision, mp] = lightning_precision(p, e.unsupported);
  std::ostringstream os;
  if (v1) {
    e.target = "Lightning >= 2.6 (lightning.pytorch FSDPStrategy, FSDP1; device_mesh needs torch >= 2.2)";
    if (p.fp8_all_gather) e.unsupported.push_back("fp8_all_gather: FSDP1 cannot all-gather in float8");
    ac_class_set_notes(p, cls, e.unsupported);
    if (p.grad_accum > 1 && p.grad_sync)
      e.unsupported.push_back("grad_sync=true (reduce every micro-batch): the Trainer accumulates inside FSDP's no_sync(); "
                              "reducing every micro-batch needs a Fabric loop without no_backward_sync");
    bool hybrid = p.mesh_replicate > 1 && p.mesh_shard > 1;
    // FSDPStrategy's keywords as the plan-key table spells them for Lightning (program/plan_keys.cpp).
    const auto kw = [](const char* plan_key) { return "    " + sim::spelling(plan_key, sim::Framework::Lightning) + "="; };
    os << "# fsdpsim export: PyTorch Lightning, target " << e.target << "\n"
       << "# plan: " << in.label << "\n"
       << "import torch\n"
       << "import lightning as L\n"
       << "from lightning.pytorch.strategies import FSDPStrategy\n"
       << "from torch.distributed.fsdp import BackwardPrefetch" << (mp.empty() ? "" : ", MixedPrecision") << "\n"
       << optimizer_import(p)
       << (p.float8 != models::Float8Recipe::None ? "from torchao.float8 import Float8LinearConfig, convert_to_float8_training\n" : "")
       << block_import_line(in.model) << "\n\n"
       << "strategy = FSDPStrategy(\n"
       << kw("sharding_strategy") << "\"" << sim::strategy_name(p.sharding_strategy) << "\",\n";
    if (hybrid) os << "    device_mesh=(" << p.mesh_replicate << ", " << p.mesh_shard << "),  # (replicate, shard)\n";
    switch (p.auto_wrap_policy.kind) {
      case models::WrapPolicy::Kind::TransformerBlock: os << kw("auto_wrap_policy") << "{" << cls << "},\n"; break;
      case models::WrapPolicy::Kind::None: os << "    # auto_wrap_policy=None: the whole model is one FSDP unit\n"; break;
      case models::WrapPolicy::Kind::Size:
        os << kw("auto_wrap_policy") << "functools.partial(size_based_auto_wrap_policy, min_num_params="
           << p.auto_wrap_policy.min_num_params << "),\n";
        break;
      case models::WrapPolicy::Kind::Modules:
        os << kw("auto_wrap_policy") << "{" << cls << "},  # plan wraps modules by name; adapt\n";
        e.unsupported.push_back("auto_wrap_policy by module names: give Lightning a class set or a callable policy");
        break;
    }
    if (p.activation_checkpointing.mode != AcMode::None)
      os << kw("activation_checkpointing") << "{" << cls << "},\n";
    os << kw("cpu_offload") << py_bool(p.cpu_offload.params) << ",\n";
    if (!mp.empty()) os << "    mixed_precision=" << mp << ",\n";
    os << kw("backward_prefetch")
       << (p.backward_prefetch == sim::BackwardPrefetch::NONE ? std::string("None")
                                                               : "BackwardPrefetch." + sim::prefetch_name(p.backward_prefetch))
       << ",  # forwarded to FullyShardedDataParallel\n"
       << kw("forward_prefetch") << py_bool(p.forward_prefetch) << ",\n"
       << kw("limit_all_gathers") << py_bool(p.limit_all_gathers) << ",\n"
       << kw("use_orig_params") << py_bool(p.use_orig_params) << ",\n"
       << "    state_dict_type=\"sharded\",\n"
       << ")\n";
    os << lightning_module_code(in);
    if (p.auto_wrap_policy.kind == models::WrapPolicy::Kind::Size) {
      std::string t = os.str();
      std::string imp = "import functools\nfrom torch.distributed.fsdp.wrap import size_based_auto_wrap_policy\n";
      t.insert(t.find("import torch\n"), imp);
      os.str(t);
      os.seekp(0, std::ios_base::end);
    }
  } else {
    e.target = "Lightning >= 2.4 (lightning.pytorch ModelParallelStrategy + fully_shard in configure_model, FSDP2; torch >= 2.6)";
    if (p.mesh_replicate > 1)
      e.unsupported.push_back("mesh (" + std::to_string(p.mesh_replicate) + ", " + std::to_string(p.mesh_shard) +
                              "): ModelParallelStrategy has no replicate (HSDP) dimension (Lightning-AI/pytorch-lightning#21059); "
                              "this export shards over all " + std::to_string(p.mesh_replicate * p.mesh_shard) +
                              " GPUs - use the raw FSDP2 export for HSDP");
    std::ostringstream body;
    std::vector<std::string> notes;
    body << "        dp_mesh = self.device_mesh[\"data_parallel\"]\n"
         << fsdp2_sharding_code(in, "        ", "self.model", "dp_mesh", notes);
    for (auto& n : notes) e.unsupported.push_back(n);
    if (p.grad_accum > 1 && !p.grad_sync)
      e.unsupported.push_back("grad_sync=false (no_sync while accumulating): the Trainer reduces every micro-batch under "
                              "ModelParallelStrategy; call self.model.set_requires_gradient_sync(is_last) in a "
                              "manual-optimization loop");
    auto m = p.activation_checkpointing.mode;
    os << "# fsdpsim export: PyTorch Lightning, target " << e.target << "\n"
       << "# plan: " << in.label << "\n"
       << "import torch\n"
       << "import lightning as L\n"
       << "from lightning.pytorch.strategies import ModelParallelStrategy\n"
       << "from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard\n"
       << optimizer_import(p);
    if (m == AcMode::Full || m == AcMode::EveryK)
      os << "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper\n";
    if (p.fp8_all_gather || p.float8 != models::Float8Recipe::None)
      os << "from torchao.float8 import Float8LinearConfig, convert_to_float8_training\n";
    os << "\n\nclass LitModel(L.LightningModule):\n"
       << "    def __init__(self, model):\n"
       << "        super().__init__()\n"
       << "        self.model = model  # your " << in.model.name << " module\n\n"
       << "    def configure_model(self):\n"
       << body.str() << "\n"
       << "    def configure_optimizers(self):\n"
       << "        return " << optimizer_code(p, "self.parameters()") << "  # your learning rate\n\n\n"
       << "strategy = ModelParallelStrategy(data_parallel_size=" << p.mesh_replicate * p.mesh_shard
       << ", tensor_parallel_size=1)\n";
    precision = "";  // the dtypes are set by MixedPrecisionPolicy above
  }
  os << "trainer = L.Trainer(\n"
     << "    accelerator=\"cuda\",\n"
     << "    num_nodes=" << in.cluster.nodes << ",\n"
     << "    devices=" << in.cluster.gpus_per_node << ",\n"
     << "    strategy=strategy,\n";
  if (!precision.empty()) os << "    precision=\"" << precision << "\",\n";
  os << "    " << sim::spelling("grad_accum", sim::Framework::Lightning) << "=" << p.grad_accum << ",\n"
     << ")\n"
     << "# DataLoader(batch_size=" << p.micro_batch << "): the micro-batch per GPU, sequences of " << p.seq_len
     << " tokens\n";
  if (!alloc_conf_line(p).empty()) os << "# launch with " << alloc_conf_line(p) << " in the environment\n";
  if (p.lora.on() && p.lora.quantize_nf4)
    e.unsupported.push_back("lora.quantize_base nf4: Lightning's bitsandbytes precision under its FSDP strategies is not "
                            "modelled (the accelerate export spells bitsandbytes' QLoRA under FSDP1)");
  if (p.lora.on()) {
    // Lightning has no LoRA of its own: litgpt (on Lightning Fabric) has, and PEFT adapts a Hugging Face model
    os << "# LoRA (plan.lora): with litgpt (Lightning Fabric, FSDP1 use_orig_params): litgpt finetune lora "
       << litgpt_lora_flags(p.lora, e.unsupported) << "\n"
       << "# or in configure_model(), before sharding: from peft import LoraConfig, get_peft_model;\n"
       << "#   self.model = get_peft_model(self.model, " << peft_lora_config(in.model, p.lora, e.unsupported)
       << ")  # lora_alpha: yours\n";
    if (v1 && !p.use_orig_params)
      e.unsupported.push_back("lora with use_orig_params=False: adapters in a frozen block's FlatParameter are refused "
                              "by FSDP1; use use_orig_params=True or wrap the adapter linears apart");
  }
  for (const auto& u : e.unsupported) os << "# not expressible here: " << u << "\n";
  e.text = os.str();
  return e;
}

}  // namespace fsdpsim::planner
