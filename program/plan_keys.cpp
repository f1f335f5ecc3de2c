// The plan-key table (plan_keys.h). The keys' meanings, values and defaults are documented at the top of
// plan.cpp; this file is how each is read, printed, checked and spelled.
#include "program/plan_keys.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "common/errors.h"

namespace fsdpsim::sim {

ReshardAfterForward ReshardAfterForward::group(int k) {
  if (k < 2) throw std::invalid_argument("ReshardAfterForward::group(" + std::to_string(k) + "): a group has k > 1 GPUs");
  return ReshardAfterForward(k);
}

std::string ReshardAfterForward::text() const {
  if (is_unset()) return "unset";
  if (is_group()) return std::to_string(code_);
  return keeps() ? "false" : "true";
}

namespace {

using AcMode = ActivationCheckpointing::Mode;

constexpr std::int64_t kMaxMesh = 1 << 20;          // far above any cluster; guards overflow
constexpr int kMaxPrefetchDepth = 16;                // P6: deeper prefetch only adds memory

const std::vector<std::string> kStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                              "_HYBRID_SHARD_ZERO2"};

bool parse_long(const std::string& s, long long& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtoll(s.c_str(), &end, 10);
  return *end == '\0';
}
std::string bool_text(bool b) { return b ? "true" : "false"; }

// ---- JSON readers of the structured keys ------------------------------------------------------

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
  const std::string allowed = "expected \"none\", \"full\", \"selective_op\", \"every_<k>\" or {mode, every_k, outside_fsdp, outside_compile}";
  ActivationCheckpointing ac;
  auto set_mode = [&](const std::string& s, const std::string& f) {
    if (s == "none") ac.mode = AcMode::None;
    else if (s == "full") ac.mode = AcMode::Full;
    else if (s == "selective_op") ac.mode = AcMode::SelectiveOp;
    else if (s == "every_k") ac.mode = AcMode::EveryK;
    else if (s.rfind("every_", 0) == 0) {
      ac.mode = AcMode::EveryK;
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
  r.check_no_unknown_keys({"mode", "every_k", "outside_fsdp", "outside_compile"});
  set_mode(r.get_string("mode", "full"), r.field("mode"));
  if (r.has("every_k")) {
    int k = static_cast<int>(r.get_int("every_k", 1, 999999));
    if (ac.mode != AcMode::EveryK) throw InputError(r.field("every_k"), std::to_string(k), "only with mode \"every_k\"");
    ac.every_k = k;
  }
  ac.outside_fsdp = r.get_bool("outside_fsdp", false);
  ac.outside_compile = r.get_bool("outside_compile", false);
  return ac;
}

Json ac_json(const ActivationCheckpointing& ac) {
  if (!ac.outside_fsdp && !ac.outside_compile) return checkpointing_name(ac);
  Json a = {{"mode", ac.mode == AcMode::EveryK ? "every_k" : checkpointing_name(ac)}};
  if (ac.outside_fsdp) a["outside_fsdp"] = true;
  if (ac.outside_compile) a["outside_compile"] = true;
  if (ac.mode == AcMode::EveryK) a["every_k"] = ac.every_k;
  return a;
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

Json wrap_json(const models::WrapPolicy& w) {
  switch (w.kind) {
    case models::WrapPolicy::Kind::TransformerBlock: return "transformer_block";
    case models::WrapPolicy::Kind::None: return "none";
    case models::WrapPolicy::Kind::Size: return {{"min_num_params", w.min_num_params}};
    case models::WrapPolicy::Kind::Modules: return {{"modules", w.modules}};
  }
  return "transformer_block";
}

Dtype parse_compute_dtype(const JsonReader& r, const std::string& key) {
  Dtype d = parse_dtype(r.get_string(key), r.field(key));
  // fp8 is not a dtype FSDP computes, reduces or keeps masters in; the fp8 all-gather is its own key (D4).
  if (d == Dtype::FP8)
    throw InputError(r.field(key), "\"" + r.get_string(key) + "\"",
                     "expected fp32, bf16 or fp16 (for fp8 all-gathers set fp8_all_gather: true)");
  return d;
}

// The per-module keys (PlanKey::per_module) are what a module_overrides entry may set.
std::vector<std::string> per_module_keys();

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
    r.check_no_unknown_keys(per_module_keys());
    ModuleOverride m;
    m.module = name;
    if (r.has("reshard_after_forward")) m.reshard_after_forward = ReshardAfterForward::of(r.get_bool("reshard_after_forward"));
    out.push_back(std::move(m));
  }
  return out;
}

Json module_overrides_json(const std::vector<ModuleOverride>& overrides) {
  Json o = Json::object();
  for (const auto& m : overrides) {
    Json e = Json::object();
    if (!m.reshard_after_forward.is_unset()) e["reshard_after_forward"] = !m.reshard_after_forward.keeps();
    o[m.module] = e;
  }
  return o;
}

std::vector<std::string> parse_unit_names(const Json& v) {
  const char* expected = "expected an array of FSDP unit names (as `fsdpsim model-info` lists them, or \"root\", "
                         "\"last_block\")";
  if (!v.is_array()) throw InputError("plan.frozen_units", json_value_for_message(v), expected);
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string() || e.get<std::string>().empty())
      throw InputError("plan.frozen_units", json_value_for_message(e), expected);
    out.push_back(e.get<std::string>());
  }
  return out;
}

