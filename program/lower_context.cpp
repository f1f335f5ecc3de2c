// The parts of the lowering both FSDP versions share: sizes, segments, orders, kernels, groups, the
// op builder, the optimizer step and the step facts. See program/lower_context.h.
#include "program/lower_context.h"

#include <stdexcept>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "common/errors.h"
#include "models/nf4.h"
#include "program/optimizer_state.h"

namespace fsdpsim::sim::lowering {
namespace {

// QLoRA needs each unit's tensor list to know which of its tensors are NF4 weights (models::tensor_nf4).
void refuse_unlisted_nf4(const models::FsdpUnit& u) {
  if (u.params <= 0) return;
  throw InputError("plan.lora.quantize_base", "\"nf4\"",
                   "unit " + (u.name.empty() ? std::string("<root>") : u.name) +
                       " is known by its parameter count alone: which of its tensors are NF4 weights is unknown");
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::int64_t scaled(std::int64_t n, double f) {
  return f >= 1.0 ? n : static_cast<std::int64_t>(std::llround(static_cast<double>(n) * f));
}

// Tensors of a unit; a unit the wrap graph describes only by its count is one flat tensor.
template <typename Fn>
void for_each_tensor(const models::FsdpUnit& u, Fn fn) {
  if (u.tensors.empty()) {
    if (u.params > 0) fn(u.params, u.params);
    return;
  }
  for (const auto& t : u.tensors) {
    std::int64_t numel = t.numel();
    std::int64_t dim0 = t.shape.empty() ? 1 : t.shape[0];
    fn(numel, dim0);
  }
}

// Distinct nodes among ranks start, start+stride, ... (count ranks), gpus_per_node ranks per node.
// The node index start+i*stride / gpn never decreases with i, so counting its changes counts nodes.
int nodes_of(int start, int stride, int count, int gpn) {
  if (count <= 0) return 1;
  if (stride == 1) return (start + count - 1) / gpn - start / gpn + 1;
  if (stride >= gpn) return count;
  int nodes = 1, last = start / gpn;
  for (int i = 1; i < count; ++i) {
    int n = (start + i * stride) / gpn;
    if (n != last) ++nodes, last = n;
  }
  return nodes;
}

bool unit_has_part(const models::FsdpUnit& u, models::ModulePart p) {
  return std::find(u.parts.begin(), u.parts.end(), p) != u.parts.end();
}

// The kernel lists of the three parts, forward and backward (the blocks' backward per distinct GradFlow),
// and the block's recompute under each checkpointing mode. A planner lowers thousands of plans of one model
// with a few (micro_batch, seq_len) shapes, so the caller's OpRecycler keeps the lists of its most recent
// shapes, keyed by every input of the models:: kernel functions (the ModelSpec compared field by field): a
// hit returns exactly the lists those functions would build. Sharing the same immutable lists across calls
// also lets a recycled compute op keep its Op::shared_kernels unchanged.
using KernelList = std::shared_ptr<const std::vector<models::KernelDesc>>;
}  // namespace (reopened below)

// kernel_lists' entries, kept in the caller's OpRecycler: a planner lowers thousands of plans of one
// model at a handful of shapes, and building the kernel lists is a large part of a lowering.
struct KernelListCache {
  struct Entry {
    models::ModelSpec model;
    std::int64_t micro_batch, seq_len;
    Dtype act;
    models::KernelOptions opt;
    models::GradFlow embedding, final_part;
    std::vector<models::GradFlow> blocks;
    KernelList fwd[3], bwd[3], rec[3];
    std::vector<KernelList> block_bwd;
  };
  std::vector<Entry> entries;   // most recent first
};

OpRecycler::OpRecycler() = default;
OpRecycler::~OpRecycler() = default;

namespace {
void kernel_lists(Context& c, const models::ModelSpec& model, const Plan& plan) {
  const Dtype act = plan.param_dtype;   // activations in the compute dtype (M9)
  models::KernelOptions opt = kernel_options(plan);
  opt.lora = c.trainable.lora;
  using Entry = KernelListCache::Entry;
  constexpr std::size_t kEntries = 8;
  KernelListCache fresh;   // (no recycler: nothing is kept)
  if (c.recycler && !c.recycler->kernels) c.recycler->kernels = std::make_unique<KernelListCache>();
  std::vector<Entry>& cache = c.recycler ? c.recycler->kernels->entries : fresh.entries;
  const Entry* hit = nullptr;
  for (std::size_t i = 0; i < cache.size() && !hit; ++i) {
    const Entry& e = cache[i];
    if (e.micro_batch == plan.micro_batch && e.seq_len == plan.seq_len && e.act == act && e.opt == opt &&
        e.embedding == c.flows.embedding && e.final_part == c.flows.final_part && e.blocks == c.block_flows &&
        e.model == model) {
      std::rotate(cache.begin(), cache.begin() + static_cast<std::ptrdiff_t>(i),
                  cache.begin() + static_cast<std::ptrdiff_t>(i) + 1);   // most recent first
      hit = &cache.front();
    }
  }
  if (!hit) {
    Entry e{model, plan.micro_batch, plan.seq_len, act, opt, c.flows.embedding, c.flows.final_part, c.block_flows,
            {}, {}, {}, {}};
    const models::GradFlow part_flow[3] = {c.flows.embedding, models::GradFlow{}, c.flows.final_part};
    for (int p = 0; p < 3; ++p) {
      auto part = static_cast<models::ModulePart>(p);
      e.fwd[p] = std::make_shared<const std::vector<models::KernelDesc>>(
          models::forward_kernels(model, part, plan.micro_batch, plan.seq_len, act, opt));
      e.bwd[p] = std::make_shared<const std::vector<models::KernelDesc>>(
          models::backward_kernels(model, part, plan.micro_batch, plan.seq_len, act, part_flow[p], opt));
      e.rec[p] = std::make_shared<const std::vector<models::KernelDesc>>(models::recompute_kernels(
          model, models::ModulePart::Block, plan.micro_batch, plan.seq_len, act, static_cast<models::CheckpointMode>(p), opt));
    }
    for (const models::GradFlow& f : c.block_flows)
      e.block_bwd.push_back(f == models::GradFlow{} ? e.bwd[static_cast<int>(models::ModulePart::Block)]
                                                    : std::make_shared<const std::vector<models::KernelDesc>>(
                                                          models::backward_kernels(model, models::ModulePart::Block,
                                                                                   plan.micro_batch, plan.seq_len, act,
                                                                                   f, opt)));
    if (cache.size() == kEntries) cache.pop_back();
    cache.insert(cache.begin(), std::move(e));
    hit = &cache.front();
  }
  for (int p = 0; p < 3; ++p) {
    c.fwd_kernels[p] = hit->fwd[p];
    c.bwd_kernels[p] = hit->bwd[p];
    c.rec_kernels[p] = hit->rec[p];
  }
  c.block_bwd = hit->block_bwd;
  if (!c.trainable.all && !c.trainable.lora.on())
    c.notes.push_back("trainable_fraction < 1: whole weight matrices of the blocks train (models/trainable.h: LoRA's "
                      "usual targets first, evenly spaced blocks), everything else is frozen; frozen weights get no "
                      "weight-gradient GEMM and their linears save no input, and nothing before the first trainable "
                      "weight is saved (FSDP1: every weight of a unit with a trainable one trains, M13)");
  if (plan.compile)
    c.notes.push_back("compile: inductor's fusion of each block's norms, rotary, activation and residual adds is "
                      "modelled from its fusion rules (one kernel per chain of pointwise/reduction ops between "
                      "GEMMs and attention), not traced; GEMMs and attention run as in eager; the CPU issues each "
                      "fused kernel at the eager per-op cost, without the compiled graphs' guards and launches (a "
                      "compiled llama-1b step on 8 H200 measured 128 ms per step, CPU-bound, where this charges 51 ms of CPU: compiled "
                      "small-model steps may be CPU-bound and slower than predicted)");
  if (plan.float8 != models::Float8Recipe::None)
    c.notes.push_back("float8: the blocks' linears run fp8 GEMMs at the GPU's fp8 peak with torchao's amax/scale/"
                      "cast kernels (LM head and MoE router in bf16); rowwise GEMMs are timed like tensorwise ones");
  if (plan.activation_checkpointing.outside_compile)
    c.notes.push_back("checkpoint(compile(block)): an eager checkpoint around each compiled block keeps its input and "
                      "reruns the whole compiled forward before its backward (torchtune's order); derived from "
                      "torch.utils.checkpoint's saved-tensor hooks, not measured against PyTorch");
  else if (plan.activation_checkpointing.mode != ActivationCheckpointing::Mode::None)
    c.notes.push_back(opt.checkpoint_early_stop || plan.compile
                          ? "recompute: a fully checkpointed block reruns its forward up to the MLP's last linear "
                            "(non-reentrant checkpoint's early stop); selective op AC reruns the ops its policy "
                            "does not save"
                          : "recompute: a fully checkpointed block reruns its whole forward (torchtitan's "
                            "early_stop=False, or reentrant checkpointing); selective op AC reruns the ops its "
                            "policy does not save");
}

}  // namespace

models::CheckpointMode layer_checkpoint_mode(const ActivationCheckpointing& ac, int layer) {
  switch (ac.mode) {
    case ActivationCheckpointing::Mode::None: return models::CheckpointMode::None;
    case ActivationCheckpointing::Mode::Full: return models::CheckpointMode::Full;
    case ActivationCheckpointing::Mode::SelectiveOp: return models::CheckpointMode::SelectiveOp;
    case ActivationCheckpointing::Mode::EveryK:
      // torchtitan layer SAC (A4): every k-th block is checkpointed.
      return layer % ac.every_k == 0 ? models::CheckpointMode::Full : models::CheckpointMode::None;
  }
  return models::CheckpointMode::None;
}

models::KernelOptions kernel_options(const Plan& plan) {
  models::KernelOptions o;
  // (the bundled runtime runs one kernel per norm, rotary and SwiGLU: the fused recipe's kernels)
  o.implementation = plan.implementation == models::ModelImpl::Runtime ? models::ModelImpl::Fused : plan.implementation;
  o.compile = plan.compile;
  o.float8 = plan.float8;
  // torchtitan's checkpoint_wrapper passes early_stop=False; checkpoint(FSDP(block)) is Hugging Face's
  // gradient_checkpointing, reentrant by default (no early stop). Otherwise non-reentrant
  // torch.utils.checkpoint with its default early stop (Lightning, accelerate, Composer with
  // activation_checkpointing_reentrant false, as llm-foundry's benchmarks set it).
  o.checkpoint_early_stop =
      plan.implementation != models::ModelImpl::TorchTitan && !plan.activation_checkpointing.outside_fsdp;
  o.checkpoint_outside_compile = plan.activation_checkpointing.outside_compile;
  return o;
}

int unit_by_name(const models::WrapGraph& graph, const std::string& name, std::int64_t n_layers) {
  const int U = static_cast<int>(graph.units.size());
  if (name == "root") return 0;
  if (name == "last_block") {
    // the unit that computes the model's last transformer block
    for (int u = U - 1; u >= 1; --u)
      for (int l : graph.units[u].layers)
        if (l == n_layers - 1) return u;
    return -1;
  }
  for (int u = 0; u < U; ++u)
    if (graph.units[u].name == name) return u;
  return -1;
}

namespace {
// Whether the trainable-set rule can place a unit's tensors (module-tree names, models/module_tree.cpp); a
// unit listed with other names (a hand-built graph) is taken like one known by its count alone.
bool placeable(const models::FsdpUnit& u) {
  for (const auto& t : u.tensors)
    if (t.name.rfind("model.", 0) == 0 || t.name.rfind("transformer.", 0) == 0 || t.name.rfind("lm_head", 0) == 0 ||
        t.name.rfind("gpt_neox.", 0) == 0 || t.name.rfind("embed_out", 0) == 0)
      return true;
  return false;
}

// LoRA adapters a unit holds (TrainableSet::block_adapters for each block it computes, head_adapters when
// it computes the head): fn(numel, dim0) per adapter matrix.
template <typename Fn>
void for_each_adapter(const models::FsdpUnit& u, const models::TrainableSet& ts, Fn fn) {
  if (!ts.lora.on()) return;
  for (std::size_t i = 0; i < u.layers.size(); ++i)
    for (const models::AdapterMatrix& a : ts.block_adapters) fn(a.numel(), a.rows);
  if (unit_has_part(u, models::ModulePart::FinalNormAndHead))
    for (const models::AdapterMatrix& a : ts.head_adapters) fn(a.numel(), a.rows);
}
}  // namespace

UnitSizes fsdp1_unit_sizes(const models::FsdpUnit& u, int N, Dtype flat_dtype, bool use_orig_params,
                           const models::TrainableSet& ts, double unit_fraction,
                           std::vector<std::int64_t>* orig_param_shards, std::vector<FlatTensor>* flat_tensors) {
  UnitSizes s;
  s.params = u.params;
  // M1: `_get_aligned_numel` = 16 // itemsize; padding goes before a tensor that would start unaligned.
  const std::int64_t align = use_orig_params ? 16 / dtype_bytes(flat_dtype) : 1;
  std::int64_t total = 0;
  struct Span {
    std::int64_t offset, numel;
  };
  std::vector<Span> trained;   // the trainable tensors' places in the flat parameter
  std::int64_t trainable = 0;
  int depth = 0;   // (of the tensor added next: flat_tensors)
  const auto add = [&](std::int64_t numel, bool trains) {
    if (flat_tensors) flat_tensors->push_back({numel, depth});
    if (align > 1 && total % align != 0) total += align - total % align;
    if (trains) {
      trained.push_back({total, numel});
      trainable += numel;
    }
    total += numel;
  };
  const bool listed = !u.tensors.empty() && placeable(u);
  const bool frozen = unit_fraction <= 0.0;   // plan.frozen_units
  if (ts.lora.nf4 && !listed) refuse_unlisted_nf4(u);
  // LoRA adapters: with use_orig_params they are tensors of the unit's FlatParameter (litgpt's Block holds
  // its LoRALinear's lora_A, lora_B beside the frozen weights), placed before the first adapted weight of
  // each block (LoRALinear registers lora_A, lora_B as its own parameters, named before its child
  // `linear`'s weight: nn.Module.named_parameters walks a module's own parameters, then its children);
  // without use_orig_params FSDP1 refuses a FlatParameter of mixed requires_grad (_flat_param.py
  // FlatParamHandle._validate_tensors_to_flatten), so the adapters are flattened apart (torchtune's
  // lora_fsdp_wrap_policy wraps each LoRA A / B linear in its own FSDP unit): modelled as one more
  // FlatParameter of this unit holding its adapters (one all-gather and one reduce-scatter with the unit's; its
  // shard a tensor of its own, fsdp1_flat_params).
  const bool adapters_inline = ts.lora.on() && use_orig_params;
  std::int64_t adapters = 0;
  for_each_adapter(u, ts, [&](std::int64_t numel, std::int64_t) { adapters += numel; });
  std::vector<char> placed;
  if (!listed) {
    for_each_tensor(u, [&](std::int64_t numel, std::int64_t) { add(numel, !frozen && !ts.lora.on()); });
    if (adapters_inline && adapters > 0) add(adapters, !frozen);
  } else {
    placed.assign(static_cast<std::size_t>(std::max<int>(static_cast<int>(ts.layers.size()), 0)) + 1, 0);
    for (const auto& t : u.tensors) {
      depth = static_cast<int>(std::count(t.name.begin(), t.name.end(), '.'));
      if (adapters_inline) {
        const models::TensorWeight tw = models::tensor_weight(t.name);
        const bool in_block = tw.layer >= 0 && tw.layer < static_cast<int>(ts.layers.size());
        const std::size_t slot = in_block ? static_cast<std::size_t>(tw.layer) : placed.size() - 1;
        const bool adapted = in_block ? (tw.weights & ts.lora.targets) != 0 && !t.name.ends_with(".bias")
                                      : ts.lora.adapts(models::Weight::LmHead) && (tw.weights & models::weight_bit(models::Weight::LmHead));
        if (adapted && !placed[slot]) {
          placed[slot] = 1;
          for (const models::AdapterMatrix& a : in_block ? ts.block_adapters : ts.head_adapters) add(a.numel(), !frozen);
        }
      }
      if (models::tensor_nf4(ts.lora, t.name)) {
        // bitsandbytes' packed codes in the flat dtype (bnb_4bit_quant_storage), the QuantState beside them
        add(models::bnb4_packed_numel(t.numel(), dtype_bytes(flat_dtype)), false);
        s.nf4_replicated_bytes += models::bnb4_quant_state_bytes(t.numel());
        continue;
      }
      add(t.numel(), !frozen && models::tensor_trains(ts, t.name));
    }
  }
  if (!listed && flat_tensors) flat_tensors->clear();   // (its tensors are not known)
  // use_orig_params: the flat param itself is padded to a multiple of N; otherwise `_get_shard` pads shards.
  if (use_orig_params && total % N != 0) total += N - total % N;
  s.shard = ceil_div(total, N);
  if (ts.lora.on() && !use_orig_params && adapters > 0) s.shard += ceil_div(adapters, N);   // the adapters' own
  s.unsharded = s.shard * N;
  if (adapters_inline) s.params += adapters;
  if (frozen) {
    // A unit with every parameter frozen (plan.frozen_units): its FlatParameter does not require grad
    // (requires_grad is the OR over its tensors, FlatParamHandle._validate_tensors_to_flatten), so autograd
    // gives it no flat grad and FSDP registers no post-backward hook for it.
    s.trainable = s.grad = s.optim = 0;
  } else if (ts.lora.on() && !use_orig_params) {
    // the base FlatParameter is frozen (no grad); the adapters' FlatParameter trains whole
    s.params += adapters;
    s.trainable = adapters;
    s.grad = adapters;
    s.optim = ceil_div(adapters, N);
  } else if (!listed && !ts.all && !ts.lora.on()) {
    // a unit known by its count alone: its fraction (the plan's, spread over the units not frozen) trains;
    // with use_orig_params the flat grad is full size (M13)
    s.trainable = scaled(u.params, unit_fraction);
    s.grad = use_orig_params ? total : scaled(total, unit_fraction);
    s.optim = ceil_div(s.trainable, N);
  } else if (!use_orig_params || (trainable == s.params && !listed)) {
    // (no use_orig_params) the unit trains whole or not at all; or every tensor of a unit known by its
    // count alone trains
    s.trainable = trainable > 0 ? s.params : 0;
    s.grad = trainable > 0 ? total : 0;
    s.optim = ceil_div(s.trainable, N);
  } else {
    // use_orig_params: the flat gradient is whole when any tensor trains (M13); the optimizer steps the
    // trainable tensors' parts of this rank's shard [0, shard) (rank 0's), one original parameter each
    // (FlatParamHandle._use_sharded_views: a view of the shard's slice, empty for a tensor outside it)
    s.trainable = trainable == s.params ? s.params : trainable;
    s.grad = trainable > 0 ? total : 0;
    for (const Span& t : trained) {
      const std::int64_t piece = std::max<std::int64_t>(0, std::min(t.offset + t.numel, s.shard) - t.offset);
      s.optim += piece;
      if (orig_param_shards && piece > 0) orig_param_shards->push_back(piece);
    }
  }
  s.needs_pad = s.grad % N != 0;
  s.grad_shard = ceil_div(s.grad, N);
  s.rs_input = s.grad_shard * N;
  return s;
}

UnitSizes fsdp2_unit_sizes(const models::FsdpUnit& u, int N, const models::TrainableSet& ts, double unit_fraction,
                           std::vector<std::int64_t>* param_shards, std::vector<std::int64_t>* all_shards) {
  const bool frozen = unit_fraction <= 0.0;   // plan.frozen_units
  UnitSizes s;
  s.params = u.params;
  // M6: torch.chunk along dim 0; every rank stores chunks[0]'s size (ceil(d0/N) rows), zero-padded.
  // Per tensor ceil(dim0/N) * (numel / dim0), with numel / dim0 computed as the product of the other
  // dims (equal: numel is dim0 times that product) without the division or a second pass over the shape.
  std::int64_t shard = 0;
  if (u.tensors.empty() || !placeable(u)) {
    // known by its count (or unplaceable names): its fraction trains
    if (ts.lora.nf4) refuse_unlisted_nf4(u);
    for_each_tensor(u, [&](std::int64_t numel, std::int64_t dim0) {
      if (dim0 > 0) shard += ceil_div(dim0, N) * (numel / dim0);
    });
    const bool base_trains = !frozen && !ts.lora.on();
    s.trainable = !base_trains ? 0 : ts.all ? u.params : scaled(u.params, unit_fraction);
    s.grad_shard = !base_trains ? 0 : ts.all ? shard : scaled(shard, unit_fraction);
  } else {
    for (const auto& t : u.tensors) {
      const std::size_t dims = t.shape.size();
      const std::int64_t dim0 = dims == 0 ? 1 : t.shape[0];   // a 0-d tensor: numel 1
      if (dim0 <= 0) continue;                                  // no rows: nothing to shard
      std::int64_t rest = 1;
      for (std::size_t i = 1; i < dims; ++i) rest *= t.shape[i];
      const std::int64_t chunk = ceil_div(dim0, N) * rest;
      shard += chunk;
      if (all_shards) all_shards->push_back(chunk);
      if (models::tensor_nf4(ts.lora, t.name)) {
        // nf4_split splits each inner tensor of the NF4Tensor evenly (models/nf4.h): the rows must divide
        // among the ranks and each rank's part must hold whole scaler blocks, or PyTorch stops at the split.
        if (dim0 % N != 0 || chunk % models::kNf4Quantum != 0)
          throw InputError("plan.lora.quantize_base", "\"nf4\"",
                           t.name + " (" + std::to_string(dim0) + " x " + std::to_string(rest) + ") does not split into " +
                               std::to_string(N) + " NF4 shards: torchao's nf4_split needs the rows divisible by the "
                               "shard count and each shard's elements by " + std::to_string(models::kNf4Quantum) +
                               " (64-element blocks, 256 scalers per factor)");
        s.nf4_shard += chunk;
        s.nf4_shard_bytes += models::nf4_bytes(chunk);
      }
      if (frozen || !models::tensor_trains(ts, t.name)) continue;   // D5: a frozen parameter has no .grad
      s.trainable += dim0 * rest;
      s.grad_shard += chunk;
      if (param_shards) param_shards->push_back(chunk);
    }
  }
  // LoRA adapters: parameters of the unit like any other (per-parameter sharding), the only ones that train
  for_each_adapter(u, ts, [&](std::int64_t numel, std::int64_t dim0) {
    const std::int64_t chunk = ceil_div(dim0, N) * (numel / dim0);
    shard += chunk;
    if (all_shards && chunk > 0) all_shards->push_back(chunk);
    s.params += numel;
    if (frozen) return;
    s.trainable += numel;
    s.grad_shard += chunk;
    if (param_shards && chunk > 0) param_shards->push_back(chunk);
  });
  s.shard = shard;
  s.unsharded = shard * N;
  s.nf4_unsharded = s.nf4_shard * N;
  s.nf4_unsharded_bytes = s.nf4_shard_bytes * N;   // (each weight's N equal shards: nf4_bytes is linear in them)
  s.grad = s.trainable;                       // D5: only trainable params have .grad
  s.rs_input = s.grad_shard * N;
  s.optim = s.grad_shard;
  return s;
}

// FSDP2 keeps each parameter's shard as a tensor of its own (FSDPParam._sharded_param_data; to_empty or a
// sharded state dict creates them one by one, in the module's parameter order), so the caching allocator
// places each: the MLP weights' 1-10 MiB shards of a small model share 20 MiB segments. A unit with NF4
// weights (their shards are several inner tensors each, models/nf4.h) or known by its count stays one
// buffer (empty list).
std::vector<std::int64_t> fsdp2_shard_tensors(const Context& c, int u) {
  const UnitSizes& s = c.sizes[static_cast<std::size_t>(u)];
  if (s.nf4_shard > 0) return {};
  std::vector<std::int64_t> all;
  fsdp2_unit_sizes(c.graph->units[static_cast<std::size_t>(u)], c.N, c.trainable, 1.0, nullptr, &all);
  std::int64_t sum = 0;
  for (std::int64_t n : all) sum += n;
  if (sum != s.shard) return {};
  return all;
}

std::vector<Fsdp1FlatParam> fsdp1_flat_params(const Context& c, int u) {
  const UnitSizes& s = c.sizes[static_cast<std::size_t>(u)];
  const models::FsdpUnit& unit = c.graph->units[static_cast<std::size_t>(u)];
  const Plan& plan = *c.plan;
  std::vector<FlatTensor> tensors;
  fsdp1_unit_sizes(unit, c.N, plan.master_weights_dtype, plan.use_orig_params, c.trainable, 1.0, nullptr, &tensors);
  // Materialized module by module, breadth first (_get_modules_to_materialize; _move_module_to_device's queue
  // alike): the modules at one depth come in the order named_parameters meets them, so a stable sort of the
  // flatten order by depth gives that order.
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const FlatTensor& a, const FlatTensor& b) { return a.depth < b.depth; });
  std::vector<Fsdp1FlatParam> flats;
  Fsdp1FlatParam a;   // (the adapters' FlatParameter, when apart)
  std::int64_t adapters = 0;
  if (c.trainable.lora.on() && !plan.use_orig_params)
    for_each_adapter(unit, c.trainable, [&](std::int64_t numel, std::int64_t) {
      adapters += numel;
      a.originals.push_back(numel * c.bm);
    });
  const bool adapters_apart = adapters > 0;
  if (adapters_apart) {
    a.bytes = ceil_div(adapters, c.N) * c.bm;
    flats.push_back(std::move(a));
  }
  Fsdp1FlatParam base;
  base.bytes = s.shard_bytes(c.bm) - (adapters_apart ? flats[0].bytes : 0);
  for (const FlatTensor& t : tensors) base.originals.push_back(t.numel * c.bm);
  flats.push_back(std::move(base));
  return flats;
}

