// Plan parsing, printing and resolution against a cluster shape.
//
// Plan keys (JSON; PyTorch's names). Every key is optional; an unknown key is an InputError "plan.<key>".
// How each key is read, printed, checked against the FSDP version and spelled elsewhere: its descriptor
// in the table of program/plan_keys.cpp, in this order.
//
// | key                      | values                                                      | default            |
// |--------------------------|-------------------------------------------------------------|--------------------|
// | fsdp_version             | 1 (FullyShardedDataParallel) or 2 (fully_shard)             | 2                  |
// | mesh                     | {"replicate": R, "shard": S} or [R, S]; R*S = GPUs          | derived (below)    |
// | sharding_strategy        | FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD,          | FULL_SHARD (FSDP2: |
// |                          | _HYBRID_SHARD_ZERO2 (FSDP2: mapped onto rAF + mesh, F2.12)  | from rAF + mesh)   |
// | reshard_after_forward    | true, false, or an int k (FSDP2 only; 1 < k < shard, k | S) | true               |
// | backward_prefetch        | BACKWARD_PRE, BACKWARD_POST (FSDP1 only), NONE, null = NONE | BACKWARD_PRE       |
// | forward_prefetch         | true/false (FSDP1 P3; FSDP2 = explicit forward prefetch P6) | false              |
// | limit_all_gathers        | true/false (FSDP1 rate limiter, P4; ignored by FSDP2)       | true               |
// | prefetch_depth           | 1..16 modules prefetched ahead (>1: FSDP2 explicit, P6)     | 1                  |
// | activation_checkpointing | "none", "full", "selective_op", "every_<k>", or             | "none"             |
// |                          | {"mode": ..., "every_k": k, "outside_fsdp": bool,           |                    |
// |                          |  "outside_compile": bool (checkpoint(compile(block)))}      |                    |
// | activation_offloading    | "none", "streams", "sync": torchtune's OffloadActivations    | "none"             |
// |                          | (use_streams true / false); needs full checkpointing        |                    |
// | param_dtype              | fp32, bf16, fp16                                            | bf16               |
// | reduce_dtype             | fp32, bf16, fp16                                            | fp32               |
// | master_weights_dtype     | fp32, bf16, fp16 (at least as wide as param_dtype)          | fp32               |
// | micro_batch              | sequences per rank per micro-batch, 1..65536                | 1                  |
// | seq_len                  | tokens per sequence, 1..4194304                             | 2048               |
// | grad_accum               | micro-batches per optimizer step, 1..65536                  | 1                  |
// | grad_sync                | true: reduce every micro-batch; false: no_sync until last   | false              |
// | cpu_offload              | true/false (= params) or {"params": bool, "optimizer": bool}| false              |
// | fp8_all_gather           | true/false (FSDP2 + torchao float8, param_dtype bf16, D4)   | false              |
// | trainable_fraction       | (0, 1]: that share trains as whole block matrices (D5, M13) | 1                  |
// | optimizer                | "adamw" (2 states), "sgd" (momentum, 1 state), or a low-bit | "adamw"            |
// |                          | or paged AdamW: "bnb_adamw8bit", "bnb_paged_adamw",         |                    |
// |                          | "bnb_paged_adamw8bit" (bitsandbytes, FSDP1),                |                    |
// |                          | "torchao_adamw8bit", "torchao_adamw4bit"                    |                    |
// |                          | (program/optimizer_state.h)                                 |                    |
// | auto_wrap_policy         | "transformer_block", "none", {"min_num_params": N},         | "transformer_block"|
// |                          | {"modules": ["layers.*", ...]}                              |                    |
// | use_orig_params          | true/false (FSDP1 only: alignment padding, M1; M13)         | true               |
// | cross_entropy            | "torch" (F.cross_entropy), "fused" (flash-attn's fused CE), | "torch"            |
// |                          | "fused_linear" (Liger's fused linear CE: no full logits),   |                    |
// |                          | "chunked" (torchtune's CEWithChunkedOutputLoss + chunked    |                    |
// |                          | output projection)                                          |                    |
// | cross_entropy_chunks     | 1..65536: num_output_chunks of "chunked" (only with it)     | 8 (torchtune's)    |
// | implementation           | "torchtitan", "hf", "litgpt", "fused", "runtime" (fsdpsim's | "hf"               |
// |                          | own runtime): whose block code runs (what autograd saves)   |                    |
// | compile                  | true/false: torch.compile (inductor) of each block          | false              |
// | float8                   | "none", "tensorwise", "rowwise" (torchao Float8Linear)      | "none"             |
// | alloc_conf               | PYTORCH_CUDA_ALLOC_CONF text: expandable_segments:True,     | ""                 |
// |                          | max_split_size_mb:N                                         |                    |
// | free_logits_before_backward | true/false: the loop frees the logits before backward()  | torchtitan: true,  |
// |                          | (torchtitan `del pred`)                                     | else false         |
// | loss_in_model_forward    | true/false: the model's forward computes the loss (HF with  | hf: true (not with |
// |                          | labels), inside whatever wraps the forward                  | chunked), else false|
// | optimizer_impl           | "foreach" (torch.optim's default) or "fused"                | "foreach"          |
// | module_overrides         | {"<unit name>" or "last_block": {"reshard_after_forward": b}}| {}                 |
// | frozen_units             | ["<unit name>", "root", ...]: units with no trainable param | []                 |
// |                          | (no grad, no optimizer state); needs trainable_fraction < 1 |                    |
// |                          | or lora                                                     |                    |
// | lora                     | {"rank": r, "targets": ["q","v",...], "dropout": p}: LoRA   | none               |
// |                          | adapters in every block, base weights frozen; targets from  |                    |
// |                          | q, k, v, o, gate, up, down, mlp (= gate, up, down), head;   |                    |
// |                          | rank 1..65536, dropout [0, 1) (default 0); not with         |                    |
// |                          | trainable_fraction < 1                                      |                    |
//
// Mesh defaults (resolve_plan): FSDP1 FULL_SHARD/SHARD_GRAD_OP -> (1, world); NO_SHARD -> (world, 1);
// HYBRID_SHARD/_HYBRID_SHARD_ZERO2 -> (world / gpus_per_node, gpus_per_node) (F1.15). FSDP2 -> (1, world),
// or the same as FSDP1 when sharding_strategy names a hybrid or NO_SHARD strategy.
#include "program/plan.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/errors.h"
#include "common/json_reader.h"
#include "program/plan_keys.h"

