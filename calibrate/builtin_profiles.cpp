#include "calibrate/builtin_profiles.h"

#include <map>

#include "common/errors.h"
#include "common/json_reader.h"

namespace fsdpsim::calibrate {
namespace {

struct Catalog {
  std::map<std::string, nlohmann::json> gpus, fabrics;
};

// Parsed once, on first use; the embedded text is fixed at build time.
const Catalog& catalog() {
  static const Catalog c = [] {
    Catalog cat;
    for (const auto& f : embedded_profile_files()) {
      std::string path = f.path;
      nlohmann::json j = parse_json_text(f.text, "calibrate/profiles/" + path);
      std::string name = j.at("name").get<std::string>();
      if (path.rfind("gpus/", 0) == 0) cat.gpus[name] = std::move(j);
      else if (path.rfind("fabrics/", 0) == 0) cat.fabrics[name] = std::move(j);
    }
    return cat;
  }();
  return c;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

}  // namespace

std::vector<std::string> builtin_gpu_names() {
  std::vector<std::string> v;
  for (const auto& [k, _] : catalog().gpus) v.push_back(k);
  return v;
}

std::vector<std::string> builtin_fabric_names() {
  std::vector<std::string> v;
  for (const auto& [k, _] : catalog().fabrics) v.push_back(k);
  return v;
}

std::vector<std::string> builtin_fabric_names(const std::string& kind) {
  std::vector<std::string> v;
  for (const auto& [k, j] : catalog().fabrics)
    if (j.value("kind", "") == kind) v.push_back(k);
  return v;
}

bool is_builtin_gpu(const std::string& name) { return catalog().gpus.count(name) > 0; }
bool is_builtin_fabric(const std::string& name) { return catalog().fabrics.count(name) > 0; }

const nlohmann::json& builtin_gpu_json(const std::string& name, const std::string& field) {
  auto it = catalog().gpus.find(name);
  if (it == catalog().gpus.end())
    throw InputError(field, "\"" + name + "\"", "unknown GPU; built-in GPUs: " + join(builtin_gpu_names()));
  return it->second;
}

const nlohmann::json& builtin_fabric_json(const std::string& name, const std::string& field) {
  auto it = catalog().fabrics.find(name);
  if (it == catalog().fabrics.end())
    throw InputError(field, "\"" + name + "\"", "unknown fabric; built-in fabrics: " + join(builtin_fabric_names()));
  return it->second;
}

}  // namespace fsdpsim::calibrate