std::vector<std::pair<std::int64_t, std::int64_t>> unit_adapters(const Context& c, int u) {
  std::vector<std::pair<std::int64_t, std::int64_t>> v;
  for_each_adapter(c.graph->units[static_cast<std::size_t>(u)], c.trainable,
                   [&](std::int64_t numel, std::int64_t dim0) { v.emplace_back(numel, dim0); });
  return v;
}

std::vector<std::int64_t> optimizer_state_tensors(const Context& c, int u) {
  return optimizer_state_tensors(c.graph->units[u], *c.plan, c.N, c.trainable, c.sizes[u].optim);
}

std::vector<std::int64_t> optimizer_state_tensors(const models::FsdpUnit& unit, const Plan& plan, int N,
                                                  const models::TrainableSet& ts, std::int64_t optim) {
  if (optim <= 0) return {};
  if (plan.implementation == models::ModelImpl::Runtime) return {optim};
  std::vector<std::int64_t> t;
  if (plan.fsdp_version == FsdpVersion::FSDP2) {
    fsdp2_unit_sizes(unit, N, ts, 1.0, &t);
  } else if (plan.use_orig_params) {
    fsdp1_unit_sizes(unit, N, plan.master_weights_dtype, true, ts, 1.0, &t);
  }
  std::int64_t sum = 0;
  for (std::int64_t n : t) sum += n;
  if (t.empty() || sum != optim) t = {optim};   // a unit known by its count alone: one state
  return t;
}