namespace fsdpsim::sim {
namespace {

constexpr std::int64_t kMaxMesh = 1 << 20;          // far above any cluster; guards overflow

bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::HYBRID_SHARD || s == ShardingStrategy::_HYBRID_SHARD_ZERO2;
}

std::string mesh_text(int r, int s) { return "(" + std::to_string(r) + ", " + std::to_string(s) + ")"; }

}  // namespace

LoraPlan parse_lora(const Json& v, const std::string& field) {
  const char* expected =
      "expected {\"rank\": r, \"targets\": [\"q\", \"v\", ...], \"dropout\": p, \"quantize_base\": \"nf4\" | \"none\"}";
  if (!v.is_object()) throw InputError(field, json_value_for_message(v), expected);
  JsonReader r(v, field);
  r.check_no_unknown_keys({"rank", "targets", "dropout", "quantize_base"});
  LoraPlan l;
  if (!r.has("rank")) throw InputError(field + ".rank", "<missing>", "the adapters' rank, an integer >= 1");
  l.rank = r.get_int("rank", 1, 65536);
  l.dropout = r.get_double("dropout", 0.0, 1.0, 0.0);
  if (l.dropout >= 1.0)
    throw InputError(field + ".dropout", json_value_for_message(r.raw("dropout")),
                     "expected a probability in [0, 1) (1 drops the whole adapter input)");
  if (!r.has("targets")) throw InputError(field + ".targets", "<missing>", "expected a non-empty array of target names");
  const Json& t = r.raw("targets");
  std::string names;
  for (const std::string& n : lora_target_names()) names += (names.empty() ? "" : ", ") + n;
  const std::string what = "expected a non-empty array of targets from: " + names + ", mlp (= gate, up, down)";
  if (!t.is_array() || t.empty()) throw InputError(field + ".targets", json_value_for_message(t), what);
  std::vector<bool> on(lora_target_names().size(), false);
  for (const auto& e : t) {
    const std::string n = e.is_string() ? e.get<std::string>() : "";
    const auto& tn = lora_target_names();
    const auto it = std::find(tn.begin(), tn.end(), n);
    if (n == "mlp") {
      for (const char* x : {"gate", "up", "down"})
        on[static_cast<std::size_t>(std::find(tn.begin(), tn.end(), x) - tn.begin())] = true;
    } else if (it != tn.end()) {
      on[static_cast<std::size_t>(it - tn.begin())] = true;
    } else {
      throw InputError(field + ".targets", json_value_for_message(e), "unknown LoRA target; " + what);
    }
  }
  for (std::size_t i = 0; i < on.size(); ++i)
    if (on[i]) l.targets.push_back(lora_target_names()[i]);
  if (r.has("quantize_base")) {
    const Json& q = r.raw("quantize_base");
    const std::string s = q.is_string() ? q.get<std::string>() : "";
    if (s != "nf4" && s != "none")
      throw InputError(field + ".quantize_base", json_value_for_message(q),
                       "expected \"nf4\" (QLoRA: 4-bit NormalFloat base weights) or \"none\"");
    l.quantize_nf4 = s == "nf4";
  }
  return l;
}

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q", "k", "v", "o", "gate", "up", "down", "head"};
  return names;
}

