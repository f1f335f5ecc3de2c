// torchtune recipe configs (`tune run <recipe> --config <file>.yaml`) for `fsdpsim diagnose`: the keys the
// distributed recipes read (recipes/full_finetune_distributed.py and lora_finetune_distributed.py, meta-pytorch/
// torchtune bd2a0fc7c; the same keys at 30b8519e, 2024-09). Facts from those recipes:
//  * FSDP2: training.shard_model calls fully_shard on each `layers.i` (and each module named in
//    custom_sharded_layers), then on the root; reshard_after_forward = fsdp_reshard_after_forward (default True);
//    fsdp_cpu_offload = CPUOffloadPolicy (params, gradients and the optimizer step on the CPU);
//  * pure `dtype` training (default bf16): the model is built in that dtype and no MixedPrecisionPolicy is set,
//    so parameters, all-gathers, gradients, reductions and the optimizer state share it;
//  * gradient_accumulation_steps: every micro-batch's backward reduce-scatters (no set_requires_gradient_sync);
//  * enable_activation_checkpointing wraps each TransformerSelfAttentionLayer (non-reentrant, early stop) after
//    compile_model compiled it in place: checkpoint(compile(layer)) when both are on (outside_compile);
//  * the training step deletes the logits (or never makes them: LinearCrossEntropyLoss) before backward;
//  * LoRA: only the adapters train (set_trainable_params(model, get_adapter_params(model))), so the root unit
//    (embedding, final norm, output) holds none unless apply_lora_to_output adapts the output.
// The model's own keys (lora_*, qlora_*) and the optimizer's _component_ are read from the text by the shared
// readers (read_lora, read_optimizer in planner/user_config.cpp).
#include <algorithm>
#include <regex>

#include "common/errors.h"
#include "planner/config_readers.h"
#include "planner/config_text.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {
namespace {

using namespace config_text;
using AcMode = sim::ActivationCheckpointing::Mode;

// Top-level keys the recipes read that change memory or time, and the ones that do not (not warned about).
const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> k = {
      "model", "tokenizer", "checkpointer", "dataset", "dataset_val", "seed", "shuffle", "batch_size", "batch_size_val",
      "optimizer", "lr_scheduler", "loss", "epochs", "max_steps_per_epoch", "gradient_accumulation_steps",
      "clip_grad_norm", "compile", "metric_logger", "log_every_n_steps", "log_peak_memory_stats", "log_level", "device",
      "dtype", "enable_activation_checkpointing", "enable_activation_offloading", "activation_offloading_use_streams",
      "custom_sharded_layers", "fsdp_cpu_offload", "fsdp_reshard_after_forward", "optimizer_in_bwd", "profiler",
      "output_dir", "resume_from_checkpoint", "save_adapter_weights_only", "run_val_every_n_steps", "save_every_n_steps",
      "tensor_parallel_dim", "tensor_parallel_plan", "data_parallel_shard_dim", "data_parallel_replicate_dim",
      "context_parallel_dim", "context_parallel_rotate_method", "cudnn_deterministic_mode", "quantizer",
      "ac_mode", "ac_option", "memory_efficient_fsdp_wrap", "low_cpu_ram", "collate_fn",
      "num_training_steps", "teacher_model", "teacher_checkpointer", "kd_loss", "kd_ratio", "fsdp_sharding_strategy",
      "datasets"};
  return k;
}

bool yaml_bool(const YAML::Node& n, const std::string& key) {
  return as_bool(key, unquote(yaml_text(n)));
}

std::int64_t yaml_int(const YAML::Node& n, const std::string& key, std::int64_t lo, std::int64_t hi) {
  return as_int(key, unquote(yaml_text(n)), lo, hi);
}

bool is_null(const YAML::Node& n) { return !n || n.IsNull() || sim::lower(unquote(yaml_text(n))) == "null"; }