GradFlows grad_flows(const models::ModelSpec& m, const models::WrapGraph& g, const Plan& plan,
                     const models::TrainableSet& ts) {
  using models::Weight;
  using models::weight_bit;
  GradFlows f;
  const int L = static_cast<int>(m.n_layers);
  f.layers.assign(static_cast<std::size_t>(std::max(L, 0)), models::GradFlow{});
  if (ts.all) return f;   // full training: every part's default flow
  std::vector<models::WeightMask> eff(f.layers.size(), 0);
  models::WeightMask outside = 0;   // Embedding, FinalNorm, LmHead
  bool biases = true;               // (GradFlow::biases_train)
  if (plan.fsdp_version == FsdpVersion::FSDP2 || (ts.lora.on() && !plan.use_orig_params)) {
    biases = false;
    // FSDP2: per parameter. FSDP1 LoRA without use_orig_params: the adapters are FlatParameters of their
    // own (fsdp1_unit_sizes), the base weights' FlatParameter does not require grad.
    for (int l = 0; l < L; ++l) eff[static_cast<std::size_t>(l)] = ts.layer(l);
    outside = ts.outside;
  } else {
    const std::vector<double> unit_f = unit_trainable_fractions(g, plan);
    for (std::size_t ui = 0; ui < g.units.size(); ++ui) {
      const models::FsdpUnit& u = g.units[ui];
      if (unit_f[ui] <= 0.0) continue;   // plan.frozen_units
      const bool by_count = u.tensors.empty() || !placeable(u);
      bool trains = by_count && u.params > 0 && !ts.lora.on();
      if (!by_count)
        for (const auto& t : u.tensors) trains = trains || models::tensor_trains(ts, t.name);
      // LoRA with use_orig_params: the unit's adapters are views of its FlatParameter, which then requires
      // grad, and so does every view of it (the base weights included: M13)
      for (int l : u.layers)
        if (l >= 0 && l < L && (ts.layer(l) & weight_bit(Weight::Adapter))) {
          trains = true;
          eff[static_cast<std::size_t>(l)] |= weight_bit(Weight::Adapter);
        }
      if (unit_has_part(u, models::ModulePart::FinalNormAndHead) && (ts.outside & weight_bit(Weight::Adapter))) {
        trains = true;
        outside |= weight_bit(Weight::Adapter);
      }
      if (!trains) continue;
      if (by_count) {   // a unit known by its count: its parts train whole
        for (int l : u.layers)
          if (l >= 0 && l < L) eff[static_cast<std::size_t>(l)] = models::kAllWeights;
        if (unit_has_part(u, models::ModulePart::Embedding)) outside |= weight_bit(Weight::Embedding);
        if (unit_has_part(u, models::ModulePart::FinalNormAndHead))
          outside |= weight_bit(Weight::FinalNorm) | weight_bit(Weight::LmHead);
        continue;
      }
      for (const auto& t : u.tensors) {
        // (bitsandbytes' MatMul4Bit returns no gradient for its packed weight: no weight-gradient GEMM, nothing
        // saved for one, though the view requires grad)
        if (models::tensor_nf4(ts.lora, t.name)) continue;
        const models::TensorWeight tw = models::tensor_weight(t.name);
        if (tw.layer >= 0 && tw.layer < L) eff[static_cast<std::size_t>(tw.layer)] |= tw.weights;
        else if (tw.layer < 0) outside |= tw.weights;
      }
    }
    // a tied LM head is the embedding's weight
    if (m.tied_embeddings && (outside & weight_bit(Weight::Embedding))) outside |= weight_bit(Weight::LmHead);
  }
  const auto& ac = plan.activation_checkpointing;
  bool rg = (outside & weight_bit(Weight::Embedding)) != 0 ||
            (ac.outside_fsdp && ac.mode != ActivationCheckpointing::Mode::None);
  f.embedding = {outside & weight_bit(Weight::Embedding), false, biases};
  for (int l = 0; l < L; ++l) {
    const auto i = static_cast<std::size_t>(l);
    f.layers[i] = {eff[i], rg, biases};
    rg = rg || eff[i] != 0;
  }
  // (a LoRA adapter on the head trains in the final part: its tape saves A's input and output, its kernels
  // include the adapter's weight gradients)
  f.final_part = {outside & (weight_bit(Weight::FinalNorm) | weight_bit(Weight::LmHead) | weight_bit(Weight::Adapter)),
                  rg, biases};
  f.matmul_trained = models::trained_matmul_fraction(m, plan.implementation, eff,
                                                     (outside & weight_bit(Weight::LmHead)) != 0);
  return f;
}