bool is_zero2(ShardingStrategy s) {
  return s == ShardingStrategy::SHARD_GRAD_OP || s == ShardingStrategy::_HYBRID_SHARD_ZERO2;
}

// FSDP2: the strategy is only a name for (rAF, mesh) (F2.12); the reshard_after_forward it implies.
ReshardAfterForward implied_reshard(const Plan& p) {
  if (p.sharding_strategy == ShardingStrategy::NO_SHARD) return p.reshard_after_forward;
  return ReshardAfterForward::of_strategy(p.sharding_strategy);
}

// ---- text forms -------------------------------------------------------------------------------

std::string canonical_positive_int(const std::string& field, const std::string& v, long long hi) {
  long long x = 0;
  if (!parse_long(v, x) || x < 1 || x > hi) throw InputError(field, v, "an integer in [1, " + std::to_string(hi) + "]");
  return std::to_string(x);
}

// Enumerated keys: the JSON names of the values, in the order the reader's message lists them.
template <class E>
struct Names {
  std::vector<std::pair<E, std::string>> names;
  std::vector<std::string> list() const {
    std::vector<std::string> l;
    for (const auto& [e, n] : names) l.push_back(n);
    return l;
  }
  const std::string& of(E e) const {
    for (const auto& [x, n] : names)
      if (x == e) return n;
    return names.front().second;
  }
  E from(const std::string& s) const {
    for (const auto& [x, n] : names)
      if (n == s) return x;
    return names.front().first;
  }
};

// A key the plan reads with JsonReader::get_bool and prints as a JSON bool.
PlanKey bool_key(std::string name, bool Plan::*field, bool dflt, SearchRole search) {
  PlanKey k;
  k.name = name;
  k.default_json = dflt ? "true" : "false";
  k.read = [name, field](const JsonReader& r, Plan& p) { p.*field = r.get_bool(name); };
  k.write = [name, field](const Plan& p, Json& j) { j[name] = p.*field; };
  k.search = search;
  if (search == SearchRole::Searched) {
    k.canonical = [](const std::string& f, const std::string& v) { return bool_text(parse_bool_text(f, v)); };
    k.text = [field](const Plan& p) { return bool_text(p.*field); };
  }
  k.set = [field](Plan& p, const std::string& v, const std::string& f) { p.*field = parse_bool_text(f, v); };
  return k;
}

// An integer key in [lo, hi]; searched ones take the text form of a positive integer up to hi.
template <class T>
PlanKey int_key(std::string name, T Plan::*field, T lo, T hi, SearchRole search) {
  PlanKey k;
  k.name = name;
  k.default_json = std::to_string(Plan{}.*field);
  k.read = [name, field, lo, hi](const JsonReader& r, Plan& p) { p.*field = static_cast<T>(r.get_int(name, lo, hi)); };
  k.write = [name, field](const Plan& p, Json& j) { j[name] = p.*field; };
  k.search = search;
  if (search == SearchRole::Searched) {
    k.canonical = [hi](const std::string& f, const std::string& v) { return canonical_positive_int(f, v, hi); };
    k.text = [field](const Plan& p) { return std::to_string(p.*field); };
  }
  k.set = [field, hi](Plan& p, const std::string& v, const std::string& f) {
    p.*field = static_cast<T>(std::stoll(canonical_positive_int(f, v, hi)));
  };
  return k;
}

// An enumerated key read with JsonReader::get_enum; `set` takes the names in any case, `what` lists them
// for the --fix error.
template <class E>
PlanKey enum_key(std::string name, E Plan::*field, Names<E> names, std::string what) {
  PlanKey k;
  k.name = name;
  k.default_json = "\"" + names.of(Plan{}.*field) + "\"";
  k.read = [name, field, names](const JsonReader& r, Plan& p) { p.*field = names.from(r.get_enum(name, names.list())); };
  k.write = [name, field, names](const Plan& p, Json& j) { j[name] = names.of(p.*field); };
  k.set = [field, names, what](Plan& p, const std::string& v, const std::string& f) {
    const std::string l = lower(v);
    for (const auto& [e, n] : names.names)
      if (n == l) {
        p.*field = e;
        return;
      }
    throw InputError(f, v, what);
  };
  return k;
}

PlanKey dtype_key(std::string name, Dtype Plan::*field) {
  PlanKey k;
  k.name = name;
  k.default_json = "\"" + std::string(dtype_name(Plan{}.*field)) + "\"";
  k.read = [name, field](const JsonReader& r, Plan& p) { p.*field = parse_compute_dtype(r, name); };
  k.write = [name, field](const Plan& p, Json& j) { j[name] = std::string(dtype_name(p.*field)); };
  k.search = SearchRole::Searched;
  k.canonical = [](const std::string& f, const std::string& v) { return std::string(dtype_name(parse_dtype(v, f))); };
  k.text = [field](const Plan& p) { return std::string(dtype_name(p.*field)); };
  k.set = [field](Plan& p, const std::string& v, const std::string& f) { p.*field = parse_dtype(v, f); };
  return k;
}

