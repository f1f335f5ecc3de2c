// The candidate space (note "default search space" in search_space.h).
#include "planner/search_space.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/errors.h"
#include "program/optimizer_state.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {
namespace {

using sim::ActivationCheckpointing;
using sim::BackwardPrefetch;
using sim::FsdpVersion;
using sim::Plan;
using sim::ShardingStrategy;
using AcMode = ActivationCheckpointing::Mode;

// Canonicalizes the value of a `--fix/--exclude` constraint (the key's text form, program/plan_keys.h), or
// throws naming the key. "precision" is the planner's own key: a preset sets the three dtypes at once.
std::string canonicalize(const std::string& key, const std::string& raw, const std::string& field) {
  std::string v = sim::strip_quotes(raw);
  if (key == "precision") return find_precision_preset(v, field).name;
  const sim::PlanKey& k = sim::plan_key(key);
  return k.canonical ? k.canonical(field, v) : v;   // base keys are checked by apply_base_constraint
}

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

const Constraint* find_fixed(const SpaceOptions& o, const std::string& key) {
  for (const auto& c : o.fixed)
    if (c.key == key) return &c;
  return nullptr;
}
bool constrained(const SpaceOptions& o, const std::string& key) {
  if (find_fixed(o, key)) return true;
  for (const auto& c : o.excluded)
    if (c.key == key) return true;
  return false;
}

struct Fsdp1Knobs {
  BackwardPrefetch bp;
  bool forward_prefetch;
  bool limit_all_gathers;
};

// Single deviations from PyTorch's defaults, or the full product when the user constrains a knob.
std::vector<Fsdp1Knobs> fsdp1_knob_sets(const SpaceOptions& o) {
  if (!constrained(o, "backward_prefetch") && !constrained(o, "forward_prefetch") && !constrained(o, "limit_all_gathers"))
    return {{BackwardPrefetch::BACKWARD_PRE, false, true},
            {BackwardPrefetch::BACKWARD_POST, false, true},
            {BackwardPrefetch::BACKWARD_PRE, true, true},
            {BackwardPrefetch::BACKWARD_PRE, false, false}};
  std::vector<Fsdp1Knobs> out;
  for (auto bp : {BackwardPrefetch::BACKWARD_PRE, BackwardPrefetch::BACKWARD_POST, BackwardPrefetch::NONE})
    for (bool fp : {false, true})
      for (bool lag : {true, false}) out.push_back({bp, fp, lag});
  return out;
}

}  // namespace

// ---- precision presets ------------------------------------------------------------------------

const std::vector<PrecisionPreset>& precision_presets() {
  static const std::vector<PrecisionPreset> k = {
      {"bf16", Dtype::BF16, Dtype::FP32, Dtype::FP32, false,
       "bf16 compute and all-gathers, fp32 gradient reduction, fp32 master weights (torchtitan's default)"},
      {"bf16-bf16reduce", Dtype::BF16, Dtype::BF16, Dtype::FP32, false,
       "bf16 compute and reduction, fp32 master weights (Lightning >= 2.6 \"bf16-mixed\")"},
      {"bf16-true", Dtype::BF16, Dtype::BF16, Dtype::BF16, false,
       "pure bf16: no fp32 master copy (Lightning \"bf16-true\"); half the sharded state, less exact updates"},
      {"fp32", Dtype::FP32, Dtype::FP32, Dtype::FP32, false, "full fp32 (Lightning \"32-true\")"},
      {"fp8-ag", Dtype::BF16, Dtype::FP32, Dtype::FP32, true,
       "as bf16, with FSDP2 float8 all-gathers (torchao enable_fsdp_float8_all_gather) and tensorwise float8 linears",
       models::Float8Recipe::Tensorwise},
      {"fp8-tensorwise", Dtype::BF16, Dtype::FP32, Dtype::FP32, false,
       "as bf16, with torchao float8 linears, tensorwise scaling (H100/H200/B200 only)", models::Float8Recipe::Tensorwise},
      {"fp8-rowwise", Dtype::BF16, Dtype::FP32, Dtype::FP32, false,
       "as bf16, with torchao float8 linears, rowwise scaling (torchtitan's default recipe; H100/H200/B200 only)",
       models::Float8Recipe::Rowwise},
  };
  return k;
}