std::vector<double> unit_trainable_fractions(const models::WrapGraph& graph, const Plan& plan) {
  const int U = static_cast<int>(graph.units.size());
  std::vector<double> f(U, plan.trainable_fraction);
  if (plan.frozen_units.empty()) return f;
  std::int64_t n_layers = 0;   // for "last_block": the model's layers as the graph's units hold them
  for (const auto& u : graph.units)
    for (int l : u.layers) n_layers = std::max<std::int64_t>(n_layers, l + 1);
  std::vector<char> frozen(U, 0);
  for (const std::string& name : plan.frozen_units) {
    const int u = unit_by_name(graph, name, n_layers);
    if (u < 0) {
      std::string names;
      for (int v = 0, shown = 0; v < U && shown < 4; ++v)
        if (!graph.units[v].name.empty()) names += (shown++ ? ", " : "") + graph.units[v].name;
      throw InputError("plan.frozen_units", "\"" + name + "\"",
                       "no FSDP unit of that name under this wrap policy; names are as `fsdpsim model-info` lists "
                       "the units (e.g. " + names + "), or \"root\", or \"last_block\"");
    }
    frozen[u] = 1;
  }
  std::int64_t total = 0, open = 0;
  for (int u = 0; u < U; ++u) {
    total += graph.units[u].params;
    if (!frozen[u]) open += graph.units[u].params;
  }
  if (open <= 0)
    throw InputError("plan.frozen_units", std::to_string(plan.frozen_units.size()) + " units",
                     "at least one unit with parameters must train");
  // The same trainable count, f * total, on the units that train.
  const double spread = std::min(1.0, plan.trainable_fraction * static_cast<double>(total) / static_cast<double>(open));
  for (int u = 0; u < U; ++u) f[u] = frozen[u] ? 0.0 : spread;
  return f;
}

std::vector<UnitSizes> plan_unit_sizes(const models::WrapGraph& graph, const Plan& plan, int N,
                                       const models::TrainableSet& ts) {
  const std::vector<double> f = unit_trainable_fractions(graph, plan);
  std::vector<UnitSizes> sizes;
  sizes.reserve(graph.units.size());
  for (std::size_t i = 0; i < graph.units.size(); ++i)
    sizes.push_back(plan.fsdp_version == FsdpVersion::FSDP1
                        ? fsdp1_unit_sizes(graph.units[i], N, plan.master_weights_dtype, plan.use_orig_params, ts, f[i])
                        : fsdp2_unit_sizes(graph.units[i], N, ts, f[i]));
  return sizes;
}

models::LoraShape lora_shape(const models::ModelSpec& m, const Plan& plan) {
  using models::Weight;
  using models::weight_bit;
  models::LoraShape l;
  if (!plan.lora.on()) return l;
  l.rank = plan.lora.rank;
  l.dropout = plan.lora.dropout > 0.0;
  l.nf4 = plan.lora.quantize_nf4;
  if (l.nf4) {
    // What is modelled of QLoRA (models/nf4.h): pure low-precision training, no float8, offload under FSDP1 only.
    const auto refuse = [](const std::string& why) {
      throw InputError("plan.lora.quantize_base", "\"nf4\"", why);
    };
    // FSDP2: torchao's NF4Tensor (torchtune); FSDP1: bitsandbytes' Params4bit in the flat parameter's dtype
    // (bnb_4bit_quant_storage), its QuantState on every rank (models/nf4.h).
    l.nf4_bnb = plan.fsdp_version == FsdpVersion::FSDP1;
    if (plan.float8 != models::Float8Recipe::None || plan.fp8_all_gather)
      refuse("float8 compute or all-gathers do not apply to NF4 base weights: set float8 none and fp8_all_gather false");
    // FSDP1's offload moves the flat parameter's elements (bitsandbytes' packed codes among them) and leaves the
    // QuantState on the GPU, where the dequantization kernel reads it; FSDP2's offload of NF4Tensors is not modelled.
    if ((plan.cpu_offload.params || plan.cpu_offload.optimizer) && plan.fsdp_version == FsdpVersion::FSDP2)
      refuse("CPU offload of torchao's NF4 base weights under FSDP2 is not modelled: set cpu_offload false (under "
             "FSDP1, bitsandbytes' layout, it is)");
    if (plan.master_weights_dtype != plan.param_dtype)
      refuse("QLoRA is modelled with its adapters in the compute dtype (pure " + std::string(dtype_name(plan.param_dtype)) +
             " training, as torchtune's and litgpt's QLoRA recipes run): set master_weights_dtype to the param_dtype");
    if (m.is_moe()) refuse("NF4 experts of a mixture of experts are not modelled");
    if (plan.implementation == models::ModelImpl::Runtime)
      refuse("the bundled runtime has no NF4 weights (implementation runtime)");
  }
  const bool plain = m.mlp == models::MlpKind::Plain;
  for (const std::string& t : plan.lora.targets) {
    if (m.is_moe() && (t == "gate" || t == "up" || t == "down"))
      throw InputError("plan.lora.targets", "\"" + t + "\"",
                       "LoRA on a mixture-of-experts MLP is not modelled (adapt q, k, v, o or head)");
    if (t == "gate" && plain)
      throw InputError("plan.lora.targets", "\"gate\"",
                       "this model's MLP has no gate projection (a plain MLP: use up and down)");
    l.targets |= t == "q"      ? weight_bit(Weight::Q)
                 : t == "k"    ? weight_bit(Weight::K)
                 : t == "v"    ? weight_bit(Weight::V)
                 : t == "o"    ? weight_bit(Weight::Out)
                 : t == "gate" ? weight_bit(Weight::Gate)
                 : t == "up"   ? weight_bit(Weight::Up) | weight_bit(Weight::Fc)
                 : t == "down" ? weight_bit(Weight::Down)
                               : weight_bit(Weight::LmHead);
  }
  // the rank of a low-rank update is at most the smaller side of the matrix it adapts
  std::int64_t smallest = std::min(m.hidden, m.head_dim * std::min(m.n_heads, m.n_kv_heads));
  if (l.adapts(Weight::Gate) || l.adapts(Weight::Up) || l.adapts(Weight::Down)) smallest = std::min(smallest, m.ffn_hidden);
  if (l.rank > smallest)
    throw InputError("plan.lora.rank", std::to_string(l.rank),
                     "above the smallest dimension of an adapted matrix (" + std::to_string(smallest) +
                         "): a low-rank update needs rank <= min(in, out)");
  return l;
}

models::TrainableSet plan_trainable_set(const models::ModelSpec& m, const models::WrapGraph& graph, const Plan& plan) {
  models::TrainableSet ts = plan.lora.on() ? models::lora_trainable_set(m, plan.implementation, lora_shape(m, plan))
                                           : models::trainable_set(m, plan.implementation, plan.trainable_fraction);
  if (plan.frozen_units.empty() || ts.all) return ts;
  // The harness freezes the named units after freeze_to_fraction (scripts/torch_memory/parallel.py
  // freeze_units): their blocks' matrices stop training.
  const std::vector<double> f = unit_trainable_fractions(graph, plan);
  for (std::size_t u = 0; u < graph.units.size(); ++u) {
    if (f[u] > 0.0) continue;
    for (int l : graph.units[u].layers)
      if (l >= 0 && l < static_cast<int>(ts.layers.size())) ts.layers[static_cast<std::size_t>(l)] = 0;
    if (unit_has_part(graph.units[u], models::ModulePart::FinalNormAndHead)) ts.outside = 0;
  }
  return ts;
}

namespace {
// Groups the units of [first, last) by segment key(u) (-1: left out), keeping their order within a
// segment: a stable counting sort into one flat array.
template <typename It, typename Key>
void group_by_segment(UnitsBySegment& out, int S, It first, It last, Key key) {
  out.start.assign(static_cast<std::size_t>(S) + 2, 0);
  int n = 0;
  for (It it = first; it != last; ++it)
    if (const int k = key(*it); k >= 0) ++out.start[k + 2], ++n;
  for (int s = 2; s <= S + 1; ++s) out.start[s] += out.start[s - 1];   // start[k + 1] = begin of segment k
  out.units.resize(n);
  for (It it = first; it != last; ++it)
    if (const int k = key(*it); k >= 0) out.units[out.start[k + 1]++] = *it;
  // Each start[k + 1] has advanced to the end of segment k, i.e. the begin of segment k + 1: start[s]
  // is now segment s's begin for every s <= S (start[0] = 0).
}
}  // namespace

