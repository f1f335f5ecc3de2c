// torchtitan TOML job configs for `fsdpsim diagnose` (ecosystem.md §2.4): the TOML-era keys of
// torchtitan/config/job_config.py (read at 9810191bb^, the parent of the 2026-02 config refactor), and the
// older `[float8]` section (before 5b5d46856, 2025-09-26, which moved it to [quantize.linear.float8]).
// torchtitan is FSDP2 only, runs its own model code (implementation "torchtitan") and frees the
// logits before backward (resolve_plan's default for that implementation). Sections read:
//   [training] [parallelism] [activation_checkpoint] [compile] [float8] / [quantize.linear.float8]
//   [optimizer] [model] (converters); sections that do not change one training step (job, metrics,
//   checkpoint, ...) are skipped, any other section is named in a warning, never dropped silently.
#include <algorithm>

#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include "common/errors.h"
#include "planner/config_readers.h"
#include "planner/config_text.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {
namespace {

using AcMode = sim::ActivationCheckpointing::Mode;

class Toml {
 public:
  explicit Toml(const toml::table& t) : t_(t) {}
  const toml::node* node(const std::string& path) const { return t_.at_path(path).node(); }
  bool has(const std::string& path) const { return node(path) != nullptr; }
  long long get_int(const std::string& path, long long dflt, long long lo, long long hi) const {
    const toml::node* n = node(path);
    if (!n) return dflt;
    if (auto v = n->value<long long>()) {
      if (*v < lo || *v > hi) throw InputError(path, std::to_string(*v), "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return *v;
    }
    throw InputError(path, "<not an integer>", "an integer");
  }
  std::string get_str(const std::string& path, const std::string& dflt) const {
    const toml::node* n = node(path);
    if (!n) return dflt;
    if (auto v = n->value<std::string>()) return *v;
    if (auto v = n->value<long long>()) return std::to_string(*v);
    throw InputError(path, "<not a string>", "a string");
  }
  bool get_bool(const std::string& path, bool dflt) const {
    const toml::node* n = node(path);
    if (!n) return dflt;
    if (auto v = n->value<bool>()) return *v;
    throw InputError(path, "<not a bool>", "true or false");
  }
  std::vector<std::string> get_strings(const std::string& path) const {
    std::vector<std::string> out;
    const toml::node* n = node(path);
    if (!n) return out;
    if (auto v = n->value<std::string>()) {   // the CLI's comma-separated form written into TOML
      std::string cur;
      for (char c : *v + ",") {
        if (c == ',') { if (!cur.empty()) out.push_back(config_text::trim(cur)); cur.clear(); }
        else cur += c;
      }
      return out;
    }
    const toml::array* a = n->as_array();
    if (!a) throw InputError(path, "<not a list>", "a list of strings");
    for (const auto& e : *a) {
      auto s = e.value<std::string>();
      if (!s) throw InputError(path, "<not a string>", "a list of strings");
      out.push_back(*s);
    }
    return out;
  }

 private:
  const toml::table& t_;
};

// The TOML path of a plan key, as the plan-key table spells it for torchtitan (program/plan_keys.cpp).
std::string titan(const char* plan_key) { return sim::spelling(plan_key, sim::Framework::TorchTitan); }

// A dtype key of [training] (default `dflt`).
Dtype titan_dtype(const Toml& t, const char* plan_key, const std::string& dflt) {
  const std::string path = titan(plan_key), v = t.get_str(path, dflt);
  if (v == "bfloat16") return Dtype::BF16;
  if (v == "float32") return Dtype::FP32;
  throw InputError(path, v, "bfloat16 or float32");
}

// [compile]: enable, components (job_config.py Compile; default components ["model", "loss"]).
void read_compile(const Toml& t, UserConfig& cfg) {
  if (!t.get_bool(titan("compile"), false)) {
    if (t.has("compile")) cfg.facts.push_back("[compile] enable = false: eager");
    return;
  }
  auto comps = t.get_strings("compile.components");
  bool model = comps.empty() || std::find(comps.begin(), comps.end(), "model") != comps.end();
  cfg.plan.compile = model;
  std::string list;
  for (const auto& c : comps) list += (list.empty() ? "" : ", ") + c;
  cfg.facts.push_back("[compile] enable = true" + (comps.empty() ? std::string() : " (components " + list + ")") +
                      (model ? ": each block compiled with inductor, compile true" : ": the model is not compiled, compile false"));
}

// float8: on when [model] converters names it; configured by [float8] (older) or [quantize.linear.float8].
void read_float8(const Toml& t, UserConfig& cfg) {
  auto& p = cfg.plan;
  auto conv = t.get_strings("model.converters");
  bool on = std::find(conv.begin(), conv.end(), "float8") != conv.end() ||
            std::find(conv.begin(), conv.end(), "quantize.linear.float8") != conv.end();
  const std::string sec = t.has("quantize.linear.float8") ? "quantize.linear.float8" : "float8";
  if (!on) {
    if (t.has(sec))
      cfg.facts.push_back("[" + sec + "] present but [model] converters does not name float8: bf16 matmuls, float8 off");
    return;
  }
  const std::string recipe_key = sec + "." + sim::section_key("float8", sim::Framework::TorchTitan);
  std::string recipe = t.get_str(recipe_key, "tensorwise");   // None -> Float8LinearConfig() = tensorwise
  if (recipe == "tensorwise") p.float8 = models::Float8Recipe::Tensorwise;
  else if (recipe == "rowwise") p.float8 = models::Float8Recipe::Rowwise;
  else if (recipe == "rowwise_with_gw_hp") {
    p.float8 = models::Float8Recipe::Rowwise;
    cfg.warnings.push_back(recipe_key + " rowwise_with_gw_hp: simulated as rowwise (its weight-gradient matmul in high precision is not modelled)");
  } else {
    throw InputError(recipe_key, recipe, "tensorwise, rowwise or rowwise_with_gw_hp");
  }
  const std::string ag_key = sec + "." + sim::section_key("fp8_all_gather", sim::Framework::TorchTitan);
  bool ag = t.get_bool(ag_key, false);
  if (ag && p.float8 != models::Float8Recipe::Tensorwise)
    throw InputError(ag_key, "true", "tensorwise scaling (torchao's float8 all-gather needs it)");
  p.fp8_all_gather = ag;
  cfg.facts.push_back("[model] converters float8 + [" + sec + "]: torchao Float8Linear, float8 \"" +
                      models::float8_recipe_name(p.float8) + "\"" + (ag ? ", float8 all-gathers" : ""));
}

void read_optimizer(const Toml& t, UserConfig& cfg) {
  auto& p = cfg.plan;
  std::string name = t.get_str(titan("optimizer"), "AdamW");
  if (name != "AdamW" && name != "Adam") throw InputError(titan("optimizer"), name, "AdamW or Adam (torchtitan's optimizers)");
  p.optimizer = sim::Optimizer::AdamW;
  std::string impl = t.get_str(titan("optimizer_impl"), "fused");   // job_config.py Optimizer default "fused"
  if (impl == "fused") p.optimizer_impl = sim::OptimizerImpl::Fused;
  else if (impl == "foreach") p.optimizer_impl = sim::OptimizerImpl::Foreach;
  else if (impl == "for-loop") {
    p.optimizer_impl = sim::OptimizerImpl::Fused;
    cfg.warnings.push_back(titan("optimizer_impl") + " for-loop: simulated as fused for memory (per-tensor temporaries only); "
                           "its per-parameter kernel launches are not modelled");
  } else {
    throw InputError(titan("optimizer_impl"), impl, "fused, foreach or for-loop");
  }
}

void warn_unread_sections(const toml::table& t, UserConfig& cfg) {
  // Sections that do not change one training step's memory or time on the GPU.
  static const std::vector<std::string> inert = {"job", "profiling", "metrics", "lr_scheduler", "checkpoint", "validation",
                                                 "comm", "fault_tolerance", "experimental", "debug", "memory_estimation",
                                                 "dataloader"};
  static const std::vector<std::string> read = {"model", "training", "parallelism", "activation_checkpoint", "compile",
                                                "float8", "quantize", "optimizer"};
  for (const auto& [k, v] : t) {
    std::string s(k.str());
    if (std::find(inert.begin(), inert.end(), s) != inert.end() || std::find(read.begin(), read.end(), s) != read.end()) continue;
    cfg.warnings.push_back("[" + s + "] is not read by fsdpsim (the simulation ignores it)");
  }
}

}  // namespace

void read_torchtitan(const std::string& text, const std::string& source, const models::ModelSpec& model, UserConfig& cfg) {
  (void)model;
  toml::table tbl;
  try {
    tbl = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw InputError(source, "<TOML parse error at line " + std::to_string(e.source().begin.line) + ">", std::string(e.description()));
  }
  const Toml t(tbl);
  auto& p = cfg.plan;
  p.fsdp_version = sim::FsdpVersion::FSDP2;
  p.implementation = models::ModelImpl::TorchTitan;
  // Defaults from torchtitan/config/job_config.py (ecosystem.md §2.4).
  p.micro_batch = t.get_int(titan("micro_batch"), 8, 1, 65536);
  cfg.micro_batch_given = true;
  p.seq_len = t.get_int(titan("seq_len"), 2048, 1, 1 << 22);
  cfg.seq_len_given = true;
  p.param_dtype = titan_dtype(t, "param_dtype", "bfloat16");
  p.reduce_dtype = titan_dtype(t, "reduce_dtype", "float32");
  p.master_weights_dtype = titan_dtype(t, "master_weights_dtype", "float32");
  if (p.master_weights_dtype == Dtype::BF16) p.param_dtype = p.reduce_dtype = Dtype::BF16;
  p.cpu_offload.params = p.cpu_offload.optimizer = t.get_bool(titan("cpu_offload"), false);
  long long replicate = t.get_int("parallelism.data_parallel_replicate_degree", 1, 1, 1 << 20);
  long long shard = t.get_int("parallelism.data_parallel_shard_degree", -1, -1, 1 << 20);
  if (shard == 0) throw InputError("parallelism.data_parallel_shard_degree", "0", "-1 (the leftover ranks) or >= 1");
  p.mesh_replicate = static_cast<int>(replicate);
  p.mesh_shard = static_cast<int>(shard);  // -1 resolved against the cluster by the caller
  std::string raf = t.get_str(titan("reshard_after_forward"), "default");
  if (raf == "always") p.reshard_after_forward = sim::ReshardAfterForward::yes();
  else if (raf == "never") p.reshard_after_forward = sim::ReshardAfterForward::no();
  else if (raf == "default") {
    // "default" without pipeline parallelism: blocks resharded after forward, the last one not
    // (torchtitan's parallelize.py: the FSDP group used first in backward is not resharded).
    p.reshard_after_forward = sim::ReshardAfterForward::yes();
    p.module_overrides = {sim::ModuleOverride{"last_block", sim::ReshardAfterForward::no()}};
  } else {
    throw InputError(titan("reshard_after_forward"), raf, "default, always or never");
  }
  for (const char* k : {"tensor_parallel_degree", "context_parallel_degree", "pipeline_parallel_degree"}) {
    const std::string path = std::string("parallelism.") + k;
    if (long long d = t.get_int(path, 1, 1, 1 << 20); d != 1)
      throw InputError(path, std::to_string(d), "1 (fsdpsim simulates FSDP data parallelism only)");
  }
  std::string mode = t.get_str(titan("activation_checkpointing"), "selective");
  std::string opt = t.get_str("activation_checkpoint.selective_ac_option", "2");
  if (mode == "none") p.activation_checkpointing.mode = AcMode::None;
  else if (mode == "full") p.activation_checkpointing.mode = AcMode::Full;
  else if (mode == "selective") {
    if (opt == "op") p.activation_checkpointing.mode = AcMode::SelectiveOp;
    else {
      long long k = config_text::as_int("activation_checkpoint.selective_ac_option", opt, 1, 1 << 20);
      p.activation_checkpointing.mode = k == 1 ? AcMode::Full : AcMode::EveryK;
      p.activation_checkpointing.every_k = static_cast<int>(k);
    }
  } else {
    throw InputError(titan("activation_checkpointing"), mode, "none, selective or full (memory_budget needs torch.compile; not simulated)");
  }
  long long gbs = t.get_int("training.global_batch_size", -1, -1, std::int64_t{1} << 40);
  if (gbs > 0) p.grad_accum = -gbs;  // resolved against the data-parallel degree by the caller
  read_compile(t, cfg);
  read_float8(t, cfg);
  read_optimizer(t, cfg);
  warn_unread_sections(tbl, cfg);
  cfg.facts.push_back("torchtitan: FSDP2, its own model code (implementation \"torchtitan\"), mesh (" + std::to_string(replicate) +
                      ", " + (shard < 0 ? std::string("leftover") : std::to_string(shard)) + "), fsdp_reshard_after_forward \"" +
                      raf + "\"" + (raf == "default" ? " (the last block kept unsharded after forward)" : "") +
                      ", activation_checkpoint " + mode + (mode == "selective" ? " (" + opt + ")" : ""));
  p.grad_sync = true;
}

}  // namespace fsdpsim::planner
