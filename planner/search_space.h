// The planner's candidate space: every FSDP configuration `fsdpsim plan` considers for one model,
// cluster and batch target, and the `--fix key=value` / `--exclude key=value` constraints on it.
//
// The default space (note "default search space", copied into the README):
//   fsdp_version            1 and 2
//   mesh (replicate, shard) every node-aligned mesh with replicate x shard = GPUs: shard divides the
//                           GPUs per node (shard inside a node) or is a multiple of it (shard across
//                           nodes, up to the whole world). shard = 1 is pure replication (DDP-like).
//   FSDP1 strategy          replicate = 1: FULL_SHARD, SHARD_GRAD_OP; shard = 1: NO_SHARD;
//                           both > 1: HYBRID_SHARD, _HYBRID_SHARD_ZERO2
//   FSDP1 prefetch knobs    PyTorch's defaults (BACKWARD_PRE, forward_prefetch=False,
//                           limit_all_gathers=True) and each single deviation from them
//                           (BACKWARD_POST; forward_prefetch=True; limit_all_gathers=False). Fixing
//                           or excluding any of the three keys searches their full product instead.
//   FSDP2 reshard_after_forward  true, false, and the int GPUs-per-node when the shard group spans
//                           nodes of more than one GPU (ZeRO++ hpZ, semantics F2.4/F2.12); prefetch_depth
//                           1 and 2.
//   activation_checkpointing none, full, every_2, selective_op (FSDP(AC(block)), semantics A1/A3)
//   micro_batch x grad_accum every divisor split of the per-GPU batch (global batch / GPUs)
//   grad_sync               false (no_sync until the last micro-batch) and true, when grad_accum > 1
//   cpu_offload             false and true (params, grads and optimizer state on the CPU)
//   precision               the presets the user allows (--precision; default "bf16")
// NO_SHARD (shard = 1) has no all-gathers, so its prefetch knobs are not varied.
// Sizes: 3,352 candidates for the default command (llama3-8b, 8xH100-SXM, 8192 tokens, 4M-token
// batch: 64 sequences per GPU), 1,088 for llama3-70b on 128x8 H100s (one sequence per GPU);
// tests/planner/test_unit_search_space.cpp checks exact counts on small clusters.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "program/plan.h"
#include "program/plan_keys.h"

namespace fsdpsim::planner {

// A named precision choice: the three dtypes of a plan (+ FSDP2 fp8 all-gather).
struct PrecisionPreset {
  std::string name;        // "bf16", "bf16-bf16reduce", "bf16-true", "fp32", "fp8-ag", "fp8-rowwise", ...
  Dtype param = Dtype::BF16;
  Dtype reduce = Dtype::FP32;
  Dtype master = Dtype::FP32;
  bool fp8_all_gather = false;
  std::string meaning;     // one line for --help and the report
  // torchao float8 compute (plan key float8); fp8_all_gather implies tensorwise. A GPU without fp8
  // tensor cores in its profile (A100; the RTX4090 profile lists no fp8 peak) makes such a candidate invalid (InputError naming plan.float8).
  models::Float8Recipe float8 = models::Float8Recipe::None;
};
const std::vector<PrecisionPreset>& precision_presets();
// InputError(field, name) listing the presets when unknown.
const PrecisionPreset& find_precision_preset(const std::string& name, const std::string& field);

// The global batch the search must meet, in sequences of seq_len tokens.
struct BatchTarget {
  std::int64_t seq_len = 8192;
  std::int64_t global_batch_sequences = 0;
  std::string note;        // set when the requested batch was rounded (the report shows it)
  std::int64_t tokens() const { return seq_len * global_batch_sequences; }
};
// Default when neither is given: 4M tokens (the Llama 2 paper's global batch, Touvron et al. 2023
// §2.2: "a global batch-size of 4M tokens"), raised to one sequence per GPU on larger clusters.
// Tokens are rounded up to a whole number of sequences per GPU (noted); sequences must be a
// multiple of the GPU count (the data-parallel degree is always the world) or InputError.
BatchTarget resolve_batch_target(std::int64_t seq_len, std::int64_t global_batch_tokens,
                                 std::int64_t global_batch_sequences, int world);

// `--fix key=value` / `--exclude key=value` with plan JSON keys; the value is kept canonical.
struct Constraint {
  std::string key;
  std::string value;       // canonical form (see canonical_value)
  std::string text;        // as typed, for messages
};
Constraint parse_constraint(const std::string& text, const std::string& field);
// Sets a base (not searched) key on a plan: optimizer, trainable_fraction, use_orig_params,
// auto_wrap_policy (transformer_block | none | min_num_params:<N>). InputError naming the key.
void apply_base_constraint(sim::Plan& p, const Constraint& c);
// Plan JSON keys the search varies (the ones --exclude accepts).
const std::vector<std::string>& searched_keys();
// Other plan keys --fix accepts; they set the base plan (not searched).
const std::vector<std::string>& base_keys();

struct SpaceOptions {
  BatchTarget batch;
  std::vector<std::string> precisions = {"bf16"};
  std::vector<Constraint> fixed;
  std::vector<Constraint> excluded;
  sim::Plan base;          // optimizer, trainable_fraction, auto_wrap_policy, use_orig_params
};

struct Candidate {
  int index = 0;           // enumeration order (stable): ids and tie-breaks use it
  std::string id;          // "c0042"
  sim::Plan plan;          // mesh filled in (resolved form)
  std::string family;      // "FULL_SHARD", "HYBRID_SHARD", "NO_SHARD + CPU offload", ...
  std::string label;       // "FSDP2 FULL_SHARD mesh(1,8) rAF=true AC=none mb=2 ga=4 bf16"
};

// Node-aligned meshes (replicate, shard) for a cluster, by increasing shard size.
std::vector<std::pair<int, int>> valid_meshes(int nodes, int gpus_per_node);

// Enumerates the space (see the note at the top); constraints applied. InputError when a
// constraint names an unknown key or a value its key cannot take, or when nothing is left.
std::vector<Candidate> enumerate_candidates(const SpaceOptions& opts, int nodes, int gpus_per_node);

// The canonical value of a searched key in a plan ("true", "[2,8]", "every_2", "BACKWARD_PRE").
std::string canonical_value(const sim::Plan& p, const std::string& key);
std::string precision_name(const sim::Plan& p);        // preset name or "param=..,reduce=..,master=.."
std::string family_of(const sim::Plan& p, int gpus_per_node);
std::string label_of(const sim::Plan& p);

}  // namespace fsdpsim::planner