void swap_storage(Context& a, Context& b) {
  a.sizes.swap(b.sizes);
  a.reshard_after_forward.swap(b.reshard_after_forward);
  a.segments.swap(b.segments);
  a.first_seg.swap(b.first_seg);
  a.last_seg.swap(b.last_seg);
  a.forward_order.swap(b.forward_order);
  a.backward_order.swap(b.backward_order);
  a.forward_pos.swap(b.forward_pos);
  a.backward_pos.swap(b.backward_pos);
  for (UnitsBySegment Context::*l : {&Context::opening, &Context::closing, &Context::backward_starts}) {
    (a.*l).start.swap((b.*l).start);
    (a.*l).units.swap((b.*l).units);
  }
  a.act_saved.swap(b.act_saved);
  a.act_recompute.swap(b.act_recompute);
  a.layer_mode.swap(b.layer_mode);
  a.notes.swap(b.notes);
}

void make_context(Context& c, const models::ModelSpec& model, const models::WrapGraph& graph, const Plan& plan,
                  const Topology& topo) {
  c.model = &model;
  c.graph = &graph;
  c.plan = &plan;
  c.topo = topo;
  c.R = plan.mesh_replicate;
  c.N = plan.mesh_shard;
  c.W = topo.world;
  c.notes.clear();
  if (c.R < 1 || c.N < 1 || c.R * c.N != c.W)
    throw InputError("plan.mesh", "(" + std::to_string(c.R) + ", " + std::to_string(c.N) + ")",
                     "the plan must be resolved (resolve_plan) for " + std::to_string(c.W) + " GPUs before lowering");
  if (graph.units.empty() || !graph.units[0].is_root)
    throw InputError("wrap_graph", "<no root unit>", "a wrap graph with units[0] = the root");
  c.strategy = effective_strategy(plan);
  c.sharded = c.N > 1 && c.strategy != ShardingStrategy::NO_SHARD;
  if (!c.sharded && c.N > 1)
    throw InputError("plan.mesh", std::to_string(c.N), "NO_SHARD needs a 1-wide shard dim");
  if (!c.sharded && plan.fsdp_version == FsdpVersion::FSDP1 && c.strategy != ShardingStrategy::NO_SHARD)
    c.notes.push_back("FSDP1 with a shard group of 1 GPU runs as NO_SHARD (PyTorch switches strategy when the "
                      "world size is 1)");
  c.hybrid = c.sharded && c.R > 1;
  c.bp = dtype_bytes(plan.param_dtype);
  c.br = dtype_bytes(plan.reduce_dtype);
  c.bm = dtype_bytes(plan.master_weights_dtype);
  c.mixed = plan.master_weights_dtype != plan.param_dtype;
  c.reduce_cast = plan.reduce_dtype != plan.param_dtype;
  c.micro_batches = static_cast<int>(plan.grad_accum);
  check_optimizer(plan);
  c.optimizer_states = optimizer_state_count(plan.optimizer);   // AdamW exp_avg + exp_avg_sq; SGD momentum

  const int U = static_cast<int>(graph.units.size());
  c.trainable = plan_trainable_set(model, graph, plan);
  c.sizes = plan_unit_sizes(graph, plan, c.N, c.trainable);
  c.state_tensors.resize(static_cast<std::size_t>(U));
  for (int u = 0; u < U; ++u) c.state_tensors[static_cast<std::size_t>(u)] = optimizer_state_tensors(c, u);
  c.shard_tensors.assign(static_cast<std::size_t>(U), {});
  if (plan.fsdp_version == FsdpVersion::FSDP2 && plan.implementation != models::ModelImpl::Runtime)
    for (int u = 0; u < U; ++u) c.shard_tensors[static_cast<std::size_t>(u)] = fsdp2_shard_tensors(c, u);
  if (!plan.frozen_units.empty())
    c.notes.push_back("frozen_units: no gradient, reduction or optimizer state for those units (their matrices "
                      "stop training after the trainable_fraction rule has picked them; a unit known by its count "
                      "alone takes the fraction spread over the other units)");
  if (c.trainable.lora.on()) {
    c.notes.push_back("lora: low-rank adapters beside the targeted linears of every block, base weights frozen; "
                      "model FLOPs count the adapters at 6 per parameter and token, and the weight gradients of the "
                      "base matrices that autograd sees trainable; the adapters run in the compute dtype even under "
                      "float8; an adapter on the LM head saves its dropout, mask and rank-wide A output, and its "
                      "vocabulary-wide tensors (base output, B output, scaled product, sum) are allocated one by one "
                      "(program/lower_walk.cpp head_lora_forward)");
    if (c.trainable.lora.nf4 && c.trainable.lora.nf4_bnb)
      c.notes.push_back("lora.quantize_base nf4 (QLoRA) under FSDP1: bitsandbytes' Params4bit, its packed codes N / 4 elements "
                        "of the flat parameter's dtype (bnb_4bit_quant_storage), sharded and gathered as such; its "
                        "double-quantized QuantState (absmax per 64, a second level per 256, codes: about 0.016 bytes per "
                        "element), a module attribute FSDP does not shard, whole on every rank; each linear dequantizes "
                        "its weight (fp32 absmax, then a compute-dtype copy, two CUDA kernels) for its forward and again "
                        "for its input gradient; the LM head, embedding and norms stay in the compute dtype");
    else if (c.trainable.lora.nf4)
      // (c.notes holds string literals: one per compile setting, the shared wording spliced in by the preprocessor)
#define FSDPSIM_NF4_NOTE(HOW)                                                                                         \
  "lora.quantize_base nf4 (QLoRA): every block linear's base weight is a torchao NF4Tensor (0.516 bytes per element: " \
  "4-bit codes, int8 scalers per 64, a factor per 256 scalers; its 34 bytes of table and mean per weight left out), "  \
  "sharded, all-gathered and kept unsharded as such; each linear dequantizes it into a compute-dtype copy " HOW       \
  "; the LM head, embedding and norms stay in the compute dtype. Reserved memory leaves out what loading leaves "      \
  "behind: quantizing each full weight on the GPU before sharding it (torchtune's loader does) leaves the small NF4 " \
  "shards in partly used segments (0.83 GiB of reserved at Llama-3-8B, 8 GPUs, in the PyTorch reference): keep "      \
  "that much headroom"
      c.notes.push_back(plan.compile ? FSDPSIM_NF4_NOTE("for its forward in one fused kernel, and under compile keeps "
                                                        "that copy for its input gradient: 2 bytes per element of every "
                                                        "NF4 weight saved from a block's forward to its backward (as "
                                                        "measured on PyTorch 2.11, where eager saves none), under full "
                                                        "activation checkpointing too, with the NF4 GEMMs' outputs "
                                                        "(LinearNF4's ops escape a checkpoint traced in the compiled "
                                                        "graph; an eager checkpoint around the compiled block, "
                                                        "activation_checkpointing.outside_compile, drops them)")
                                     : FSDPSIM_NF4_NOTE("for its forward and again for its input gradient, eagerly: "
                                                        "get_original_weight's int64 and bf16 temporaries peak at 14 "
                                                        "bytes per element of the weight, in 11 kernels (compile fuses "
                                                        "them into one)"));
#undef FSDPSIM_NF4_NOTE
    if (plan.fsdp_version == FsdpVersion::FSDP1 && plan.use_orig_params)
      c.notes.push_back("lora with FSDP1 use_orig_params: each block's FlatParameter holds its adapters beside the frozen "
                        "weights, so it requires grad, every view of it does: the whole unsharded flat gradient, the "
                        "frozen matrices' weight gradients and saved inputs as in full training (M13)");
    if (plan.fsdp_version == FsdpVersion::FSDP1 && !plan.use_orig_params)
      c.notes.push_back("lora with FSDP1 without use_orig_params: the adapters cannot share a FlatParameter with frozen "
                        "weights (PyTorch refuses mixed requires_grad), so they are wrapped apart (torchtune's "
                        "lora_fsdp_wrap_policy wraps each adapter linear); modelled as one adapter FlatParameter per "
                        "unit (its shard a tensor of its own, constructed before the unit's), gathered and reduced "
                        "with the unit's (the real wrapping issues one small collective per adapter linear)");
  }
  if (!c.trainable.all && !c.trainable.lora.on() && plan.fsdp_version == FsdpVersion::FSDP1 && !plan.use_orig_params)
    c.notes.push_back("trainable_fraction < 1 with FSDP1 and use_orig_params false: a FlatParameter has one "
                      "requires_grad (PyTorch refuses mixed units, M13), so a unit with a trainable matrix is taken "
                      "to train whole (its gradients and optimizer state), the others to be frozen");
  c.flows = grad_flows(model, graph, plan, c.trainable);
  c.block_flows.clear();
  c.layer_flow.assign(c.flows.layers.size(), 0);
  for (std::size_t l = 0; l < c.flows.layers.size(); ++l) {
    const models::GradFlow& f = c.flows.layers[l];
    auto it = std::find(c.block_flows.begin(), c.block_flows.end(), f);
    if (it == c.block_flows.end()) it = c.block_flows.insert(c.block_flows.end(), f);
    c.layer_flow[l] = static_cast<std::int16_t>(it - c.block_flows.begin());
  }
  if (c.block_flows.empty()) c.block_flows.push_back(models::GradFlow{});
  // ---- reshard_after_forward per unit: the plan's, None for the root, then plan.module_overrides ----
  c.reshard_after_forward.assign(U, plan.reshard_after_forward);
  c.reshard_after_forward[0] = ReshardAfterForward::unset();
  for (const ModuleOverride& o : plan.module_overrides) {
    if (o.reshard_after_forward.is_unset()) continue;
    const int u = unit_by_name(graph, o.module, model.n_layers);
    if (u < 0) {
      std::string names;
      for (int v = 0, shown = 0; v < U && shown < 4; ++v)
        if (!graph.units[v].name.empty()) names += (shown++ ? ", " : "") + graph.units[v].name;
      throw InputError("plan.module_overrides." + o.module, "\"" + o.module + "\"",
                       "no FSDP unit of that name under this wrap policy; names are as `fsdpsim model-info` lists "
                       "the units (e.g. " + names + "), or \"root\", or \"last_block\"");
    }
    c.reshard_after_forward[u] = o.reshard_after_forward;
  }

  // ---- forward segments and which unit each one uses ----
  const int L = static_cast<int>(model.n_layers);
  c.segments.clear();
  c.segments.reserve(L + 2);
  c.segments.push_back({models::ModulePart::Embedding, -1, 0});
  for (int l = 0; l < L; ++l) c.segments.push_back({models::ModulePart::Block, l, 0});
  c.segments.push_back({models::ModulePart::FinalNormAndHead, -1, 0});
  const int S = static_cast<int>(c.segments.size());
  if (static_cast<int>(graph.forward_order.size()) == U) {
    c.forward_order.assign(graph.forward_order.begin(), graph.forward_order.end());
  } else {
    c.forward_order.clear();
    for (int u = 0; u < U; ++u) c.forward_order.push_back(u);
  }
  // forward_order must list every unit exactly once (a hand-built WrapGraph may not): everything below
  // indexes per-unit arrays with its entries.
  c.forward_pos.assign(U, -1);
  for (int i = 0; i < U; ++i) {
    const int u = c.forward_order[i];
    if (u < 0 || u >= U || c.forward_pos[u] >= 0)
      throw InputError("wrap_graph.forward_order[" + std::to_string(i) + "]", std::to_string(u),
                       "a permutation of the " + std::to_string(U) + " unit ids (each once)");
    c.forward_pos[u] = i;
  }
  c.first_seg.assign(U, -1);
  c.last_seg.assign(U, -1);
  for (int u = 1; u < U; ++u) {
    const auto& unit = graph.units[u];
    auto cover = [&](int s) {
      if (c.first_seg[u] < 0 || s < c.first_seg[u]) c.first_seg[u] = s;
      c.last_seg[u] = std::max(c.last_seg[u], s);
    };
    if (unit_has_part(unit, models::ModulePart::Embedding)) cover(0);
    if (unit_has_part(unit, models::ModulePart::FinalNormAndHead)) cover(S - 1);
    for (int l : unit.layers)
      if (l >= 0 && l < L) cover(l + 1);
    if (c.first_seg[u] < 0) {
      // A unit that computes no whole part (e.g. a wrapped sub-module of the root): it unshards with the root.
      c.first_seg[u] = 0;
      c.last_seg[u] = S - 1;
    }
  }
  c.first_seg[0] = 0;
  c.last_seg[0] = S - 1;
  // The innermost unit covering a segment: the one latest in pre-forward order (nested units pre-forward
  // later); units spanning the whole forward do not count. Each unit visits only the segments it covers.
  for (int u = 1; u < U; ++u) {
    if (c.first_seg[u] == 0 && c.last_seg[u] == S - 1) continue;
    for (int s = c.first_seg[u]; s <= c.last_seg[u]; ++s)
      if (c.forward_pos[u] > c.forward_pos[c.segments[s].unit]) c.segments[s].unit = u;
  }
  // Pre-forward hooks of each segment, in pre-forward order.
  auto non_root_first = [&](int u) { return u != 0 ? c.first_seg[u] : -1; };
  auto non_root_last = [&](int u) { return u != 0 ? c.last_seg[u] : -1; };
  group_by_segment(c.opening, S, c.forward_order.begin(), c.forward_order.end(), non_root_first);
  // Post-forward order: units finish forward at their last segment (inner before outer: reverse
  // pre-forward order within a segment); the root last. Without the root, that order grouped by last
  // segment is exactly `closing` (the post-forward hooks of each segment).
  group_by_segment(c.closing, S, c.forward_order.rbegin(), c.forward_order.rend(), non_root_last);
  // Backward order = reverse post-forward order: the root first.
  c.backward_order.resize(U);
  c.backward_order[0] = 0;
  std::copy(c.closing.units.rbegin(), c.closing.units.rend(), c.backward_order.begin() + 1);
  group_by_segment(c.backward_starts, S, c.backward_order.begin(), c.backward_order.end(),
                   [&](int u) { return c.last_seg[u]; });
  c.backward_pos.assign(U, 0);
  for (int i = 0; i < U; ++i) c.backward_pos[c.backward_order[i]] = i;

  // ---- kernels, once per part (and per OpRecycler for the same model and shape: see kernel_lists) ----
  kernel_lists(c, model, plan);
  const Dtype act = plan.param_dtype;   // activations in the compute dtype (M9)

  // ---- activations (saved per block under its checkpointing mode, models/implementation.h) ----
  const auto& ac = plan.activation_checkpointing;
  const models::ImplOptions impl{plan.implementation, plan.compile,      plan.float8,
                                 c.trainable.lora,    c.topo.sm_count, plan.activation_checkpointing.outside_compile};
  c.block_acts.resize(c.block_flows.size() * 3);
  std::vector<char> known(c.block_acts.size(), 0);
  const auto block_acts = [&](int flow, models::CheckpointMode mode) -> const Context::BlockActivations& {
    const std::size_t m = static_cast<std::size_t>(flow) * 3 + static_cast<std::size_t>(mode);
    Context::BlockActivations& a = c.block_acts[m];
    if (known[m]) return a;
    known[m] = 1;
    const models::GradFlow& g = c.block_flows[static_cast<std::size_t>(flow)];
    const models::BlockMemory mem = models::block_memory(model, plan.micro_batch, plan.seq_len, act, mode, impl, g);
    a.saved = mem.saved;
    a.forward_events = mem.forward_events;
    a.forward_extra = mem.forward_extra;
    a.recompute.clear();
    Bytes recomputed = 0;
    if (plan.implementation == models::ModelImpl::Runtime && mode != models::CheckpointMode::None) {
      // one buffer: what the uncheckpointed block saves beyond what this mode keeps (the block input)
      const Bytes none = models::block_memory(model, plan.micro_batch, plan.seq_len, act, models::CheckpointMode::None,
                                              impl, g).saved_bytes();
      recomputed = std::max<Bytes>(0, none - mem.saved_bytes());
      a.recompute.push_back({"recomp", recomputed});
    }
    // backward_extra counts the recompute of a checkpointed block; the walk allocates those tensors itself
    a.backward_extra = std::max<Bytes>(0, mem.backward_extra - recomputed);
    a.backward_with_grads = std::max<Bytes>(0, mem.backward_extra_with_grads - recomputed);
    a.recompute_events = mem.recompute_events;   // (none for the bundled runtime's blocks)
    a.incoming_grad = 0;
    if (!a.recompute_events.empty()) {
      // The recompute tensor by tensor (models::AutogradTape::recompute_events): what it makes again and keeps
      // for the backward is the block's recompute list (the uncheckpointed block's saved tensors this mode did
      // not keep), its temporaries are freed inside its op, and it holds the incoming gradient from its start:
      // the backward's transient is then its own ops' peak beyond those.
      for (models::ForwardEvent& e : a.recompute_events) {
        if (e.kind != models::ForwardEvent::Kept) continue;
        e.saved = static_cast<int>(a.recompute.size());
        a.recompute.push_back({e.name, e.bytes});
        recomputed += e.bytes;
      }
      a.incoming_grad = mem.incoming_grad;
      a.backward_extra = std::max<Bytes>(0, mem.backward_phase_extra - recomputed - a.incoming_grad);
      a.backward_with_grads = std::max<Bytes>(0, mem.backward_phase_extra_with_grads - recomputed - a.incoming_grad);
    }
    a.param_grads = mem.param_grads;
    a.backward_events = mem.backward_events;
    for (models::BackwardEvent& e : a.backward_events) {
      if (e.storage < 0 || e.saved >= 0) continue;
      for (const models::ForwardEvent& r : a.recompute_events)
        if (r.kind == models::ForwardEvent::Kept && r.storage == e.storage) e.recomputed = r.saved;
    }
    return a;
  };
  c.layer_mode.assign(L, 0);
  c.act_saved.assign(L, 0);
  c.act_recompute.assign(L, 0);
  for (int l = 0; l < L; ++l) {
    const auto mode = layer_checkpoint_mode(ac, l);
    const Context::BlockActivations& a = block_acts(c.layer_flow[l], mode);
    c.layer_mode[l] = static_cast<std::int8_t>(mode);
    for (const auto& t : a.saved) c.act_saved[l] += t.bytes;
    for (const auto& t : a.recompute) c.act_recompute[l] += t.bytes;
  }
  c.final_norm = models::final_norm_memory(model, plan.micro_batch, plan.seq_len, act, impl, c.flows.final_part);
  {
    Context::BlockActivations& a = c.final_norm_acts;
    a.saved = c.final_norm.saved;
    a.forward_events = c.final_norm.forward_events;
    a.forward_extra = c.final_norm.forward_extra;
    a.backward_extra = c.final_norm.backward_extra;
    a.backward_with_grads = c.final_norm.backward_extra_with_grads;
    a.param_grads = c.final_norm.param_grads;
    a.backward_events = c.final_norm.backward_events;
    a.recompute.clear();
    a.recompute_events.clear();
    a.incoming_grad = 0;
  }
  // The embedding dropout's mask lives from the forward's start to the embedding's backward. A frozen
  // embedding gives an output that does not require grad, so native_dropout records no graph and saves
  // nothing (c.flows.embedding); the bundled runtime has no dropout.
  c.embedding_saved.clear();
  if (model.embd_dropout > 0.0 && c.flows.embedding.trains_weight(models::Weight::Embedding) &&
      plan.implementation != models::ModelImpl::Runtime)
    c.embedding_saved.push_back({"embd_mask", plan.micro_batch * plan.seq_len * model.hidden});
  c.loss = loss_memory(model, plan, c.flows.final_part.trains_weight(models::Weight::LmHead));
  if (c.loss.chunked_output) {
    // The head's weight trains (not LoRA's frozen output projection, nor a frozen unit): every chunk after the
    // first adds a new V x C gradient into the .grad (LossMemory::head_weight_grad).
    const int head = c.segments.back().unit;
    if (c.flows.final_part.trains_weight(models::Weight::LmHead) && c.sizes[head].grad > 0)
      c.loss.head_weight_grad = model.vocab_size * model.hidden * c.bp;
    if (plan.compile)
      c.notes.push_back("cross_entropy chunked with compile: torchtune's compile_loss compiles compute_cross_entropy "
                        "(one chunk's upcast + cross_entropy); what inductor saves for it (it may keep the bf16 chunk "
                        "and per-row statistics instead of the fp32 copy and log-softmax) is not modelled: the loss is "
                        "modelled as eager (approximate)");
    if (c.segments.back().unit != 0 && plan.fsdp_version == FsdpVersion::FSDP2)
      c.notes.push_back("cross_entropy chunked: the head, its own FSDP2 unit here, is called once per chunk in "
                        "torchtune's chunked_output (an unshard, and in backward a reduce-scatter, per call); modelled "
                        "as one call (one unshard, one reduction, the chunks' weight gradients accumulated)");
  }
  c.notes.push_back("activations as the implementation recipe's code saves them (models/implementation.cpp), "
                    "tensor by tensor, with each block's forward and backward transients, the logits and the "
                    "loss's tensors in forward and backward");
  if (plan.implementation != models::ModelImpl::Runtime)
    c.notes.push_back("caching allocator: the first step starts from the persistent sharded state, allocated tensor by "
                      "tensor as the model is materialized (FSDP2: each parameter's shard; FSDP1: each FlatParameter's, "
                      "flattened whole then sharded unit by unit while the unit's original parameters are held, the "
                      "root last, as FSDP1's constructor does: its peak is reported), then the "
                      "training loop's batch (input ids and labels) and the recipe's rotary tables with the "
                      "temporaries that make them, then the cache emptied; other temporaries of the script's model "
                      "loading are not modelled, so a real run may reserve more (in the PyTorch reference about 0.8 "
                      "GiB: QLoRA quantizing full weights on the GPU before sharding them)");
  if (plan.implementation != models::ModelImpl::Runtime && plan.fsdp_version == FsdpVersion::FSDP1 &&
      plan.cpu_offload.params)
    c.notes.push_back("FSDP1 construction with the parameters offloaded: each FlatParameter's shard is made on the "
                      "device beside its originals and flattened whole, then moved to the CPU "
                      "(_init_param_handle_from_params' flat_param_to), so the construction peaks while the largest "
                      "unit is made");

  // ---- process groups: shard groups are contiguous ranks, replicate groups stride across them ----
  const int gpn = std::max(1, topo.gpus_per_node);
  c.shard_group = {c.N, nodes_of(0, 1, c.N, gpn)};
  c.replicate_group = {c.R, nodes_of(0, c.N, c.R, gpn)};
  c.world_group = {c.W, nodes_of(0, 1, c.W, gpn)};
  const int k = plan.reshard_after_forward.is_group() ? plan.reshard_after_forward.group_size() : c.N;
  c.post_forward_group = {k, nodes_of(0, 1, k, gpn)};
}