// `--fix lora=<rank>:<target>,<target>...[:<dropout>][:nf4]` (e.g. 16:q,k,v or 8:q,v:0.05 or 16:q,v:0:nf4), or
// the plan's JSON object.
LoraPlan parse_lora_text(const std::string& text, const std::string& field) {
  const std::string what =
      "<rank>:<targets>[:<dropout>][:nf4], e.g. 16:q,v or 8:q,v:0.05 or 16:q,v:0:nf4 (QLoRA), or the plan's {\"rank\": ...}";
  if (!text.empty() && text[0] == '{') return parse_lora(parse_json_text(text, field), field);
  Json j;
  std::string v = text;
  if (v.size() > 4 && v.ends_with(":nf4")) {
    j["quantize_base"] = "nf4";
    v.resize(v.size() - 4);
  }
  const auto c1 = v.find(':');
  if (c1 == std::string::npos) throw InputError(field, text, what);
  const auto c2 = v.find(':', c1 + 1);
  long long rank = 0;
  if (!parse_long(v.substr(0, c1), rank)) throw InputError(field, text, what);
  j["rank"] = rank;
  j["targets"] = Json::array();
  const std::string targets = v.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
  std::size_t pos = 0;
  while (pos <= targets.size()) {
    const std::size_t end = std::min(targets.find(',', pos), targets.size());
    j["targets"].push_back(strip_quotes(targets.substr(pos, end - pos)));
    pos = end + 1;
  }
  if (c2 != std::string::npos) {
    char* e = nullptr;
    const std::string d = v.substr(c2 + 1);
    const double dropout = std::strtod(d.c_str(), &e);
    if (d.empty() || *e != '\0') throw InputError(field, text, what);
    j["dropout"] = dropout;
  }
  return parse_lora(j, field);
}

const std::string kLoraOrFraction = "give either lora (the adapters train, nothing else) or trainable_fraction < 1, not both";

