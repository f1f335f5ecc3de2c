// Pruning bounds (note "pruning bounds" in bounds.h). Every term is something the lowering must
// allocate or run; anything uncertain is left out, so the bounds stay below the simulation.
#include "planner/bounds.h"

#include "program/lower_context.h"
#include "program/optimizer_state.h"

#include <algorithm>

namespace fsdpsim::planner {
namespace {

using AcMode = sim::ActivationCheckpointing::Mode;

models::CheckpointMode block_mode(const sim::ActivationCheckpointing& ac, std::int64_t layer) {
  switch (ac.mode) {
    case AcMode::None: return models::CheckpointMode::None;
    case AcMode::Full: return models::CheckpointMode::Full;
    case AcMode::SelectiveOp: return models::CheckpointMode::SelectiveOp;
    case AcMode::EveryK:
      return (ac.every_k <= 1 || layer % ac.every_k == 0) ? models::CheckpointMode::Full : models::CheckpointMode::None;
  }
  return models::CheckpointMode::None;
}

// Blocks in [first, layers) fully recomputed in backward under a checkpointing mode (selective: counted
// as none).
std::int64_t recomputed_blocks(const sim::ActivationCheckpointing& ac, std::int64_t layers, std::int64_t first = 0) {
  std::int64_t n = 0;
  for (std::int64_t l = std::max<std::int64_t>(first, 0); l < layers; ++l)
    n += block_mode(ac, l) == models::CheckpointMode::Full;
  return n;
}

}  // namespace

std::pair<std::string, Bytes> MemoryBound::largest_component() const {
  std::pair<std::string, Bytes> best{"sharded params", sharded_params};
  auto consider = [&](const char* n, Bytes b) {
    if (b > best.second) best = {n, b};
  };
  consider("sharded grads", sharded_grads);
  consider("optimizer state", optimizer_state);
  consider("saved activations", activations);
  consider("logits", logits);
  consider("the head's unsharded FSDP unit", unsharded_unit);
  consider("the units kept unsharded after forward", kept_unsharded);
  consider("the gradients carried across micro-batches", carried_grads);
  consider("the loss's backward", loss_backward);
  return best;
}

Bounds::Bounds(const models::ModelSpec& model, const calibrate::HardwareProfile& hw, const models::WrapPolicy& policy)
    : model_(model), hw_(hw), counts_(models::count_params(model)) {
  models::WrapGraph g = models::build_wrap_graph(model, policy);
  for (const auto& u : g.units) {
    unit_params_ += u.params;
    if (std::find(u.parts.begin(), u.parts.end(), models::ModulePart::FinalNormAndHead) != u.parts.end())
      head_unit_params_ = std::max(head_unit_params_, u.params);
  }
}

MemoryBound Bounds::memory(const sim::Plan& p) const {
  MemoryBound m;
  m.context = hw_.cuda_context_bytes();
  const std::int64_t shard = std::max(1, p.mesh_shard);
  const std::int64_t total = counts_.total;
  const models::TrainableSet& ts = trainable(p);
  const Bytes master = dtype_bytes(p.master_weights_dtype);
  const Bytes grad_b = std::min(master, dtype_bytes(p.reduce_dtype));
  if (!p.cpu_offload.params) {
    const std::int64_t per_rank = total / shard;
    // (frozen_units take their blocks' matrices or adapters out of the set: no lower bound on what is left)
    const std::int64_t trainable = ts.all ? per_rank : p.frozen_units.empty() ? ts.trainable / shard : 0;
    // (QLoRA: an NF4 weight holds more than half a byte per element, models/nf4.h; half a byte bounds every
    // parameter from below)
    m.sharded_params = p.lora.quantize_nf4 ? per_rank / 2 : per_rank * master;
    m.sharded_grads = trainable * grad_b;
    const int states = sim::optimizer_state_count(p.optimizer);
    const bool rank_share_unknown = !ts.all && p.fsdp_version == sim::FsdpVersion::FSDP1 && p.use_orig_params;
    m.optimizer_state = p.cpu_offload.optimizer || rank_share_unknown
                            ? 0
                            : states * sim::optimizer_state_lower_bound(p.optimizer, trainable, master);
  }
  const Dtype act = p.param_dtype;
  // (with torchtune's activation offloading the checkpointed inputs leave the GPU but for a few: none counted)
  const bool offloaded = p.activation_offloading != sim::ActivationOffload::None;
  for (std::int64_t l = 0; l < model_.n_layers && ts.all && !offloaded; ++l)
    m.activations += models::block_saved_activation_bytes(model_, p.micro_batch, p.seq_len, act,
                                                         block_mode(p.activation_checkpointing, l));
  // The logits in the compute dtype (a part of what every loss implementation but the fused linear
  // one holds); never more than what the simulator charges for the plan's loss.
  m.logits = std::min(p.micro_batch * p.seq_len * model_.vocab_size * dtype_bytes(act),
                      models::logits_bytes(model_, p.micro_batch, p.seq_len, act, p.cross_entropy));
  // An unsharded parameter's bytes per element: NF4 more than half a byte, fp8 all-gather one.
  auto unsharded_bytes = [&](std::int64_t params) {
    return p.lora.quantize_nf4 ? params / 2 : params * (p.fp8_all_gather ? 1 : dtype_bytes(p.param_dtype));
  };
  if (shard > 1) {
    m.unsharded_unit = unsharded_bytes(head_unit_params_);
    const bool keeps = p.fsdp_version == sim::FsdpVersion::FSDP1
                           ? sim::ReshardAfterForward::of_strategy(p.sharding_strategy).keeps()
                           : p.reshard_after_forward.keeps() && p.module_overrides.empty();
    if (keeps) m.kept_unsharded = unsharded_bytes(unit_params_ - head_unit_params_);
    // FSDP2 reshard_after_forward k (hpZ): resharded to groups of k, each unit's 1/k kept until its backward
    else if (p.fsdp_version == sim::FsdpVersion::FSDP2 && p.reshard_after_forward.is_group() && p.module_overrides.empty())
      m.kept_unsharded = unsharded_bytes(unit_params_ - head_unit_params_) / p.reshard_after_forward.group_size();
  }
  if (p.grad_accum > 1 && ts.all) {
    // (offload: the sharded gradients go to the CPU; no_sync's unsharded ones stay on the GPU)
    if (!p.grad_sync) m.carried_grads = total * std::min(grad_b, dtype_bytes(p.param_dtype));
    else if (!p.cpu_offload.params) m.carried_grads = m.sharded_grads;
  }
  if (p.cross_entropy == models::LossImpl::Torch && p.implementation != models::ModelImpl::Runtime) {
    const sim::lowering::LossMemory l = sim::lowering::loss_memory(model_, p, ts.all);
    if (l.chunk_rows == 0 && !l.chunked_output)
      m.loss_backward = (l.free_logits ? 0 : l.logits) + l.saved + l.nll_grad + l.lsm_grad;
  }
  return m;
}

TimeNs Bounds::kernels_time(const std::vector<models::KernelDesc>& ks) const {
  TimeNs t = 0;
  for (const auto& k : ks) {
    switch (k.kind) {
      case models::KernelKind::Gemm: t += hw_.gemm_time(k.m, k.n, k.k, k.dtype) * k.count; break;
      case models::KernelKind::Attention:
        t += hw_.attention_time(k.batch, k.seq, k.heads, k.kv_heads, k.head_dim, k.dtype, k.backward);
        break;
      default: t += hw_.memory_bound_time(k.bytes); break;
    }
  }
  return t;
}

TimeNs Bounds::micro_batch_compute(std::int64_t mb, std::int64_t seq, Dtype dtype, bool wgrad,
                                   std::int64_t first_backward_block) const {
  using models::ModulePart;
  TimeNs fwd_block = kernels_time(models::forward_kernels(model_, ModulePart::Block, mb, seq, dtype));
  TimeNs t = kernels_time(models::forward_kernels(model_, ModulePart::Embedding, mb, seq, dtype)) +
             model_.n_layers * fwd_block +
             kernels_time(models::forward_kernels(model_, ModulePart::FinalNormAndHead, mb, seq, dtype));
  const std::int64_t backward_blocks = std::max<std::int64_t>(0, model_.n_layers - first_backward_block);
  t += kernels_time(models::backward_kernels(model_, ModulePart::Embedding, mb, seq, dtype, wgrad)) +
       backward_blocks * kernels_time(models::backward_kernels(model_, ModulePart::Block, mb, seq, dtype, wgrad)) +
       kernels_time(models::backward_kernels(model_, ModulePart::FinalNormAndHead, mb, seq, dtype, wgrad));
  return t;
}

const models::TrainableSet& Bounds::trainable(const sim::Plan& p) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (p.lora.on()) {
    const auto key = std::make_pair(static_cast<int>(p.implementation), sim::plan_to_json(p)["lora"].dump());
    auto it = lora_.find(key);
    if (it == lora_.end())
      it = lora_.emplace(key, models::lora_trainable_set(model_, p.implementation, sim::lowering::lora_shape(model_, p))).first;
    return it->second;
  }
  const auto key = std::make_pair(static_cast<int>(p.implementation), p.trainable_fraction);
  auto it = trainable_.find(key);
  if (it == trainable_.end())
    it = trainable_.emplace(key, models::trainable_set(model_, p.implementation, p.trainable_fraction)).first;
  return it->second;   // std::map: the reference stays valid as entries are added
}