void check_optimizer(const Plan& plan) {
  if (const std::string why = optimizer_not_modelled(plan); !why.empty())
    throw InputError("plan.optimizer", plan_to_json(plan)["optimizer"].dump(), why);
}

LossMemory loss_memory(const models::ModelSpec& m, const Plan& plan, bool head_trains) {
  LossMemory l;
  l.impl = plan.cross_entropy;
  const Bytes e = dtype_bytes(plan.param_dtype);   // activations in the compute dtype (M9)
  const Bytes t = plan.micro_batch * plan.seq_len;
  const Bytes tv = t * m.vocab_size;
  // Where the loss runs: Hugging Face models compute it in their forward when given labels (Lightning and
  // accelerate loops pass them); torchtitan's and litgpt's train steps call the loss on the model's output.
  l.inside_model = plan.loss_in_model_forward.value_or(plan.implementation == models::ModelImpl::HF);
  l.free_logits = plan.free_logits_before_backward.value_or(false);
  if (plan.implementation == models::ModelImpl::Runtime) {
    l.in_head_op = true;
    l.free_logits = false;
    l.logits = models::logits_bytes(m, plan.micro_batch, plan.seq_len, plan.param_dtype, plan.cross_entropy);
    l.forward_transient =
        models::logits_peak_bytes(m, plan.micro_batch, plan.seq_len, plan.param_dtype, plan.cross_entropy) - l.logits;
    return l;
  }
  switch (plan.cross_entropy) {
    case models::LossImpl::Torch: {
      // torchtitan's cross_entropy_loss and transformers' ForCausalLMLoss upcast with .float(); litgpt's
      // chunked_cross_entropy does not (models::loss_upcasts_logits).
      const bool upcast = models::loss_upcasts_logits(m, {plan.implementation, plan.compile, plan.float8});
      const Bytes le = upcast ? 4 : e;
      l.logits = tv * e;
      l.upcast = upcast && e != 4 ? tv * 4 : 0;
      l.saved = tv * le;
      l.nll_grad = l.lsm_grad = tv * le;
      l.logits_grad = l.upcast > 0 ? tv * e : 0;
      l.chunk_rows = std::min<std::int64_t>(
          t, models::loss_chunk_rows(m, {plan.implementation, plan.compile, plan.float8}));
      if (l.chunk_rows > 0) {
        // chunked (litgpt): the nll/log_softmax gradients are one chunk's (transient), the gradient the
        // head reads is split_with_sizes_backward's cat of all chunks' (in the log-probabilities' dtype)
        l.rows = t;
        l.row_bytes = m.vocab_size * le;
        l.nll_grad = l.lsm_grad = l.chunk_bytes(0);
        l.logits_grad = tv * le;
      }
      break;
    }
    case models::LossImpl::Fused:
      l.logits = tv * e;
      l.saved = t * 4;
      l.logits_grad = tv * e;
      break;
    case models::LossImpl::FusedLinear: {
      l.logits = models::logits_bytes(m, plan.micro_batch, plan.seq_len, plan.param_dtype, plan.cross_entropy);
      l.forward_transient =
          models::logits_peak_bytes(m, plan.micro_batch, plan.seq_len, plan.param_dtype, plan.cross_entropy) - l.logits;
      l.free_logits = false;   // what it keeps is the head input's gradient, not logits the loop holds
      // ...and the head weight's gradient: Liger's LigerFusedLinearCrossEntropyFunction.forward
      // (liger_kernel/ops/fused_linear_cross_entropy.py) accumulates grad_weight = zeros_like(weight)
      // chunk by chunk and saves it for backward when the weight requires grad (V x C in the weight's
      // dtype; none when it is frozen). Its backward returns it, and AccumulateGrad takes it as the weight's
      // .grad without a copy (the engine has released the saved tensor by then): the walk frees it just
      // before the head's backward allocates the unit's gradient.
      if (head_trains) l.weight_grad = m.vocab_size * m.hidden * e;
      l.input_grad = t * m.hidden * e;
      break;
    }
    case models::LossImpl::Chunked: {
      // torchtune 30b8519e: the recipes (recipes/full_finetune_distributed.py, lora_finetune_distributed.py,
      // setup: `self._model.set_num_output_chunks(self._loss_fn.num_output_chunks)` for CEWithChunkedOutputLoss)
      // call `logits = self._model(**batch)`, `loss = self._loss_fn(logits, labels)`: the loss runs on the model's
      // output (a list of chunks), outside its forward, whatever the block code.
      //  - TransformerDecoder.chunked_output (torchtune/modules/transformer.py): [self.output(chunk) for chunk in
      //    last_hidden_state.chunk(num_output_chunks, dim=1)]: one logits tensor per sequence chunk, compute dtype.
      //  - CEWithChunkedOutputLoss.forward (torchtune/modules/loss/ce_chunked_output_loss.py): reshapes each chunk
      //    (a view) and calls compute_cross_entropy on each in order: F.cross_entropy(logits.float(), labels,
      //    reduction="sum"). Per chunk (tools/autograd/derivatives.yaml): _to_copy saves no tensor (its backward is
      //    _to_copy_backward(grad, self.options())), so the fp32 copy dies when cross_entropy returns; _log_softmax
      //    saves its fp32 result (backward: _log_softmax_backward_data(grad, result, dim, ...)); nll_loss_forward
      //    saves self (that result), target and total_weight. No node saves the bf16 chunks (the head's matmul
      //    saves its input and the weight), so the recipes' `del logits` frees them before backward.
      //  - backward (LoweringWalk::loss_backward): chunk by chunk, last first; each leaves its compute-dtype gradient
      //    waiting for the head's backward.
      // Eager only: torchtune's compile_loss (torchtune/training/_compile.py) compiles compute_cross_entropy alone;
      // what inductor then saves per chunk is not modelled (Context notes).
      const std::int64_t n = std::max(1, plan.cross_entropy_chunks);
      const std::int64_t seq_chunk = (plan.seq_len + n - 1) / n;   // torch.chunk: ceil(size / chunks) per chunk
      l.inside_model = false;
      l.chunked_output = true;
      l.rows = t;
      l.chunk_rows = plan.micro_batch * seq_chunk;
      l.row_bytes = m.vocab_size * 4;   // fp32 log-probabilities, nll_loss_backward's and _log_softmax_backward_data's gradients
      l.logits_row = m.vocab_size * e;
      l.upcast_row = e != 4 ? m.vocab_size * 4 : 0;
      l.head_in_grad_row = m.hidden * e;
      l.logits = tv * e;
      l.saved = tv * 4;
      l.nll_grad = l.lsm_grad = l.chunk_bytes(0);
      l.logits_grad = tv * e;
      break;
    }
  }
  return l;
}