std::vector<PlanKey> make_table() {
  using S = SearchRole;
  using F = Framework;
  std::vector<PlanKey> t;

  {
    PlanKey k;
    k.name = "fsdp_version";
    k.default_json = "2";
    k.read = [](const JsonReader& r, Plan& p) {
      p.fsdp_version = r.get_int("fsdp_version", 1, 2) == 1 ? FsdpVersion::FSDP1 : FsdpVersion::FSDP2;
    };
    k.write = [](const Plan& p, Json& j) { j["fsdp_version"] = static_cast<int>(p.fsdp_version); };
    k.search = S::Searched;
    k.canonical = [](const std::string& f, const std::string& v) {
      if (v == "1" || v == "2") return v;
      throw InputError(f, v, "fsdp_version is 1 or 2");
    };
    k.text = [](const Plan& p) { return p.fsdp_version == FsdpVersion::FSDP1 ? "1" : "2"; };
    k.set = [](Plan& p, const std::string& v, const std::string& f) {
      const std::string c = plan_key("fsdp_version").canonical(f, v);
      p.fsdp_version = c == "1" ? FsdpVersion::FSDP1 : FsdpVersion::FSDP2;
    };
    k.spellings = {{F::Accelerate, "fsdp_config.fsdp_version"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "mesh";   // default derived by resolve_plan
    k.read = [](const JsonReader& r, Plan& p) { parse_mesh(r.raw("mesh"), p); };
    k.write = [](const Plan& p, Json& j) {
      if (p.mesh_replicate > 0 && p.mesh_shard > 0) j["mesh"] = {{"replicate", p.mesh_replicate}, {"shard", p.mesh_shard}};
    };
    k.search = S::Searched;
    k.canonical = [](const std::string& f, const std::string& v) {
      auto [r, s] = parse_mesh_text(f, v);
      return mesh_value_text(r, s);
    };
    k.text = [](const Plan& p) { return mesh_value_text(p.mesh_replicate, p.mesh_shard); };
    k.set = [](Plan& p, const std::string& v, const std::string& f) {
      std::tie(p.mesh_replicate, p.mesh_shard) = parse_mesh_text(f, v);
    };
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "sharding_strategy";
    k.default_json = "\"FULL_SHARD\"";
    k.read = [](const JsonReader& r, Plan& p) {
      const std::string s = r.get_enum("sharding_strategy", kStrategies);
      p.sharding_strategy = static_cast<ShardingStrategy>(std::find(kStrategies.begin(), kStrategies.end(), s) - kStrategies.begin());
      // FSDP2: without reshard_after_forward the strategy sets it (reshard_after_forward's reader checks both).
      if (p.fsdp_version == FsdpVersion::FSDP2) p.reshard_after_forward = implied_reshard(p);
    };
    k.write = [](const Plan& p, Json& j) { j["sharding_strategy"] = strategy_name(p.sharding_strategy); };
    k.search = S::Searched;
    k.canonical = [](const std::string& f, const std::string& v) { return strategy_name(parse_strategy_text(f, v)); };
    k.text = [](const Plan& p) { return strategy_name(effective_strategy(p)); };
    k.set = [](Plan& p, const std::string& v, const std::string& f) { p.sharding_strategy = parse_strategy_text(f, v); };
    k.spellings = {{F::Lightning, "sharding_strategy"}, {F::Accelerate, "fsdp_config.fsdp_sharding_strategy"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "reshard_after_forward";
    k.versions = KeyVersions::Fsdp2Only;
    k.default_json = "true";
    k.given_refused = true;
    k.version_error = "FSDP1 has no reshard_after_forward; use sharding_strategy (SHARD_GRAD_OP = false)";
    k.read = [](const JsonReader& r, Plan& p) {
      const Json& v = r.raw("reshard_after_forward");
      if (v.is_boolean()) {
        p.reshard_after_forward = ReshardAfterForward::of(v.get<bool>());
      } else if (v.is_number_integer()) {
        p.reshard_after_forward =
            ReshardAfterForward::group(static_cast<int>(r.get_int("reshard_after_forward", 2, kMaxMesh)));
      } else {
        throw InputError("plan.reshard_after_forward", json_value_for_message(v),
                         "expected true, false or an integer k > 1 that divides the shard size");
      }
      if (p.fsdp_version == FsdpVersion::FSDP2 && r.has("sharding_strategy") &&
          p.reshard_after_forward.keeps() != implied_reshard(p).keeps())
        throw InputError("plan.sharding_strategy", "\"" + strategy_name(p.sharding_strategy) + "\"",
                         "contradicts reshard_after_forward (FSDP2: FULL_SHARD/HYBRID_SHARD = true, "
                         "SHARD_GRAD_OP/_HYBRID_SHARD_ZERO2 = false)");
    };
    k.write = [](const Plan& p, Json& j) {
      if (p.fsdp_version != FsdpVersion::FSDP2) return;
      const ReshardAfterForward r = p.reshard_after_forward;
      if (r.is_group()) j["reshard_after_forward"] = r.group_size();
      else j["reshard_after_forward"] = !r.keeps();
    };
    k.search = S::Searched;
    k.canonical = [](const std::string& f, const std::string& v) { return parse_reshard_text(f, v).text(); };
    k.text = [](const Plan& p) {
      if (p.fsdp_version == FsdpVersion::FSDP2) return p.reshard_after_forward.text();
      return bool_text(!is_zero2(p.sharding_strategy) && p.sharding_strategy != ShardingStrategy::NO_SHARD);
    };
    k.set = [](Plan& p, const std::string& v, const std::string& f) { p.reshard_after_forward = parse_reshard_text(f, v); };
    k.spellings = {{F::Accelerate, "fsdp_config.fsdp_reshard_after_forward"},
                   {F::TorchTitan, "parallelism.fsdp_reshard_after_forward"}};
    k.per_module = true;
    t.push_back(std::move(k));
  }
  {
    Names<BackwardPrefetch> names{{{BackwardPrefetch::BACKWARD_PRE, "BACKWARD_PRE"},
                                   {BackwardPrefetch::BACKWARD_POST, "BACKWARD_POST"},
                                   {BackwardPrefetch::NONE, "NONE"}}};
    PlanKey k = enum_key("backward_prefetch", &Plan::backward_prefetch, names, "");
    // FSDP2 has no such argument; its own behaviour is BACKWARD_PRE (or NONE), never BACKWARD_POST.
    k.versions = KeyVersions::Fsdp1Only;
    k.refused = [](const Plan& p) {
      return p.fsdp_version == FsdpVersion::FSDP2 && p.backward_prefetch == BackwardPrefetch::BACKWARD_POST;
    };
    k.refused_value = [](const Plan&) { return std::string("\"BACKWARD_POST\""); };
    k.version_error = "FSDP2 supports BACKWARD_PRE (its default, F2.7) or NONE";
    k.search = S::Searched;
    k.canonical = [](const std::string& f, const std::string& v) { return prefetch_name(parse_prefetch_text(f, v)); };
    k.text = [](const Plan& p) { return p.fsdp_version == FsdpVersion::FSDP1 ? prefetch_name(p.backward_prefetch) : "n/a"; };
    k.set = [](Plan& p, const std::string& v, const std::string& f) { p.backward_prefetch = parse_prefetch_text(f, v); };
    k.spellings = {{F::Lightning, "backward_prefetch"}, {F::Accelerate, "fsdp_config.fsdp_backward_prefetch"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k = bool_key("forward_prefetch", &Plan::forward_prefetch, false, S::Searched);
    // The search varies it for FSDP1 only (FSDP2's forward prefetch is prefetch_depth's explicit lists).
    k.text = [](const Plan& p) { return p.fsdp_version == FsdpVersion::FSDP1 ? bool_text(p.forward_prefetch) : "n/a"; };
    k.spellings = {{F::Lightning, "forward_prefetch"}, {F::Accelerate, "fsdp_config.fsdp_forward_prefetch"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k = bool_key("limit_all_gathers", &Plan::limit_all_gathers, true, S::Searched);
    k.versions = KeyVersions::Fsdp1Only;   // FSDP2 has no rate limiter: ignored there, not refused
    k.text = [](const Plan& p) { return p.fsdp_version == FsdpVersion::FSDP1 ? bool_text(p.limit_all_gathers) : "n/a"; };
    k.spellings = {{F::Lightning, "limit_all_gathers"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k = int_key("prefetch_depth", &Plan::prefetch_depth, 1, kMaxPrefetchDepth, S::Searched);
    k.versions = KeyVersions::Fsdp2Only;
    k.refused = [](const Plan& p) { return p.fsdp_version == FsdpVersion::FSDP1 && p.prefetch_depth > 1; };
    k.refused_value = [](const Plan& p) { return std::to_string(p.prefetch_depth); };
    k.version_error = "1 for FSDP1 (deeper explicit prefetch is FSDP2's set_modules_to_*_prefetch, P6)";
    k.text = [](const Plan& p) { return p.fsdp_version == FsdpVersion::FSDP1 ? "n/a" : std::to_string(p.prefetch_depth); };
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "activation_checkpointing";
    k.default_json = "\"none\"";
    k.read = [](const JsonReader& r, Plan& p) { p.activation_checkpointing = parse_ac(r.raw("activation_checkpointing")); };
    k.write = [](const Plan& p, Json& j) { j["activation_checkpointing"] = ac_json(p.activation_checkpointing); };
    k.search = S::Searched;
    k.canonical = [](const std::string& f, const std::string& v) { return checkpointing_text(parse_ac_text(f, v)); };
    k.text = [](const Plan& p) { return checkpointing_text(p.activation_checkpointing); };
    k.set = [](Plan& p, const std::string& v, const std::string& f) { p.activation_checkpointing = parse_ac_text(f, v); };
    k.spellings = {{F::Lightning, "activation_checkpointing_policy"},
                   {F::Accelerate, "fsdp_config.fsdp_activation_checkpointing"},
                   {F::TorchTitan, "activation_checkpoint.mode"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k = enum_key("activation_offloading", &Plan::activation_offloading,
                         Names<ActivationOffload>{{{ActivationOffload::None, activation_offload_name(ActivationOffload::None)},
                                                   {ActivationOffload::Streams, activation_offload_name(ActivationOffload::Streams)},
                                                   {ActivationOffload::Sync, activation_offload_name(ActivationOffload::Sync)}}},
                         "none, streams or sync");
    const auto write = k.write;
    k.write = [write](const Plan& p, Json& j) {
      if (p.activation_offloading != ActivationOffload::None) write(p, j);
    };
    k.default_json = "";   // printed when on
    k.search = S::Base;
    t.push_back(std::move(k));
  }
  t.push_back(dtype_key("param_dtype", &Plan::param_dtype));
  t.back().spellings = {{F::TorchTitan, "training.mixed_precision_param"}};
  t.push_back(dtype_key("reduce_dtype", &Plan::reduce_dtype));
  t.back().spellings = {{F::TorchTitan, "training.mixed_precision_reduce"}};
  t.push_back(dtype_key("master_weights_dtype", &Plan::master_weights_dtype));
  t.back().spellings = {{F::TorchTitan, "training.dtype"}};
  t.push_back(int_key<std::int64_t>("micro_batch", &Plan::micro_batch, 1, 65536, S::Searched));
  t.back().spellings = {{F::TorchTitan, "training.local_batch_size"}};
  t.push_back(int_key<std::int64_t>("seq_len", &Plan::seq_len, 1, std::int64_t{1} << 22, S::None));
  t.back().spellings = {{F::TorchTitan, "training.seq_len"}};
  t.push_back(int_key<std::int64_t>("grad_accum", &Plan::grad_accum, 1, 65536, S::Searched));
  t.back().spellings = {{F::Lightning, "accumulate_grad_batches"}};
  t.push_back(bool_key("grad_sync", &Plan::grad_sync, false, S::Searched));
  {
    PlanKey k;
    k.name = "cpu_offload";
    k.default_json = R"({"optimizer":false,"params":false})";
    k.read = [](const JsonReader& r, Plan& p) { p.cpu_offload = parse_offload(r.raw("cpu_offload")); };
    k.write = [](const Plan& p, Json& j) {
      j["cpu_offload"] = {{"params", p.cpu_offload.params}, {"optimizer", p.cpu_offload.optimizer}};
    };
    k.search = S::Searched;
    k.canonical = [](const std::string& f, const std::string& v) { return bool_text(parse_bool_text(f, v)); };
    k.text = [](const Plan& p) { return bool_text(p.cpu_offload.params); };
    // FSDP's offload_params: params, grads and optimizer state on the CPU (M11).
    k.set = [](Plan& p, const std::string& v, const std::string& f) {
      p.cpu_offload.params = p.cpu_offload.optimizer = parse_bool_text(f, v);
    };
    k.spellings = {{F::Lightning, "cpu_offload"},
                   {F::Accelerate, "fsdp_config.fsdp_offload_params"},
                   {F::TorchTitan, "training.enable_cpu_offload"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k = bool_key("fp8_all_gather", &Plan::fp8_all_gather, false, S::Searched);
    k.versions = KeyVersions::Fsdp2Only;
    k.refused = [](const Plan& p) {
      return p.fp8_all_gather && (p.fsdp_version == FsdpVersion::FSDP1 || p.param_dtype != Dtype::BF16);
    };
    k.refused_value = [](const Plan&) { return std::string("true"); };
    k.version_error = "needs fsdp_version 2 and param_dtype bf16 (torchao float8, D4)";
    k.spellings = {{F::TorchTitan, "quantize.linear.float8.enable_fsdp_float8_all_gather"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "trainable_fraction";
    k.default_json = "1.0";
    k.read = [](const JsonReader& r, Plan& p) {
      p.trainable_fraction = r.get_double("trainable_fraction", 0.0, 1.0);
      if (!(p.trainable_fraction > 0.0))
        throw InputError("plan.trainable_fraction", json_value_for_message(r.raw("trainable_fraction")),
                         "expected a number in (0, 1] (a fully frozen model does not train)");
    };
    k.write = [](const Plan& p, Json& j) { j["trainable_fraction"] = p.trainable_fraction; };
    k.search = S::Base;
    k.set = [](Plan& p, const std::string& v, const std::string& f) {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(x > 0.0 && x <= 1.0)) throw InputError(f, v, "a fraction in (0, 1]");
      p.trainable_fraction = x;
    };
    t.push_back(std::move(k));
  }
  {
    PlanKey k = enum_key("optimizer", &Plan::optimizer,
                         Names<Optimizer>{{{Optimizer::AdamW, "adamw"},
                                           {Optimizer::SGD, "sgd"},
                                           {Optimizer::BnbAdamW8bit, "bnb_adamw8bit"},
                                           {Optimizer::BnbPagedAdamW, "bnb_paged_adamw"},
                                           {Optimizer::BnbPagedAdamW8bit, "bnb_paged_adamw8bit"},
                                           {Optimizer::TorchaoAdamW8bit, "torchao_adamw8bit"},
                                           {Optimizer::TorchaoAdamW4bit, "torchao_adamw4bit"}}},
                         "adamw, sgd, bnb_adamw8bit, bnb_paged_adamw, bnb_paged_adamw8bit, torchao_adamw8bit or "
                         "torchao_adamw4bit");
    k.search = S::Base;
    const auto set = k.set;
    k.set = [set](Plan& p, const std::string& v, const std::string& f) { set(p, lower(v) == "adam" ? "adamw" : v, f); };
    k.spellings = {{F::TorchTitan, "optimizer.name"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "auto_wrap_policy";
    k.default_json = "\"transformer_block\"";
    k.read = [](const JsonReader& r, Plan& p) { p.auto_wrap_policy = parse_wrap(r.raw("auto_wrap_policy")); };
    k.write = [](const Plan& p, Json& j) { j["auto_wrap_policy"] = wrap_json(p.auto_wrap_policy); };
    k.search = S::Base;
    k.set = [](Plan& p, const std::string& v, const std::string& f) {
      const std::string l = lower(v);
      models::WrapPolicy w;
      if (l == "transformer_block") w.kind = models::WrapPolicy::Kind::TransformerBlock;
      else if (l == "none") w.kind = models::WrapPolicy::Kind::None;
      else if (long long n = 0; l.rfind("min_num_params:", 0) == 0 && parse_long(l.substr(15), n) && n >= 1) {
        w.kind = models::WrapPolicy::Kind::Size;
        w.min_num_params = n;
      } else {
        throw InputError(f, v, "transformer_block, none or min_num_params:<N>");
      }
      p.auto_wrap_policy = w;
    };
    k.spellings = {{F::Lightning, "auto_wrap_policy"}, {F::Accelerate, "fsdp_config.fsdp_auto_wrap_policy"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k = bool_key("use_orig_params", &Plan::use_orig_params, true, S::Base);
    k.versions = KeyVersions::Fsdp1Only;
    k.write = [](const Plan& p, Json& j) {
      if (p.fsdp_version == FsdpVersion::FSDP1) j["use_orig_params"] = p.use_orig_params;
    };
    k.refused = [](const Plan& p) { return p.fsdp_version == FsdpVersion::FSDP2 && !p.use_orig_params; };
    k.refused_value = [](const Plan&) { return std::string("false"); };
    k.version_error = "FSDP1 only (FSDP2 always keeps the original parameters)";
    k.spellings = {{F::Lightning, "use_orig_params"}, {F::Accelerate, "fsdp_config.fsdp_use_orig_params"}};
    t.push_back(std::move(k));
  }
  {
    using models::LossImpl;
    PlanKey k = enum_key("cross_entropy", &Plan::cross_entropy,
                         Names<LossImpl>{{{LossImpl::Torch, "torch"}, {LossImpl::Fused, "fused"},
                                          {LossImpl::FusedLinear, "fused_linear"}, {LossImpl::Chunked, "chunked"}}},
                         "torch, fused, fused_linear or chunked");
    k.search = S::Base;
    t.push_back(std::move(k));
  }
  {
    PlanKey k = int_key("cross_entropy_chunks", &Plan::cross_entropy_chunks, 1, 65536, S::None);
    const auto read = k.read;
    k.read = [read](const JsonReader& r, Plan& p) {
      read(r, p);
      if (p.cross_entropy != models::LossImpl::Chunked)
        throw InputError("plan.cross_entropy_chunks", std::to_string(p.cross_entropy_chunks),
                         "only with cross_entropy \"chunked\" (torchtune's num_output_chunks)");
    };
    k.write = [](const Plan& p, Json& j) {
      if (p.cross_entropy == models::LossImpl::Chunked) j["cross_entropy_chunks"] = p.cross_entropy_chunks;
    };
    k.default_json = "";   // printed with cross_entropy "chunked" only
    t.push_back(std::move(k));
  }
  {
    using models::ModelImpl;
    Names<ModelImpl> names{{{ModelImpl::TorchTitan, "torchtitan"}, {ModelImpl::HF, "hf"}, {ModelImpl::LitGPT, "litgpt"},
                            {ModelImpl::Fused, "fused"}, {ModelImpl::Runtime, "runtime"}}};
    PlanKey k = enum_key("implementation", &Plan::implementation, names, "torchtitan, hf, litgpt or fused");
    k.search = S::Base;
    const auto set = k.set;
    // fsdpsim's own runtime is no implementation a plan search trains with.
    k.set = [set](Plan& p, const std::string& v, const std::string& f) {
      if (lower(v) == "runtime") throw InputError(f, v, "torchtitan, hf, litgpt or fused");
      set(p, v, f);
    };
    t.push_back(std::move(k));
  }
  t.push_back(bool_key("compile", &Plan::compile, false, S::Base));
  t.back().spellings = {{F::TorchTitan, "compile.enable"}};
  {
    using models::Float8Recipe;
    PlanKey k = enum_key("float8", &Plan::float8,
                         Names<Float8Recipe>{{{Float8Recipe::None, "none"}, {Float8Recipe::Tensorwise, "tensorwise"},
                                              {Float8Recipe::Rowwise, "rowwise"}}},
                         "none, tensorwise or rowwise");
    k.spellings = {{F::TorchTitan, "quantize.linear.float8.recipe_name"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "alloc_conf";
    k.default_json = "\"\"";
    k.read = [](const JsonReader& r, Plan& p) { p.alloc_conf = parse_alloc_conf(r.get_string("alloc_conf"), r.field("alloc_conf")); };
    k.write = [](const Plan& p, Json& j) { j["alloc_conf"] = alloc_conf_text(p.alloc_conf); };
    k.search = S::Base;
    k.set = [](Plan& p, const std::string& v, const std::string& f) { p.alloc_conf = parse_alloc_conf(v, f); };
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "free_logits_before_backward";   // default derived from implementation by resolve_plan
    k.read = [](const JsonReader& r, Plan& p) { p.free_logits_before_backward = r.get_bool("free_logits_before_backward"); };
    k.write = [](const Plan& p, Json& j) {
      if (p.free_logits_before_backward) j["free_logits_before_backward"] = *p.free_logits_before_backward;
    };
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "loss_in_model_forward";   // default derived from implementation and cross_entropy (lowering::loss_memory)
    k.read = [](const JsonReader& r, Plan& p) { p.loss_in_model_forward = r.get_bool("loss_in_model_forward"); };
    k.write = [](const Plan& p, Json& j) {
      if (p.loss_in_model_forward) j["loss_in_model_forward"] = *p.loss_in_model_forward;
    };
    t.push_back(std::move(k));
  }
  {
    PlanKey k = enum_key("optimizer_impl", &Plan::optimizer_impl,
                         Names<OptimizerImpl>{{{OptimizerImpl::Foreach, "foreach"}, {OptimizerImpl::Fused, "fused"}}},
                         "foreach or fused");
    k.search = S::Base;
    k.spellings = {{F::TorchTitan, "optimizer.implementation"}};
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "module_overrides";
    k.versions = KeyVersions::Fsdp2Only;
    k.default_json = "";   // printed when there are overrides
    k.read = [](const JsonReader& r, Plan& p) { p.module_overrides = parse_module_overrides(r.raw("module_overrides")); };
    k.write = [](const Plan& p, Json& j) {
      if (!p.module_overrides.empty()) j["module_overrides"] = module_overrides_json(p.module_overrides);
    };
    k.refused = [](const Plan& p) {
      if (p.fsdp_version != FsdpVersion::FSDP1) return false;
      for (const auto& m : p.module_overrides)
        if (!m.reshard_after_forward.is_unset()) return true;
      return false;
    };
    k.version_error = "FSDP2 only (FSDP1 sets resharding per sharding_strategy for every unit)";
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "frozen_units";
    k.default_json = "";   // printed when there are frozen units
    k.read = [](const JsonReader& r, Plan& p) { p.frozen_units = parse_unit_names(r.raw("frozen_units")); };
    k.write = [](const Plan& p, Json& j) {
      if (!p.frozen_units.empty()) j["frozen_units"] = p.frozen_units;
    };
    t.push_back(std::move(k));
  }
  {
    PlanKey k;
    k.name = "lora";
    k.default_json = "";   // printed when adapters are on
    k.read = [](const JsonReader& r, Plan& p) {
      p.lora = parse_lora(r.raw("lora"), "plan.lora");
      if (r.has("trainable_fraction") && p.trainable_fraction < 1.0)
        throw InputError("plan.trainable_fraction", json_value_for_message(r.raw("trainable_fraction")), kLoraOrFraction);
    };
    k.write = [](const Plan& p, Json& j) {
      if (!p.lora.on()) return;
      j["lora"] = {{"rank", p.lora.rank}, {"targets", p.lora.targets}, {"dropout", p.lora.dropout}};
      if (p.lora.quantize_nf4) j["lora"]["quantize_base"] = "nf4";
    };
    k.search = S::Base;
    k.set = [](Plan& p, const std::string& v, const std::string& f) {
      p.lora = parse_lora_text(v, f);
      if (p.trainable_fraction < 1.0) throw InputError(f, v, kLoraOrFraction);
    };
    t.push_back(std::move(k));
  }
  return t;
}

std::vector<std::string> per_module_keys() {
  std::vector<std::string> out;
  for (const PlanKey& k : plan_keys())
    if (k.per_module) out.push_back(k.name);
  return out;
}

}  // namespace

const std::vector<PlanKey>& plan_keys() {
  static const std::vector<PlanKey> table = make_table();
  return table;
}

const PlanKey* find_plan_key(std::string_view name) {
  for (const PlanKey& k : plan_keys())
    if (k.name == name) return &k;
  return nullptr;
}

const PlanKey& plan_key(std::string_view name) {
  if (const PlanKey* k = find_plan_key(name)) return *k;
  throw std::logic_error("not a plan key: " + std::string(name));
}

const std::vector<std::string>& plan_key_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const PlanKey& k : plan_keys()) n.push_back(k.name);
    return n;
  }();
  return names;
}

std::string spelling(std::string_view key, Framework f) {
  for (const Spelling& s : plan_key(key).spellings)
    if (s.framework == f) return s.key;
  return "";
}

std::string section_key(std::string_view key, Framework f) {
  const std::string s = spelling(key, f);
  return s.substr(s.rfind('.') + 1);
}

void check_versions(const Plan& p) {
  for (const PlanKey& k : plan_keys()) {
    if (!k.refused || !k.refused(p)) continue;
    if (k.name == "module_overrides")   // the field names the overridden unit
      for (const auto& m : p.module_overrides)
        if (!m.reshard_after_forward.is_unset())
          throw InputError("plan.module_overrides." + m.module + ".reshard_after_forward",
                           bool_text(!m.reshard_after_forward.keeps()), k.version_error);
    throw InputError("plan." + k.name, k.refused_value(p), k.version_error);
  }
}

// ---- text forms -------------------------------------------------------------------------------

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string strip_quotes(const std::string& s) {
  const std::size_t b = s.find_first_not_of(" \t\"'"), e = s.find_last_not_of(" \t\"'");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::pair<int, int> parse_mesh_text(const std::string& field, const std::string& v) {
  std::string digits;
  for (char c : v) digits += std::isdigit(static_cast<unsigned char>(c)) ? c : ' ';
  std::istringstream is(digits);
  long long r = 0, s = 0, extra = 0;
  bool ok = static_cast<bool>(is >> r >> s) && !(is >> extra);
  for (char c : v)
    if (!std::isdigit(static_cast<unsigned char>(c)) && std::string("[](), xX\t").find(c) == std::string::npos) ok = false;
  if (!ok || r < 1 || s < 1 || r > 1 << 20 || s > 1 << 20)
    throw InputError(field, v, "a mesh (replicate, shard): [2,8], (2, 8) or 2x8");
  return {static_cast<int>(r), static_cast<int>(s)};
}

ActivationCheckpointing parse_ac_text(const std::string& field, const std::string& v) {
  std::string l = lower(v);
  ActivationCheckpointing ac;
  if (l == "none" || l == "false" || l == "no") return ac;
  if (l == "full" || l == "true") { ac.mode = AcMode::Full; return ac; }
  if (l == "selective_op" || l == "selective" || l == "op") { ac.mode = AcMode::SelectiveOp; return ac; }
  long long k = 0;
  if (l.rfind("every_", 0) == 0 && parse_long(l.substr(6), k) && k >= 1 && k <= 1024) {
    if (k == 1) ac.mode = AcMode::Full;
    else { ac.mode = AcMode::EveryK; ac.every_k = static_cast<int>(k); }
    return ac;
  }
  throw InputError(field, v, "none, full, every_<k> (k >= 1) or selective_op");
}

ShardingStrategy parse_strategy_text(const std::string& field, const std::string& v) {
  std::string u = upper(v);
  if (u.rfind("SHARDINGSTRATEGY.", 0) == 0) u = u.substr(17);
  if (u == "HYBRID_SHARD_ZERO2") u = "_HYBRID_SHARD_ZERO2";
  const auto it = std::find(kStrategies.begin(), kStrategies.end(), u);
  if (it == kStrategies.end())
    throw InputError(field, v, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or _HYBRID_SHARD_ZERO2");
  return static_cast<ShardingStrategy>(it - kStrategies.begin());
}

BackwardPrefetch parse_prefetch_text(const std::string& field, const std::string& v) {
  std::string u = upper(v);
  if (u.rfind("BACKWARDPREFETCH.", 0) == 0) u = u.substr(17);
  if (u == "BACKWARD_PRE") return BackwardPrefetch::BACKWARD_PRE;
  if (u == "BACKWARD_POST") return BackwardPrefetch::BACKWARD_POST;
  if (u == "NONE" || u == "NULL" || u == "NO_PREFETCH") return BackwardPrefetch::NONE;
  throw InputError(field, v, "BACKWARD_PRE, BACKWARD_POST or NONE");
}

ReshardAfterForward parse_reshard_text(const std::string& field, const std::string& v) {
  std::string l = lower(v);
  if (l == "true") return ReshardAfterForward::yes();
  if (l == "false") return ReshardAfterForward::no();
  long long k = 0;
  if (parse_long(l, k) && k >= 2 && k <= 1 << 20) return ReshardAfterForward::group(static_cast<int>(k));
  throw InputError(field, v, "true, false or an int >= 2 (FSDP2: reshard to groups of that size after forward)");
}

bool parse_bool_text(const std::string& field, const std::string& v) {
  std::string l = lower(v);
  if (l == "true" || l == "1" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "0" || l == "no" || l == "off") return false;
  throw InputError(field, v, "true or false");
}

std::string mesh_value_text(int replicate, int shard) {
  return "[" + std::to_string(replicate) + "," + std::to_string(shard) + "]";
}

std::string checkpointing_text(const ActivationCheckpointing& ac) {
  if (ac.mode == AcMode::EveryK && ac.every_k <= 1) return "full";
  return checkpointing_name(ac);
}

}  // namespace fsdpsim::sim
