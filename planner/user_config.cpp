// Readers of users' configurations (note "diagnose input forms" in user_config.h): the dispatch;
// one reader per front-end in planner/read_*.cpp, their shared scanning in planner/config_text.cpp.
#include "planner/user_config.h"

#include <yaml-cpp/yaml.h>

#include "common/errors.h"
#include "common/json_reader.h"
#include "planner/config_readers.h"
#include "planner/config_text.h"

namespace fsdpsim::planner {

UserConfig parse_user_config_text(const std::string& text, const std::string& format, const std::string& source,
                                  const models::ModelSpec& model) {
  UserConfig cfg;
  cfg.format = format;
  cfg.source = source;
  cfg.plan.seq_len = 2048;
  cfg.plan.micro_batch = 1;
  if (format == "lightning") {
    read_lightning_script(text, source, model, cfg);
  } else if (format == "lightning-yaml" || format == "accelerate") {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw InputError(source, "<YAML error at line " + std::to_string(e.mark.line + 1) + ">", e.msg);
    }
    if (!root.IsMap()) throw InputError(source, "<not a mapping>", "a YAML mapping");
    try {
      if (format == "accelerate") read_accelerate(root, model, cfg);
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
    throw InputError("--format", format, "lightning, lightning-yaml, accelerate, torchtitan or plan");
  }
  config_text::read_directive(text, cfg);
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
