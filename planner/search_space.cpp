// The candidate space (note "default search space" in search_space.h).
#include "planner/search_space.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "common/json_reader.h"
#include "planner/config_text.h"

namespace fsdpsim::planner {
namespace {

using sim::ActivationCheckpointing;
using sim::BackwardPrefetch;
using sim::FsdpVersion;
using sim::Plan;
using sim::ShardingStrategy;
using AcMode = ActivationCheckpointing::Mode;

using config_text::lower;
using config_text::upper;
// Unlike config_text::trim, also strips the quotes a shell may leave around a --fix value.
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\"'"), e = s.find_last_not_of(" \t\"'");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool parse_long(const std::string& s, long long& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtoll(s.c_str(), &end, 10);
  return *end == '\0';
}

std::string canonical_bool(const std::string& field, const std::string& v) {
  std::string l = lower(v);
  if (l == "true" || l == "1" || l == "yes" || l == "on") return "true";
  if (l == "false" || l == "0" || l == "no" || l == "off") return "false";
  throw InputError(field, v, "true or false");
}

std::string canonical_positive_int(const std::string& field, const std::string& v, long long hi) {
  long long x = 0;
  if (!parse_long(v, x) || x < 1 || x > hi)
    throw InputError(field, v, "an integer in [1, " + std::to_string(hi) + "]");
  return std::to_string(x);
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
  if (u == "FULL_SHARD") return ShardingStrategy::FULL_SHARD;
  if (u == "SHARD_GRAD_OP") return ShardingStrategy::SHARD_GRAD_OP;
  if (u == "NO_SHARD") return ShardingStrategy::NO_SHARD;
  if (u == "HYBRID_SHARD") return ShardingStrategy::HYBRID_SHARD;
  if (u == "_HYBRID_SHARD_ZERO2" || u == "HYBRID_SHARD_ZERO2") return ShardingStrategy::_HYBRID_SHARD_ZERO2;
  throw InputError(field, v, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or _HYBRID_SHARD_ZERO2");
}

BackwardPrefetch parse_prefetch_text(const std::string& field, const std::string& v) {
  std::string u = upper(v);
  if (u.rfind("BACKWARDPREFETCH.", 0) == 0) u = u.substr(17);
  if (u == "BACKWARD_PRE") return BackwardPrefetch::BACKWARD_PRE;
  if (u == "BACKWARD_POST") return BackwardPrefetch::BACKWARD_POST;
  if (u == "NONE" || u == "NULL" || u == "NO_PREFETCH") return BackwardPrefetch::NONE;
  throw InputError(field, v, "BACKWARD_PRE, BACKWARD_POST or NONE");
}

// reshard_after_forward as the plan stores it: -1 true, 0 false, k > 1 an int.
int parse_reshard_text(const std::string& field, const std::string& v) {
  std::string l = lower(v);
  if (l == "true") return -1;
  if (l == "false") return 0;
  long long k = 0;
  if (parse_long(l, k) && k >= 2 && k <= 1 << 20) return static_cast<int>(k);
  throw InputError(field, v, "true, false or an int >= 2 (FSDP2: reshard to groups of that size after forward)");
}

// Canonicalizes the value of a `--fix/--exclude` constraint, or throws naming the key.
std::string canonicalize(const std::string& key, const std::string& raw, const std::string& field) {
  std::string v = trim(raw);
  if (key == "fsdp_version") {
    if (v == "1" || v == "2") return v;
    throw InputError(field, raw, "fsdp_version is 1 or 2");
  }
  if (key == "mesh") {
    auto [r, s] = parse_mesh_text(field, v);
    return "[" + std::to_string(r) + "," + std::to_string(s) + "]";
  }
  if (key == "sharding_strategy") return strategy_text(parse_strategy_text(field, v));
  if (key == "reshard_after_forward") return reshard_text(parse_reshard_text(field, v));
  if (key == "backward_prefetch") return prefetch_text(parse_prefetch_text(field, v));
  if (key == "forward_prefetch" || key == "limit_all_gathers" || key == "grad_sync" || key == "cpu_offload" ||
      key == "fp8_all_gather")
    return canonical_bool(field, v);
  if (key == "prefetch_depth") return canonical_positive_int(field, v, 16);
  if (key == "micro_batch" || key == "grad_accum") return canonical_positive_int(field, v, 65536);
  if (key == "activation_checkpointing") return checkpointing_text(parse_ac_text(field, v));
  if (key == "param_dtype" || key == "reduce_dtype" || key == "master_weights_dtype")
    return std::string(dtype_name(parse_dtype(v, field)));
  if (key == "precision") return find_precision_preset(v, field).name;
  return v;  // base keys are checked by apply_base_constraint
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

// ---- names ----------------------------------------------------------------------------------

// The plan's own spellings (sim/plan.h); the planner only folds every_1 into "full".
std::string strategy_text(ShardingStrategy s) { return sim::strategy_name(s); }
std::string prefetch_text(BackwardPrefetch b) { return sim::prefetch_name(b); }
std::string checkpointing_text(const ActivationCheckpointing& ac) {
  if (ac.mode == AcMode::EveryK && ac.every_k <= 1) return "full";
  return sim::checkpointing_name(ac);
}
std::string reshard_text(int r) {
  if (r < 0) return "true";
  if (r == 0 || r == 1) return "false";
  return std::to_string(r);
}


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

const std::vector<std::string>& searched_keys() {
  static const std::vector<std::string> k = {
      "fsdp_version", "mesh", "sharding_strategy", "reshard_after_forward", "backward_prefetch",
      "forward_prefetch", "limit_all_gathers", "prefetch_depth", "activation_checkpointing", "micro_batch",
      "grad_accum", "grad_sync", "cpu_offload", "param_dtype", "reduce_dtype", "master_weights_dtype",
      "fp8_all_gather", "precision"};
  return k;
}
const std::vector<std::string>& base_keys() {
  static const std::vector<std::string> k = {"optimizer",     "trainable_fraction", "auto_wrap_policy", "use_orig_params",
                                             "cross_entropy", "implementation",     "compile",          "optimizer_impl",
                                             "alloc_conf",    "lora"};
  return k;
}

Constraint parse_constraint(const std::string& text, const std::string& field) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw InputError(field, text, "key=value with a plan JSON key, e.g. fsdp_version=2 or activation_checkpointing=full");
  Constraint c;
  c.key = trim(text.substr(0, eq));
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
  bool v1 = p.fsdp_version == FsdpVersion::FSDP1;
  if (key == "fsdp_version") return v1 ? "1" : "2";
  if (key == "mesh") return "[" + std::to_string(p.mesh_replicate) + "," + std::to_string(p.mesh_shard) + "]";
  if (key == "sharding_strategy") return strategy_text(effective_strategy(p));
  if (key == "reshard_after_forward") {
    if (!v1) return reshard_text(p.reshard_after_forward);
    auto s = p.sharding_strategy;
    return (s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD) ? "true" : "false";
  }
  // FSDP1-only knobs read "n/a" under FSDP2 (fixing one restricts the search to FSDP1), and
  // FSDP2's prefetch_depth reads "n/a" under FSDP1.
  if (key == "backward_prefetch") return v1 ? prefetch_text(p.backward_prefetch) : "n/a";
  if (key == "forward_prefetch") return v1 ? (p.forward_prefetch ? "true" : "false") : "n/a";
  if (key == "limit_all_gathers") return v1 ? (p.limit_all_gathers ? "true" : "false") : "n/a";
  if (key == "prefetch_depth") return v1 ? "n/a" : std::to_string(p.prefetch_depth);
  if (key == "activation_checkpointing") return checkpointing_text(p.activation_checkpointing);
  if (key == "micro_batch") return std::to_string(p.micro_batch);
  if (key == "grad_accum") return std::to_string(p.grad_accum);
  if (key == "grad_sync") return p.grad_sync ? "true" : "false";
  if (key == "cpu_offload") return p.cpu_offload.params ? "true" : "false";
  if (key == "param_dtype") return std::string(dtype_name(p.param_dtype));
  if (key == "reduce_dtype") return std::string(dtype_name(p.reduce_dtype));
  if (key == "master_weights_dtype") return std::string(dtype_name(p.master_weights_dtype));
  if (key == "fp8_all_gather") return p.fp8_all_gather ? "true" : "false";
  if (key == "precision") return precision_name(p);
  return "";
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
  std::string f = effective_strategy(p) == ShardingStrategy::NO_SHARD ? "DDP (NO_SHARD)" : strategy_text(effective_strategy(p));
  if (p.fsdp_version == FsdpVersion::FSDP2 && p.reshard_after_forward > 1) f += " (hpZ)";
  if (p.mesh_shard > gpus_per_node) f += " across nodes";
  if (p.cpu_offload.params) f += " + CPU offload";
  return f;
}

std::string label_of(const Plan& p) {
  bool v1 = p.fsdp_version == FsdpVersion::FSDP1;
  std::ostringstream os;
  os << (v1 ? "FSDP1 " : "FSDP2 ") << strategy_text(effective_strategy(p)) << " mesh(" << p.mesh_replicate << ","
     << p.mesh_shard << ")";
  if (!v1 && p.mesh_shard > 1) os << " rAF=" << reshard_text(p.reshard_after_forward);
  if (!v1 && p.prefetch_depth != 1) os << " prefetch=" << p.prefetch_depth;
  if (v1 && p.mesh_shard > 1) {
    if (p.backward_prefetch != BackwardPrefetch::BACKWARD_PRE) os << " " << prefetch_text(p.backward_prefetch);
    if (p.forward_prefetch) os << " forward_prefetch";
    if (!p.limit_all_gathers) os << " limit_all_gathers=False";
  }
  os << " AC=" << checkpointing_text(p.activation_checkpointing) << " mb=" << p.micro_batch << " ga=" << p.grad_accum;
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
    auto m = parse_mesh_text("--fix mesh", f->value);
    if (static_cast<std::int64_t>(m.first) * m.second != world)
      throw InputError("--fix mesh", f->text, "replicate x shard must equal the " + std::to_string(world) + " GPUs");
    meshes = {m};
  }
  std::vector<ActivationCheckpointing> acs(4);
  acs[1].mode = AcMode::Full;
  acs[2].mode = AcMode::EveryK;
  acs[2].every_k = 2;
  acs[3].mode = AcMode::SelectiveOp;
  if (auto* f = find_fixed(o, "activation_checkpointing")) acs = {parse_ac_text("--fix activation_checkpointing", f->value)};

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
  std::vector<int> rafs_int;   // FSDP2 int reshard_after_forward values beyond the default
  if (auto* f = find_fixed(o, "reshard_after_forward"))
    if (f->value != "true" && f->value != "false") rafs_int.push_back(std::stoi(f->value));
  std::vector<int> depths = {1, 2};
  if (auto* f = find_fixed(o, "prefetch_depth")) depths = {std::stoi(f->value)};

  // Precision presets: the allowed list, or all of them when a dtype key is constrained.
  std::vector<PrecisionPreset> precisions;
  bool dtype_fixed = find_fixed(o, "param_dtype") || find_fixed(o, "reduce_dtype") ||
                     find_fixed(o, "master_weights_dtype") || find_fixed(o, "fp8_all_gather") || find_fixed(o, "precision");
  if (dtype_fixed) precisions = precision_presets();
  else
    for (const auto& n : o.precisions) precisions.push_back(find_precision_preset(n, "--precision"));

  const auto knobs = fsdp1_knob_sets(o);
  std::vector<Plan> plans;
  auto emit_rest = [&](Plan p) {  // AC x micro-batch x sync x offload x precision
    for (const auto& ac : acs)
      for (auto mb : mbs)
        for (int sync = 0; sync < 2; ++sync) {
          std::int64_t ga = per_gpu / mb;
          if (sync == 1 && ga == 1) continue;
          for (int off = 0; off < 2; ++off) {
            // FSDP1 CPU offload cannot accumulate gradients outside no_sync (semantics M11).
            if (off && sync && p.fsdp_version == FsdpVersion::FSDP1) continue;
            for (const auto& pr : precisions) {
              if (pr.fp8_all_gather && p.fsdp_version == FsdpVersion::FSDP1) continue;
              Plan q = p;
              q.activation_checkpointing = ac;
              q.micro_batch = mb;
              q.grad_accum = ga;
              q.seq_len = batch.seq_len;
              q.grad_sync = sync == 1;
              // FSDP's offload_params: params, grads and optimizer state on the CPU, the step on the CPU
              // (M11; sim/plan.cpp requires optimizer offload with params offload).
              q.cpu_offload.params = off == 1;
              q.cpu_offload.optimizer = off == 1;
              q.param_dtype = pr.param;
              q.reduce_dtype = pr.reduce;
              q.master_weights_dtype = pr.master;
              q.fp8_all_gather = pr.fp8_all_gather;
              q.float8 = pr.float8;
              plans.push_back(q);
            }
          }
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
          p.reshard_after_forward = (st == ShardingStrategy::FULL_SHARD || st == ShardingStrategy::HYBRID_SHARD) ? -1 : 0;
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
        std::vector<int> rafs = {-1};
        if (s > 1) rafs.push_back(0);
        if (s > gpus_per_node && s % gpus_per_node == 0) rafs.push_back(gpus_per_node);
        for (int k : rafs_int)
          if (k > 1 && k < s && s % k == 0 && std::find(rafs.begin(), rafs.end(), k) == rafs.end()) rafs.push_back(k);
        for (int raf : rafs) {
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
                     "keys exclude FSDP2 and prefetch_depth excludes FSDP1)");
  }
  return out;
}

void apply_base_constraint(Plan& p, const Constraint& c) {
  const std::string field = "--fix " + c.key;
  const std::string& v = c.value;
  if (c.key == "optimizer") {
    std::string l = lower(v);
    if (l == "adamw" || l == "adam") p.optimizer = sim::Optimizer::AdamW;
    else if (l == "sgd") p.optimizer = sim::Optimizer::SGD;
    else throw InputError(field, v, "adamw or sgd");
  } else if (c.key == "trainable_fraction") {
    char* end = nullptr;
    double f = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(f > 0.0 && f <= 1.0)) throw InputError(field, v, "a fraction in (0, 1]");
    p.trainable_fraction = f;
  } else if (c.key == "lora") {
    // "<rank>:<target>,<target>...[:<dropout>]" (e.g. 16:q,k,v or 8:q,v:0.05), or the plan's JSON object
    const std::string what = "<rank>:<targets>[:<dropout>], e.g. 16:q,v or 8:q,v:0.05, or the plan's {\"rank\": ...}";
    nlohmann::json j;
    if (!v.empty() && v[0] == '{') {
      j = parse_json_text(v, field);
    } else {
      const auto c1 = v.find(':');
      if (c1 == std::string::npos) throw InputError(field, v, what);
      const auto c2 = v.find(':', c1 + 1);
      long long rank = 0;
      if (!parse_long(v.substr(0, c1), rank)) throw InputError(field, v, what);
      j["rank"] = rank;
      j["targets"] = nlohmann::json::array();
      const std::string targets = v.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
      std::size_t pos = 0;
      while (pos <= targets.size()) {
        const std::size_t end = std::min(targets.find(',', pos), targets.size());
        j["targets"].push_back(trim(targets.substr(pos, end - pos)));
        pos = end + 1;
      }
      if (c2 != std::string::npos) {
        char* e = nullptr;
        const std::string d = v.substr(c2 + 1);
        const double dropout = std::strtod(d.c_str(), &e);
        if (d.empty() || *e != '\0') throw InputError(field, v, what);
        j["dropout"] = dropout;
      }
    }
    p.lora = sim::parse_lora(j, field);
    if (p.trainable_fraction < 1.0)
      throw InputError(field, v, "give either lora (the adapters train, nothing else) or trainable_fraction < 1, not both");
  } else if (c.key == "use_orig_params") {
    p.use_orig_params = canonical_bool(field, v) == "true";
  } else if (c.key == "cross_entropy") {
    std::string l = lower(v);
    if (l == "torch") p.cross_entropy = models::LossImpl::Torch;
    else if (l == "fused") p.cross_entropy = models::LossImpl::Fused;
    else if (l == "fused_linear") p.cross_entropy = models::LossImpl::FusedLinear;
    else if (l == "chunked") p.cross_entropy = models::LossImpl::Chunked;   // torchtune's 8 output chunks
    else throw InputError(field, v, "torch, fused, fused_linear or chunked");
  } else if (c.key == "implementation") {
    std::string l = lower(v);
    if (l == "torchtitan") p.implementation = models::ModelImpl::TorchTitan;
    else if (l == "hf") p.implementation = models::ModelImpl::HF;
    else if (l == "litgpt") p.implementation = models::ModelImpl::LitGPT;
    else if (l == "fused") p.implementation = models::ModelImpl::Fused;
    else throw InputError(field, v, "torchtitan, hf, litgpt or fused");
  } else if (c.key == "compile") {
    p.compile = canonical_bool(field, v) == "true";
  } else if (c.key == "optimizer_impl") {
    std::string l = lower(v);
    if (l == "foreach") p.optimizer_impl = sim::OptimizerImpl::Foreach;
    else if (l == "fused") p.optimizer_impl = sim::OptimizerImpl::Fused;
    else throw InputError(field, v, "foreach or fused");
  } else if (c.key == "alloc_conf") {
    p.alloc_conf = sim::parse_alloc_conf(v, field);
  } else if (c.key == "auto_wrap_policy") {
    std::string l = lower(v);
    models::WrapPolicy w;
    if (l == "transformer_block") w.kind = models::WrapPolicy::Kind::TransformerBlock;
    else if (l == "none") w.kind = models::WrapPolicy::Kind::None;
    else if (long long n = 0; l.rfind("min_num_params:", 0) == 0 && parse_long(l.substr(15), n) && n >= 1) {
      w.kind = models::WrapPolicy::Kind::Size;
      w.min_num_params = n;
    } else {
      throw InputError(field, v, "transformer_block, none or min_num_params:<N>");
    }
    p.auto_wrap_policy = w;
  } else {
    throw InputError(field, v, "not a base plan key");
  }
}

}  // namespace fsdpsim::planner
