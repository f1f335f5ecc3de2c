// Plan keys as one table (issue 22 stage 4): one descriptor per key of the plan JSON, in the order
// plan.cpp documents them. Everything that reads or prints a key goes through its descriptor: the JSON
// reader and writer (parse_plan, plan_to_json), the FSDP-version checks (resolve_plan), the text form
// the planner's `--fix` / `--exclude` take and prints (planner/search_space.cpp), and the frameworks'
// spellings of the key that diagnose's readers and the exporters use (planner/read_*.cpp, export_*.cpp).
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/json_reader.h"
#include "program/plan.h"

namespace fsdpsim::sim {

// Which FSDP versions have a key. A one-version key that a plan of the other version uses is an
// InputError naming the key (PlanKey::refused); limit_all_gathers is the exception: FSDP2 ignores it.
enum class KeyVersions { Both, Fsdp1Only, Fsdp2Only };

// How `fsdpsim plan` treats a key: searched (--fix keeps the candidates with that value, --exclude drops
// them), base (--fix sets it on every candidate), or not settable from the command line.
enum class SearchRole { None, Searched, Base };

// The front-ends whose configs diagnose reads and the exporters write (ecosystem.md §2).
enum class Framework { Lightning, Accelerate, TorchTitan };
struct Spelling {
  Framework framework;
  std::string key;      // as the framework's config names it ("fsdp_config.fsdp_sharding_strategy")
};

struct PlanKey {
  std::string name;                  // the JSON key, PyTorch's word
  KeyVersions versions = KeyVersions::Both;
  std::string default_json;          // the default as plan_to_json prints it ("" where it is derived)
  // ---- JSON ----
  // Reads the key (present and not null) into the plan; InputError naming "plan.<name>".
  std::function<void(const JsonReader& r, Plan& p)> read;
  // Writes the plan's value into the plan object (nothing where the key does not print for this plan).
  std::function<void(const Plan& p, Json& out)> write;
  // ---- FSDP version ----
  // When set: whether the plan uses the key in a way its FSDP version cannot (refused by check_versions
  // with `version_error`, the value shown as refused_value prints it). given_refused: any value given in
  // the JSON to a plan of the other version is refused at once by parse_plan (reshard_after_forward).
  std::function<bool(const Plan& p)> refused;
  std::function<std::string(const Plan& p)> refused_value;
  std::string version_error;
  bool given_refused = false;
  // ---- text form (--fix key=value, framework configs) ----
  SearchRole search = SearchRole::None;
  // A value as typed -> the canonical text, or InputError(field, ...). Unset: the text is kept as typed
  // (base keys: `set` checks it).
  std::function<std::string(const std::string& field, const std::string& text)> canonical;
  // The plan's value as canonical text ("n/a" where the plan's FSDP version has no such setting).
  std::function<std::string(const Plan& p)> text;
  // Sets the key on a plan from its text (InputError(field, text, ...) when the key cannot take it).
  std::function<void(Plan& p, const std::string& text, const std::string& field)> set;
  // ---- elsewhere ----
  std::vector<Spelling> spellings;   // the frameworks' names for the key
  bool per_module = false;           // settable per FSDP unit in module_overrides
};

// Every plan key, in the order plan.cpp documents them.
const std::vector<PlanKey>& plan_keys();
// The key's descriptor, or nullptr.
const PlanKey* find_plan_key(std::string_view name);
// The key's descriptor (a name that is not a plan key is a programming error: std::logic_error).
const PlanKey& plan_key(std::string_view name);
// The JSON names of every key, in table order (the reader's known keys).
const std::vector<std::string>& plan_key_names();
// The framework's name for a key ("" when the table has none), and the same inside its section (its last
// dotted part: "fsdp_sharding_strategy", "enable_cpu_offload").
std::string spelling(std::string_view key, Framework f);
std::string section_key(std::string_view key, Framework f);

// The first one-version key the plan uses against its FSDP version (table order): InputError naming it.
void check_versions(const Plan& p);

// Text forms of the plan's structured values (the planner's --fix values and the framework readers share
// them). Each throws InputError(field, text, what it takes).
std::pair<int, int> parse_mesh_text(const std::string& field, const std::string& text);   // [2,8] (2, 8) 2x8
ActivationCheckpointing parse_ac_text(const std::string& field, const std::string& text); // none full every_2 ...
ShardingStrategy parse_strategy_text(const std::string& field, const std::string& text);  // ShardingStrategy.X too
BackwardPrefetch parse_prefetch_text(const std::string& field, const std::string& text);  // null/NO_PREFETCH = NONE
ReshardAfterForward parse_reshard_text(const std::string& field, const std::string& text);   // true false k
bool parse_bool_text(const std::string& field, const std::string& text);                  // true/1/yes/on ...
// ASCII case folding, and a value as a shell or a config file may leave it: blanks and quotes around it removed.
std::string lower(std::string s);
std::string upper(std::string s);
std::string strip_quotes(const std::string& s);
// Canonical texts of those values: "[2,8]", "full" (every_1 folds into full), "FULL_SHARD", "true".
std::string mesh_value_text(int replicate, int shard);
std::string checkpointing_text(const ActivationCheckpointing& ac);

}  // namespace fsdpsim::sim