TimeNs Bounds::step_time(const sim::Plan& p) const {
  const models::TrainableSet& ts = trainable(p);
  const bool wgrad = ts.all;   // (LoRA: the adapters' small weight gradients are left out of the bound)
  // Frozen weights: the blocks after the first one with a trainable weight surely have a backward (their
  // input requires grad); the first one's starts at that weight, earlier ones may have none.
  const std::int64_t first = ts.all ? 0 : ts.first_trained_layer() + 1;
  TimeNs per_mb = 0, fwd_block = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_tuple(p.micro_batch, p.seq_len, static_cast<int>(p.param_dtype),
                               std::string("step") + std::to_string(first), wgrad);
    auto it = cache_.find(key);
    if (it == cache_.end())
      it = cache_.emplace(key, micro_batch_compute(p.micro_batch, p.seq_len, p.param_dtype, wgrad, first)).first;
    per_mb = it->second;
    auto fkey = std::make_tuple(p.micro_batch, p.seq_len, static_cast<int>(p.param_dtype), std::string("fwd_block"), false);
    auto ft = cache_.find(fkey);
    if (ft == cache_.end())
      ft = cache_.emplace(fkey, kernels_time(models::forward_kernels(model_, models::ModulePart::Block, p.micro_batch,
                                                                     p.seq_len, p.param_dtype))).first;
    fwd_block = ft->second;
  }
  TimeNs t = p.grad_accum * (per_mb + recomputed_blocks(p.activation_checkpointing, model_.n_layers, first) * fwd_block);
  if ((p.cpu_offload.params || p.cpu_offload.optimizer) &&
      !(!ts.all && p.fsdp_version == sim::FsdpVersion::FSDP1 && p.use_orig_params))
    t += hw_.cpu_optimizer_time(ts.all ? counts_.total / std::max(1, p.mesh_shard) : ts.trainable / std::max(1, p.mesh_shard));
  return t;
}

double Bounds::tokens_per_s_per_gpu_upper(const sim::Plan& p) const {
  TimeNs t = step_time(p);
  double tokens = static_cast<double>(p.micro_batch * p.seq_len * p.grad_accum);
  return t > 0 ? tokens / to_seconds(t) : 1e300;
}

}  // namespace fsdpsim::planner
