// Readers of users' configurations (note "diagnose input forms" in user_config.h).
#include "planner/user_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <limits>
#include <regex>
#include <sstream>

#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include "common/errors.h"
#include "common/json_reader.h"
#include "planner/search_space.h"

namespace fsdpsim::planner {
namespace {

using KV = std::map<std::string, std::string>;
using AcMode = sim::ActivationCheckpointing::Mode;

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
std::string unquote(std::string s) {
  s = trim(s);
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) return s.substr(1, s.size() - 2);
  return s;
}
std::string last_component(const std::string& s) {
  std::string u = unquote(s);
  auto d = u.rfind('.');
  return d == std::string::npos ? u : u.substr(d + 1);
}
std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
bool as_bool(const std::string& key, const std::string& v) {
  std::string l = lower(unquote(v));
  if (l == "true" || l == "1" || l == "yes") return true;
  if (l == "false" || l == "0" || l == "no" || l == "none" || l == "null" || l.empty()) return false;
  // cpu_offload=CPUOffload(offload_params=True)
  if (l.find("offload_params=true") != std::string::npos) return true;
  if (l.find("offload_params=false") != std::string::npos || l.rfind("cpuoffload(", 0) == 0) return false;
  throw InputError(key, v, "True or False");
}
long long as_int(const std::string& key, const std::string& v, long long lo, long long hi) {
  std::string u = unquote(v);
  char* end = nullptr;
  double d = std::strtod(u.c_str(), &end);   // accepts 1e8 (min_num_params=1e8)
  // !(lo <= d <= hi) also rejects NaN ("nan"), whose conversion to an integer is undefined.
  if (u.empty() || *end != '\0' || !(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)) ||
      d != static_cast<long long>(d))
    throw InputError(key, v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<long long>(d);
}
// Identifiers of "{A, B}", "[A, B]", "(A,)", "A", "A,B" (last dotted component of each).
std::vector<std::string> as_names(const std::string& v) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : v) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.') cur += c;
    else {
      if (!cur.empty()) out.push_back(last_component(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(last_component(cur));
  return out;
}
std::vector<long long> as_ints(const std::string& v) {
  std::vector<long long> out;
  std::string cur;
  for (char c : v + " ") {
    if (std::isdigit(static_cast<unsigned char>(c))) cur += c;
    else if (!cur.empty()) {
      // More than 18 digits would overflow std::stoll: saturate, the caller's range check rejects it.
      out.push_back(cur.size() > 18 ? std::numeric_limits<long long>::max() : std::stoll(cur));
      cur.clear();
    }
  }
  return out;
}

// ---- the tolerant Python keyword scanner ----------------------------------------------------

// The text between the parentheses of the first call `name(` (balanced, quotes respected).
bool call_arguments(const std::string& text, const std::string& name, std::string& out) {
  std::regex re("\\b" + name + "\\s*\\(");
  std::smatch m;
  if (!std::regex_search(text, m, re)) return false;
  size_t i = static_cast<size_t>(m.position(0) + m.length(0));
  int depth = 1;
  char quote = 0;
  size_t start = i;
  for (; i < text.size() && depth > 0; ++i) {
    char c = text[i];
    if (quote) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') quote = c;
    else if (c == '#') { while (i < text.size() && text[i] != '\n') ++i; }
    else if (c == '(' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == ']' || c == '}') --depth;
  }
  if (depth != 0) throw InputError(name + "(...)", "<unbalanced parentheses>", "a complete call");
  out = text.substr(start, i - 1 - start);
  return true;
}

// key=value pairs at the top level of an argument list (positional arguments are ignored).
KV keyword_arguments(const std::string& args) {
  KV kv;
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    char c = args[i];
    if (quote) {
      cur += c;
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '#') { while (i < args.size() && args[i] != '\n') ++i; continue; }
    if (c == '"' || c == '\'') quote = c;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  for (const auto& p : parts) {
    auto eq = p.find('=');
    if (eq == std::string::npos) continue;
    std::string k = trim(p.substr(0, eq));
    bool ident = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (ident) kv[k] = trim(p.substr(eq + 1));
  }
  return kv;
}

// `# fsdpsim: micro_batch=2 seq_len=8192 grad_accum=4`
void read_directive(const std::string& text, UserConfig& cfg) {
  std::regex re("#\\s*fsdpsim:([^\\n]*)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    std::istringstream is((*it)[1].str());
    std::string tok;
    while (is >> tok) {
      auto eq = tok.find('=');
      if (eq == std::string::npos) continue;
      std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
      if (k == "micro_batch") { cfg.plan.micro_batch = as_int("# fsdpsim: micro_batch", v, 1, 65536); cfg.micro_batch_given = true; }
      else if (k == "seq_len") { cfg.plan.seq_len = as_int("# fsdpsim: seq_len", v, 1, 1 << 22); cfg.seq_len_given = true; }
      else if (k == "grad_accum") cfg.plan.grad_accum = as_int("# fsdpsim: grad_accum", v, 1, 65536);
      else throw InputError("# fsdpsim: " + k, v, "micro_batch, seq_len or grad_accum");
    }
  }
}

// ---- Lightning keys (shared by the Python and YAML forms) ------------------------------------

void apply_precision_string(const std::string& key, const std::string& raw, UserConfig& cfg) {
  std::string s = lower(unquote(raw));
  auto& p = cfg.plan;
  cfg.precision = s;
  if (s == "32-true" || s == "32") { p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::FP32; }
  else if (s == "bf16-mixed" || s == "bf16") { p.param_dtype = p.reduce_dtype = Dtype::BF16; p.master_weights_dtype = Dtype::FP32; }
  else if (s == "16-mixed" || s == "16") { p.param_dtype = p.reduce_dtype = Dtype::FP16; p.master_weights_dtype = Dtype::FP32; }
  else if (s == "bf16-true") { p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::BF16; }
  else if (s == "16-true") { p.param_dtype = p.reduce_dtype = p.master_weights_dtype = Dtype::FP16; }
  else throw InputError(key, raw, "32-true, bf16-mixed, 16-mixed, bf16-true or 16-true (Lightning's FSDP precision strings)");
  cfg.facts.push_back("precision \"" + s + "\" (Lightning >= 2.6): param_dtype " + std::string(dtype_name(p.param_dtype)) +
                      ", reduce_dtype " + std::string(dtype_name(p.reduce_dtype)) + ", master weights " +
                      std::string(dtype_name(p.master_weights_dtype)));
}

void apply_lightning(const KV& strategy, const KV& trainer, const std::string& prefix_s, const std::string& prefix_t,
                     const models::ModelSpec& model, UserConfig& cfg) {
  auto& p = cfg.plan;
  p.fsdp_version = sim::FsdpVersion::FSDP1;
  p.use_orig_params = true;  // Lightning's FSDPStrategy default
  p.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
  p.master_weights_dtype = Dtype::FP32;
  p.param_dtype = p.reduce_dtype = Dtype::FP32;  // Trainer default precision "32-true"
  static const std::vector<std::string> known = {
      "sharding_strategy", "device_mesh", "auto_wrap_policy", "activation_checkpointing_policy", "activation_checkpointing",
      "cpu_offload", "mixed_precision", "backward_prefetch", "forward_prefetch", "limit_all_gathers", "use_orig_params",
      "state_dict_type", "sync_module_states", "timeout", "process_group_backend", "checkpoint_io", "precision"};
  for (const auto& [k, v] : strategy) {
    const std::string key = prefix_s + k;
    if (k == "sharding_strategy") {
      std::string s = last_component(v);
      Constraint c = parse_constraint("sharding_strategy=" + s, key);
      if (c.value == "FULL_SHARD") p.sharding_strategy = sim::ShardingStrategy::FULL_SHARD;
      else if (c.value == "SHARD_GRAD_OP") p.sharding_strategy = sim::ShardingStrategy::SHARD_GRAD_OP;
      else if (c.value == "NO_SHARD") p.sharding_strategy = sim::ShardingStrategy::NO_SHARD;
      else if (c.value == "HYBRID_SHARD") p.sharding_strategy = sim::ShardingStrategy::HYBRID_SHARD;
      else p.sharding_strategy = sim::ShardingStrategy::_HYBRID_SHARD_ZERO2;
    } else if (k == "device_mesh") {
      auto ints = as_ints(v);
      if (ints.size() != 2 || ints[0] < 1 || ints[1] < 1 || ints[0] > (1 << 20) || ints[1] > (1 << 20))
        throw InputError(key, v, "(replicate, shard), each in [1, 1048576], e.g. (2, 4)");
      p.mesh_replicate = static_cast<int>(ints[0]);
      p.mesh_shard = static_cast<int>(ints[1]);
    } else if (k == "auto_wrap_policy") {
      cfg.wrap_policy_given = true;
      std::string l = lower(v);
      if (l.find("size_based") != std::string::npos) {
        p.auto_wrap_policy.kind = models::WrapPolicy::Kind::Size;
        std::smatch m;
        if (std::regex_search(v, m, std::regex("min_num_params\\s*=\\s*([0-9eE.+_]+)")))
          p.auto_wrap_policy.min_num_params = as_int(key + ".min_num_params", m[1].str(), 1, std::int64_t{1} << 50);
        else
          p.auto_wrap_policy.min_num_params = 100'000'000;  // PyTorch's size_based_auto_wrap_policy default (1e8)
      } else if (l == "none" || l.empty()) {
        p.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
      } else {
        cfg.wrap_classes = as_names(v);
        bool hit = std::find(cfg.wrap_classes.begin(), cfg.wrap_classes.end(), model.block_class) != cfg.wrap_classes.end();
        p.auto_wrap_policy.kind = hit ? models::WrapPolicy::Kind::TransformerBlock : models::WrapPolicy::Kind::None;
        if (!hit)
          cfg.facts.push_back("auto_wrap_policy " + v + " names no module of " + model.name + " (its blocks are " +
                              model.block_class + "): nothing is wrapped");
      }
    } else if (k == "activation_checkpointing_policy" || k == "activation_checkpointing") {
      auto names = as_names(v);
      bool hit = std::find(names.begin(), names.end(), model.block_class) != names.end();
      if (hit) p.activation_checkpointing.mode = AcMode::Full;
      else if (lower(unquote(v)) != "none")
        cfg.facts.push_back(k + " " + v + " names no module of " + model.name + ": no block is checkpointed");
    } else if (k == "cpu_offload") {
      p.cpu_offload.params = p.cpu_offload.optimizer = as_bool(key, v);
    } else if (k == "mixed_precision") {
      std::smatch m;
      if (std::regex_search(v, m, std::regex("param_dtype\\s*=\\s*([A-Za-z0-9_.]+)"))) p.param_dtype = parse_dtype(m[1].str(), key + ".param_dtype");
      if (std::regex_search(v, m, std::regex("reduce_dtype\\s*=\\s*([A-Za-z0-9_.]+)"))) p.reduce_dtype = parse_dtype(m[1].str(), key + ".reduce_dtype");
    } else if (k == "backward_prefetch") {
      Constraint c = parse_constraint("backward_prefetch=" + last_component(v), key);
      p.backward_prefetch = c.value == "BACKWARD_PRE" ? sim::BackwardPrefetch::BACKWARD_PRE
                            : c.value == "BACKWARD_POST" ? sim::BackwardPrefetch::BACKWARD_POST : sim::BackwardPrefetch::NONE;
    } else if (k == "forward_prefetch") {
      p.forward_prefetch = as_bool(key, v);
    } else if (k == "limit_all_gathers") {
      p.limit_all_gathers = as_bool(key, v);
    } else if (k == "use_orig_params") {
      p.use_orig_params = as_bool(key, v);
    } else if (std::find(known.begin(), known.end(), k) == known.end()) {
      cfg.warnings.push_back("ignored " + key + " = " + v);
    }
  }
  if (!cfg.wrap_policy_given)
    cfg.facts.push_back("no auto_wrap_policy: FSDPStrategy wraps the whole model as one FSDP unit");
  bool precision_set = false;
  for (const auto& [k, v] : trainer) {
    const std::string key = prefix_t + k;
    if (k == "precision") { precision_set = true; continue; }
    if (k == "devices") { if (lower(unquote(v)) != "auto" && lower(unquote(v)) != "-1") cfg.gpus_per_node = static_cast<int>(as_int(key, v, 1, 1024)); }
    else if (k == "num_nodes") cfg.nodes = static_cast<int>(as_int(key, v, 1, 1 << 20));
    else if (k == "accumulate_grad_batches") p.grad_accum = as_int(key, v, 1, 65536);
  }
  // Precision after the strategy's mixed_precision? Lightning: an explicit MixedPrecision wins.
  if (precision_set) {
    Dtype pd = p.param_dtype, rd = p.reduce_dtype;
    bool mp = strategy.count("mixed_precision") > 0;
    apply_precision_string(prefix_t + "precision", trainer.at("precision"), cfg);
    if (mp) { p.param_dtype = pd; p.reduce_dtype = rd; }
  } else {
    cfg.facts.push_back("no Trainer precision: \"32-true\" (Lightning's default)");
  }
  // Lightning (like FSDP1 without no_sync) reduces gradients every micro-batch unless told otherwise.
  p.grad_sync = true;
}

// ---- YAML / TOML helpers --------------------------------------------------------------------

std::string yaml_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsNull()) return "None";
  std::string s = "[";
  if (n.IsSequence())
    for (size_t i = 0; i < n.size(); ++i) s += (i ? ", " : "") + yaml_text(n[i]);
  return s + "]";
}