const PrecisionPreset& find_precision_preset(const std::string& name, const std::string& field) {
  std::string allowed;
  for (const auto& p : precision_presets()) {
    if (p.name == name) return p;
    allowed += (allowed.empty() ? "" : ", ") + p.name;
  }
  throw InputError(field, name, "one of " + allowed);
}

std::string precision_name(const Plan& p) {
  for (const auto& pr : precision_presets())
    if (pr.param == p.param_dtype && pr.reduce == p.reduce_dtype && pr.master == p.master_weights_dtype &&
        pr.fp8_all_gather == p.fp8_all_gather && pr.float8 == p.float8)
      return pr.name;
  return "param=" + std::string(dtype_name(p.param_dtype)) + ",reduce=" + std::string(dtype_name(p.reduce_dtype)) +
         ",master=" + std::string(dtype_name(p.master_weights_dtype)) + (p.fp8_all_gather ? ",fp8-ag" : "");
}

// ---- batch ------------------------------------------------------------------------------------

BatchTarget resolve_batch_target(std::int64_t seq_len, std::int64_t tokens, std::int64_t seqs, int world) {
  if (seq_len < 1 || seq_len > (1 << 22)) throw InputError("--seq-len", std::to_string(seq_len), "an integer in [1, 4194304]");
  if (world < 1) throw InputError("cluster", std::to_string(world), "at least one GPU");
  if (tokens > 0 && seqs > 0)
    throw InputError("--global-batch", std::to_string(seqs), "give either --global-batch or --global-batch-tokens, not both");
  BatchTarget b;
  b.seq_len = seq_len;
  if (seqs > 0) {
    if (seqs % world != 0)
      throw InputError("--global-batch", std::to_string(seqs),
                       "a multiple of the " + std::to_string(world) + " GPUs (FSDP's data-parallel degree is every GPU), e.g. " +
                           std::to_string((seqs + world - 1) / world * world));
    b.global_batch_sequences = seqs;
    return b;
  }
  // Llama 2 (Touvron et al. 2023, §2.2): "a global batch-size of 4M tokens" = 2^22.
  constexpr std::int64_t kDefaultTokens = std::int64_t{1} << 22;
  bool dflt = tokens <= 0;
  std::int64_t want = dflt ? kDefaultTokens : tokens;
  std::int64_t s = (want + seq_len - 1) / seq_len;
  s = (s + world - 1) / world * world;
  b.global_batch_sequences = s;
  if (dflt)
    b.note = "default global batch: 4M tokens (Llama 2's), as " + std::to_string(s) + " sequences of " +
             std::to_string(seq_len) + " tokens (" + std::to_string(s * seq_len) + " tokens, a whole number per GPU)";
  else if (s * seq_len != want)
    b.note = "--global-batch-tokens " + std::to_string(want) + " rounded up to " + std::to_string(s * seq_len) +
             " tokens = " + std::to_string(s) + " sequences (a whole number of sequences per GPU)";
  return b;
}

// ---- constraints ------------------------------------------------------------------------------

// The table's keys of a search role (PlanKey::search). Listed in the order the search varies them, then the
// base keys as `fsdpsim plan` has always listed them (its messages); a key the order does not name follows.
std::vector<std::string> keys_of(sim::SearchRole role) {
  static const std::vector<std::string> order = {
      "fsdp_version", "mesh", "sharding_strategy", "reshard_after_forward", "backward_prefetch", "forward_prefetch",
      "limit_all_gathers", "prefetch_depth", "activation_checkpointing", "micro_batch", "grad_accum", "grad_sync",
      "cpu_offload", "param_dtype", "reduce_dtype", "master_weights_dtype", "fp8_all_gather",
      "optimizer", "trainable_fraction", "auto_wrap_policy", "use_orig_params", "cross_entropy", "implementation",
      "compile", "optimizer_impl", "alloc_conf", "lora"};
  std::vector<std::string> out;
  for (const std::string& n : order)
    if (sim::plan_key(n).search == role) out.push_back(n);
  for (const sim::PlanKey& k : sim::plan_keys())
    if (k.search == role && std::find(order.begin(), order.end(), k.name) == order.end()) out.push_back(k.name);
  return out;
}

