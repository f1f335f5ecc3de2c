// Plan parsing, printing and resolution against a cluster shape.
//
// Plan keys (JSON; PyTorch's names). Every key is optional; an unknown key is an InputError "plan.<key>".
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
// |                          | {"mode": ..., "every_k": k, "outside_fsdp": bool}           |                    |
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
// | optimizer                | "adamw" (2 states) or "sgd" (momentum, 1 state)             | "adamw"            |
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
#include "sim/plan.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/errors.h"
#include "common/json_reader.h"

namespace fsdpsim::sim {
namespace {

constexpr std::int64_t kMaxMesh = 1 << 20;          // far above any cluster; guards overflow
constexpr int kMaxPrefetchDepth = 16;                // P6: deeper prefetch only adds memory

const std::vector<std::string> kPlanKeys = {
    "fsdp_version", "mesh", "sharding_strategy", "reshard_after_forward", "backward_prefetch",
    "forward_prefetch", "limit_all_gathers", "prefetch_depth", "activation_checkpointing", "param_dtype",
    "reduce_dtype", "master_weights_dtype", "micro_batch", "seq_len", "grad_accum", "grad_sync",
    "cpu_offload", "fp8_all_gather", "trainable_fraction", "optimizer", "auto_wrap_policy", "use_orig_params",
    "cross_entropy", "cross_entropy_chunks", "implementation", "compile", "float8", "alloc_conf", "free_logits_before_backward",
    "optimizer_impl", "module_overrides", "frozen_units", "lora"};

const std::vector<std::string> kStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                              "_HYBRID_SHARD_ZERO2"};

ShardingStrategy strategy_from_name(const std::string& s) {
  if (s == "FULL_SHARD") return ShardingStrategy::FULL_SHARD;
  if (s == "SHARD_GRAD_OP") return ShardingStrategy::SHARD_GRAD_OP;
  if (s == "NO_SHARD") return ShardingStrategy::NO_SHARD;
  if (s == "HYBRID_SHARD") return ShardingStrategy::HYBRID_SHARD;
  return ShardingStrategy::_HYBRID_SHARD_ZERO2;
}

bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::HYBRID_SHARD || s == ShardingStrategy::_HYBRID_SHARD_ZERO2;
}
// Strategies that keep the unsharded params from forward to backward (F1.7, F2.12).
bool is_zero2(ShardingStrategy s) {
  return s == ShardingStrategy::SHARD_GRAD_OP || s == ShardingStrategy::_HYBRID_SHARD_ZERO2;
}

std::string mesh_text(int r, int s) { return "(" + std::to_string(r) + ", " + std::to_string(s) + ")"; }

void parse_mesh(const Json& v, Plan& p) {
  const std::string field = "plan.mesh";
  if (v.is_array()) {
    if (v.size() != 2)
      throw InputError(field, json_value_for_message(v), "expected [replicate, shard] (2 integers) or {replicate, shard}");
    Json obj = {{"replicate", v[0]}, {"shard", v[1]}};
    JsonReader r(obj, field);
    p.mesh_replicate = static_cast<int>(r.get_int("replicate", 1, kMaxMesh));
    p.mesh_shard = static_cast<int>(r.get_int("shard", 1, kMaxMesh));
    return;
  }
  if (!v.is_object())
    throw InputError(field, json_value_for_message(v), "expected [replicate, shard] (2 integers) or {replicate, shard}");
  JsonReader r(v, field);
  r.check_no_unknown_keys({"replicate", "shard"});
  p.mesh_replicate = static_cast<int>(r.get_int("replicate", 1, kMaxMesh));
  p.mesh_shard = static_cast<int>(r.get_int("shard", 1, kMaxMesh));
}

int parse_every_k(const std::string& s, const std::string& field) {
  // "every_<k>" with k a positive integer without sign or leading junk.
  const std::string digits = s.substr(6);
  bool ok = !digits.empty() && digits.size() <= 6;
  for (char c : digits) ok = ok && c >= '0' && c <= '9';
  int k = ok ? std::stoi(digits) : 0;
  if (k < 1)
    throw InputError(field, "\"" + s + "\"", "expected every_<k> with k an integer in [1, 999999]");
  return k;
}

