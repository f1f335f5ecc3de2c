// Internal to the config readers (user_config.h): tolerant scanning of a user's Python, YAML and
// TOML text, and the value conversions every reader shares. Values are checked where they are read
// and a bad one is InputError naming the key as the user wrote it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "models/model_spec.h"
#include "planner/user_config.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner::config_text {

using KV = std::map<std::string, std::string>;

std::string trim(const std::string& s);
std::string unquote(std::string s);
std::string last_component(const std::string& s);   // "ShardingStrategy.FULL_SHARD" -> "FULL_SHARD"
using sim::lower;
using sim::upper;
bool as_bool(const std::string& key, const std::string& v);   // True/False, 1/0, CPUOffload(offload_params=...)
long long as_int(const std::string& key, const std::string& v, long long lo, long long hi);
std::vector<std::string> as_names(const std::string& v);     // identifiers of "{A, B}", "[A]", "A,B"
std::vector<long long> as_ints(const std::string& v);

// The text without Python comments (quotes respected): what the scanners below look at, so a call
// named in a comment is not read as code.
std::string strip_python_comments(const std::string& text);
// The text between the parentheses of the first call `name(` (balanced, quotes and comments
// respected); false when there is none.
bool call_arguments(const std::string& text, const std::string& name, std::string& out);
// key=value pairs at the top level of an argument list (positional arguments are ignored).
KV keyword_arguments(const std::string& args);

// YAML: a scalar as text, a sequence as "[a, b]"; a map's entries as KV.
std::string yaml_text(const YAML::Node& n);
KV yaml_map(const YAML::Node& n);

// Sets a plan key from a config's value through the key's text form (program/plan_keys.h), as `--fix` reads
// it (quotes stripped); an error names `key` and the plan key ("fsdp_config.fsdp_backward_prefetch
// backward_prefetch").
void set_plan_key(sim::Plan& p, const std::string& plan_key, const std::string& value, const std::string& key);

// `# fsdpsim: micro_batch=2 seq_len=8192 grad_accum=4`
void read_directive(const std::string& text, UserConfig& cfg);

// The first integer assigned to a sequence-length name in a script or YAML text (`seq_len = 4096`,
// `max_seq_length: 2048`, `block_size=1024`, ...); sets plan.seq_len and a fact. No-op when none.
void read_sequence_length(const std::string& text, UserConfig& cfg);

// The closest of `known` to `key` when it is a likely misspelling (edit distance <= 2, or <= 3 for
// long keys), else "".
std::string closest_key(const std::string& key, const std::vector<std::string>& known);

// Whether `cls` names a block of the model under the implementation that runs it: the Hugging Face
// class (model.block_class), LitGPT's `Block` or torchtitan's `TransformerBlock`.
bool names_block(const std::vector<std::string>& classes, const models::ModelSpec& model, models::ModelImpl impl);
std::string block_class_for(const models::ModelSpec& model, models::ModelImpl impl);

}  // namespace fsdpsim::planner::config_text