const std::vector<std::string>& searched_keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> s = keys_of(sim::SearchRole::Searched);
    s.push_back("precision");
    return s;
  }();
  return k;
}
const std::vector<std::string>& base_keys() {
  static const std::vector<std::string> k = keys_of(sim::SearchRole::Base);
  return k;
}

Constraint parse_constraint(const std::string& text, const std::string& field) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw InputError(field, text, "key=value with a plan JSON key, e.g. fsdp_version=2 or activation_checkpointing=full");
  Constraint c;
  c.key = sim::strip_quotes(text.substr(0, eq));
  c.text = text;
  const auto& s = searched_keys();
  const auto& b = base_keys();
  if (std::find(s.begin(), s.end(), c.key) == s.end() && std::find(b.begin(), b.end(), c.key) == b.end()) {
    std::string all;
    for (const auto& k : s) all += (all.empty() ? "" : ", ") + k;
    for (const auto& k : b) all += ", " + k;
    if (c.key == "seq_len") throw InputError(field, text, "use --seq-len for the sequence length");
    throw InputError(field, text, "unknown key \"" + c.key + "\"; plan keys: " + all);
  }
  c.value = canonicalize(c.key, text.substr(eq + 1), field + " " + c.key);
  return c;
}

std::string canonical_value(const Plan& p, const std::string& key) {
  if (key == "precision") return precision_name(p);
  const sim::PlanKey* k = sim::find_plan_key(key);
  return k && k->text ? k->text(p) : "";
}

// ---- meshes, families, labels ------------------------------------------------------------------

std::vector<std::pair<int, int>> valid_meshes(int nodes, int gpus_per_node) {
  std::vector<std::pair<int, int>> out;
  int world = nodes * gpus_per_node;
  for (int s = 1; s <= world; ++s) {
    if (world % s != 0) continue;
    bool inside = gpus_per_node % s == 0;
    bool across = s % gpus_per_node == 0;
    if (inside || across) out.emplace_back(world / s, s);
  }
  return out;
}

std::string family_of(const Plan& p, int gpus_per_node) {
  // NO_SHARD is how FSDP spells DDP: the family is named for what users know it as.
  std::string f = effective_strategy(p) == ShardingStrategy::NO_SHARD ? "DDP (NO_SHARD)" : sim::strategy_name(effective_strategy(p));
  if (p.fsdp_version == FsdpVersion::FSDP2 && p.reshard_after_forward.is_group()) f += " (hpZ)";
  if (p.mesh_shard > gpus_per_node) f += " across nodes";
  if (p.cpu_offload.params) f += " + CPU offload";
  return f;
}

std::string label_of(const Plan& p) {
  bool v1 = p.fsdp_version == FsdpVersion::FSDP1;
  std::ostringstream os;
  os << (v1 ? "FSDP1 " : "FSDP2 ") << sim::strategy_name(effective_strategy(p)) << " mesh(" << p.mesh_replicate << ","
     << p.mesh_shard << ")";
  if (!v1 && p.mesh_shard > 1) os << " rAF=" << p.reshard_after_forward.text();
  if (!v1 && p.prefetch_depth != 1) os << " prefetch=" << p.prefetch_depth;
  if (v1 && p.mesh_shard > 1) {
    if (p.backward_prefetch != BackwardPrefetch::BACKWARD_PRE) os << " " << sim::prefetch_name(p.backward_prefetch);
    if (p.forward_prefetch) os << " forward_prefetch";
    if (!p.limit_all_gathers) os << " limit_all_gathers=False";
  }
  if (v1 && !p.use_orig_params) os << " use_orig_params=False";
  os << " AC=" << sim::checkpointing_text(p.activation_checkpointing)
     << (p.activation_checkpointing.outside_compile ? "(around compile)" : "")
     << (p.activation_offloading == sim::ActivationOffload::Streams ? "+act-offload"
         : p.activation_offloading == sim::ActivationOffload::Sync  ? "+act-offload(sync)"
                                                                    : "")
     << " mb=" << p.micro_batch
     << " ga=" << p.grad_accum;
  if (p.grad_accum > 1) os << (p.grad_sync ? " sync" : " no_sync");
  if (p.cpu_offload.params) os << " offload";
  os << " " << precision_name(p);
  return os.str();
}