ActivationCheckpointing parse_ac(const Json& v) {
  const std::string field = "plan.activation_checkpointing";
  const std::string allowed = "expected \"none\", \"full\", \"selective_op\", \"every_<k>\" or {mode, every_k, outside_fsdp}";
  ActivationCheckpointing ac;
  auto set_mode = [&](const std::string& s, const std::string& f) {
    if (s == "none") ac.mode = ActivationCheckpointing::Mode::None;
    else if (s == "full") ac.mode = ActivationCheckpointing::Mode::Full;
    else if (s == "selective_op") ac.mode = ActivationCheckpointing::Mode::SelectiveOp;
    else if (s == "every_k") ac.mode = ActivationCheckpointing::Mode::EveryK;
    else if (s.rfind("every_", 0) == 0) {
      ac.mode = ActivationCheckpointing::Mode::EveryK;
      ac.every_k = parse_every_k(s, f);
    } else {
      throw InputError(f, "\"" + s + "\"", allowed);
    }
  };
  if (v.is_string()) {
    set_mode(v.get<std::string>(), field);
    if (v.get<std::string>() == "every_k")
      throw InputError(field, "\"every_k\"", "write every_<k> (e.g. \"every_2\") or the object form with every_k");
    return ac;
  }
  if (!v.is_object()) throw InputError(field, json_value_for_message(v), allowed);
  JsonReader r(v, field);
  r.check_no_unknown_keys({"mode", "every_k", "outside_fsdp"});
  set_mode(r.get_string("mode", "full"), r.field("mode"));
  if (r.has("every_k")) {
    int k = static_cast<int>(r.get_int("every_k", 1, 999999));
    if (ac.mode != ActivationCheckpointing::Mode::EveryK)
      throw InputError(r.field("every_k"), std::to_string(k), "only with mode \"every_k\"");
    ac.every_k = k;
  }
  ac.outside_fsdp = r.get_bool("outside_fsdp", false);
  return ac;
}

CpuOffload parse_offload(const Json& v) {
  const std::string field = "plan.cpu_offload";
  CpuOffload o;
  if (v.is_boolean()) {
    // CPUOffload(offload_params=True) / CPUOffloadPolicy: params, grads and optimizer state on the CPU (M11).
    o.params = v.get<bool>();
    o.optimizer = o.params;
    return o;
  }
  if (!v.is_object()) throw InputError(field, json_value_for_message(v), "expected true/false or {params, optimizer}");
  JsonReader r(v, field);
  r.check_no_unknown_keys({"params", "optimizer"});
  o.params = r.get_bool("params", false);
  o.optimizer = r.get_bool("optimizer", o.params);
  if (o.params && !o.optimizer)
    throw InputError(r.field("optimizer"), "false",
                     "offloading params also offloads the optimizer (CPUOffload / CPUOffloadPolicy run the step on the CPU)");
  return o;
}

models::WrapPolicy parse_wrap(const Json& v) {
  const std::string field = "plan.auto_wrap_policy";
  const std::string allowed = "expected \"transformer_block\", \"none\", {\"min_num_params\": N} or {\"modules\": [names]}";
  models::WrapPolicy w;
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s == "transformer_block") w.kind = models::WrapPolicy::Kind::TransformerBlock;
    else if (s == "none") w.kind = models::WrapPolicy::Kind::None;
    else throw InputError(field, "\"" + s + "\"", allowed);
    return w;
  }
  if (!v.is_object() || v.size() != 1) throw InputError(field, json_value_for_message(v), allowed);
  JsonReader r(v, field);
  r.check_no_unknown_keys({"min_num_params", "modules"});
  if (r.has("min_num_params")) {
    w.kind = models::WrapPolicy::Kind::Size;
    w.min_num_params = r.get_int("min_num_params", 1, std::int64_t{1} << 50);
    return w;
  }
  const Json& m = r.raw("modules");
  if (!m.is_array() || m.empty())
    throw InputError(r.field("modules"), json_value_for_message(m), "expected a non-empty array of module names");
  w.kind = models::WrapPolicy::Kind::Modules;
  for (const auto& e : m) {
    if (!e.is_string() || e.get<std::string>().empty())
      throw InputError(r.field("modules"), json_value_for_message(e), "expected module names (non-empty strings)");
    w.modules.push_back(e.get<std::string>());
  }
  return w;
}