AllocConf parse_alloc_conf(const std::string& text, const std::string& field) {
  // c10/cuda/CUDAAllocatorConfig.cpp parseArgs: comma-separated key:value pairs; an unknown key is an error
  // there too. Options PyTorch has that this model does not follow are refused rather than ignored.
  AllocConf a;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    auto trim = [](std::string x) {
      const auto b = x.find_first_not_of(" \t");
      const auto e = x.find_last_not_of(" \t");
      return b == std::string::npos ? std::string() : x.substr(b, e - b + 1);
    };
    item = trim(item);
    if (item.empty()) {
      if (end == text.size()) break;
      continue;
    }
    const std::size_t colon = item.find(':');
    const std::string key = trim(item.substr(0, colon));
    const std::string value = colon == std::string::npos ? "" : trim(item.substr(colon + 1));
    if (key == "expandable_segments") {
      if (value == "True" || value == "true") a.expandable_segments = true;
      else if (value == "False" || value == "false") a.expandable_segments = false;
      else throw InputError(field, "\"" + item + "\"", "expandable_segments takes True or False");
    } else if (key == "max_split_size_mb") {
      bool ok = !value.empty() && value.size() <= 9;
      for (char c : value) ok = ok && c >= '0' && c <= '9';
      const long long mb = ok ? std::stoll(value) : -1;
      // PyTorch: "CachingAllocator option max_split_size_mb too small, must be > " kLargeBuffer (20 MiB)
      if (mb <= 20)
        throw InputError(field, "\"" + item + "\"", "max_split_size_mb takes an integer number of MiB > 20");
      a.max_split_size = static_cast<Bytes>(mb) * kMiB;
    } else if (key == "garbage_collection_threshold" || key == "roundup_power2_divisions" ||
               key == "max_non_split_rounding_mb" || key == "release_lock_on_cudamalloc" ||
               key == "pinned_use_cuda_host_register" || key == "pinned_num_register_threads" || key == "backend" ||
               key == "pinned_use_background_threads") {
      throw InputError(field, "\"" + item + "\"",
                       "a valid PyTorch option that fsdpsim's allocator model does not follow; it models "
                       "expandable_segments and max_split_size_mb (remove the option to simulate without it)");
    } else {
      throw InputError(field, "\"" + item + "\"",
                       "unknown allocator option; expected expandable_segments:True|False or max_split_size_mb:N");
    }
  }
  return a;
}

std::string alloc_conf_text(const AllocConf& a) {
  std::string s;
  if (a.expandable_segments) s = "expandable_segments:True";
  if (a.max_split_size > 0)
    s += (s.empty() ? "" : ",") + std::string("max_split_size_mb:") + std::to_string(a.max_split_size / kMiB);
  return s;
}

Plan parse_plan(const Json& j) {
  JsonReader r(j, "plan");
  r.check_no_unknown_keys(plan_key_names());
  Plan p;
  for (const PlanKey& k : plan_keys()) {
    if (!r.has(k.name)) {
      // PyTorch's backward_prefetch=None; any other null key is its default.
      if (k.name == "backward_prefetch" && j.contains(k.name)) p.backward_prefetch = BackwardPrefetch::NONE;
      continue;
    }
    k.read(r, p);
    const bool other_version = (k.versions == KeyVersions::Fsdp1Only && p.fsdp_version != FsdpVersion::FSDP1) ||
                               (k.versions == KeyVersions::Fsdp2Only && p.fsdp_version != FsdpVersion::FSDP2);
    if (k.given_refused && other_version) throw InputError(r.field(k.name), json_value_for_message(r.raw(k.name)), k.version_error);
  }
  return p;
}