// custom_sharded_layers: torchtune's module names (also under a fusion model's `decoder.`) -> the wrap policy's
// (program/plan.h WrapPolicy modules).
std::string unit_module(const std::string& torchtune_name) {
  const std::string leaf = last_component(torchtune_name);
  if (leaf == "tok_embeddings") return "embed_tokens";
  if (leaf == "output") return "lm_head";
  return "";
}

void read_loss(const YAML::Node& loss, UserConfig& cfg) {
  auto& p = cfg.plan;
  const std::string comp = loss && loss.IsMap() && loss["_component_"] ? unquote(yaml_text(loss["_component_"])) : "";
  if (comp.empty()) return;   // the recipe's default: torch.nn.CrossEntropyLoss-like on the whole logits
  const std::string cls = last_component(comp);
  if (cls == "CEWithChunkedOutputLoss") {
    p.cross_entropy = models::LossImpl::Chunked;
    p.cross_entropy_chunks = loss["num_output_chunks"]
                                 ? static_cast<int>(yaml_int(loss["num_output_chunks"], "loss.num_output_chunks", 1, 65536))
                                 : 8;
    cfg.facts.push_back("loss " + cls + ": the model's chunked output, cross_entropy chunked, " +
                        std::to_string(p.cross_entropy_chunks) + " chunks");
  } else if (cls == "LinearCrossEntropyLoss") {
    p.cross_entropy = models::LossImpl::FusedLinear;
    cfg.facts.push_back("loss " + cls + ": the output projection and the loss per chunk of tokens, no whole logits -> "
                        "cross_entropy fused_linear (approximate: modelled as a fused linear cross-entropy)");
  } else if (cls == "CrossEntropyLoss") {
    cfg.facts.push_back("loss " + cls + ": cross_entropy torch on the whole logits");
  } else {
    cfg.warnings.push_back("loss._component_ " + comp + " is not modelled: simulated as cross_entropy on the whole logits");
  }
}

void read_sequence(const YAML::Node& root, UserConfig& cfg) {
  const YAML::Node ds = root["dataset"], tok = root["tokenizer"];
  const bool packed = ds && ds.IsMap() && ds["packed"] && yaml_bool(ds["packed"], "dataset.packed");
  YAML::Node len;
  std::string where;
  for (const auto& [node, name] : {std::pair{ds, "dataset"}, std::pair{tok, "tokenizer"}})
    if (where.empty() && node && node.IsMap() && !is_null(node["max_seq_len"])) {
      len = node["max_seq_len"];
      where = std::string(name) + ".max_seq_len";
    }
  if (where.empty()) {
    if (packed) throw InputError("dataset.packed", "True", "packing needs tokenizer.max_seq_len (the packed length)");
    return;   // unbounded samples: the sequence length is not in the config
  }
  cfg.plan.seq_len = yaml_int(len, where, 1, 4194304);
  cfg.seq_len_given = true;
  cfg.facts.push_back(where + " " + std::to_string(cfg.plan.seq_len) +
                      (packed ? ": every packed sequence has that length"
                              : ": samples are padded to the longest in the batch, at most that (an upper bound)"));
}

}  // namespace

