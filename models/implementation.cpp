// The public face of the implementation recipes: validate, write the block on a tape
// (models/block_recipes.cpp), pick the policy for the checkpointing mode and compile option
// (models/autograd_tape.cpp), and read off the saved tensors and the transients.
//
// The planner evaluates the same (model, micro-batch, mode, options) many times: results are memoized
// per thread (the tape is a few dozen ops; a MoE model's per-expert loop makes it a few hundred).
#include "models/implementation.h"

#include <algorithm>
#include <tuple>

#include "common/errors.h"
#include "models/block_recipes.h"

namespace fsdpsim::models {
namespace {

void validate(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len) {
  if (micro_batch <= 0) throw InputError("micro_batch", std::to_string(micro_batch), "a positive number of sequences");
  if (seq_len <= 0) throw InputError("seq_len", std::to_string(seq_len), "a positive number of tokens");
  auto positive = [&](const char* field, std::int64_t v) {
    if (v <= 0) throw InputError(std::string("model.") + field, std::to_string(v), "a positive integer");
  };
  positive("hidden", m.hidden);
  positive("n_heads", m.n_heads);
  positive("n_kv_heads", m.n_kv_heads);
  positive("head_dim", m.head_dim);
  positive("ffn_hidden", m.ffn_hidden);
  if (m.n_heads % m.n_kv_heads != 0)
    throw InputError("model.n_kv_heads", std::to_string(m.n_kv_heads),
                     "a divisor of n_heads (" + std::to_string(m.n_heads) + ")");
  if (m.is_moe() && (m.experts_top_k <= 0 || m.experts_top_k > m.n_experts))
    throw InputError("model.experts_top_k", std::to_string(m.experts_top_k),
                     "between 1 and n_experts (" + std::to_string(m.n_experts) + ")");
}

BlockMemory read(const AutogradTape& t, const TapePolicy& p) {
  BlockMemory bm;
  const auto& storages = t.storages();
  const int input_storage = t.tensors()[static_cast<std::size_t>(t.input_tensor())].storage;
  std::vector<int> saved_index(storages.size(), -1);
  for (std::size_t s = 0; s < storages.size(); ++s) {
    if (!p.kept[s]) continue;
    saved_index[s] = static_cast<int>(bm.saved.size());
    bm.saved.push_back({storages[s].name, p.bytes[s], static_cast<int>(s) == input_storage});
  }
  bm.forward_events = t.forward_events(p);
  for (ForwardEvent& e : bm.forward_events)
    if (e.kind == ForwardEvent::Kept) e.saved = saved_index[static_cast<std::size_t>(e.storage)];
  const TapeCost c = t.cost(p);
  bm.forward_extra = c.forward_extra;
  bm.backward_extra = c.backward_extra;
  bm.backward_extra_with_grads = c.backward_extra_with_grads;
  bm.param_grads = c.param_grads;
  bm.recompute_events = t.recompute_events(p);
  bm.backward_events = t.backward_events(p);
  for (BackwardEvent& e : bm.backward_events)
    if (e.storage >= 0) e.saved = saved_index[static_cast<std::size_t>(e.storage)];
  bm.backward_phase_extra = c.backward_phase_extra;
  bm.backward_phase_extra_with_grads = c.backward_phase_extra_with_grads;
  bm.incoming_grad = c.incoming_grad;
  return bm;
}

TapePolicy policy_for(const AutogradTape& t, CheckpointMode mode, bool compile, bool outside_compile) {
  const TapePolicy inner = compile ? t.compiled_policy() : t.eager_policy();
  switch (mode) {
    // checkpoint(compile(block)): torch.utils.checkpoint's pack hook (non-reentrant, saved_tensors_hooks) sees
    // the compiled function's save_for_backward at run time and drops every tensor but the block's input (the
    // set lives until the compiled forward returns); the recompute reruns the compiled forward, which saves the
    // compiled set for this block's backward alone.
    case CheckpointMode::Full:
      return compile && outside_compile ? t.checkpoint_around_compiled(inner) : t.full_checkpoint_policy(inner);
    case CheckpointMode::SelectiveOp: return t.selective_op_policy(inner);
    case CheckpointMode::None: break;
  }
  return inner;
}

struct MemoKey {
  ModelSpec model;
  std::int64_t micro_batch = 0, seq_len = 0;
  Dtype act = Dtype::BF16;
  CheckpointMode mode = CheckpointMode::None;
  ModelImpl impl = ModelImpl::HF;
  bool compile = false, outside_compile = false;
  Float8Recipe float8 = Float8Recipe::None;
  bool final_norm = false;
  GradFlow flow;
  LoraShape lora;
  int sm_count = 0;
  bool operator==(const MemoKey& o) const {
    return std::tie(micro_batch, seq_len, act, mode, impl, compile, outside_compile, float8, final_norm, sm_count) ==
               std::tie(o.micro_batch, o.seq_len, o.act, o.mode, o.impl, o.compile, o.outside_compile, o.float8,
                        o.final_norm, o.sm_count) &&
           flow == o.flow && lora == o.lora && model == o.model;
  }
};

// A small per-thread cache: the most recent results, oldest replaced first.
const BlockMemory& memoized(const MemoKey& key) {
  constexpr std::size_t kEntries = 32;
  thread_local std::vector<std::pair<MemoKey, BlockMemory>> cache;
  thread_local std::size_t next = 0;
  for (const auto& [k, v] : cache)
    if (k == key) return v;
  const ImplOptions o{key.impl, key.compile, key.float8, key.lora, key.sm_count, key.outside_compile};
  const std::int64_t tokens = key.micro_batch * key.seq_len;
  BlockMemory bm;
  if (key.final_norm) {
    const AutogradTape t = build_final_norm_tape(key.model, tokens, key.act, o, key.flow);
    // torchtitan compiles each TransformerBlock (apply_compile), not the final norm
    const bool compiled = key.compile && key.impl != ModelImpl::TorchTitan;
    bm = read(t, compiled ? t.compiled_policy() : t.eager_policy());
  } else {
    const AutogradTape t = build_block_tape(key.model, tokens, key.act, o, key.flow);
    bm = read(t, policy_for(t, key.mode, key.compile, key.outside_compile));
  }
  if (cache.size() < kEntries) {
    cache.emplace_back(key, std::move(bm));
    return cache.back().second;
  }
  const std::size_t slot = next++ % kEntries;
  cache[slot] = {key, std::move(bm)};
  return cache[slot].second;
}

}  // namespace

Bytes BlockMemory::saved_bytes() const {
  Bytes s = 0;
  for (const SavedTensor& t : saved) s += t.bytes;
  return s;
}

BlockMemory block_memory(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype act,
                         CheckpointMode mode, const ImplOptions& o, const GradFlow& g) {
  validate(m, micro_batch, seq_len);
  if (o.impl == ModelImpl::Runtime) {
    // The bundled runtime's kernels keep each block's saved activations in one buffer laid out as the
    // legacy formula says (runtime/model/block.h); its other scratch is outside the caching allocator.
    BlockMemory bm;
    bm.saved.push_back({"act", block_saved_activation_bytes(m, micro_batch, seq_len, act, mode)});
    return bm;
  }
  return memoized({m, micro_batch, seq_len, act, mode, o.impl, o.compile, o.checkpoint_outside_compile, o.float8, false,
                   g, o.lora, o.sm_count});
}

BlockMemory final_norm_memory(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype act,
                              const ImplOptions& o, const GradFlow& g) {
  validate(m, micro_batch, seq_len);
  if (o.impl == ModelImpl::Runtime) return {};   // the runtime's final-norm activations are scratch
  return memoized({m, micro_batch, seq_len, act, CheckpointMode::None, o.impl, o.compile, false, o.float8, true, g,
                   o.lora, o.sm_count});
}

bool loss_upcasts_logits(const ModelSpec& /*m*/, const ImplOptions& o) { return o.impl != ModelImpl::LitGPT; }

std::int64_t loss_chunk_rows(const ModelSpec& /*m*/, const ImplOptions& o) { return o.impl == ModelImpl::LitGPT ? 128 : 0; }

ModelImpl parse_model_impl(const std::string& s, const std::string& field) {
  for (ModelImpl i : {ModelImpl::TorchTitan, ModelImpl::HF, ModelImpl::LitGPT, ModelImpl::Fused})
    if (s == model_impl_name(i)) return i;
  throw InputError(field, s, "torchtitan, hf, litgpt or fused");
}

}  // namespace fsdpsim::models
