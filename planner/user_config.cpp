// Readers of users' configurations (note "diagnose input forms" in user_config.h): the dispatch;
// one reader per front-end in planner/read_*.cpp, their shared scanning in planner/config_text.cpp.
#include "planner/user_config.h"

#include <algorithm>
#include <regex>
#include <set>

#include <yaml-cpp/yaml.h>

#include "common/errors.h"
#include "common/json_reader.h"
#include "models/wrap_graph.h"
#include "planner/config_readers.h"
#include "planner/config_text.h"
#include "program/optimizer_state.h"

namespace fsdpsim::planner {
namespace {

// Module names of the frameworks' LoRA configs -> plan.lora targets (sim::lora_target_names).
void add_module_target(const std::string& raw, std::set<std::string>& on, std::vector<std::string>& unknown) {
  std::string n = raw;
  const auto dot = n.rfind('.');
  if (dot != std::string::npos) n = n.substr(dot + 1);
  static const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> map = {
      {{"q_proj", "wq", "query", "q"}, {"q"}},
      {{"k_proj", "wk", "key", "k"}, {"k"}},
      {{"v_proj", "wv", "value", "v"}, {"v"}},
      {{"o_proj", "output_proj", "out_proj", "wo", "dense"}, {"o"}},
      {{"gate_proj", "w1", "fc_1"}, {"gate"}},
      {{"up_proj", "w3", "fc_2", "c_fc"}, {"up"}},
      {{"down_proj", "w2"}, {"down"}},
      {{"c_attn", "Wqkv", "qkv_proj", "query_key_value"}, {"q", "k", "v"}},
      {{"lm_head", "output"}, {"head"}},
      {{"all-linear"}, {"q", "k", "v", "o", "gate", "up", "down"}},
  };
  for (const auto& [names, targets] : map)
    if (std::find(names.begin(), names.end(), n) != names.end()) {
      on.insert(targets.begin(), targets.end());
      return;
    }
  unknown.push_back(raw);
}

bool truthy(const std::string& v) { return v == "True" || v == "true" || v == "1"; }

// LoRA settings in a user's script or YAML, read into plan.lora: litgpt's finetune/lora.py globals and CLI
// flags (lora_r, lora_alpha, lora_dropout, lora_query, lora_key, lora_value, lora_projection, lora_mlp,
// lora_head), torchtune's LoRA model arguments (lora_rank, lora_attn_modules, apply_lora_to_mlp,
// apply_lora_to_output, lora_dropout) and PEFT's LoraConfig(r=..., target_modules=[...], lora_dropout=...).
void read_lora(const std::string& text, UserConfig& cfg) {
  const auto value = [&](const std::string& key, std::string& out) {
    const std::regex re("(?:^|[\\s,(-])" + key + R"(\s*(?:=|:|\s)\s*["']?([A-Za-z0-9_.+-]+))");
    std::smatch m;
    if (!std::regex_search(text, m, re)) return false;
    out = m[1].str();
    return true;
  };
  std::string rank_text, v;
  std::string how;
  std::set<std::string> on;
  std::vector<std::string> unknown;
  if (value("lora_r", rank_text)) {
    how = "litgpt lora_r = " + rank_text;
    const std::pair<const char*, std::vector<std::string>> flags[] = {
        {"lora_query", {"q"}}, {"lora_key", {"k"}}, {"lora_value", {"v"}}, {"lora_projection", {"o"}},
        {"lora_mlp", {"gate", "up", "down"}}, {"lora_head", {"head"}}};
    for (const auto& [flag, targets] : flags)
      if (value(flag, v) && truthy(v)) on.insert(targets.begin(), targets.end());
  } else if (value("lora_rank", rank_text)) {
    how = "torchtune lora_rank: " + rank_text;
    std::smatch m;
    if (std::regex_search(text, m, std::regex(R"(lora_attn_modules\s*[:=]\s*\[([^\]]*)\])"))) {
      const std::string list = m[1].str();
      static const std::regex word(R"([A-Za-z_0-9]+)");
      for (std::sregex_iterator it(list.begin(), list.end(), word), end; it != end; ++it)
        add_module_target(it->str(), on, unknown);
    }
    if (value("apply_lora_to_mlp", v) && truthy(v)) on.insert({"gate", "up", "down"});
    if (value("apply_lora_to_output", v) && truthy(v)) on.insert("head");
  } else {
    std::smatch m;
    if (!std::regex_search(text, m, std::regex(R"(LoraConfig\s*\(([^)]*)\))"))) return;
    const std::string args = m[1].str();
    std::smatch a;
    if (!std::regex_search(args, a, std::regex(R"((?:^|[\s,])r\s*=\s*([0-9]+))"))) return;
    rank_text = a[1].str();
    how = "PEFT LoraConfig(r=" + rank_text + ")";
    if (std::regex_search(args, a, std::regex(R"(target_modules\s*=\s*\[([^\]]*)\])"))) {
      const std::string list = a[1].str();
      static const std::regex name(R"([A-Za-z_0-9.\-]+)");
      for (std::sregex_iterator it(list.begin(), list.end(), name), end; it != end; ++it)
        add_module_target(it->str(), on, unknown);
    } else if (std::regex_search(args, a, std::regex(R"(target_modules\s*=\s*["']([^"']+)["'])"))) {
      add_module_target(a[1].str(), on, unknown);
    }
    if (std::regex_search(args, a, std::regex(R"(lora_dropout\s*=\s*([0-9.eE+-]+))"))) v = a[1].str();
    else v.clear();
  }
  if (how.rfind("PEFT", 0) != 0) {
    if (!value("lora_dropout", v)) v.clear();
  }
  for (const auto& u : unknown)
    cfg.warnings.push_back("LoRA target module `" + u + "` is not one fsdpsim knows (q, k, v, o, gate, up, down, head): left out");
  if (on.empty()) {
    cfg.warnings.push_back(how + ": no LoRA target read; the plan trains every parameter");
    return;
  }
  nlohmann::json j;
  try {
    j["rank"] = std::stoll(rank_text);
  } catch (const std::exception&) {
    throw InputError("lora rank", rank_text, "an integer");
  }
  j["targets"] = std::vector<std::string>(on.begin(), on.end());
  if (!v.empty()) {
    try {
      j["dropout"] = std::stod(v);
    } catch (const std::exception&) {
      throw InputError("lora_dropout", v, "a probability in [0, 1)");
    }
  }
  // QLoRA: torchtune's qlora_* builders (or a builder's quantize_base: True) make torchao NF4 base weights.
  std::string quantize;
  const bool torchtune_nf4 = how.rfind("torchtune", 0) == 0 &&
                             (std::regex_search(text, std::regex(R"(\.qlora_[A-Za-z0-9_]+)")) ||
                              (value("quantize_base", quantize) && truthy(quantize)));
  // bitsandbytes' NF4 (transformers' BitsAndBytesConfig, litgpt's bnb.nf4): modelled under FSDP1 (models/nf4.h)
  const bool bnb4 = std::regex_search(text, std::regex(R"(load_in_4bit\s*[=:]\s*[Tt]rue|bnb\.nf4)"));
  const bool bnb_fp4 = std::regex_search(text, std::regex(R"(bnb_4bit_quant_type\s*[=:]\s*["']?fp4)"));
  const bool bnb_nf4 = bnb4 && !bnb_fp4 && cfg.plan.fsdp_version == sim::FsdpVersion::FSDP1;
  if (torchtune_nf4 || bnb_nf4) j["quantize_base"] = "nf4";
  if (bnb4 && !bnb_nf4)
    cfg.warnings.push_back(std::string("bitsandbytes 4-bit base weights ") +
                           (bnb_fp4 ? "in FP4 are not modelled (NF4 is)"
                                    : "under FSDP2 are not modelled (under FSDP1 they are)") +
                           ": the plan keeps the base weights in the compute dtype");
  cfg.plan.lora = sim::parse_lora(j, "lora (" + how + ")");
  std::string targets;
  for (const auto& t : cfg.plan.lora.targets) targets += (targets.empty() ? "" : ", ") + t;
  cfg.facts.push_back("LoRA rank " + std::to_string(cfg.plan.lora.rank) + " on " + targets + " read from " + how +
                      " -> plan lora (adapters train, base weights frozen" +
                      (torchtune_nf4 || bnb_nf4 ? ", NF4 base weights: lora.quantize_base nf4)" : ")"));
}

// The optimizer a config or script builds (plan key `optimizer`, program/optimizer_state.h): a class path, as
// torchtune's `optimizer: _component_:`, LightningCLI's `class_path:` or a script's constructor call spells it,
// else Hugging Face TrainingArguments' `optim` (transformers' OptimizerNames). What is not modelled is kept as
// torch.optim's AdamW with a warning.
void read_optimizer(const std::string& text, UserConfig& cfg) {
  using O = sim::Optimizer;
  struct Name {
    const char* name;
    O o;
  };
  static const std::regex class_re(
      R"((bitsandbytes\.optim|bnb\.optim|torchao\.optim|torchao\.prototype\.low_bit_optim|torch\.optim)\.([A-Z][A-Za-z0-9_]*))");
  // `from bitsandbytes.optim import PagedAdamW8bit` (then the bare class name in the script)
  static const std::regex import_re(
      R"(from\s+(bitsandbytes\.optim|torchao\.optim|torchao\.prototype\.low_bit_optim)\s+import\s+\(?\s*([A-Z][A-Za-z0-9_]*))");
  static const std::regex hf_re(R"((?:^|[\s,(])optim\s*[=:]\s*["']?([A-Za-z0-9_]+))");
  std::smatch m;
  std::string how;
  O o = O::AdamW;
  bool known = false, fused = false;
  if (std::regex_search(text, m, class_re) || std::regex_search(text, m, import_re)) {
    const std::string lib = m[1].str(), cls = m[2].str();
    how = lib + "." + cls;
    static const std::vector<Name> bnb = {{"AdamW8bit", O::BnbAdamW8bit},       {"Adam8bit", O::BnbAdamW8bit},
                                          {"PagedAdamW8bit", O::BnbPagedAdamW8bit}, {"PagedAdam8bit", O::BnbPagedAdamW8bit},
                                          {"PagedAdamW", O::BnbPagedAdamW},         {"PagedAdamW32bit", O::BnbPagedAdamW},
                                          {"PagedAdam", O::BnbPagedAdamW},          {"PagedAdam32bit", O::BnbPagedAdamW}};
    static const std::vector<Name> ao = {{"AdamW8bit", O::TorchaoAdamW8bit}, {"Adam8bit", O::TorchaoAdamW8bit},
                                         {"AdamW4bit", O::TorchaoAdamW4bit}, {"Adam4bit", O::TorchaoAdamW4bit}};
    static const std::vector<Name> torch = {{"AdamW", O::AdamW}, {"Adam", O::AdamW}, {"SGD", O::SGD}};
    const std::vector<Name>& names = lib.rfind("torchao", 0) == 0 ? ao : lib == "torch.optim" ? torch : bnb;
    for (const Name& n : names)
      if (cls == n.name) o = n.o, known = true;
    fused = lib == "torch.optim" && std::regex_search(text, std::regex(R"(fused\s*[=:]\s*[Tt]rue)"));
  } else if (std::regex_search(text, m, hf_re)) {
    how = "optim " + m[1].str();
    static const std::vector<Name> hf = {{"adamw_torch", O::AdamW},           {"adamw_torch_fused", O::AdamW},
                                         {"adamw_hf", O::AdamW},              {"sgd", O::SGD},
                                         {"adamw_bnb_8bit", O::BnbAdamW8bit}, {"adamw_8bit", O::BnbAdamW8bit},
                                         {"paged_adamw_8bit", O::BnbPagedAdamW8bit}, {"paged_adamw_32bit", O::BnbPagedAdamW},
                                         {"adamw_torch_8bit", O::TorchaoAdamW8bit}, {"adamw_torch_4bit", O::TorchaoAdamW4bit}};
    for (const Name& n : hf)
      if (m[1].str() == n.name) o = n.o, known = true;
    fused = m[1].str() == "adamw_torch_fused";
  } else {
    return;
  }
  if (!known) {
    cfg.warnings.push_back(how + ": this optimizer is not modelled: simulated as torch.optim.AdamW (two states in the "
                           "parameter's dtype)");
    return;
  }
  sim::Plan with = cfg.plan;
  with.optimizer = o;
  if (const std::string why = sim::optimizer_not_modelled(with); !why.empty()) {
    cfg.warnings.push_back(how + ": " + why + "; simulated as torch.optim.AdamW (two states in the parameter's dtype)");
    return;
  }
  cfg.plan.optimizer = o;
  if (fused) cfg.plan.optimizer_impl = sim::OptimizerImpl::Fused;
  cfg.facts.push_back(how + " -> plan optimizer " + sim::plan_to_json(cfg.plan)["optimizer"].get<std::string>() +
                      (fused ? " (optimizer_impl fused)" : ""));
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
    read_lightning_script(text, source, model, cfg);
  } else if (format == "lightning-yaml" || format == "accelerate" || format == "torchtune") {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw InputError(source, "<YAML error at line " + std::to_string(e.mark.line + 1) + ">", e.msg);
    }
    if (!root.IsMap()) throw InputError(source, "<not a mapping>", "a YAML mapping");
    try {
      if (format == "accelerate") read_accelerate(root, model, cfg);
      else if (format == "torchtune") read_torchtune(root, text, model, cfg);
      else read_lightning_yaml(root, model, cfg);
    } catch (const YAML::Exception& e) {   // e.g. a key that is itself a mapping or a sequence
      throw InputError(source, "<YAML structure at line " + std::to_string(e.mark.line + 1) + ">", e.msg);
    }
  } else if (format == "torchtitan") {
    read_torchtitan(text, source, model, cfg);
  } else if (format == "plan") {
    cfg.plan = sim::parse_plan(parse_json_text(text, source));
    cfg.micro_batch_given = cfg.seq_len_given = true;
    cfg.wrap_policy_given = true;
  } else {
    throw InputError("--format", format, "lightning, lightning-yaml, accelerate, torchtune, torchtitan or plan");
  }
  if (format != "plan") read_lora(text, cfg);
  if (format == "torchtune" && cfg.plan.lora.on() && !cfg.plan.lora.adapts("head")) {
    // Every unit without a block: the root, and the embedding and output when custom_sharded_layers wraps them.
    try {
      cfg.plan.frozen_units.clear();
      for (const models::FsdpUnit& u : models::build_wrap_graph(model, cfg.plan.auto_wrap_policy).units)
        if (u.layers.empty()) cfg.plan.frozen_units.push_back(u.is_root ? "root" : u.name);
    } catch (const InputError&) {   // a policy the model cannot take: the simulation names it; the root alone here
      cfg.plan.frozen_units = {"root"};
    }
    std::string names;
    for (const std::string& n : cfg.plan.frozen_units) names += (names.empty() ? "" : ", ") + n;
    cfg.facts.push_back("LoRA in torchtune trains the adapters alone: the units outside the layers (" + names +
                        ") hold no trainable parameter (frozen_units)");
  }
  if (format != "plan" && format != "torchtitan") read_optimizer(text, cfg);   // (torchtitan's [optimizer] is read)
  config_text::read_directive(text, cfg);
  if (!cfg.wrap_policy_given || cfg.plan.auto_wrap_policy.kind == models::WrapPolicy::Kind::None) cfg.wraps_nothing = true;
  return cfg;
}

std::string yaml_format_of(const std::string& text) {
  if (text.find("fsdp_config") != std::string::npos || text.find("distributed_type") != std::string::npos)
    return "accelerate";
  if (std::regex_search(text, std::regex(R"(_component_\s*:\s*["']?torchtune\.)"))) return "torchtune";
  return "lightning-yaml";
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
      fmt = yaml_format_of(text);
    else throw InputError("--config", path, "a .py (Lightning), .yaml (accelerate, torchtune or LightningCLI), .toml (torchtitan) or .json (plan) file, or give --format");
  }
  UserConfig cfg = parse_user_config_text(text, fmt, path, model);
  if (opts.micro_batch > 0) { cfg.plan.micro_batch = opts.micro_batch; cfg.micro_batch_given = true; }
  if (opts.seq_len > 0) { cfg.plan.seq_len = opts.seq_len; cfg.seq_len_given = true; }
  if (opts.grad_accum > 0) cfg.plan.grad_accum = opts.grad_accum;
  return cfg;
}

}  // namespace fsdpsim::planner