Dtype parse_compute_dtype(const JsonReader& r, const std::string& key, Dtype dflt) {
  if (!r.has(key)) return dflt;
  Dtype d = parse_dtype(r.get_string(key), r.field(key));
  // fp8 is not a dtype FSDP computes, reduces or keeps masters in; the fp8 all-gather is its own key (D4).
  if (d == Dtype::FP8)
    throw InputError(r.field(key), "\"" + r.get_string(key) + "\"",
                     "expected fp32, bf16 or fp16 (for fp8 all-gathers set fp8_all_gather: true)");
  return d;
}

std::vector<ModuleOverride> parse_module_overrides(const Json& v) {
  const std::string field = "plan.module_overrides";
  if (!v.is_object())
    throw InputError(field, json_value_for_message(v),
                     "expected {\"<unit name>\" or \"last_block\": {\"reshard_after_forward\": true|false}}");
  std::vector<ModuleOverride> out;
  for (const auto& [name, o] : v.items()) {
    const std::string f = field + "." + name;
    if (name.empty()) throw InputError(field, "\"\"", "module names must be non-empty");
    if (!o.is_object()) throw InputError(f, json_value_for_message(o), "expected {\"reshard_after_forward\": true|false}");
    JsonReader r(o, f);
    r.check_no_unknown_keys({"reshard_after_forward"});
    ModuleOverride m;
    m.module = name;
    if (r.has("reshard_after_forward")) m.reshard_after_forward = r.get_bool("reshard_after_forward") ? -1 : 0;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

LoraPlan parse_lora(const Json& v, const std::string& field) {
  const char* expected = "expected {\"rank\": r, \"targets\": [\"q\", \"v\", ...], \"dropout\": p}";
  if (!v.is_object()) throw InputError(field, json_value_for_message(v), expected);
  JsonReader r(v, field);
  r.check_no_unknown_keys({"rank", "targets", "dropout"});
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
  r.check_no_unknown_keys(kPlanKeys);
  Plan p;
  p.fsdp_version = r.get_int("fsdp_version", 1, 2, 2) == 1 ? FsdpVersion::FSDP1 : FsdpVersion::FSDP2;
  if (r.has("mesh")) parse_mesh(r.raw("mesh"), p);

  bool rAF_given = r.has("reshard_after_forward");
  if (rAF_given) {
    const Json& v = r.raw("reshard_after_forward");
    if (v.is_boolean()) {
      p.reshard_after_forward = v.get<bool>() ? -1 : 0;
    } else if (v.is_number_integer()) {
      p.reshard_after_forward = static_cast<int>(r.get_int("reshard_after_forward", 2, kMaxMesh));
    } else {
      throw InputError("plan.reshard_after_forward", json_value_for_message(v),
                       "expected true, false or an integer k > 1 that divides the shard size");
    }
  }
  bool strategy_given = r.has("sharding_strategy");
  if (strategy_given) p.sharding_strategy = strategy_from_name(r.get_enum("sharding_strategy", kStrategies));

  if (p.fsdp_version == FsdpVersion::FSDP1) {
    if (rAF_given)
      throw InputError("plan.reshard_after_forward", json_value_for_message(r.raw("reshard_after_forward")),
                       "FSDP1 has no reshard_after_forward; use sharding_strategy (SHARD_GRAD_OP = false)");
  } else if (strategy_given) {
    // FSDP2: the strategy is only a name for (rAF, mesh) (F2.12); it must agree with an explicit rAF.
    int implied = is_zero2(p.sharding_strategy) ? 0 : -1;
    if (p.sharding_strategy == ShardingStrategy::NO_SHARD) implied = p.reshard_after_forward;
    if (rAF_given && (p.reshard_after_forward == 0) != (implied == 0))
      throw InputError("plan.sharding_strategy", "\"" + strategy_name(p.sharding_strategy) + "\"",
                       "contradicts reshard_after_forward (FSDP2: FULL_SHARD/HYBRID_SHARD = true, "
                       "SHARD_GRAD_OP/_HYBRID_SHARD_ZERO2 = false)");
    if (!rAF_given) p.reshard_after_forward = implied;
  }

  if (r.has("backward_prefetch")) {
    std::string b = r.get_enum("backward_prefetch", {"BACKWARD_PRE", "BACKWARD_POST", "NONE"});
    p.backward_prefetch = b == "BACKWARD_PRE"    ? BackwardPrefetch::BACKWARD_PRE
                          : b == "BACKWARD_POST" ? BackwardPrefetch::BACKWARD_POST
                                                 : BackwardPrefetch::NONE;
  } else if (j.contains("backward_prefetch")) {
    p.backward_prefetch = BackwardPrefetch::NONE;   // PyTorch's backward_prefetch=None
  }
  p.forward_prefetch = r.get_bool("forward_prefetch", false);
  p.limit_all_gathers = r.get_bool("limit_all_gathers", true);
  p.prefetch_depth = static_cast<int>(r.get_int("prefetch_depth", 1, kMaxPrefetchDepth, 1));
  if (r.has("activation_checkpointing")) p.activation_checkpointing = parse_ac(r.raw("activation_checkpointing"));
  p.param_dtype = parse_compute_dtype(r, "param_dtype", Dtype::BF16);
  p.reduce_dtype = parse_compute_dtype(r, "reduce_dtype", Dtype::FP32);
  p.master_weights_dtype = parse_compute_dtype(r, "master_weights_dtype", Dtype::FP32);
  p.micro_batch = r.get_int("micro_batch", 1, 65536, 1);
  p.seq_len = r.get_int("seq_len", 1, std::int64_t{1} << 22, 2048);
  p.grad_accum = r.get_int("grad_accum", 1, 65536, 1);
  p.grad_sync = r.get_bool("grad_sync", false);
  if (r.has("cpu_offload")) p.cpu_offload = parse_offload(r.raw("cpu_offload"));
  p.fp8_all_gather = r.get_bool("fp8_all_gather", false);
  p.trainable_fraction = r.get_double("trainable_fraction", 0.0, 1.0, 1.0);
  if (!(p.trainable_fraction > 0.0))
    throw InputError("plan.trainable_fraction", json_value_for_message(r.raw("trainable_fraction")),
                     "expected a number in (0, 1] (a fully frozen model does not train)");
  if (r.has("optimizer"))
    p.optimizer = r.get_enum("optimizer", {"adamw", "sgd"}) == "adamw" ? Optimizer::AdamW : Optimizer::SGD;
  if (r.has("auto_wrap_policy")) p.auto_wrap_policy = parse_wrap(r.raw("auto_wrap_policy"));
  p.use_orig_params = r.get_bool("use_orig_params", true);
  if (r.has("cross_entropy")) {
    const std::string ce = r.get_enum("cross_entropy", {"torch", "fused", "fused_linear", "chunked"});
    p.cross_entropy = ce == "fused"          ? models::LossImpl::Fused
                      : ce == "fused_linear" ? models::LossImpl::FusedLinear
                      : ce == "chunked"      ? models::LossImpl::Chunked
                                             : models::LossImpl::Torch;
  }
  if (r.has("cross_entropy_chunks")) {
    p.cross_entropy_chunks = static_cast<int>(r.get_int("cross_entropy_chunks", 1, 65536, models::kDefaultLossChunks));
    if (p.cross_entropy != models::LossImpl::Chunked)
      throw InputError("plan.cross_entropy_chunks", std::to_string(p.cross_entropy_chunks),
                       "only with cross_entropy \"chunked\" (torchtune's num_output_chunks)");
  }
  if (r.has("implementation")) {
    const std::string impl = r.get_enum("implementation", {"torchtitan", "hf", "litgpt", "fused", "runtime"});
    p.implementation = impl == "torchtitan" ? models::ModelImpl::TorchTitan
                       : impl == "litgpt"   ? models::ModelImpl::LitGPT
                       : impl == "fused"    ? models::ModelImpl::Fused
                       : impl == "runtime"  ? models::ModelImpl::Runtime
                                            : models::ModelImpl::HF;
  }
  p.compile = r.get_bool("compile", false);
  if (r.has("float8")) {
    const std::string f = r.get_enum("float8", {"none", "tensorwise", "rowwise"});
    p.float8 = f == "tensorwise" ? models::Float8Recipe::Tensorwise
               : f == "rowwise"  ? models::Float8Recipe::Rowwise
                                 : models::Float8Recipe::None;
  }
  if (r.has("alloc_conf")) p.alloc_conf = parse_alloc_conf(r.get_string("alloc_conf"), r.field("alloc_conf"));
  if (r.has("free_logits_before_backward")) p.free_logits_before_backward = r.get_bool("free_logits_before_backward");
  if (r.has("optimizer_impl"))
    p.optimizer_impl = r.get_enum("optimizer_impl", {"foreach", "fused"}) == "fused" ? OptimizerImpl::Fused
                                                                                       : OptimizerImpl::Foreach;
  if (r.has("module_overrides")) p.module_overrides = parse_module_overrides(r.raw("module_overrides"));
  if (r.has("frozen_units")) {
    const Json& v = r.raw("frozen_units");
    const char* expected = "expected an array of FSDP unit names (as `fsdpsim model-info` lists them, or \"root\", "
                           "\"last_block\")";
    if (!v.is_array()) throw InputError("plan.frozen_units", json_value_for_message(v), expected);
    for (const auto& e : v) {
      if (!e.is_string() || e.get<std::string>().empty())
        throw InputError("plan.frozen_units", json_value_for_message(e), expected);
      p.frozen_units.push_back(e.get<std::string>());
    }
  }
  if (r.has("lora")) {
    p.lora = parse_lora(r.raw("lora"), "plan.lora");
    if (r.has("trainable_fraction") && p.trainable_fraction < 1.0)
      throw InputError("plan.trainable_fraction", json_value_for_message(r.raw("trainable_fraction")),
                       "give either lora (the adapters train, nothing else) or trainable_fraction < 1, not both");
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
  j["fsdp_version"] = static_cast<int>(p.fsdp_version);
  if (p.mesh_replicate > 0 && p.mesh_shard > 0) j["mesh"] = {{"replicate", p.mesh_replicate}, {"shard", p.mesh_shard}};
  j["sharding_strategy"] = strategy_name(p.sharding_strategy);
  if (p.fsdp_version == FsdpVersion::FSDP2) {
    if (p.reshard_after_forward < 0) j["reshard_after_forward"] = true;
    else if (p.reshard_after_forward == 0) j["reshard_after_forward"] = false;
    else j["reshard_after_forward"] = p.reshard_after_forward;
  }
  j["backward_prefetch"] = prefetch_name(p.backward_prefetch);
  j["forward_prefetch"] = p.forward_prefetch;
  j["limit_all_gathers"] = p.limit_all_gathers;
  j["prefetch_depth"] = p.prefetch_depth;
  const auto& ac = p.activation_checkpointing;
  if (ac.outside_fsdp) {
    Json a = {{"mode", ac.mode == ActivationCheckpointing::Mode::EveryK ? "every_k" : checkpointing_name(ac)},
              {"outside_fsdp", true}};
    if (ac.mode == ActivationCheckpointing::Mode::EveryK) a["every_k"] = ac.every_k;
    j["activation_checkpointing"] = a;
  } else {
    j["activation_checkpointing"] = checkpointing_name(ac);
  }
  j["param_dtype"] = std::string(dtype_name(p.param_dtype));
  j["reduce_dtype"] = std::string(dtype_name(p.reduce_dtype));
  j["master_weights_dtype"] = std::string(dtype_name(p.master_weights_dtype));
  j["micro_batch"] = p.micro_batch;
  j["seq_len"] = p.seq_len;
  j["grad_accum"] = p.grad_accum;
  j["grad_sync"] = p.grad_sync;
  j["cpu_offload"] = {{"params", p.cpu_offload.params}, {"optimizer", p.cpu_offload.optimizer}};
  j["fp8_all_gather"] = p.fp8_all_gather;
  j["trainable_fraction"] = p.trainable_fraction;
  j["optimizer"] = p.optimizer == Optimizer::AdamW ? "adamw" : "sgd";
  j["cross_entropy"] = models::loss_impl_name(p.cross_entropy);
  if (p.cross_entropy == models::LossImpl::Chunked) j["cross_entropy_chunks"] = p.cross_entropy_chunks;
  switch (p.auto_wrap_policy.kind) {
    case models::WrapPolicy::Kind::TransformerBlock: j["auto_wrap_policy"] = "transformer_block"; break;
    case models::WrapPolicy::Kind::None: j["auto_wrap_policy"] = "none"; break;
    case models::WrapPolicy::Kind::Size: j["auto_wrap_policy"] = {{"min_num_params", p.auto_wrap_policy.min_num_params}}; break;
    case models::WrapPolicy::Kind::Modules: j["auto_wrap_policy"] = {{"modules", p.auto_wrap_policy.modules}}; break;
  }
  if (p.fsdp_version == FsdpVersion::FSDP1) j["use_orig_params"] = p.use_orig_params;
  j["implementation"] = models::model_impl_name(p.implementation);
  j["compile"] = p.compile;
  j["float8"] = models::float8_recipe_name(p.float8);
  j["alloc_conf"] = alloc_conf_text(p.alloc_conf);
  if (p.free_logits_before_backward) j["free_logits_before_backward"] = *p.free_logits_before_backward;
  j["optimizer_impl"] = p.optimizer_impl == OptimizerImpl::Fused ? "fused" : "foreach";
  if (!p.module_overrides.empty()) {
    Json o = Json::object();
    for (const auto& m : p.module_overrides) {
      Json e = Json::object();
      if (m.reshard_after_forward != -2) e["reshard_after_forward"] = m.reshard_after_forward != 0;
      o[m.module] = e;
    }
    j["module_overrides"] = o;
  }
  if (!p.frozen_units.empty()) j["frozen_units"] = p.frozen_units;
  if (p.lora.on()) j["lora"] = {{"rank", p.lora.rank}, {"targets", p.lora.targets}, {"dropout", p.lora.dropout}};
  return j;
}

ShardingStrategy effective_strategy(const Plan& p) {
  if (p.fsdp_version == FsdpVersion::FSDP1) return p.sharding_strategy;
  // F2.12: FSDP2 has no strategy enum; a 1-wide shard dim is NO_SHARD (DDP-like), a 2-D mesh is HSDP,
  // and reshard_after_forward=False is the ZeRO-2 variant. An int rAF (hpZ) still reshards after forward.
  if (p.mesh_shard == 1) return ShardingStrategy::NO_SHARD;
  bool zero2 = p.reshard_after_forward == 0;
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
    int k = p.reshard_after_forward;
    if (k > 0) {
      if (k >= p.mesh_shard || p.mesh_shard % k != 0)
        throw InputError("plan.reshard_after_forward", std::to_string(k),
                         "an int must divide the shard size " + std::to_string(p.mesh_shard) +
                             " and lie strictly between 1 and it (F2.4)");
    }
    p.sharding_strategy = effective_strategy(p);
  }

  // ---- feature / version consistency ----
  if (fsdp1 && p.prefetch_depth > 1)
    throw InputError("plan.prefetch_depth", std::to_string(p.prefetch_depth),
                     "1 for FSDP1 (deeper explicit prefetch is FSDP2's set_modules_to_*_prefetch, P6)");
  if (!fsdp1 && p.backward_prefetch == BackwardPrefetch::BACKWARD_POST)
    throw InputError("plan.backward_prefetch", "\"BACKWARD_POST\"", "FSDP2 supports BACKWARD_PRE (its default, F2.7) or NONE");
  if (!fsdp1 && !p.use_orig_params)
    throw InputError("plan.use_orig_params", "false", "FSDP1 only (FSDP2 always keeps the original parameters)");
  if (p.fp8_all_gather && (fsdp1 || p.param_dtype != Dtype::BF16))
    throw InputError("plan.fp8_all_gather", "true", "needs fsdp_version 2 and param_dtype bf16 (torchao float8, D4)");
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
  if (!p.frozen_units.empty() && p.trainable_fraction >= 1.0 && !p.lora.on())
    throw InputError("plan.frozen_units", "[\"" + p.frozen_units.front() + "\", ...]",
                     "frozen units need trainable_fraction < 1 (the fraction of the whole model that trains) or lora");
  if (p.lora.on() && p.implementation == models::ModelImpl::Runtime)
    throw InputError("plan.lora", "{\"rank\": " + std::to_string(p.lora.rank) + ", ...}",
                     "fsdpsim's own runtime has no LoRA adapters (use implementation hf, litgpt, fused or torchtitan)");
  if (p.lora.on() && p.trainable_fraction < 1.0)
    throw InputError("plan.trainable_fraction", std::to_string(p.trainable_fraction),
                     "give either lora (the adapters train, nothing else) or trainable_fraction < 1, not both");
  for (const auto& m : p.module_overrides)
    if (m.reshard_after_forward != -2 && fsdp1)
      throw InputError("plan.module_overrides." + m.module + ".reshard_after_forward",
                       m.reshard_after_forward ? "true" : "false",
                       "FSDP2 only (FSDP1 sets resharding per sharding_strategy for every unit)");
  if (p.micro_batch * p.seq_len > (std::int64_t{1} << 31))
    throw InputError("plan.micro_batch", std::to_string(p.micro_batch),
                     "micro_batch x seq_len must stay below 2^31 tokens per micro-batch");
  return p;
}

}  // namespace fsdpsim::sim
