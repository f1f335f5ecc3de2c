// Internal: one reader per front-end for `fsdpsim diagnose` (note "diagnose input forms" in
// user_config.h); parse_user_config_text dispatches to them.
#pragma once
#include <string>

#include <yaml-cpp/yaml.h>

#include "models/model_spec.h"
#include "planner/user_config.h"

namespace fsdpsim::planner {

// planner/read_lightning.cpp: a Python script (FSDPStrategy(...) or strategy="fsdp", Trainer/Fabric)
// and the LightningCLI YAML form.
void read_lightning_script(const std::string& text, const std::string& source, const models::ModelSpec& model,
                           UserConfig& cfg);
void read_lightning_yaml(const YAML::Node& root, const models::ModelSpec& model, UserConfig& cfg);
// planner/read_accelerate.cpp: `accelerate config` YAML.
void read_accelerate(const YAML::Node& root, const models::ModelSpec& model, UserConfig& cfg);
// planner/read_torchtune.cpp: a torchtune recipe config (YAML with `_component_:` entries).
void read_torchtune(const YAML::Node& root, const std::string& text, const models::ModelSpec& model, UserConfig& cfg);
// planner/read_torchtitan.cpp: a torchtitan TOML job config.
void read_torchtitan(const std::string& text, const std::string& source, const models::ModelSpec& model, UserConfig& cfg);

}  // namespace fsdpsim::planner