Plan load_plan(const std::string& file_or_inline, const std::string& field) {
  std::size_t first = file_or_inline.find_first_not_of(" \t\r\n");
  Json j = (first != std::string::npos && file_or_inline[first] == '{')
               ? parse_json_text(file_or_inline, field)
               : read_json_file(file_or_inline, field);
  return parse_plan(j);
}

std::string strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD: return "HYBRID_SHARD";
    case ShardingStrategy::_HYBRID_SHARD_ZERO2: return "_HYBRID_SHARD_ZERO2";
  }
  return "FULL_SHARD";
}

std::string prefetch_name(BackwardPrefetch b) {
  switch (b) {
    case BackwardPrefetch::BACKWARD_PRE: return "BACKWARD_PRE";
    case BackwardPrefetch::BACKWARD_POST: return "BACKWARD_POST";
    case BackwardPrefetch::NONE: return "NONE";
  }
  return "NONE";
}

std::string activation_offload_name(ActivationOffload o) {
  switch (o) {
    case ActivationOffload::None: return "none";
    case ActivationOffload::Streams: return "streams";
    case ActivationOffload::Sync: return "sync";
  }
  return "none";
}

std::string checkpointing_name(const ActivationCheckpointing& ac) {
  switch (ac.mode) {
    case ActivationCheckpointing::Mode::None: return "none";
    case ActivationCheckpointing::Mode::Full: return "full";
    case ActivationCheckpointing::Mode::SelectiveOp: return "selective_op";
    case ActivationCheckpointing::Mode::EveryK: return "every_" + std::to_string(ac.every_k);
  }
  return "none";
}

Json plan_to_json(const Plan& p) {
  Json j = Json::object();
  for (const PlanKey& k : plan_keys()) k.write(p, j);
  return j;
}

ShardingStrategy effective_strategy(const Plan& p) {
  if (p.fsdp_version == FsdpVersion::FSDP1) return p.sharding_strategy;
  // F2.12: FSDP2 has no strategy enum; a 1-wide shard dim is NO_SHARD (DDP-like), a 2-D mesh is HSDP,
  // and reshard_after_forward=False is the ZeRO-2 variant. An int rAF (hpZ) still reshards after forward.
  if (p.mesh_shard == 1) return ShardingStrategy::NO_SHARD;
  bool zero2 = p.reshard_after_forward.keeps();
  if (p.mesh_replicate > 1) return zero2 ? ShardingStrategy::_HYBRID_SHARD_ZERO2 : ShardingStrategy::HYBRID_SHARD;
  if (p.mesh_shard == 0 && (p.sharding_strategy == ShardingStrategy::NO_SHARD || is_hybrid(p.sharding_strategy)))
    return p.sharding_strategy;   // unresolved plan: the user's name
  return zero2 ? ShardingStrategy::SHARD_GRAD_OP : ShardingStrategy::FULL_SHARD;
}