OffloadPacks offload_packs(const models::ModelSpec& m, const Plan& plan, const LossMemory& l) {
  OffloadPacks o;
  if (plan.activation_offloading == ActivationOffload::None) return o;
  if (m.positions == models::PositionKind::Rotary) {
    const Bytes s = plan.seq_len, d = m.rope_dims();
    if (plan.implementation == models::ModelImpl::TorchTitan) {
      o.rope = 1;
      o.rope_bytes = s * (d / 2) * 8;   // freqs_cis[:seqlen], complex64
    } else {
      o.rope = 2;
      o.rope_bytes = s * d * dtype_bytes(plan.param_dtype);   // cos, sin: 1 x S x d in the compute dtype
    }
  }
  o.rope_copied = o.rope_bytes >= kMinOffloadBytes ? o.rope : 0;
  o.loss = l.inside_model && l.impl == models::LossImpl::Torch && l.chunks() == 0 && !l.in_head_op;
  if (const Bytes target = plan.micro_batch * plan.seq_len * 8; o.loss && target >= kMinOffloadBytes) o.loss_target = target;
  return o;
}

// ---------------------------------------------------------------------------------------------
Builder::Builder(StepProgram& p, OpRecycler* recycler, bool full, std::vector<SiteGroup>* sites)
    : prog_(p), full_(full), sites_(sites) {
  if (sites_) sites_->clear();
  if (recycler && prog_.ops.empty() && prog_.buffers.empty()) {
    prog_.ops.swap(recycler->ops);
    prog_.buffers.swap(recycler->buffers);
  }
  ops_size_ = static_cast<int>(prog_.ops.size());
  buffers_size_ = static_cast<int>(prog_.buffers.size());
}