KV yaml_map(const YAML::Node& n) {
  KV kv;
  if (n && n.IsMap())
    for (const auto& it : n) kv[it.first.as<std::string>()] = yaml_text(it.second);
  return kv;
}

void read_accelerate(const YAML::Node& root, const models::ModelSpec& model, UserConfig& cfg) {
  auto& p = cfg.plan;
  KV top = yaml_map(root);
  KV f = yaml_map(root["fsdp_config"]);
  if (top.count("distributed_type") && top["distributed_type"] != "FSDP")
    throw InputError("distributed_type", top["distributed_type"], "FSDP (this diagnoses FSDP configurations)");
  int version = f.count("fsdp_version") ? static_cast<int>(as_int("fsdp_config.fsdp_version", f["fsdp_version"], 1, 2)) : 1;
  p.fsdp_version = version == 1 ? sim::FsdpVersion::FSDP1 : sim::FsdpVersion::FSDP2;
  auto strategy_from = [&](const std::string& key, const std::string& v) {
    static const char* nums[] = {"", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"};
    std::string s = unquote(v);
    if (s.size() == 1 && s[0] >= '1' && s[0] <= '5') s = nums[s[0] - '0'];
    Constraint c = parse_constraint("sharding_strategy=" + s, key);
    for (auto st : {sim::ShardingStrategy::FULL_SHARD, sim::ShardingStrategy::SHARD_GRAD_OP, sim::ShardingStrategy::NO_SHARD,
                    sim::ShardingStrategy::HYBRID_SHARD, sim::ShardingStrategy::_HYBRID_SHARD_ZERO2})
      if (strategy_text(st) == c.value) return st;
    return sim::ShardingStrategy::FULL_SHARD;
  };
  if (f.count("fsdp_sharding_strategy")) p.sharding_strategy = strategy_from("fsdp_config.fsdp_sharding_strategy", f["fsdp_sharding_strategy"]);
  if (f.count("fsdp_reshard_after_forward")) {
    const std::string key = "fsdp_config.fsdp_reshard_after_forward", v = f["fsdp_reshard_after_forward"];
    std::string l = lower(v);
    if (version == 2 || l == "true" || l == "false") {
      bool r = as_bool(key, v);
      p.reshard_after_forward = r ? -1 : 0;
      if (version == 1) p.sharding_strategy = r ? sim::ShardingStrategy::FULL_SHARD : sim::ShardingStrategy::SHARD_GRAD_OP;
    } else {
      p.sharding_strategy = strategy_from(key, v);  // the wizard writes the FSDP1 strategy under this key
    }
  }
  std::string wrap = f.count("fsdp_auto_wrap_policy") ? unquote(f["fsdp_auto_wrap_policy"]) : "TRANSFORMER_BASED_WRAP";
  cfg.wrap_policy_given = true;
  if (wrap == "TRANSFORMER_BASED_WRAP") {
    if (f.count("fsdp_transformer_layer_cls_to_wrap")) {
      cfg.wrap_classes = as_names(f["fsdp_transformer_layer_cls_to_wrap"]);
      bool hit = std::find(cfg.wrap_classes.begin(), cfg.wrap_classes.end(), model.block_class) != cfg.wrap_classes.end();
      p.auto_wrap_policy.kind = hit ? models::WrapPolicy::Kind::TransformerBlock : models::WrapPolicy::Kind::None;
      if (!hit)
        cfg.facts.push_back("fsdp_transformer_layer_cls_to_wrap " + f["fsdp_transformer_layer_cls_to_wrap"] +
                            " names no module of " + model.name + " (its blocks are " + model.block_class + "): nothing is wrapped");
    } else {
      p.auto_wrap_policy.kind = models::WrapPolicy::Kind::TransformerBlock;
      cfg.facts.push_back("no fsdp_transformer_layer_cls_to_wrap: accelerate uses model._no_split_modules (" + model.block_class + ")");
    }
  } else if (wrap == "SIZE_BASED_WRAP") {
    p.auto_wrap_policy.kind = models::WrapPolicy::Kind::Size;
    p.auto_wrap_policy.min_num_params =
        f.count("fsdp_min_num_params") ? as_int("fsdp_config.fsdp_min_num_params", f["fsdp_min_num_params"], 1, std::int64_t{1} << 50) : 100'000'000;
  } else if (wrap == "NO_WRAP") {
    p.auto_wrap_policy.kind = models::WrapPolicy::Kind::None;
  } else {
    throw InputError("fsdp_config.fsdp_auto_wrap_policy", wrap, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP");
  }
  for (const char* k : {"fsdp_backward_prefetch", "fsdp_backward_prefetch_policy"})
    if (f.count(k)) {
      Constraint c = parse_constraint("backward_prefetch=" + unquote(f[k]), std::string("fsdp_config.") + k);
      p.backward_prefetch = c.value == "BACKWARD_PRE" ? sim::BackwardPrefetch::BACKWARD_PRE
                            : c.value == "BACKWARD_POST" ? sim::BackwardPrefetch::BACKWARD_POST : sim::BackwardPrefetch::NONE;
    }
  if (f.count("fsdp_forward_prefetch")) p.forward_prefetch = as_bool("fsdp_config.fsdp_forward_prefetch", f["fsdp_forward_prefetch"]);
  if (f.count("fsdp_offload_params"))
    p.cpu_offload.params = p.cpu_offload.optimizer = as_bool("fsdp_config.fsdp_offload_params", f["fsdp_offload_params"]);
  if (f.count("fsdp_use_orig_params")) p.use_orig_params = as_bool("fsdp_config.fsdp_use_orig_params", f["fsdp_use_orig_params"]);
  if (f.count("fsdp_activation_checkpointing") && as_bool("fsdp_config.fsdp_activation_checkpointing", f["fsdp_activation_checkpointing"]))
    p.activation_checkpointing.mode = AcMode::Full;
  // mixed_precision: accelerate keeps fp32 master weights (FSDP2 upcasts, ecosystem.md §2.3); the
  // reduce dtype follows the compute dtype (assumed: no YAML key for it).
  std::string mp = top.count("mixed_precision") ? lower(unquote(top["mixed_precision"])) : "no";
  cfg.precision = mp;
  p.master_weights_dtype = Dtype::FP32;
  if (mp == "bf16") p.param_dtype = p.reduce_dtype = Dtype::BF16;
  else if (mp == "fp16") p.param_dtype = p.reduce_dtype = Dtype::FP16;
  else if (mp == "no") p.param_dtype = p.reduce_dtype = Dtype::FP32;
  else if (mp == "fp8") { p.param_dtype = p.reduce_dtype = Dtype::BF16; cfg.warnings.push_back("mixed_precision fp8: simulated as bf16 (accelerate's fp8 backends are not modelled)"); }
  else throw InputError("mixed_precision", mp, "no, fp16, bf16 or fp8");
  cfg.facts.push_back("mixed_precision " + mp + ": param/reduce " + std::string(dtype_name(p.param_dtype)) +
                      ", fp32 master weights (assumed: accelerate has no reduce-dtype key)");
  if (top.count("num_machines")) cfg.nodes = static_cast<int>(as_int("num_machines", top["num_machines"], 1, 1 << 20));
  if (top.count("num_processes")) {
    long long np = as_int("num_processes", top["num_processes"], 1, 1 << 24);
    int nodes = cfg.nodes > 0 ? cfg.nodes : 1;
    if (np % nodes != 0) throw InputError("num_processes", top["num_processes"], "a multiple of num_machines (it counts all machines)");
    cfg.gpus_per_node = static_cast<int>(np / nodes);
  }
  KV pc = yaml_map(root["parallelism_config"]);
  if (pc.count("parallelism_config_dp_replicate_size") || pc.count("parallelism_config_dp_shard_size")) {
    p.mesh_replicate = pc.count("parallelism_config_dp_replicate_size")
                           ? static_cast<int>(as_int("parallelism_config.parallelism_config_dp_replicate_size", pc["parallelism_config_dp_replicate_size"], 1, 1 << 20)) : 1;
    p.mesh_shard = pc.count("parallelism_config_dp_shard_size")
                       ? static_cast<int>(as_int("parallelism_config.parallelism_config_dp_shard_size", pc["parallelism_config_dp_shard_size"], 1, 1 << 20)) : 0;
    if (p.mesh_shard == 0) p.mesh_replicate = 0;
  }
  // accelerate.accumulate() skips the sync until the last micro-batch.
  p.grad_sync = false;
  static const std::vector<std::string> known_f = {
      "fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy",
      "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params", "fsdp_backward_prefetch", "fsdp_backward_prefetch_policy",
      "fsdp_forward_prefetch", "fsdp_offload_params", "fsdp_state_dict_type", "fsdp_use_orig_params",
      "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "fsdp_activation_checkpointing", "fsdp_ignored_modules"};
  for (const auto& [k, v] : f)
    if (std::find(known_f.begin(), known_f.end(), k) == known_f.end()) cfg.warnings.push_back("ignored fsdp_config." + k);
}

void read_torchtitan(const std::string& text, const std::string& source, UserConfig& cfg) {
  toml::table t;
  try {
    t = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw InputError(source, "<TOML parse error at line " + std::to_string(e.source().begin.line) + ">", std::string(e.description()));
  }
  auto& p = cfg.plan;
  p.fsdp_version = sim::FsdpVersion::FSDP2;
  auto get_int = [&](const char* sec, const char* key, long long dflt, long long lo, long long hi) -> long long {
    auto n = t[sec][key];
    if (!n) return dflt;
    if (auto v = n.value<long long>()) {
      if (*v < lo || *v > hi) throw InputError(std::string(sec) + "." + key, std::to_string(*v), "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return *v;
    }
    throw InputError(std::string(sec) + "." + key, "<not an integer>", "an integer");
  };
  auto get_str = [&](const char* sec, const char* key, const std::string& dflt) -> std::string {
    auto n = t[sec][key];
    if (!n) return dflt;
    if (auto v = n.value<std::string>()) return *v;
    if (auto v = n.value<long long>()) return std::to_string(*v);
    throw InputError(std::string(sec) + "." + key, "<not a string>", "a string");
  };
  auto get_bool = [&](const char* sec, const char* key, bool dflt) -> bool {
    auto n = t[sec][key];
    if (!n) return dflt;
    if (auto v = n.value<bool>()) return *v;
    throw InputError(std::string(sec) + "." + key, "<not a bool>", "true or false");
  };
  auto titan_dtype = [&](const char* key, const std::string& v) {
    if (v == "bfloat16") return Dtype::BF16;
    if (v == "float32") return Dtype::FP32;
    throw InputError(std::string("training.") + key, v, "bfloat16 or float32");
  };
  // Defaults from torchtitan/config/job_config.py (ecosystem.md §2.4).
  p.micro_batch = get_int("training", "local_batch_size", 8, 1, 65536);
  cfg.micro_batch_given = true;
  p.seq_len = get_int("training", "seq_len", 2048, 1, 1 << 22);
  cfg.seq_len_given = true;
  p.param_dtype = titan_dtype("mixed_precision_param", get_str("training", "mixed_precision_param", "bfloat16"));
  p.reduce_dtype = titan_dtype("mixed_precision_reduce", get_str("training", "mixed_precision_reduce", "float32"));
  p.master_weights_dtype = titan_dtype("dtype", get_str("training", "dtype", "float32"));
  if (p.master_weights_dtype == Dtype::BF16) p.param_dtype = p.reduce_dtype = Dtype::BF16;
  p.cpu_offload.params = p.cpu_offload.optimizer = get_bool("training", "enable_cpu_offload", false);
  long long replicate = get_int("parallelism", "data_parallel_replicate_degree", 1, 1, 1 << 20);
  long long shard = get_int("parallelism", "data_parallel_shard_degree", -1, -1, 1 << 20);
  if (shard == 0) throw InputError("parallelism.data_parallel_shard_degree", "0", "-1 (the leftover ranks) or >= 1");
  p.mesh_replicate = static_cast<int>(replicate);
  p.mesh_shard = static_cast<int>(shard);  // -1 resolved against the cluster by the caller
  std::string raf = get_str("parallelism", "fsdp_reshard_after_forward", "default");
  if (raf == "default" || raf == "always") p.reshard_after_forward = -1;
  else if (raf == "never") p.reshard_after_forward = 0;
  else throw InputError("parallelism.fsdp_reshard_after_forward", raf, "default, always or never");
  for (const char* k : {"tensor_parallel_degree", "context_parallel_degree", "pipeline_parallel_degree"})
    if (get_int("parallelism", k, 1, 1, 1 << 20) != 1)
      throw InputError(std::string("parallelism.") + k, std::to_string(get_int("parallelism", k, 1, 1, 1 << 20)),
                       "1 (fsdpsim simulates FSDP data parallelism only)");
  std::string mode = get_str("activation_checkpoint", "mode", "selective");
  std::string opt = get_str("activation_checkpoint", "selective_ac_option", "2");
  if (mode == "none") p.activation_checkpointing.mode = AcMode::None;
  else if (mode == "full") p.activation_checkpointing.mode = AcMode::Full;
  else if (mode == "selective") {
    if (opt == "op") p.activation_checkpointing.mode = AcMode::SelectiveOp;
    else {
      long long k = as_int("activation_checkpoint.selective_ac_option", opt, 1, 1 << 20);
      p.activation_checkpointing.mode = k == 1 ? AcMode::Full : AcMode::EveryK;
      p.activation_checkpointing.every_k = static_cast<int>(k);
    }
  } else {
    throw InputError("activation_checkpoint.mode", mode, "none, selective or full (memory_budget needs torch.compile; not simulated)");
  }
  long long gbs = get_int("training", "global_batch_size", -1, -1, std::int64_t{1} << 40);
  if (gbs > 0) cfg.plan.grad_accum = -gbs;  // resolved against the data-parallel degree by the caller
  cfg.facts.push_back("torchtitan: FSDP2, mesh (" + std::to_string(replicate) + ", " + (shard < 0 ? std::string("leftover") : std::to_string(shard)) +
                      "), reshard_after_forward \"" + raf + "\", activation_checkpoint " + mode +
                      (mode == "selective" ? " (" + opt + ")" : ""));
  p.grad_sync = true;
}

}  // namespace

UserConfig parse_user_config_text(const std::string& text, const std::string& format, const std::string& source,
                                  const models::ModelSpec& model) {
  UserConfig cfg;
  cfg.format = format;
  cfg.source = source;
  cfg.plan.seq_len = 2048;
  cfg.plan.micro_batch = 1;
  if (format == "lightning") {
    std::string sargs, targs;
    if (!call_arguments(text, "FSDPStrategy", sargs))
      throw InputError(source, "<no FSDPStrategy(...)>", "a Lightning snippet with FSDPStrategy(...) and Trainer(...)");
    if (!call_arguments(text, "Trainer", targs)) call_arguments(text, "Fabric", targs);
    apply_lightning(keyword_arguments(sargs), keyword_arguments(targs), "FSDPStrategy.", "Trainer.", model, cfg);
    std::smatch m;
    if (std::regex_search(text, m, std::regex("\\bbatch_size\\s*=\\s*([0-9]+)"))) {
      cfg.plan.micro_batch = as_int("batch_size", m[1].str(), 1, 65536);
      cfg.micro_batch_given = true;
    }
    if (text.find("gradient_checkpointing_enable") != std::string::npos) {
      cfg.hf_gradient_checkpointing = true;
      cfg.plan.activation_checkpointing.mode = AcMode::Full;
      cfg.plan.activation_checkpointing.outside_fsdp = true;
      cfg.facts.push_back("model.gradient_checkpointing_enable(): HF checkpointing outside FSDP, checkpoint(FSDP(block))");
    }
  } else if (format == "lightning-yaml" || format == "accelerate") {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw InputError(source, "<YAML error at line " + std::to_string(e.mark.line + 1) + ">", e.msg);
    }
    if (!root.IsMap()) throw InputError(source, "<not a mapping>", "a YAML mapping");
    try {
      if (format == "accelerate") {
        read_accelerate(root, model, cfg);
      } else {
        // Subscripting a scalar or sequence throws in yaml-cpp: only maps are looked into.
        auto in_map = [](const YAML::Node& n, const char* key) { return n && n.IsMap() ? n[key] : YAML::Node(); };
        YAML::Node tr = root["trainer"];
        KV trainer = yaml_map(tr);
        KV strategy;
        if (in_map(tr, "strategy").IsMap()) strategy = yaml_map(in_map(in_map(tr, "strategy"), "init_args"));
        trainer.erase("strategy");
        apply_lightning(strategy, trainer, "trainer.strategy.init_args.", "trainer.", model, cfg);
        const YAML::Node data_node = root["data"];
        KV data = yaml_map(in_map(data_node, "init_args") ? in_map(data_node, "init_args") : data_node);
        if (data.count("batch_size")) {
          cfg.plan.micro_batch = as_int("data.batch_size", data["batch_size"], 1, 65536);
          cfg.micro_batch_given = true;
        }
      }
    } catch (const YAML::Exception& e) {   // e.g. a key that is itself a mapping or a sequence
      throw InputError(source, "<YAML structure at line " + std::to_string(e.mark.line + 1) + ">", e.msg);
    }
  } else if (format == "torchtitan") {
    read_torchtitan(text, source, cfg);
  } else if (format == "plan") {
    cfg.plan = sim::parse_plan(parse_json_text(text, source));
    cfg.micro_batch_given = cfg.seq_len_given = true;
    cfg.wrap_policy_given = true;
  } else {
    throw InputError("--format", format, "lightning, lightning-yaml, accelerate, torchtitan or plan");
  }
  read_directive(text, cfg);
  if (!cfg.wrap_policy_given || cfg.plan.auto_wrap_policy.kind == models::WrapPolicy::Kind::None) cfg.wraps_nothing = true;
  return cfg;
}

UserConfig read_user_config(const std::string& path, const ReadOptions& opts, const models::ModelSpec& model) {
  std::string text = read_text_file(path, "--config");
  std::string fmt = opts.format;
  if (fmt.empty()) {
    auto ends = [&](const char* e) {
      std::string s(e);
      return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
    };
    if (ends(".py")) fmt = "lightning";
    else if (ends(".toml")) fmt = "torchtitan";
    else if (ends(".json")) fmt = "plan";
    else if (ends(".yaml") || ends(".yml"))
      fmt = (text.find("fsdp_config") != std::string::npos || text.find("distributed_type") != std::string::npos) ? "accelerate"
                                                                                                                  : "lightning-yaml";
    else throw InputError("--config", path, "a .py (Lightning), .yaml (accelerate or LightningCLI), .toml (torchtitan) or .json (plan) file, or give --format");
  }
  UserConfig cfg = parse_user_config_text(text, fmt, path, model);
  if (opts.micro_batch > 0) { cfg.plan.micro_batch = opts.micro_batch; cfg.micro_batch_given = true; }
  if (opts.seq_len > 0) { cfg.plan.seq_len = opts.seq_len; cfg.seq_len_given = true; }
  if (opts.grad_accum > 0) cfg.plan.grad_accum = opts.grad_accum;
  return cfg;
}

}  // namespace fsdpsim::planner
