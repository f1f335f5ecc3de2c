// The built-in model zoo and the Hugging Face config.json importer.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"

namespace fsdpsim::models {

std::vector<std::string> zoo_names();
// A zoo short name ("llama3-8b") or a path to a config.json; InputError(field, ...) otherwise.
ModelSpec load_model(const std::string& name_or_path, const std::string& field = "--model");
// Import a parsed HF config.json as-is (llama, mistral, qwen2, gemma, gpt2, mixtral).
ModelSpec import_hf_config(const nlohmann::json& config, const std::string& source);
// Validates sizes (positive, not absurd, divisibility); InputError naming the field.
void validate_model(const ModelSpec& m, const std::string& source);
nlohmann::json model_to_json(const ModelSpec& m);

}  // namespace fsdpsim::models