Plan resolve_plan(const Plan& in, int gpus, int gpus_per_node) {
  if (gpus < 1 || gpus > kMaxMesh) throw InputError("cluster.gpus", std::to_string(gpus), "expected at least 1 GPU");
  if (gpus_per_node < 1)
    throw InputError("cluster.gpus_per_node", std::to_string(gpus_per_node), "expected at least 1");
  Plan p = in;
  const bool fsdp1 = p.fsdp_version == FsdpVersion::FSDP1;
  const std::string world = std::to_string(gpus) + " GPUs";
  const ShardingStrategy named = p.sharding_strategy;

  // ---- the mesh ----
  if (p.mesh_replicate == 0 || p.mesh_shard == 0) {
    if (named == ShardingStrategy::NO_SHARD) {
      p.mesh_replicate = gpus;
      p.mesh_shard = 1;
    } else if (is_hybrid(named)) {
      // F1.15: shard = intra-node, replicate = across nodes.
      int gpn = std::min(gpus_per_node, gpus);
      if (gpus % gpn != 0)
        throw InputError("plan.mesh", "<derived>",
                         "HYBRID_SHARD needs the GPU count (" + world + ") to be a multiple of gpus_per_node (" +
                             std::to_string(gpus_per_node) + "); give the mesh explicitly");
      p.mesh_replicate = gpus / gpn;
      p.mesh_shard = gpn;
    } else {
      p.mesh_replicate = 1;
      p.mesh_shard = gpus;
    }
  }
  if (static_cast<std::int64_t>(p.mesh_replicate) * p.mesh_shard != gpus)
    throw InputError("plan.mesh", mesh_text(p.mesh_replicate, p.mesh_shard), "replicate x shard must equal " + world);

  // ---- strategy / mesh consistency ----
  if (fsdp1) {
    const std::string m = mesh_text(p.mesh_replicate, p.mesh_shard);
    switch (named) {
      case ShardingStrategy::FULL_SHARD:
      case ShardingStrategy::SHARD_GRAD_OP:
        if (p.mesh_replicate > 1)
          throw InputError("plan.mesh", m, strategy_name(named) + " shards over all GPUs (replicate must be 1); "
                                               "use HYBRID_SHARD or _HYBRID_SHARD_ZERO2 for a 2-D mesh");
        break;
      case ShardingStrategy::NO_SHARD:
        if (p.mesh_shard > 1) throw InputError("plan.mesh", m, "NO_SHARD replicates on every GPU: the mesh must be (" + std::to_string(gpus) + ", 1)");
        break;
      default:
        // pytorch#154888: a hybrid strategy with a 1-wide shard dim silently becomes NO_SHARD.
        if (p.mesh_shard == 1 && gpus > 1)
          throw InputError("plan.mesh", m, strategy_name(named) + " needs shard > 1 (PyTorch falls back to NO_SHARD "
                                               "and never syncs replicas, pytorch#154888); use NO_SHARD");
        break;
    }
  } else {
    // FSDP2 derives the strategy from (rAF, mesh) (F2.12). FULL_SHARD is also the default, so only the
    // other names are checked against the mesh.
    const std::string m = mesh_text(p.mesh_replicate, p.mesh_shard);
    if (named == ShardingStrategy::NO_SHARD && p.mesh_shard > 1)
      throw InputError("plan.mesh", m, "NO_SHARD is a 1-wide shard dim: the mesh must be (" + std::to_string(gpus) + ", 1)");
    if (named == ShardingStrategy::SHARD_GRAD_OP && p.mesh_replicate > 1)
      throw InputError("plan.mesh", m, "SHARD_GRAD_OP shards over all GPUs (replicate must be 1); "
                                       "use _HYBRID_SHARD_ZERO2 for a 2-D mesh");
    if (is_hybrid(named) && p.mesh_shard == 1 && gpus > 1)
      throw InputError("plan.mesh", m, strategy_name(named) + " needs shard > 1; a 1-wide shard dim is NO_SHARD");
    if (p.reshard_after_forward.is_group()) {
      const int k = p.reshard_after_forward.group_size();
      if (k >= p.mesh_shard || p.mesh_shard % k != 0)
        throw InputError("plan.reshard_after_forward", std::to_string(k),
                         "an int must divide the shard size " + std::to_string(p.mesh_shard) +
                             " and lie strictly between 1 and it (F2.4)");
    }
    p.sharding_strategy = effective_strategy(p);
  }

  // ---- feature / version consistency ----
  check_versions(p);   // the table's one-version keys (program/plan_keys.cpp)
  if (dtype_bytes(p.master_weights_dtype) < dtype_bytes(p.param_dtype) ||
      (dtype_bytes(p.master_weights_dtype) == dtype_bytes(p.param_dtype) && p.master_weights_dtype != p.param_dtype))
    throw InputError("plan.master_weights_dtype", std::string(dtype_name(p.master_weights_dtype)),
                     "must be param_dtype (" + std::string(dtype_name(p.param_dtype)) + ") or wider (fp32)");
  if (fsdp1 && p.cpu_offload.params && p.grad_accum > 1 && p.grad_sync)
    throw InputError("plan.cpu_offload", "true",
                     "FSDP1 CPU offload does not support gradient accumulation outside no_sync (M11); set grad_sync false");
  if (p.activation_checkpointing.outside_fsdp && p.activation_checkpointing.mode == ActivationCheckpointing::Mode::SelectiveOp)
    throw InputError("plan.activation_checkpointing.outside_fsdp", "true",
                     "checkpoint(FSDP(block)) is whole-block (reentrant) checkpointing: mode full or every_k");
  if (p.activation_checkpointing.outside_fsdp && p.activation_checkpointing.mode == ActivationCheckpointing::Mode::None)
    throw InputError("plan.activation_checkpointing.outside_fsdp", "true", "needs a checkpointing mode (full or every_k)");
  if (p.activation_checkpointing.outside_compile) {
    // An eager checkpoint around a compiled block: modelled for whole-block checkpointing only (an eager
    // op-level SAC policy does not see the ops inside inductor's kernels: unmodelled, unmeasured).
    const std::string f = "plan.activation_checkpointing.outside_compile";
    if (!p.compile) throw InputError(f, "true", "needs compile true (it orders the checkpoint and torch.compile)");
    if (p.activation_checkpointing.mode == ActivationCheckpointing::Mode::None)
      throw InputError(f, "true", "needs a checkpointing mode (full or every_k)");
    if (p.activation_checkpointing.mode == ActivationCheckpointing::Mode::SelectiveOp)
      throw InputError(f, "true", "modelled for whole-block checkpointing (mode full or every_k), not selective_op");
  }
  if (p.activation_offloading != ActivationOffload::None) {
    // torchtune's OffloadActivations (program/lower_walk.cpp "activation offloading"): a checkpointed block's
    // saved tensors are its checkpoint's inputs, a block without checkpointing packs every tensor it saves.
    const std::string f = "plan.activation_offloading";
    const std::string v = "\"" + activation_offload_name(p.activation_offloading) + "\"";
    const auto& ac = p.activation_checkpointing;
    if (ac.outside_fsdp)
      throw InputError(f, v, "modelled for FSDP(checkpoint(block)), not checkpoint(FSDP(block)) (outside_fsdp)");
    if (p.implementation == models::ModelImpl::Runtime)
      throw InputError(f, v, "fsdpsim's own runtime does not offload activations (use implementation hf, litgpt, "
                             "fused or torchtitan)");
  }
  // torchao: the float8 all-gather is an option of Float8Linear (Float8LinearConfig
  // enable_fsdp_float8_all_gather), supported with tensorwise scaling only; an fp8 all-gather thus implies
  // float8 compute with tensorwise scaling.
  if (p.fp8_all_gather && p.float8 == models::Float8Recipe::Rowwise)
    throw InputError("plan.fp8_all_gather", "true", "torchao's float8 all-gather needs float8 \"tensorwise\" scaling");
  if (p.fp8_all_gather && p.float8 == models::Float8Recipe::None) p.float8 = models::Float8Recipe::Tensorwise;
  if (p.float8 != models::Float8Recipe::None && p.param_dtype != Dtype::BF16)
    throw InputError("plan.float8", "\"" + models::float8_recipe_name(p.float8) + "\"",
                     "torchao float8 training needs param_dtype bf16 (the high-precision dtype of Float8Linear)");
  if (!p.free_logits_before_backward)
    p.free_logits_before_backward = p.implementation == models::ModelImpl::TorchTitan;
  if (p.loss_in_model_forward.value_or(false) && p.cross_entropy == models::LossImpl::Chunked)
    throw InputError("plan.loss_in_model_forward", "true",
                     "cross_entropy \"chunked\" is torchtune's chunked output, whose loss the recipe computes on the "
                     "model's output (false)");
  if (!p.frozen_units.empty() && p.trainable_fraction >= 1.0 && !p.lora.on())
    throw InputError("plan.frozen_units", "[\"" + p.frozen_units.front() + "\", ...]",
                     "frozen units need trainable_fraction < 1 (the fraction of the whole model that trains) or lora");
  if (p.lora.on() && p.implementation == models::ModelImpl::Runtime)
    throw InputError("plan.lora", "{\"rank\": " + std::to_string(p.lora.rank) + ", ...}",
                     "fsdpsim's own runtime has no LoRA adapters (use implementation hf, litgpt, fused or torchtitan)");
  if (p.lora.on() && p.trainable_fraction < 1.0)
    throw InputError("plan.trainable_fraction", std::to_string(p.trainable_fraction),
                     "give either lora (the adapters train, nothing else) or trainable_fraction < 1, not both");
  if (p.micro_batch * p.seq_len > (std::int64_t{1} << 31))
    throw InputError("plan.micro_batch", std::to_string(p.micro_batch),
                     "micro_batch x seq_len must stay below 2^31 tokens per micro-batch");
  return p;
}

}  // namespace fsdpsim::sim