void recycle(StepProgram& p, OpRecycler& r) {
  if (p.ops.capacity() >= r.ops.capacity()) r.ops = std::move(p.ops);
  if (p.buffers.capacity() >= r.buffers.capacity()) r.buffers = std::move(p.buffers);
  p.ops.clear();
  p.buffers.clear();
}

void Builder::finish() {
  prog_.ops.resize(static_cast<std::size_t>(num_ops_));
  prog_.buffers.resize(static_cast<std::size_t>(num_buffers_));
  ops_size_ = num_ops_;
  buffers_size_ = num_buffers_;
}

int Builder::add_stream(StreamRole role, const char* name) {
  Stream s;
  s.id = static_cast<int>(prog_.streams.size());
  s.role = role;
  s.name = name;
  prog_.streams.push_back(std::move(s));
  last_on_stream_.push_back(-1);
  pending_waits_.emplace_back();
  return prog_.streams.back().id;
}

namespace {
// Writes the short name into buf (at least 24 chars); returns its length.
inline std::size_t format_short_name(char* buf, std::string_view what, int unit) {
  std::size_t n = std::min<std::size_t>(what.size(), 10);
  std::memcpy(buf, what.data(), n);
  if (unit >= 0) {
    buf[n++] = ' ';
    buf[n++] = 'u';
    if (unit < 10) {
      buf[n++] = static_cast<char>('0' + unit);
    } else if (unit < 100) {
      buf[n++] = static_cast<char>('0' + unit / 10);
      buf[n++] = static_cast<char>('0' + unit % 10);
    } else {
      n = static_cast<std::size_t>(std::to_chars(buf + n, buf + 24, unit).ptr - buf);
    }
  }
  return n;
}
}  // namespace

std::string short_name(std::string_view what, int unit) {
  char buf[24];
  return std::string(buf, format_short_name(buf, what, unit));
}

void set_short_name(std::string& out, std::string_view what, int unit) {
  char buf[24];
  const std::size_t n = format_short_name(buf, what, unit);
  if (out.size() == n && std::memcmp(out.data(), buf, n) == 0) return;
  out.assign(buf, n);
}

Buffer& Builder::new_buffer() {
  ++buffers_size_;
  return prog_.buffers.emplace_back();
}

Op& Builder::new_op() {
  // Callers hold Op& across later op() calls: a reallocation here would leave them dangling.
  if (prog_.ops.size() == prog_.ops.capacity())
    throw std::logic_error("lowering: op vector capacity exceeded (reserve bound too small)");
  ++ops_size_;
  return prog_.ops.emplace_back();   // built in place: no move, no temporary to destroy
}

// ---------------------------------------------------------------------------------------------
void add_unit_step_totals(const Context& c, int u, std::int64_t copies, StepTotals& t) {
  const UnitSizes& s = c.sizes[static_cast<std::size_t>(u)];
  t.optim += copies * s.optim;
  t.shard += copies * s.shard;
  if (s.optim > 0) t.groups += static_cast<int>(copies);
  for (std::int64_t n : c.state_tensors[static_cast<std::size_t>(u)]) {
    t.step_bytes += copies * optimizer_step_bytes(c.plan->optimizer, n, c.bm);
    t.state_tensors += static_cast<int>(copies);
  }
}

StepTotals step_totals(const Context& c) {
  StepTotals t;
  for (int u = 0; u < static_cast<int>(c.sizes.size()); ++u) add_unit_step_totals(c, u, 1, t);
  return t;
}

int block_unit_layer(const models::FsdpUnit& unit) {
  if (unit.is_root || unit.layers.empty()) return -1;
  for (auto part : unit.parts)
    if (part != models::ModulePart::Block) return -1;
  return unit.layers.front();
}

void add_optimizer_step(const Context& c, Builder& b, StepProgram& p, const std::vector<int>& optim_bufs,
                        const std::vector<int>& grad_bufs,
                        const std::vector<int>& param_bufs, int compute) {
  const Plan& plan = *c.plan;
  b.site(-1, SitePhase::Step, -1);
  const StepTotals totals = c.step_totals ? *c.step_totals : step_totals(c);
  const std::int64_t numel = totals.optim;
  const int groups = totals.groups;
  if (plan.cpu_offload.optimizer) {
    if (!plan.cpu_offload.params) {
      // Optimizer-only offload is not a PyTorch FSDP option (DeepSpeed ZeRO-Offload style): grads go to the
      // CPU, the CPU steps, the updated params come back.
      p.notes.push_back("cpu_offload.optimizer without params: modeled as D2H of the sharded grads, a CPU "
                        "optimizer step and H2D of the updated sharded params (not a native FSDP option)");
      Op& d2h = b.op(OpKind::D2H, compute, -1, c.micro_batches - 1, "grads D2H");
      d2h.copy_bytes = numel * c.bm;
      for (int g : grad_bufs)
        if (g >= 0) b.read(d2h, g);
      b.defer_cpu_wait(d2h.id);
    }
    Op& cpu = b.op(OpKind::CpuOptimizerStep, compute, -1, c.micro_batches - 1, "optim cpu");
    cpu.params = numel;
    cpu.kernel_launches = 0;
    if (!plan.cpu_offload.params) {
      Op& h2d = b.op(OpKind::H2D, compute, -1, c.micro_batches - 1, "params H2D");
      h2d.copy_bytes = totals.shard * c.bm;
      for (int q : param_bufs)
        if (q >= 0) b.write(h2d, q);
    }
    return;
  }
  // torch/optim/adam.py _multi_tensor_adam (foreach, the default): exp_avg_sq_sqrt =
  // torch._foreach_sqrt(exp_avg_sqs) is a new tensor per parameter, alive through the update (the rest is
  // in place); fused AdamW makes none. One per optimizer_state_tensors entry, created at the unit's site so
  // that the stretch repeats it with the unit.
  std::vector<int> tmp;
  if (plan.optimizer == Optimizer::AdamW && plan.optimizer_impl == OptimizerImpl::Foreach) {
    for (int u = 0; u < static_cast<int>(c.sizes.size()); ++u) {
      if (c.sizes[u].optim <= 0) continue;
      b.site(-1, SitePhase::Step, unit_site_layer(c, u));
      for (std::int64_t numel : c.state_tensors[static_cast<std::size_t>(u)])
        tmp.push_back(b.buffer("adam_sqrt", u, numel * c.bm, MemCategory::OptimizerState, compute));
    }
    b.site(-1, SitePhase::Step, -1);
  }
  Op& o = b.op(OpKind::OptimizerStep, compute, -1, c.micro_batches - 1, "optim step");
  // Per element: read the param and its grad, write the param, read and write each state (AdamW: 7 accesses,
  // SGD with momentum: 5, in the master dtype; a low-bit optimizer its codes and scales: optimizer_step_bytes).
  o.copy_bytes = totals.step_bytes;
  // torch.optim: about one multi-tensor-apply launch per param group; bitsandbytes' and torchao's: one per tensor
  o.kernel_launches = std::max(1, optimizer_is_low_bit(plan.optimizer) ? totals.state_tensors : groups);
  // The optimizer state torch.optim creates in its first step (adamw.py / sgd.py _init_group: exp_avg and
  // exp_avg_sq, or momentum_buffer, zeros_like each parameter), before the update's temporaries.
  for (int id : optim_bufs)
    if (id >= 0 && p.buffers[id].first_step_lazy) o.allocs.push_back(id);
  for (int id : tmp) {
    o.allocs.push_back(id);
    o.frees.push_back({id, -1});
  }
  for (int g : grad_bufs)
    if (g >= 0) b.read(o, g);
  for (int q : param_bufs)
    if (q >= 0) b.write(o, q);
}

void fill_facts(const Context& c, StepProgram& p) {
  const Plan& plan = *c.plan;
  p.world = c.W;
  p.shard_size = c.N;
  p.replicate_size = c.R;
  p.gpus_per_node = c.topo.gpus_per_node;
  p.micro_batches = c.micro_batches;
  p.tokens_per_rank = plan.micro_batch * plan.seq_len * plan.grad_accum;
  p.model_flops_per_rank = (models::trained_flops_per_token(*c.model, plan.seq_len, c.flows.matmul_trained) +
                            (c.trainable.lora.on() ? 6.0 * static_cast<double>(c.trainable.trainable) : 0.0)) *
                           static_cast<double>(p.tokens_per_rank);
  for (const auto& n : c.notes) p.notes.push_back(n);
  if (optimizer_is_low_bit(c.plan->optimizer)) {
    std::string note = "optimizer " + optimizer_class(c.plan->optimizer) + ": its state laid out per tensor as its source "
                       "does (program/optimizer_state.h), created at the first step; one kernel per tensor, no "
                       "temporaries";
    if (optimizer_is_bitsandbytes(c.plan->optimizer))
      note += " (the torch.cuda.synchronize() bitsandbytes calls after each tensor's update is not timed)";
    else
      note += " (torch.compile'd single_param_adam, assumed fused into one kernel)";
    p.notes.push_back(note);
  }
}

}  // namespace fsdpsim::sim::lowering
