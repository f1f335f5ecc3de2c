// The built-in GPU and fabric profiles (calibrate/profiles/{gpus,fabrics}/*.json), embedded into the
// library at build time (calibrate/embed_profiles.cmake). Every number in them carries a "source".
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpsim::calibrate {

struct EmbeddedFile {
  const char* path;   // relative to calibrate/profiles, e.g. "gpus/H100-SXM.json"
  const char* text;   // the file's JSON text
};
// Defined in the generated builtin_profiles_data.cpp.
const std::vector<EmbeddedFile>& embedded_profile_files();

std::vector<std::string> builtin_gpu_names();      // "A100-40GB", "A100-80GB", "B200", "CPU", "H100-SXM", "H200", "RTX4090"
std::vector<std::string> builtin_fabric_names();   // intra- and inter-node fabrics
std::vector<std::string> builtin_fabric_names(const std::string& kind);  // "intra_node" or "inter_node"
bool is_builtin_gpu(const std::string& name);
bool is_builtin_fabric(const std::string& name);
// The parsed JSON; an unknown name is InputError(field, name, <the allowed names>).
const nlohmann::json& builtin_gpu_json(const std::string& name, const std::string& field);
const nlohmann::json& builtin_fabric_json(const std::string& name, const std::string& field);

}  // namespace fsdpsim::calibrate