// ---- enumeration ------------------------------------------------------------------------------

std::vector<Candidate> enumerate_candidates(const SpaceOptions& o, int nodes, int gpus_per_node) {
  if (nodes < 1 || gpus_per_node < 1) throw InputError("cluster", std::to_string(nodes) + "x" + std::to_string(gpus_per_node), "at least one GPU");
  const int world = nodes * gpus_per_node;
  const BatchTarget& batch = o.batch;
  if (batch.global_batch_sequences < world || batch.global_batch_sequences % world != 0)
    throw InputError("--global-batch", std::to_string(batch.global_batch_sequences),
                     "a positive multiple of the " + std::to_string(world) + " GPUs");
  const std::int64_t per_gpu = batch.global_batch_sequences / world;

  // Dimension lists; a --fix replaces a list by its value (which may lie outside the default).
  std::vector<std::pair<int, int>> meshes = valid_meshes(nodes, gpus_per_node);
  if (auto* f = find_fixed(o, "mesh")) {
    auto m = sim::parse_mesh_text("--fix mesh", f->value);
    if (static_cast<std::int64_t>(m.first) * m.second != world)
      throw InputError("--fix mesh", f->text, "replicate x shard must equal the " + std::to_string(world) + " GPUs");
    meshes = {m};
  }
  std::vector<ActivationCheckpointing> acs(4);
  acs[1].mode = AcMode::Full;
  acs[2].mode = AcMode::EveryK;
  acs[2].every_k = 2;
  acs[3].mode = AcMode::SelectiveOp;
  if (auto* f = find_fixed(o, "activation_checkpointing")) acs = {sim::parse_ac_text("--fix activation_checkpointing", f->value)};
  // Compiled QLoRA: where the checkpoint sits decides what a block keeps (traced inside compile, torchtitan's
  // order, the NF4 weights escape it; eager around the compiled block, torchtune's order, they do not: program/
  // plan.h ActivationCheckpointing::outside_compile). Both orders of each whole-block mode are searched; for other
  // models the order changes little but the recompute, so the default (torchtitan's) alone.
  if (o.base.compile && o.base.lora.quantize_nf4)
    for (std::size_t i = 0, n = acs.size(); i < n; ++i)
      if (acs[i].mode == AcMode::Full || acs[i].mode == AcMode::EveryK) {
        ActivationCheckpointing around = acs[i];
        around.outside_compile = true;
        acs.push_back(around);
      }

  std::vector<std::int64_t> mbs = divisors(per_gpu);
  if (auto* f = find_fixed(o, "micro_batch")) {
    std::int64_t mb = std::stoll(f->value);
    if (per_gpu % mb != 0)
      throw InputError("--fix micro_batch", f->text, "must divide the per-GPU batch of " + std::to_string(per_gpu) + " sequences");
    mbs = {mb};
  }
  if (auto* f = find_fixed(o, "grad_accum")) {
    std::int64_t ga = std::stoll(f->value);
    if (per_gpu % ga != 0)
      throw InputError("--fix grad_accum", f->text, "must divide the per-GPU batch of " + std::to_string(per_gpu) + " sequences");
    std::vector<std::int64_t> keep;
    for (auto mb : mbs)
      if (mb * ga == per_gpu) keep.push_back(mb);
    if (keep.empty())
      throw InputError("--fix grad_accum", f->text, "micro_batch x grad_accum must equal the per-GPU batch of " + std::to_string(per_gpu));
    mbs = keep;
  }
  std::vector<int> rafs_int;   // FSDP2 reshard_after_forward group sizes beyond the default
  if (auto* f = find_fixed(o, "reshard_after_forward"))
    if (const int k = sim::parse_reshard_text("--fix reshard_after_forward", f->value).group_size(); k > 0)
      rafs_int.push_back(k);
  std::vector<int> depths = {1, 2};
  if (auto* f = find_fixed(o, "prefetch_depth")) depths = {std::stoi(f->value)};

  // Precision presets: the allowed list, or all of them when a dtype key is constrained.
  std::vector<PrecisionPreset> precisions;
  bool dtype_fixed = find_fixed(o, "param_dtype") || find_fixed(o, "reduce_dtype") ||
                     find_fixed(o, "master_weights_dtype") || find_fixed(o, "fp8_all_gather") || find_fixed(o, "precision");
  if (dtype_fixed) precisions = precision_presets();
  else
    for (const auto& n : o.precisions) precisions.push_back(find_precision_preset(n, "--precision"));
  // QLoRA (lora.quantize_base nf4) is modelled in pure low precision, without float8, and with CPU offload under
  // FSDP1 only (program/lower_context.cpp lora_shape): only such candidates; bf16-true when the list has none.
  const bool nf4 = o.base.lora.quantize_nf4;
  if (nf4) {
    std::erase_if(precisions, [](const PrecisionPreset& pr) {
      return pr.master != pr.param || pr.fp8_all_gather || pr.float8 != models::Float8Recipe::None;
    });
    if (precisions.empty()) precisions.push_back(find_precision_preset("bf16-true", "--precision"));
  }

  const auto knobs = fsdp1_knob_sets(o);
  // LoRA under FSDP1: use_orig_params false too, unless the user fixed it (the adapters then form FlatParameters
  // of their own and the frozen base keeps no flat gradient: torchtune's and PEFT's FSDP1 wrapping).
  const bool both_orig = o.base.lora.on() && !find_fixed(o, "use_orig_params");
  std::vector<Plan> plans;
  auto emit_combos = [&](Plan p) {  // AC x micro-batch x sync x offload x precision
    for (const auto& ac : acs)
      for (auto mb : mbs)
        for (int sync = 0; sync < 2; ++sync) {
          std::int64_t ga = per_gpu / mb;
          if (sync == 1 && ga == 1) continue;
          for (int off = 0; off < 2; ++off) {
            // FSDP1 CPU offload cannot accumulate gradients outside no_sync (semantics M11).
            if (off && sync && p.fsdp_version == FsdpVersion::FSDP1) continue;
            // (QLoRA offload is modelled for bitsandbytes' FSDP1 layout only)
            if (off && nf4 && p.fsdp_version == FsdpVersion::FSDP2) continue;
            for (const auto& pr : precisions) {
              if (pr.fp8_all_gather && p.fsdp_version == FsdpVersion::FSDP1) continue;
              Plan q = p;
              q.activation_checkpointing = ac;
              q.micro_batch = mb;
              q.grad_accum = ga;
              q.seq_len = batch.seq_len;
              q.grad_sync = sync == 1;
              // FSDP's offload_params: params, grads and optimizer state on the CPU, the step on the CPU
              // (M11; program/plan.cpp requires optimizer offload with params offload).
              q.cpu_offload.params = off == 1;
              q.cpu_offload.optimizer = off == 1;
              q.param_dtype = pr.param;
              q.reduce_dtype = pr.reduce;
              q.master_weights_dtype = pr.master;
              q.fp8_all_gather = pr.fp8_all_gather;
              q.float8 = pr.float8;
              // (a low-bit optimizer: only what is modelled with it, program/optimizer_state.h)
              if (!sim::optimizer_not_modelled(q).empty()) continue;
              plans.push_back(q);
            }
          }
        }
  };
  auto emit_rest = [&](Plan p) {
    emit_combos(p);
    if (both_orig && p.fsdp_version == FsdpVersion::FSDP1 && p.use_orig_params) {
      p.use_orig_params = false;
      emit_combos(p);
    }
  };


  for (int version : {1, 2}) {
    for (auto [r, s] : meshes) {
      Plan p = o.base;
      p.fsdp_version = version == 1 ? FsdpVersion::FSDP1 : FsdpVersion::FSDP2;
      p.mesh_replicate = r;
      p.mesh_shard = s;
      if (version == 1) {
        std::vector<ShardingStrategy> strategies;
        if (s == 1) strategies = {ShardingStrategy::NO_SHARD};
        else if (r == 1) strategies = {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP};
        else strategies = {ShardingStrategy::HYBRID_SHARD, ShardingStrategy::_HYBRID_SHARD_ZERO2};
        for (auto st : strategies) {
          p.sharding_strategy = st;
          p.reshard_after_forward = sim::ReshardAfterForward::of_strategy(st);
          if (st == ShardingStrategy::NO_SHARD) {  // no all-gathers: prefetch knobs do not apply
            p.backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
            p.forward_prefetch = false;
            p.limit_all_gathers = true;
            emit_rest(p);
            continue;
          }
          for (const auto& k : knobs) {
            p.backward_prefetch = k.bp;
            p.forward_prefetch = k.forward_prefetch;
            p.limit_all_gathers = k.limit_all_gathers;
            emit_rest(p);
          }
        }
      } else {
        p.backward_prefetch = BackwardPrefetch::BACKWARD_PRE;  // FSDP2's default behaviour (F2.7)
        p.forward_prefetch = false;
        p.limit_all_gathers = false;                             // FSDP2 has no rate limiter
        using Raf = sim::ReshardAfterForward;
        std::vector<Raf> rafs = {Raf::yes()};
        if (s > 1) rafs.push_back(Raf::no());
        // hpZ: reshard to the node after forward; not with one GPU per node (a group of 1 is no group size).
        if (gpus_per_node > 1 && s > gpus_per_node && s % gpus_per_node == 0) rafs.push_back(Raf::group(gpus_per_node));
        for (int k : rafs_int)
          if (k > 1 && k < s && s % k == 0 && std::find(rafs.begin(), rafs.end(), Raf::group(k)) == rafs.end())
            rafs.push_back(Raf::group(k));
        for (Raf raf : rafs) {
          p.reshard_after_forward = raf;
          p.sharding_strategy = effective_strategy(p);
          for (int d : (s > 1 ? depths : std::vector<int>{depths.front()})) {
            p.prefetch_depth = d;
            emit_rest(p);
          }
        }
      }
    }
  }

  std::vector<Candidate> out;
  for (const auto& p : plans) {
    bool keep = true;
    for (const auto& c : o.fixed) {
      const auto& b = base_keys();
      if (std::find(b.begin(), b.end(), c.key) != b.end()) continue;
      if (canonical_value(p, c.key) != c.value) keep = false;
    }
    for (const auto& c : o.excluded)
      if (canonical_value(p, c.key) == c.value) keep = false;
    if (!keep) continue;
    Candidate c;
    c.index = static_cast<int>(out.size());
    char buf[16];
    std::snprintf(buf, sizeof(buf), "c%04d", c.index);
    c.id = buf;
    c.plan = p;
    c.family = family_of(p, gpus_per_node);
    c.label = label_of(p);
    out.push_back(std::move(c));
  }
  if (out.empty()) {
    std::string cs;
    for (const auto& c : o.fixed) cs += " --fix " + c.text;
    for (const auto& c : o.excluded) cs += " --exclude " + c.text;
    throw InputError("--fix/--exclude", cs.empty() ? "(none)" : cs.substr(1),
                     "no candidate plan is left; loosen the constraints (a dtype needs its preset in --precision, FSDP1-only "
                     "keys exclude FSDP2, prefetch_depth excludes FSDP1" +
                         std::string(sim::optimizer_is_bitsandbytes(o.base.optimizer)
                                         ? ", bitsandbytes' optimizers are modelled under FSDP1 only"
                                         : "") +
                         (sim::optimizer_is_low_bit(o.base.optimizer) ? ", a low-bit optimizer excludes CPU offload" : "") +
                         ")");
  }
  return out;
}

void apply_base_constraint(Plan& p, const Constraint& c) {
  const sim::PlanKey* k = sim::find_plan_key(c.key);
  if (!k || k->search != sim::SearchRole::Base) throw InputError("--fix " + c.key, c.value, "not a base plan key");
  k->set(p, c.value, "--fix " + c.key);
}

}  // namespace fsdpsim::planner