void read_torchtune(const YAML::Node& root, const std::string& text, const models::ModelSpec& model, UserConfig& cfg) {
  (void)model;
  auto& p = cfg.plan;
  // The recipe the config's own comment launches (`tune run [--nproc_per_node N] <recipe> --config ...`).
  std::smatch run;
  if (std::regex_search(text, run, std::regex(R"(tune\s+run\s+(?:--nproc_per_node\s+\S+\s+)?(\S+))")) &&
      run[1].str().find("single_device") != std::string::npos)
    cfg.warnings.push_back("this config is for " + run[1].str() + ", which trains on one GPU without FSDP: diagnosed as "
                           "if run with the matching distributed recipe");
  if (root["quantizer"] && !is_null(root["quantizer"]))
    cfg.warnings.push_back("quantizer: quantization-aware training's fake-quantization ops are not modelled (the "
                           "prediction leaves out their activations and time)");
  p.fsdp_version = sim::FsdpVersion::FSDP2;
  p.implementation = models::ModelImpl::HF;
  p.loss_in_model_forward = false;   // `logits = self._model(**batch)`, then `self._loss_fn(logits, labels)`
  cfg.facts.push_back("torchtune distributed recipe: FSDP2 fully_shard on each layers.i and the root; its modules "
                      "compute like Hugging Face's (implementation hf)");
  // dtype: pure training in one dtype
  const std::string dtype = root["dtype"] ? sim::lower(unquote(yaml_text(root["dtype"]))) : "bf16";
  if (dtype == "bf16" || dtype == "bfloat16") {
    p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::BF16;
  } else if (dtype == "fp32" || dtype == "float32") {
    p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::FP32;
  } else {
    throw InputError("dtype", dtype, "bf16 or fp32 (the dtypes torchtune's recipes train in)");
  }
  cfg.precision = dtype;
  cfg.facts.push_back("dtype " + dtype + ": parameters, gradients, reductions and optimizer state all in " +
                      std::string(dtype_name(p.param_dtype)) + " (no MixedPrecisionPolicy)");
  if (root["batch_size"]) {
    p.micro_batch = yaml_int(root["batch_size"], "batch_size", 1, 65536);
    cfg.micro_batch_given = true;
  }
  if (root["gradient_accumulation_steps"])
    p.grad_accum = static_cast<int>(yaml_int(root["gradient_accumulation_steps"], "gradient_accumulation_steps", 1, 65536));
  p.grad_sync = true;
  if (p.grad_accum > 1)
    cfg.facts.push_back("gradient_accumulation_steps " + std::to_string(p.grad_accum) +
                        ": the recipes reduce-scatter every micro-batch's gradients (grad_sync true)");
  read_sequence(root, cfg);
  if (root["fsdp_cpu_offload"] && yaml_bool(root["fsdp_cpu_offload"], "fsdp_cpu_offload")) {
    p.cpu_offload.params = p.cpu_offload.optimizer = true;
    cfg.facts.push_back("fsdp_cpu_offload: CPUOffloadPolicy (parameters, gradients and the optimizer step on the CPU)");
  }
  if (root["fsdp_reshard_after_forward"])
    p.reshard_after_forward =
        sim::ReshardAfterForward::of(yaml_bool(root["fsdp_reshard_after_forward"], "fsdp_reshard_after_forward"));
  // the mesh: data_parallel_replicate_dim (default 1) x data_parallel_shard_dim (default -1: the rest)
  const std::int64_t replicate = root["data_parallel_replicate_dim"]
                                     ? yaml_int(root["data_parallel_replicate_dim"], "data_parallel_replicate_dim", 1, 1 << 20)
                                     : 1;
  const std::int64_t shard = root["data_parallel_shard_dim"] && !is_null(root["data_parallel_shard_dim"])
                                 ? yaml_int(root["data_parallel_shard_dim"], "data_parallel_shard_dim", -1, 1 << 20)
                                 : -1;
  if (shard == 0) throw InputError("data_parallel_shard_dim", "0", "-1 (the GPUs left) or a positive size");
  if (replicate > 1 && shard > 0) {
    p.mesh_replicate = static_cast<int>(replicate);
    p.mesh_shard = static_cast<int>(shard);
    cfg.facts.push_back("data_parallel_replicate_dim x data_parallel_shard_dim: mesh (" + std::to_string(replicate) +
                        ", " + std::to_string(shard) + "), HSDP");
  } else if (replicate > 1) {
    cfg.warnings.push_back("data_parallel_replicate_dim " + std::to_string(replicate) +
                           " with data_parallel_shard_dim -1: the shard size depends on the GPU count; give "
                           "data_parallel_shard_dim (simulated with one replica)");
  } else if (shard > 0) {
    p.mesh_replicate = 1;
    p.mesh_shard = static_cast<int>(shard);
  }
  for (const char* k : {"tensor_parallel_dim", "context_parallel_dim"})
    if (root[k] && yaml_int(root[k], k, 1, 1 << 20) > 1)
      cfg.warnings.push_back(std::string(k) + " > 1: tensor and context parallelism are not modelled (data parallel only)");
  // wrapping: each layer, plus the custom sharded layers
  p.auto_wrap_policy.kind = models::WrapPolicy::Kind::TransformerBlock;
  cfg.wrap_policy_given = true;
  if (const YAML::Node c = root["custom_sharded_layers"]; c && !is_null(c)) {
    if (!c.IsSequence()) throw InputError("custom_sharded_layers", yaml_text(c), "a list of module names");
    std::vector<std::string> modules = {"layers.*"};
    for (const auto& n : c) {
      const std::string name = unquote(yaml_text(n)), ours = unit_module(name);
      if (ours.empty())
        cfg.warnings.push_back("custom_sharded_layers: " + name + " is not modelled as a unit of its own (known: "
                               "tok_embeddings, output)");
      else if (std::find(modules.begin(), modules.end(), ours) == modules.end())
        modules.push_back(ours);
    }
    if (modules.size() > 1) {
      p.auto_wrap_policy.kind = models::WrapPolicy::Kind::Modules;
      p.auto_wrap_policy.modules = modules;
      cfg.facts.push_back("custom_sharded_layers: each named module is an FSDP unit of its own besides the layers");
    }
  }
  const bool ac = root["enable_activation_checkpointing"] &&
                  yaml_bool(root["enable_activation_checkpointing"], "enable_activation_checkpointing");
  if (ac) p.activation_checkpointing.mode = AcMode::Full;
  if (const YAML::Node c = root["compile"]; c && !is_null(c)) {
    // a bool, or (later recipes) a mapping whose `model` entry compiles the layers
    p.compile = c.IsMap() ? !c["model"] || yaml_bool(c["model"], "compile.model") : yaml_bool(c, "compile");
  }
  if (p.compile)
    cfg.facts.push_back("compile: training.compile_model compiles each TransformerSelfAttentionLayer (compile true)");
  cfg.checkpoint_wraps_compiled = true;
  if (p.compile && ac) {
    p.activation_checkpointing.outside_compile = true;
    cfg.facts.push_back("compile_model runs before set_activation_checkpointing: each checkpoint wraps a compiled "
                        "layer, checkpoint(compile(layer)) (activation_checkpointing.outside_compile)");
  }
  if (root["enable_activation_offloading"] &&
      yaml_bool(root["enable_activation_offloading"], "enable_activation_offloading")) {
    // training.get_act_offloading_ctx_manager: OffloadActivations(use_streams=activation_offloading_use_streams,
    // default True) around the model's forward.
    const bool streams = !root["activation_offloading_use_streams"] ||
                         yaml_bool(root["activation_offloading_use_streams"], "activation_offloading_use_streams");
    p.activation_offloading = streams ? sim::ActivationOffload::Streams : sim::ActivationOffload::Sync;
    cfg.facts.push_back(std::string("enable_activation_offloading: OffloadActivations around the model's forward moves ") +
                        (ac ? "each checkpointed layer's input" : "every tensor the layers save (no checkpointing)") +
                        " to pinned CPU memory (activation_offloading " +
                        sim::activation_offload_name(p.activation_offloading) + ")");
  }
  if (root["optimizer_in_bwd"] && yaml_bool(root["optimizer_in_bwd"], "optimizer_in_bwd"))
    cfg.warnings.push_back("optimizer_in_bwd: the optimizer steps each parameter in its backward hook and frees its "
                           "gradient; not modelled: simulated with the step after the backward");
  read_loss(root["loss"], cfg);
  p.free_logits_before_backward = true;
  cfg.facts.push_back("the recipe deletes the logits before backward (free_logits_before_backward)");
  for (const auto& it : root) {
    const std::string k = it.first.as<std::string>();
    if (std::find(known_keys().begin(), known_keys().end(), k) != known_keys().end()) continue;
    const std::string near = closest_key(k, known_keys());
    if (!near.empty())
      cfg.warnings.push_back(k + " is not a key torchtune's recipes read (did you mean " + near + "?)");
  }
}

}  // namespace fsdpsim::planner
