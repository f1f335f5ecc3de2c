// The one lowering walk (program/lower_walk.h): the step's module walk and the model's compute, for both FSDP
// versions. Rule ids (A1-A3, F1.x, F2.x) refer to docs/fsdp-semantics.md.
#include "program/lower_walk.h"

#include <algorithm>
#include <climits>

#include "program/optimizer_state.h"

namespace fsdpsim::sim::lowering {

// torchtune's OffloadActivations default max_fwd_stash_size (min_offload_size: kMinOffloadBytes, lower_context.h):
// "activation offloading" below.
constexpr int kForwardStash = 5;

StepProgram LoweringWalk::run() {
  const int U = static_cast<int>(c_.sizes.size());
  // Builders hand out Op& references that must stay valid while the next ops are added, so the
  // vector must never reallocate during lowering: reserve an upper bound (a unit issues at most
  // ~25 ops per micro-batch: offload H2D + cast + copy-in + AG + copy-out twice, recompute, an extra
  // AG for checkpoint-outside-FSDP, backward, RS copy-in, RS, AR, post-reduce, D2H); Builder::op checks it.
  // A chunked loss adds one op per chunk and three buffers per chunk (LossMemory::chunks); torchtune's chunked
  // output four ops (loss forward, two loss backward, the head's backward) and eight buffers per chunk, and the
  // split's op with one buffer.
  const std::size_t chunks = static_cast<std::size_t>(c_.loss.chunks()) * (c_.loss.chunked_output ? 4 : 1) + 1;
  const std::size_t chunk_buffers = static_cast<std::size_t>(c_.loss.chunks()) * (c_.loss.chunked_output ? 8 : 3) + 1;
  p_.ops.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 8 + U * 32 + chunks) + 64);
  p_.buffers.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 3 + U * 8 + chunk_buffers) + U * 3);
  add_streams();
  offload_ = compute_;
  if (plan_.activation_offloading != ActivationOffload::None) {
    if (offload_streams()) offload_ = b_.add_stream(StreamRole::Offload, "activation_offload");
    packs_ = offload_packs(*c_.model, plan_, c_.loss);
    p_.notes.push_back(std::string("activation offloading (torchtune's OffloadActivations, use_streams ") +
                       (offload_streams() ? "true" : "false") +
                       "): what autograd saves in the model's forward is copied to pinned host memory (" +
                       (offload_streams() ? "on a side stream, the last 5 packed tensors kept on the GPU"
                                          : "on the compute stream") +
                       ") and back before its backward: each checkpointed block's input" +
                       (packs_.rope > 0 ? " with the rotary tables passed to it" : "") +
                       (std::any_of(c_.act_recompute.begin(), c_.act_recompute.end(), [](Bytes b) { return b == 0; })
                            ? ", every tensor a block without checkpointing saves (in one copy each way per block: "
                              "its whole set back before its backward, an upper bound on PyTorch's node-by-node "
                              "unpacking)"
                            : "") +
                       ", the final norm's saved tensors" +
                       (packs_.loss ? ", the loss's log-probabilities (packed twice: two copies each way) and target"
                                    : "") +
                       (c_.loss.inside_model && !packs_.loss && !c_.loss.in_head_op
                            ? " (not the fused loss's saved tensors, though the model's forward computes it: they stay "
                              "on the GPU here)"
                            : "") +
                       "; the output projection's input is not (NoOpManager). Derived from torchtune's source; the "
                       "copies' bytes match the device-to-host and host-to-device copy times PyTorch's profiler "
                       "measured (H200, tests/fixtures/torch_ops/*offload*) at the profile's pinned PCIe rate");
  }
  begin(param_grad_parts());
  add_persistent();
  act_.assign(c_.segments.size(), BufferRange{});
  recompute_.assign(c_.segments.size(), BufferRange{});
  grad_in_.assign(c_.segments.size(), -1);
  notes_before_step();
  for (int mb = 0; mb < c_.micro_batches; ++mb) {
    mb_ = mb;
    sync_ = plan_.grad_sync || mb == c_.micro_batches - 1;
    forward();
    backward();
  }
  p_.unit_grads = grad_shard_;
  add_optimizer_step(c_, b_, p_, optim_, grad_shard_, param_shard_, compute_);
  // optimizer.zero_grad() (set_to_none=True, the default since PyTorch 2.0) drops the sharded gradients.
  for (int g : grad_shard_)
    if (g >= 0) b_.free_now(g);
  notes_after_step();
  fill_facts(c_, p_);
  b_.finish();
  return std::move(p_);
}

// The sharded state (M2, M6, M11): each unit's sharded parameter in the master dtype (on the CPU with
// offload) and its optimizer state (trainable parameters only, D5). The sharded gradient is not persistent:
// zero_grad(set_to_none=True) leaves none until the unit's reduction creates it, and the step frees it after
// the optimizer step.
void LoweringWalk::add_persistent() {
  const int U = static_cast<int>(c_.sizes.size());
  param_shard_.assign(U, -1);
  grad_shard_.assign(U, -1);
  optim_.clear();
  p_.init_originals.clear();
  p_.init_offloaded.clear();
  std::vector<InitOffloaded> root_offloaded;   // (the root's FlatParameter is made last)
  for (int u = 0; u < U; ++u) {
    b_.site(-1, SitePhase::Persistent, unit_site_layer(c_, u));
    const UnitSizes& s = c_.sizes[u];
    if (s.params == 0) continue;
    if (!plan_.cpu_offload.params) {
      const std::vector<std::int64_t>& tensors = c_.shard_tensors[static_cast<std::size_t>(u)];
      if (plan_.fsdp_version == FsdpVersion::FSDP1 && plan_.implementation != models::ModelImpl::Runtime) {
        // Its FlatParameters (the LoRA adapters' apart, first), each made from its original parameters while
        // FSDP1's construction is modelled (StepProgram::init_originals); reads name the unit's own.
        for (const Fsdp1FlatParam& f : fsdp1_flat_params(c_, u)) {
          param_shard_[u] = b_.buffer(shard_name(), u, f.bytes, MemCategory::ShardedParams, compute_, true);
          if (p_.init_flatten_world >= 1 && !f.originals.empty())
            p_.buffers[static_cast<std::size_t>(param_shard_[u])].init_originals = intern_init_originals(f.originals);
        }
      } else if (tensors.size() > 1) {
        // One tensor per parameter (Context::shard_tensors), in order; reads name the first.
        for (std::int64_t numel : tensors) {
          const int buf = b_.buffer(shard_name(), u, numel * c_.bm, MemCategory::ShardedParams, compute_, true);
          if (param_shard_[u] < 0) param_shard_[u] = buf;
        }
      } else {
        param_shard_[u] = b_.buffer(shard_name(), u, s.shard_bytes(c_.bm), MemCategory::ShardedParams, compute_, true);
      }
    } else if (p_.init_flatten_world >= 1) {
      // FSDP1's construction with the parameters offloaded: each FlatParameter made on the device, then moved to the
      // CPU (StepProgram::init_offloaded).
      for (const Fsdp1FlatParam& f : fsdp1_flat_params(c_, u))
        (u == 0 ? root_offloaded : p_.init_offloaded)
            .push_back(InitOffloaded{f.bytes, compute_, f.originals.empty() ? -1 : intern_init_originals(f.originals)});
    }
    // QLoRA under FSDP1: bitsandbytes' QuantState of the unit's weights, a module attribute FSDP does not shard
    // (models/nf4.h): whole on every rank.
    if (s.nf4_replicated_bytes > 0)
      b_.buffer("nf4_quant_state", u, s.nf4_replicated_bytes, MemCategory::ShardedParams, compute_, true);
    if (!plan_.cpu_offload.optimizer && s.optim > 0) {
      // Per parameter (a FlatParameter is one), its states in turn, each its own tensor (torch/optim/adamw.py
      // _init_group: exp_avg, then exp_avg_sq, each torch.zeros_like(p)); the bundled runtime's as one buffer.
      const std::vector<std::int64_t>& tensors = c_.state_tensors[static_cast<std::size_t>(u)];
      // torch.optim creates its state in the first optimizer.step() (the first step's peak lacks it until
      // then); the bundled runtime allocates its state up front.
      const auto add = [&](const char* name, Bytes bytes) {
        const int buf = b_.buffer(name, u, bytes, MemCategory::OptimizerState, compute_, true);
        optim_.push_back(buf);
        if (plan_.implementation != models::ModelImpl::Runtime) b_.first_step_lazy(buf);
      };
      if (optimizer_is_low_bit(plan_.optimizer)) {
        // Each state of each tensor: its values or codes, then its block scales, as separate tensors; a
        // paged optimizer's large values live in unified memory, outside the allocator (Context notes).
        for (std::int64_t numel : tensors)
          for (int k = 0; k < c_.optimizer_states; ++k) {
            const OptimizerStateBytes sb = optimizer_state_bytes(plan_.optimizer, numel, c_.bm);
            if (sb.values > 0) add("optim", sb.values);
            if (sb.scales > 0) add("opt_scales", sb.scales);
          }
      } else {
        const int per_buffer = plan_.implementation != models::ModelImpl::Runtime ? 1 : c_.optimizer_states;
        for (std::int64_t numel : tensors)
          for (int k = 0; k < c_.optimizer_states; k += per_buffer) add("optim", numel * per_buffer * c_.bm);
      }
    }
  }
  // (FSDP1's construction: the root, unit 0, is flattened and sharded last; StepProgram::init_flatten_world)
  p_.init_flatten_last = p_.init_flatten_world >= 1 && U > 0 ? param_shard_[0] : -1;
  p_.init_offloaded.insert(p_.init_offloaded.end(), root_offloaded.begin(), root_offloaded.end());
  add_loop_inputs();
}

// What the training loop holds on the device besides the model's state, made once the model is built and sharded
// Buffer::init_originals, InitOffloaded::originals: identical lists (every block's) share one entry of
// StepProgram::init_originals.
int LoweringWalk::intern_init_originals(const std::vector<Bytes>& originals) {
  auto& lists = p_.init_originals;
  auto it = std::find(lists.begin(), lists.end(), originals);
  if (it == lists.end()) it = lists.insert(lists.end(), originals);
  return static_cast<int>(it - lists.begin());
}

// (Buffer::after_construction; StepProgram::loop_setup, with the temporaries the tables' code makes), in this order:
//  * the recipe's rotary tables, for a rotary model, from the angles: inv_freq, fp32 [rope dims / 2], the positions
//    t, fp32 [S], and freqs = outer(t, inv_freq), fp32 [S, rope dims / 2] (scripts/torch_memory/recipes/llama.py
//    setup_rope; torchtitan/models/llama3/model.py precompute_freqs_cis and litgpt/model.py build_rope_cache compute
//    the same), then torchtitan's freqs_cis = polar(ones_like(freqs), freqs), a complex64 [S, rope dims / 2]
//    buffer (over the training seq_len); litgpt's emb = cat(freqs, freqs), fp32 [S, rope dims], and its cos and sin
//    caches in the parameters' dtype (emb.cos().to(dtype): the fp32 result a temporary unless the dtype is fp32;
//    bf16-true converts buffers); transformers keeps inv_freq (LlamaRotaryEmbedding: its cos and sin are made per
//    forward). The temporaries die when the function returns;
//  * the batch: the input ids and the labels, int64 [micro_batch, S] each.
// inv_freq's own arithmetic (three 512 B temporaries) is left out. The bundled runtime keeps its own inputs (none
// here).
void LoweringWalk::add_loop_inputs() {
  std::vector<LoopSetupCall>& calls = p_.loop_setup;
  calls.clear();
  if (plan_.implementation == models::ModelImpl::Runtime) return;
  const models::ModelSpec& m = *c_.model;
  const std::int64_t S = plan_.seq_len, rope = m.rope_dims();
  int temporaries = 0;
  const auto keep = [&](const char* what, Bytes bytes) {
    const int buf = b_.buffer(what, -1, bytes, MemCategory::Activations, compute_, true);
    b_.after_construction(buf);
    calls.push_back(LoopSetupCall{LoopSetupCall::Buffer, bytes, compute_, -1});
  };
  const auto temporary = [&](Bytes bytes) {
    calls.push_back(LoopSetupCall{LoopSetupCall::Temporary, bytes, compute_, -1});
    return temporaries++;
  };
  const auto drop = [&](int t) { calls.push_back(LoopSetupCall{LoopSetupCall::Free, 0, compute_, t}); };
  if (m.positions == models::PositionKind::Rotary && rope >= 2 && S > 0) {
    const models::ModelImpl impl = plan_.implementation;
    const bool tables = impl == models::ModelImpl::TorchTitan || impl == models::ModelImpl::LitGPT;
    const Bytes angles = S * (rope / 2) * 4;
    int inv_freq = -1;
    if (tables) inv_freq = temporary((rope / 2) * 4);
    else keep("inv_freq", (rope / 2) * 4);
    const int t = temporary(S * 4), freqs = temporary(angles);
    if (impl == models::ModelImpl::TorchTitan) {
      const int ones = temporary(angles);
      keep("freqs_cis", S * (rope / 2) * 8);
      drop(ones);
    } else if (impl == models::ModelImpl::LitGPT) {
      const int emb = temporary(S * rope * 4);
      for (const char* name : {"rope_cos", "rope_sin"}) {
        if (c_.bp == 4) {
          keep(name, S * rope * 4);
        } else {
          const int fp32 = temporary(S * rope * 4);
          keep(name, S * rope * c_.bp);
          drop(fp32);
        }
      }
      drop(emb);
    }
    drop(freqs);
    drop(t);
    if (inv_freq >= 0) drop(inv_freq);
  }
  keep("input_ids", plan_.micro_batch * S * 8);
  keep("labels", plan_.micro_batch * S * 8);
}

void LoweringWalk::forward() {
  b_.site(mb_, SitePhase::Forward, -1);
  root_pre_forward();
  fire(&LoweringWalk::pre_forward, 0);
  const int S = static_cast<int>(c_.segments.size());
  const bool offloading = plan_.activation_offloading != ActivationOffload::None;
  if (offloading) {
    pack_id_ = 0;
    stash_.clear();
    saved_off_.resize(c_.segments.size());
    for (auto& v : saved_off_) v.clear();
    saved_unpacks_.assign(c_.segments.size(), 0);
    loss_off_ = false;
    offloaded_.assign(c_.segments.size(), -1);
  }
  for (int s = 0; s < S; ++s) {
    b_.site(mb_, SitePhase::Forward, segment_site_layer(c_, s));
    for (int u : c_.opening[s]) fire(&LoweringWalk::pre_forward, u);
    if (offloading) offload_pack(s);
    emit_compute(s, OpKind::Forward);
    if (offloading) offload_after_forward(s);
    for (int u : c_.closing[s]) fire(&LoweringWalk::post_forward, u);
  }
  drop_carried();   // (a model without a final norm and head: the last block's output dies here)
  b_.site(mb_, SitePhase::Forward, -1);
  // A loss computed in the model's forward runs before the root's post-forward (which flushes FSDP2's
  // kept all-gather output, F2.3); one computed on the model's output, after it.
  if (c_.loss.inside_model) loss_forward();
  fire(&LoweringWalk::post_forward, 0);
  if (!c_.loss.inside_model) loss_forward();
}

// Allocates one buffer per tensor at op `o` (they get consecutive ids: the range [first, first + n)).
LoweringWalk::BufferRange LoweringWalk::alloc_tensors(Op& o, int unit, const std::vector<models::SavedTensor>& ts) {
  BufferRange r{b_.num_buffers(), 0};
  for (const models::SavedTensor& t : ts) {
    if (t.bytes <= 0) continue;
    o.allocs.push_back(b_.buffer(t.name, unit, t.bytes, MemCategory::Activations, compute_));
    ++r.n;
  }
  return r;
}

void LoweringWalk::free_range(Op& o, BufferRange& r) {
  for (int i = 0; i < r.n; ++i)
    if (!offload_owned(r.first + i)) o.frees.push_back({r.first + i, -1});
  if (r.extra >= 0 && !offload_owned(r.extra)) o.frees.push_back({r.extra, -1});
  r = BufferRange{};
}

void LoweringWalk::drop_carried() {
  b_.free_now(carried_);   // (after the op emitted last; none when carried_ is -1)
  carried_ = -1;
}

void LoweringWalk::range_buffers(const std::vector<models::SavedTensor>& ts, const BufferRange& r, int extra_entry,
                                 std::vector<int>& out) {
  out.assign(ts.size(), -1);
  int next = r.first;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].bytes <= 0) continue;
    out[i] = static_cast<int>(i) == extra_entry ? r.extra : next++;
  }
  if (next != r.first + r.n) throw std::logic_error("lowering: a segment's saved tensors and buffers disagree");
}

// The forward's block-input event (ForwardEvent::input), or null.
static const models::ForwardEvent* input_event(const std::vector<models::ForwardEvent>& events) {
  for (const models::ForwardEvent& e : events)
    if (e.input) return &e;
  return nullptr;
}

// A transient of op `o`: allocated at its issue, freed once it is enqueued (its peak within the op).
void LoweringWalk::transient(Op& o, const char* what, int unit, Bytes bytes, MemCategory cat) {
  if (bytes <= 0) return;
  const int t = b_.buffer(what, unit, bytes, cat, compute_);
  o.allocs.push_back(t);
  o.frees.push_back({t, -1});
}

// A forward as PyTorch's allocator sees it (issue 19 item 4): the saved tensors and the temporaries one by one
// in op order, each temporary freed inside the op at its last use (models::ForwardEvent, FreeSpec
// free_inside_op), those alive at the end (the block output) after enqueueing. The saved tensors get
// consecutive buffer ids (the range returned). Without events (the bundled runtime's blocks, whose kernels
// keep one buffer): the saved tensors, then one transient of forward_extra bytes.
// The block input is the previous block's output (take_input with a carried output of its size): PyTorch
// allocated it inside the previous block's forward, before that unit's reshard and the next all-gather's
// buffers, and it stays where it was put; saved (a checkpoint's input), it joins the range as `extra`.
LoweringWalk::BufferRange LoweringWalk::alloc_forward(Op& o, int unit, const std::vector<models::SavedTensor>& saved,
                                                      const std::vector<models::ForwardEvent>& events,
                                                      Bytes forward_extra, bool take_input, bool carry_output,
                                                      const std::vector<char>* drop_at_last_read) {
  if (events.empty()) {
    if (drop_at_last_read) throw std::logic_error("lowering: offloading's packs need the forward's tensor events");
    const BufferRange r = alloc_tensors(o, unit, saved);
    transient(o, "fwd_tmp", unit, forward_extra, MemCategory::Activations);
    drop_carried();
    return r;
  }
  const models::ForwardEvent* input = input_event(events);
  const int taken = take_input && input && carried_ >= 0 && carried_bytes_ == input->bytes ? carried_ : -1;
  if (taken >= 0) carried_ = -1;
  BufferRange r{b_.num_buffers(), 0};
  saved_buf_.assign(saved.size(), -1);
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].bytes <= 0) continue;
    if (taken >= 0 && input->kind == models::ForwardEvent::Kept && static_cast<int>(i) == input->saved) {
      saved_buf_[i] = r.extra = taken;
      continue;
    }
    saved_buf_[i] = b_.buffer(saved[i].name, unit, saved[i].bytes, MemCategory::Activations, compute_);
    ++r.n;
  }
  temp_buf_.clear();
  int output_temp = -1;
  Bytes output_bytes = 0;
  std::size_t inside = 0;   // frees inside the op, placed before every other free of o
  // drop_at_last_read: saved tensors freed inside the op once the forward's last read of them has passed
  // (OffloadActivations without streams keeps only the CPU copy: the GPU tensor lives as a temporary would)
  std::vector<std::pair<int, int>> drops;   // (events seen, buffer)
  const auto drop_due = [&](int seen) {
    for (auto& [at, b] : drops)
      if (b >= 0 && at <= seen) {
        o.frees.insert(o.frees.begin() + static_cast<std::ptrdiff_t>(inside++),
                       FreeSpec{b, free_inside_op(std::max<int>(1, static_cast<int>(o.allocs.size())))});
        b = -1;
      }
  };
  for (const models::ForwardEvent& e : events) {
    if (e.kind == models::ForwardEvent::Kept && drop_at_last_read && e.saved >= 0 &&
        (*drop_at_last_read)[static_cast<std::size_t>(e.saved)]) {
      drops.emplace_back(e.forward_end >= 0 ? e.forward_end : static_cast<int>(events.size()),
                         saved_buf_.at(static_cast<std::size_t>(e.saved)));   // (the taken input's too: r.extra)
    }
  }
  int seen = 0;
  for (const models::ForwardEvent& e : events) {
    drop_due(seen++);
    switch (e.kind) {
      case models::ForwardEvent::Kept:
        if (&e != input || taken < 0) o.allocs.push_back(saved_buf_.at(static_cast<std::size_t>(e.saved)));
        saved_buf_[static_cast<std::size_t>(e.saved)] = -1;
        if (e.gemm) place_workspace(o);
        break;
      case models::ForwardEvent::Temp:
        if (static_cast<std::size_t>(e.temp) >= temp_buf_.size()) temp_buf_.resize(static_cast<std::size_t>(e.temp) + 1, -1);
        if (&e == input && taken >= 0) {
          temp_buf_[static_cast<std::size_t>(e.temp)] = taken;
          break;
        }
        temp_buf_[static_cast<std::size_t>(e.temp)] = b_.buffer(e.name, unit, e.bytes, MemCategory::Activations, compute_);
        o.allocs.push_back(temp_buf_[static_cast<std::size_t>(e.temp)]);
        if (e.output && carry_output) output_temp = e.temp, output_bytes = e.bytes;
        if (e.gemm) place_workspace(o);
        break;
      case models::ForwardEvent::FreeTemp: {
        int& t = temp_buf_.at(static_cast<std::size_t>(e.temp));
        o.frees.insert(o.frees.begin() + static_cast<std::ptrdiff_t>(inside++),
                       FreeSpec{t, free_inside_op(static_cast<int>(o.allocs.size()))});
        t = -1;
        break;
      }
    }
  }
  drop_due(seen);
  for (int b : saved_buf_)
    if (b >= 0) throw std::logic_error("lowering: saved tensor buffer " + std::to_string(b) + " has no forward event");
  drop_carried();   // (one nobody took: freed after this op, as before)
  for (std::size_t t = 0; t < temp_buf_.size(); ++t) {
    if (temp_buf_[t] < 0) continue;
    if (static_cast<int>(t) == output_temp) {
      carried_ = temp_buf_[t];
      carried_bytes_ = output_bytes;
    } else {
      o.frees.push_back({temp_buf_[t], -1});
    }
  }
  return r;
}

void LoweringWalk::emit_compute(int s, OpKind kind, Bytes grads) {
  const Segment& seg = c_.segments[s];
  const int part = static_cast<int>(seg.part);
  // (a Recompute op reruns what its layer's checkpointing mode did not save: Context::rec_kernels; a block's
  // backward is its GradFlow's: Context::block_bwd)
  const bool block = seg.part == models::ModulePart::Block;
  const auto& ks = kind == OpKind::Backward    ? (block ? c_.block_bwd[c_.layer_flow[seg.layer]] : c_.bwd_kernels[part])
                   : kind == OpKind::Recompute ? c_.rec_kernels[c_.layer_mode[seg.layer]]
                                               : c_.fwd_kernels[part];
  const char* what = kind == OpKind::Forward ? "fwd" : kind == OpKind::Backward ? "bwd" : "recompute";
  if (kind == OpKind::Backward && seg.part == models::ModulePart::FinalNormAndHead) head_lora_backward();
  Op& o = b_.compute_op(kind, compute_, seg.unit, mb_, what, ks);
  o.kernel_launches = static_cast<int>(ks->size());
  if (const int params = unsharded_params(seg.unit); params >= 0) b_.read(o, params);
  const bool head = seg.part == models::ModulePart::FinalNormAndHead;
  const Context::BlockActivations* a = block ? &c_.acts(seg.layer) : nullptr;
  // their GEMMs (the embedding has none); a forward or recompute lowered tensor by tensor places the workspace
  // at its first GEMM (the head's: its logits)
  const bool by_tensor = (kind == OpKind::Forward && (head || (block && !a->forward_events.empty()))) ||
                         (kind == OpKind::Recompute && block && !a->recompute_events.empty());
  if (block || head) cublas_workspace(o, kind != OpKind::Forward, by_tensor);
  if (kind == OpKind::Forward) {
    // What autograd saves, tensor by tensor in forward order, then the forward's own temporaries.
    if (seg.part == models::ModulePart::Embedding) {
      if (!c_.embedding_saved.empty()) act_[s] = alloc_tensors(o, seg.unit, c_.embedding_saved);
      // Its output is the first block's input, made here, before that block's all-gather (carried to it).
      const models::ForwardEvent* in =
          s + 1 < static_cast<int>(c_.segments.size()) && c_.segments[s + 1].part == models::ModulePart::Block
              ? input_event(c_.acts(c_.segments[s + 1].layer).forward_events)
              : nullptr;
      if (in) {
        carried_ = b_.buffer("embed_out", seg.unit, in->bytes, MemCategory::Activations, compute_);
        carried_bytes_ = in->bytes;
        o.allocs.push_back(carried_);
      }
    }
    // OffloadActivations without streams: what it packs dies at its last read (the CPU copy is what is kept)
    const bool sync_packs = plan_.activation_offloading == ActivationOffload::Sync && packs_saved(s);
    const std::vector<char> drops = sync_packs ? packed_mask(s) : std::vector<char>{};
    const std::vector<char>* drop = sync_packs ? &drops : nullptr;
    if (block) {
      act_[s] = alloc_forward(o, seg.unit, a->saved, a->forward_events, a->forward_extra, true, true, drop);
      place_workspace(o);   // (a block without a GEMM: at its end)
    } else if (head) {
      const models::BlockMemory& fn = c_.final_norm;
      act_[s] = alloc_forward(o, seg.unit, fn.saved, fn.forward_events, fn.forward_extra, true, false, drop);
      // (with a LoRA adapter on the head the logits are the adapter's sum, allocated after this op: head_lora_forward)
      const bool lora = head_lora();
      if (c_.loss.chunked_output) {
        // torchtune's TransformerDecoder.chunked_output: one head matmul, one logits tensor, per chunk
        logits_chunks_ = BufferRange{b_.num_buffers(), c_.loss.chunks()};
        for (int i = 0; i < c_.loss.chunks(); ++i) {
          const int l =
              b_.buffer("logits", seg.unit, c_.loss.rows_of(i) * c_.loss.logits_row, MemCategory::Logits, compute_);
          if (!lora) o.allocs.push_back(l);
        }
      } else {
        logits_ = b_.buffer("logits", seg.unit, c_.loss.logits, MemCategory::Logits, compute_);
        if (!lora) o.allocs.push_back(logits_);
      }
      place_workspace(o);   // the head's GEMM, after its logits (with an adapter, before the adapter's sum)
      // fused linear cross-entropy: one fp32 chunk of logits at a time, and the head weight's gradient
      transient(o, "loss_tmp", seg.unit, c_.loss.forward_transient, MemCategory::Logits);
      if (c_.loss.weight_grad > 0) {
        loss_weight_grad_ = b_.buffer("flce_wgrad", seg.unit, c_.loss.weight_grad, MemCategory::Logits, compute_);
        o.allocs.push_back(loss_weight_grad_);
      }
      if (lora) {   // (o is not used past this point: the ops appended below may move it)
        if (c_.loss.chunked_output) {
          for (int i = 0; i < c_.loss.chunks(); ++i)
            head_lora_forward(logits_chunks_.first + i, c_.loss.rows_of(i) * c_.loss.logits_row);
        } else {
          head_lora_forward(logits_, c_.loss.logits);
        }
      }
    }
  } else if (kind == OpKind::Recompute) {
    if (block && !a->recompute_events.empty()) {
      // The block output's gradient exists before the recompute starts (the unpack hook of the block's first
      // backward node triggers it); the recompute's tensors one by one, its temporaries freed inside the op.
      if (a->incoming_grad > 0) {
        grad_in_[s] = take_carried_grad(a->incoming_grad);
        if (grad_in_[s] < 0) {
          grad_in_[s] = b_.buffer("grad_in", seg.unit, a->incoming_grad, MemCategory::Activations, compute_);
          o.allocs.push_back(grad_in_[s]);
        }
      }
      recompute_[s] = alloc_forward(o, seg.unit, a->recompute, a->recompute_events, 0);
      place_workspace(o);
    } else {
      recompute_[s] = alloc_tensors(o, seg.unit, a->recompute);
    }
  } else {
    // The backward's gradients and temporaries on top of what is saved (models::BlockMemory::backward_extra).
    // Autograd computes each weight's gradient in the backward of the op that uses it and AccumulateGrad keeps
    // it (FSDP2's unsharded parameters' .grad; FSDP1's views' gradients, held by the split's backward node:
    // torch/csrc/autograd/functions/accumulate_grad.h, input_buffer.cpp), so when this op allocates the
    // block's gradients (`grads`) they do not all exist at the backward's peak, which comes at its first ops
    // (the MLP's output projection, with its own weight's gradient only: measured on PyTorch 2.11,
    // l3-8b-fsdp2-ac-mb2-s8192-fused): the transient is what the backward needs on top of all of them
    // (models::BlockMemory::backward_extra_with_grads). Without gradients made here (no_sync accumulating
    // into a kept .grad, a unit whose gradient an earlier segment made) the gradients are not counted.
    if (block && backward_by_tensor(*a, grads)) {
      emit_backward_events(o, s, *a, grads > 0);
      return;
    }
    if (block) {
      Bytes tmp = a->backward_extra;
      if (grads > 0 && a->param_grads > 0) tmp = std::max<Bytes>(0, a->backward_with_grads - a->param_grads);
      transient(o, "bwd_tmp", seg.unit, tmp, MemCategory::Activations);
    }
    if (head && c_.loss.chunked_output) {
      // torchtune's chunked output: the chunks' backward, the split's cat and the final norm's backward come
      // after this op (head_chunks_backward), which holds the head's GEMMs; logits the loop kept die here.
      free_range(o, logits_chunks_);
      free_range(o, recompute_[s]);
      return;
    }
    if (head && head_by_tensor(grads)) {
      // The head's backward tensor by tensor, as a block's: the tape's output gradient is the loss's logits
      // gradient (its event has 0 bytes: the logits are the lowering's), freed once the head matmul's backward has
      // made the input's (and, when the head trains, the weight's) gradient, before the final norm's backward
      // (autograd releases a node's incoming gradient after the node: torch/csrc/autograd/engine.cpp
      // evaluate_function); the norm's input gradient goes on to the last block. Measured in PyTorch 2.11's
      // allocator history of l1b-fsdp2-lora5pct-litgpt: the norm's fp32 gradients reuse freed 32 MiB blocks where
      // one transient of their sum needed a new segment.
      grad_in_[s] = head_grad_;
      head_grad_ = -1;
      emit_backward_events(o, s, c_.final_norm_acts, grads > 0, /*incoming_dies_with_first_node=*/true);
      return;
    }
    if (head) {
      Bytes tmp = c_.final_norm.backward_extra;
      if (c_.loss.impl == models::LossImpl::FusedLinear && !c_.loss.in_head_op && logits_ >= 0) {
        // Liger's fused linear cross-entropy saved the head input's gradient in its forward (what logits_ holds
        // here: LossMemory::input_grad), and its backward returns that tensor (LigerFusedLinearCrossEntropy-
        // Function.backward, liger_kernel/ops/fused_linear_cross_entropy.py): it is the gradient the final
        // norm's backward starts from (in its backward_extra as the head matmul's input gradient), and autograd
        // drops it once that backward has consumed it (in place into it with Liger's RMSNorm, which then hands
        // it to the last block as that block's incoming gradient). Measured on PyTorch 2.11
        // (l3-8b-fsdp2-ac-mb2-s8192-fused, gpt2-fsdp2-w8-fused): freed at the final norm's backward, not held
        // through the step's backward.
        tmp = std::max<Bytes>(0, tmp - c_.loss.input_grad);
        o.frees.push_back({logits_, -1});
        logits_ = -1;
      }
      transient(o, "bwd_tmp", seg.unit, tmp, MemCategory::Activations);
      if (head_grad_ >= 0) o.frees.push_back({head_grad_, -1});   // the logits' gradient from the loss
      head_grad_ = -1;
      // Logits a PyTorch loop kept die when backward() returns (backward()); the bundled runtime's head
      // backward reads them and frees them.
      if (logits_ >= 0 && plan_.implementation == models::ModelImpl::Runtime) {
        o.frees.push_back({logits_, -1});
        logits_ = -1;
      }
    }
    free_range(o, act_[s]);
    free_range(o, recompute_[s]);
    if (grad_in_[s] >= 0) o.frees.push_back({grad_in_[s], -1});
    grad_in_[s] = -1;
  }
}

bool LoweringWalk::backward_by_tensor(const Context::BlockActivations& a, Bytes grads) const {
  return !a.backward_events.empty() && (grads == 0 || grads == a.param_grads);
}

// The head's backward tensor by tensor where its op holds only the head matmul's and the final norm's backward: not
// torchtune's chunked output (head_chunks_backward), a fused linear cross-entropy (its saved input gradient), a LoRA
// adapter on the head (its T x V tensors are the lowering's), activation offloading, nor the bundled runtime.
bool LoweringWalk::head_by_tensor(Bytes grads) const {
  return head_grad_ >= 0 && !c_.loss.chunked_output && c_.loss.impl != models::LossImpl::FusedLinear && !head_lora() &&
         plan_.activation_offloading == ActivationOffload::None && plan_.implementation != models::ModelImpl::Runtime &&
         backward_by_tensor(c_.final_norm_acts, grads);
}

// The block backward as PyTorch's allocator sees it (issue 19 item 4; models::AutogradTape::backward_events): the
// incoming gradient (the recompute's grad_in, else the later block's input gradient, else made here), then op by
// op, last first, the weight's gradient (its place noted), the inputs' gradients, the kernel's workspace, the
// gradients nothing reads any more and the saved tensors after their last reader's backward
// (Node::release_variables), each freed inside the op (FreeSpec free_inside_op). The block input's gradient goes on
// to the earlier module (carried_grad_); saved tensors no backward op released are freed after it is enqueued.
void LoweringWalk::emit_backward_events(Op& o, int s, const Context::BlockActivations& a, bool weight_grads,
                                        bool incoming_dies_with_first_node) {
  const int unit = c_.segments[s].unit;
  // (an offloaded checkpoint input is the offloading's: its reload, dropped by offload_after_backward)
  const models::ForwardEvent* in = input_event(a.forward_events);
  const bool offloading = plan_.activation_offloading != ActivationOffload::None;
  const bool taken = act_[s].extra >= 0 || (offloading && offloaded_[s] >= 0);
  range_buffers(a.saved, act_[s], in && in->kind == models::ForwardEvent::Kept && taken ? in->saved : -1, saved_bufs_);
  range_buffers(a.recompute, recompute_[s], -1, rec_bufs_);
  act_[s] = recompute_[s] = BufferRange{};
  const auto storage = [&](const models::BackwardEvent& e) -> int* {
    if (e.saved >= 0) return &saved_bufs_[static_cast<std::size_t>(e.saved)];
    if (e.recomputed >= 0) return &rec_bufs_[static_cast<std::size_t>(e.recomputed)];
    return nullptr;
  };
  std::size_t inside = 0;
  const auto free_inside = [&](int& b) {
    if (b < 0) return;
    o.frees.insert(o.frees.begin() + static_cast<std::ptrdiff_t>(inside++),
                   FreeSpec{b, free_inside_op(std::max<int>(1, static_cast<int>(o.allocs.size())))});
    b = -1;
  };
  grad_buf_.clear();
  weight_slots_.clear();
  // Activation offloading (a block whose saved tensors were packed): the GPU tensors are the offloading's (stashed
  // or gone); each node that unpacks brings its offloaded tensors back (torchtune's unpack hook: on the side stream,
  // in its pool, with streams; on the compute stream without) and drops what the node before it brought back
  // (streams: after its own copies; sync: before them, its node having run). One copy per storage a node reads.
  const bool by_node = offloading && packs_saved(s);
  int node = -2;
  bool drop_due = false;
  node_copies_.clear();
  prev_copies_.clear();
  if (by_node && offload_streams()) prev_copies_.swap(pending_copies_);   // the earlier block's last node's
  const auto drop_prev = [&]() {
    for (int& b : prev_copies_) free_inside(b);
    prev_copies_.clear();
    drop_due = false;
  };
  int first_node = -1;
  for (const models::BackwardEvent& e : a.backward_events) {
    if (incoming_dies_with_first_node && e.op >= 0) {   // (an incoming gradient without events: the head's logits')
      if (first_node < 0) first_node = e.op;
      else if (e.op != first_node) free_inside(grad_in_[s]);
    }
    if (drop_due && e.kind != models::BackwardEvent::Unpack) drop_prev();
    switch (e.kind) {
      case models::BackwardEvent::WeightGrad:
        if (weight_grads) weight_slots_.push_back({o.allocs.size(), inside});
        break;
      case models::BackwardEvent::Grad: {
        if (static_cast<std::size_t>(e.grad) >= grad_buf_.size()) grad_buf_.resize(static_cast<std::size_t>(e.grad) + 1, -1);
        int b = -1;
        if (e.op < 0) {   // the block output's gradient: the recompute's, when it made one, or the later block's
          std::swap(b, grad_in_[s]);
          if (b < 0) b = take_carried_grad(e.bytes);
        } else if (int* st = e.storage >= 0 ? storage(e) : nullptr; st && !offload_owned(*st)) {   // into the saved tensor
          std::swap(b, *st);
        }
        if (b < 0) {
          b = b_.buffer(e.op < 0 ? "grad_in" : "act_grad", unit, e.bytes, MemCategory::Activations, compute_);
          o.allocs.push_back(b);
        }
        grad_buf_[static_cast<std::size_t>(e.grad)] = b;
        break;
      }
      case models::BackwardEvent::FreeGrad: free_inside(grad_buf_.at(static_cast<std::size_t>(e.grad))); break;
      case models::BackwardEvent::Workspace: {
        int w = b_.buffer("bwd_ws", unit, e.bytes, MemCategory::Activations, compute_);
        o.allocs.push_back(w);
        free_inside(w);
        break;
      }
      case models::BackwardEvent::Release:
        if (int* st = storage(e)) {
          if (offload_owned(*st)) *st = -1;   // (the offloading's: its stash, or freed at its last forward read)
          free_inside(*st);
        }
        break;
      case models::BackwardEvent::Unpack: {
        const int* st = by_node ? storage(e) : nullptr;
        if (!st || std::find(unpacked_.begin(), unpacked_.end(), *st) == unpacked_.end()) break;
        if (e.op != node) {   // a new node: the previous one's copies go
          node = e.op;
          prev_copies_.insert(prev_copies_.end(), node_copies_.begin(), node_copies_.end());
          node_copies_.clear();
          if (offload_streams()) drop_due = true;
          else drop_prev();
        }
        const int c = b_.buffer("act_reload", unit, e.bytes, MemCategory::Activations, offload_);
        o.allocs.push_back(c);
        node_copies_.push_back(c);
        node_copied_ = true;
        break;
      }
    }
  }
  if (drop_due) drop_prev();
  for (int b : prev_copies_) o.frees.push_back({b, -1});   // (a block whose nodes brought nothing back)
  prev_copies_.clear();
  // the last node's: with streams the next node that unpacks drops them (offload_after_backward, the next packed
  // block's first, or the end-of-backward callback); without, its node has run
  if (offload_streams()) pending_copies_.swap(node_copies_);
  for (int b : node_copies_) o.frees.push_back({b, -1});
  node_copies_.clear();
  if (o.allocs.empty())   // (an op that makes nothing frees after it is enqueued)
    for (std::size_t f = 0; f < inside; ++f) o.frees[f].reuse_after_op = -1;
  // the block input's gradient (the one left) goes on to the earlier module
  if (std::count_if(grad_buf_.begin(), grad_buf_.end(), [](int b) { return b >= 0; }) == 1) {
    int& g = *std::find_if(grad_buf_.begin(), grad_buf_.end(), [](int b) { return b >= 0; });
    carried_grad_ = g;
    carried_grad_bytes_ = p_.buffers[static_cast<std::size_t>(g)].bytes;
    carried_grad_op_ = o.id;
    g = -1;
  }
  for (const std::vector<int>* v : {&grad_buf_, &saved_bufs_, &rec_bufs_})
    for (int b : *v)
      if (b >= 0 && !offload_owned(b)) o.frees.push_back({b, -1});
  if (grad_in_[s] >= 0) o.frees.push_back({grad_in_[s], -1});
  grad_in_[s] = -1;
}

int LoweringWalk::take_carried_grad(Bytes bytes) {
  if (carried_grad_ < 0 || carried_grad_bytes_ != bytes) return -1;
  const int g = carried_grad_;
  carried_grad_ = -1;
  return g;
}

const std::vector<int>* LoweringWalk::cut_grads(const char* name, int u, Bytes bytes) {
  if (cut_ == nullptr || bytes != cut_->param_grads || !cut_bufs_.empty()) return nullptr;
  for (const models::BackwardEvent& e : cut_->backward_events)
    if (e.kind == models::BackwardEvent::WeightGrad)
      cut_bufs_.push_back(b_.buffer(name, u, e.bytes, MemCategory::UnshardedGrads, compute_));
  return cut_bufs_.empty() ? nullptr : &cut_bufs_;
}

void LoweringWalk::place_weight_grads(Op& o, std::size_t first) {
  if (weight_slots_.empty() || first >= o.allocs.size()) return;
  tail_.assign(o.allocs.begin() + static_cast<std::ptrdiff_t>(first), o.allocs.end());
  o.allocs.resize(first);
  const bool pieces = cut_bufs_.size() == weight_slots_.size();
  const auto is_piece = [&](int b) { return pieces && std::find(cut_bufs_.begin(), cut_bufs_.end(), b) != cut_bufs_.end(); };
  // from the last slot back: an insertion moves the allocations and the inside frees after it, not the slots before
  for (std::size_t i = weight_slots_.size(); i-- > 0;) {
    const WeightSlot& w = weight_slots_[i];
    std::size_t n = 0;
    const auto insert = [&](int b) { o.allocs.insert(o.allocs.begin() + static_cast<std::ptrdiff_t>(w.allocs + n++), b); };
    if (pieces) insert(cut_bufs_[i]);
    if (i == 0)
      for (int b : tail_)
        if (!is_piece(b)) insert(b);
    for (std::size_t f = w.inside_frees; f < o.frees.size() && is_free_inside_op(o.frees[f].reuse_after_op); ++f)
      o.frees[f].reuse_after_op = free_inside_op(allocs_before_free(o.frees[f].reuse_after_op) + static_cast<int>(n));
  }
  weight_slots_.clear();
}

// A LoRA adapter on the LM head (plan.lora.targets "head"; models/block_recipes.cpp lora): the head computes
// base(x) + B(A(drop(x))) * scaling, as PEFT's (tuners/lora/layer.py Linear.forward: result = result +
// lora_B(lora_A(dropout(x))) * scaling), torchtune's and litgpt's LoRALinear.forward do, each op out of place.
// The final norm's tape holds the adapter's dropout, mask and A's output (rank wide); its vocabulary-wide
// tensors are allocated here, one buffer each, because they set how many logits-sized segments the caching
// allocator holds: the base output (T x V), B's output (T x V), the product by the scaling (mul.Scalar, a new
// T x V tensor that saves nothing), all three alive at once; B's output dies when the product is made, then
// the sum (the logits the loss reads) is a new tensor and the product and the base output die (autograd's
// AddBackward and MulBackward save neither). Not for a fused linear cross-entropy (it takes the head's weight
// alone, no adapter path) nor the bundled runtime (no adapters).
bool LoweringWalk::head_lora() const {
  return c_.trainable.lora.adapts(models::Weight::LmHead) && c_.loss.impl != models::LossImpl::FusedLinear &&
         !c_.loss.in_head_op && plan_.implementation != models::ModelImpl::Runtime;
}

// Two memory-only ops after the head's forward (its GEMMs are in the head's op): "head lora", the three T x V
// tensors (head_out, lora_b_out, lora_scale) with B's output freed, then "lora sum", the sum `logits` (a
// buffer the head's op made and did not allocate) with the product and the base output freed. With
// torchtune's chunked output, once per chunk (`bytes` the chunk's).
void LoweringWalk::head_lora_forward(int logits, Bytes bytes) {
  Op& o = loss_op(OpKind::Forward, "head lora");
  const int base = b_.buffer("head_out", o.unit, bytes, MemCategory::Logits, compute_);
  const int yb = b_.buffer("lora_b_out", o.unit, bytes, MemCategory::Logits, compute_);
  const int scaled = b_.buffer("lora_scale", o.unit, bytes, MemCategory::Logits, compute_);
  o.allocs.push_back(base);
  o.allocs.push_back(yb);
  o.allocs.push_back(scaled);
  o.frees.push_back({yb, -1});
  Op& sum = loss_op(OpKind::Forward, "lora sum");
  sum.allocs.push_back(logits);
  sum.frees.push_back({scaled, -1});
  sum.frees.push_back({base, -1});
}

// The head adapter's backward, before the head's backward op: AddBackward hands the logits' gradient to both
// branches as it is; the adapter's nodes (created after the base matmul, so run first by the engine,
// engine.h CompareNodeTaskTime) start with MulBackward's grad * scaling, a new T x V tensor that lives while
// B's matmul backward (rank-wide grad_input, B's V x r weight gradient) reads it, then dies: op "lora bwd",
// transient lora_sgrad. Only when the adapter trains or the head's input requires grad (otherwise no adapter
// node runs). Not modelled with torchtune's chunked output (one adapter path per chunk, each chunk's scaled
// gradient rows x V, in head_chunks_backward's per-chunk order).
void LoweringWalk::head_lora_backward() {
  if (!head_lora() || c_.loss.chunked_output) return;
  const models::GradFlow& f = c_.flows.final_part;
  if (!f.trains_weight(models::Weight::Adapter) && !f.input_requires_grad) return;
  Op& o = loss_op(OpKind::Backward, "lora bwd");
  transient(o, "lora_sgrad", o.unit, c_.loss.logits, MemCategory::Logits);
}

// cuBLAS workspaces (aten/src/ATen/cuda/CublasHandlePool.cpp, getCurrentCUDABlasHandle): cuBLAS handles
// are per thread (a thread-local pool window) and each (handle, stream) pair gets a workspace
// (getChosenWorkspaceSize: 32 MiB on Hopper and Blackwell) from the caching allocator at its first GEMM,
// kept in cublas_handle_stream_to_workspace for the life of the process (cuBLASLt shares it). The
// forward's GEMMs run on the Python thread; the backward's, and a checkpoint's recompute, on the autograd
// engine's device thread: two workspaces on the compute stream, created in the first step, live after it.
// The GEMM's output is allocated before the call fetches the handle, so the workspace follows the first
// GEMM's output: in the allocator history of l1b-fsdp2-ac-mb4-s4096-hf-offload-sync (PyTorch 2.11,
// reports/validation/torch-memory-2026-11-28) the forward's comes right after the first block's q_proj
// output and sits in a 128 MiB segment the RMSNorm's fp32 temporaries had left free, not in a segment
// of its own. The bundled runtime is not PyTorch: none.
void LoweringWalk::cublas_workspace(Op& o, bool autograd_thread, bool at_first_gemm) {
  int& ws = cublas_ws_[autograd_thread ? 1 : 0];
  if (ws >= 0 || c_.topo.cublas_workspace <= 0 || plan_.implementation == models::ModelImpl::Runtime) return;
  ws = b_.buffer("cublas_ws", -1, c_.topo.cublas_workspace, MemCategory::Activations, compute_, true);
  b_.first_step_lazy(ws);
  if (at_first_gemm) pending_ws_ = ws;
  else o.allocs.push_back(ws);
}

void LoweringWalk::place_workspace(Op& o) {
  if (pending_ws_ < 0) return;
  o.allocs.push_back(pending_ws_);
  pending_ws_ = -1;
}

// An op of the loss that only allocates and frees: its kernels are in the head's lists (models/kernels.cpp
// cross_entropy, cross_entropy_bwd), so it takes no GPU or CPU time of its own.

// One chunk's cross-entropy backward (torch/csrc/autograd: nll_loss_backward's zero-filled gradient, then
// _log_softmax_backward_data's; the nll gradient and the chunk's saved log-probabilities are released).
// Returns the log-softmax gradient's buffer.
int LoweringWalk::chunk_ce_backward(const LossMemory& l, int i, int saved) {
  Op& o = loss_op(OpKind::Backward, "ce bwd");
  const int g1 = b_.buffer("nll_grad", o.unit, l.chunk_bytes(i), MemCategory::Logits, compute_);
  const int g2 = b_.buffer("lsm_grad", o.unit, l.chunk_bytes(i), MemCategory::Logits, compute_);
  o.allocs.push_back(g1);
  o.allocs.push_back(g2);
  o.frees.push_back({g1, -1});
  o.frees.push_back({saved, -1});
  return g2;
}

Op& LoweringWalk::loss_op(OpKind kind, const char* what) {
  static const std::shared_ptr<const std::vector<models::KernelDesc>> kNoKernels =
      std::make_shared<const std::vector<models::KernelDesc>>();
  Op& o = b_.compute_op(kind, compute_, c_.segments.back().unit, mb_, what, kNoKernels);
  o.kernel_launches = 0;
  return o;
}

// The loss's forward (LossMemory): the fp32 copy and the saved log-probabilities (or logsumexp); the loop
// frees the logits here if it deletes them before backward.
void LoweringWalk::loss_forward() {
  const LossMemory& l = c_.loss;
  if (l.impl == models::LossImpl::FusedLinear || l.in_head_op) return;   // all in the head's op
  if (l.chunked_output) {
    // CEWithChunkedOutputLoss.forward (torchtune/modules/loss/ce_chunked_output_loss.py): compute_cross_entropy
    // on each chunk in order: the .float() copy (freed when F.cross_entropy returns) and _log_softmax's fp32
    // result, saved for backward (LossMemory::chunked_output). The labels, the per-chunk sums and the count of
    // elements are a few bytes per token, not counted.
    loss_chunk_ids_.clear();
    for (int i = 0; i < l.chunks(); ++i) {
      Op& o = loss_op(OpKind::Forward, "ce chunk");
      if (l.upcast_row > 0) {
        const int up = b_.buffer("logits_fp32", o.unit, l.rows_of(i) * l.upcast_row, MemCategory::Logits, compute_);
        o.allocs.push_back(up);
        o.frees.push_back({up, -1});
      }
      const int lp = b_.buffer("log_probs", o.unit, l.chunk_bytes(i), MemCategory::Logits, compute_);
      o.allocs.push_back(lp);
      loss_chunk_ids_.push_back(lp);
      // the recipes' `del logits` (full_finetune_distributed.py: "free logits otherwise it peaks backward memory")
      if (i == l.chunks() - 1 && l.free_logits) free_range(o, logits_chunks_);
    }
    return;
  }
  Op& o = loss_op(OpKind::Forward, "loss");
  if (l.upcast > 0) {
    const int up = b_.buffer("logits_fp32", o.unit, l.upcast, MemCategory::Logits, compute_);
    o.allocs.push_back(up);
    o.frees.push_back({up, -1});   // _log_softmax saves its result, not its input
  }
  if (l.chunks() > 0) {
    // litgpt/utils.py chunked_cross_entropy: cross_entropy per 128-row view of the logits, each saving
    // its log_softmax output (the per-row losses and their cat are a few bytes per row, not counted)
    loss_chunks_ = BufferRange{b_.num_buffers(), l.chunks()};
    for (int i = 0; i < l.chunks(); ++i)
      o.allocs.push_back(b_.buffer("log_probs", o.unit, l.chunk_bytes(i), MemCategory::Logits, compute_));
  } else if (l.saved > 0) {
    loss_saved_ = b_.buffer("log_probs", o.unit, l.saved, MemCategory::Logits, compute_);
    o.allocs.push_back(loss_saved_);
  }
  if (l.free_logits && logits_ >= 0) {
    o.frees.push_back({logits_, -1});
    logits_ = -1;
  }
  if (packs_.loss && loss_saved_ >= 0) pack_loss();   // (o is not used past this point)
}

// The loss's backward (LossMemory): nll_loss_backward, _log_softmax_backward_data, the upcast's backward.
void LoweringWalk::loss_backward() {
  const LossMemory& l = c_.loss;
  if (l.in_head_op) return;
  if (loss_weight_grad_ >= 0) {   // handed to AccumulateGrad: the head's backward allocates the unit's gradient
    Op& o = loss_op(OpKind::Backward, "flce bwd");
    o.frees.push_back({loss_weight_grad_, -1});
    loss_weight_grad_ = -1;
  }
  const auto release_saved = [&](Op& o) {
    if (loss_saved_ >= 0) o.frees.push_back({loss_saved_, -1});
    loss_saved_ = -1;
  };
  if (l.chunked_output) {
    // CEWithChunkedOutputLoss's backward: `total_loss += chunk_loss` chains the chunks, so the autograd engine
    // (torch/csrc/autograd/engine.h ReadyQueue::CompareNodeTaskTime: the ready node with the highest
    // sequence_nr first) runs chunk n-1's NllLossBackward, LogSoftmaxBackward and ToCopyBackward, then the
    // previous AddBackward and chunk n-2's, ... : every chunk's loss backward before any reshape/ head-matmul
    // node of the forward's chunked_output (created earlier, lower sequence numbers). Per chunk:
    //   nll_loss_backward: grad_input = zeros_like(self), fp32; _log_softmax_backward_data: a new fp32 gradient;
    //   then the engine drops the node's input (the nll gradient) and release_variables() its saved result
    //   (engine.cpp evaluate_function); _to_copy_backward: grad.to(compute dtype), then the fp32 gradient dies.
    // The compute-dtype gradient waits in the input buffer of the chunk's reshape (ViewBackward) node until the
    // head's backward (head_chunks_backward).
    std::vector<int>& grads = head_chunk_grads_;
    grads.assign(static_cast<std::size_t>(l.chunks()), -1);
    for (int i = l.chunks() - 1; i >= 0; --i) {
      const int g2 = chunk_ce_backward(l, i, loss_chunk_ids_[static_cast<std::size_t>(i)]);
      grads[static_cast<std::size_t>(i)] = g2;
      if (l.upcast_row > 0) {   // fp32 logits: no .float() node, the fp32 gradient itself flows on
        Op& down = loss_op(OpKind::Backward, "upcast bwd");
        const int g = b_.buffer("logits_grad", down.unit, l.rows_of(i) * l.logits_row, MemCategory::Logits, compute_);
        down.allocs.push_back(g);
        down.frees.push_back({g2, -1});
        grads[static_cast<std::size_t>(i)] = g;
      }
    }
    loss_chunk_ids_.clear();
    return;
  }
  if (l.chunks() > 0) {
    // One chunk at a time, last chunk first (the engine runs the ready node with the highest sequence
    // number): nll_loss_backward's zero-filled gradient, _log_softmax_backward_data's, then the nll
    // gradient and the chunk's saved output are released; the chunks' gradients wait in the split's
    // input buffer until split_with_sizes_backward concatenates them (torch/csrc/autograd/FunctionsManual.cpp).
    const int n = l.chunks();
    const int grads = b_.num_buffers();
    for (int i = n - 1; i >= 0; --i) chunk_ce_backward(l, i, loss_chunks_.first + i);
    loss_chunks_ = BufferRange{};
    Op& cat = loss_op(OpKind::Backward, "split bwd");
    head_grad_ = b_.buffer("logits_grad", cat.unit, l.logits_grad, MemCategory::Logits, compute_);
    cat.allocs.push_back(head_grad_);
    for (int i = 0; i < n; ++i) cat.frees.push_back({grads + 2 * i + 1, -1});
  } else if (l.impl == models::LossImpl::Torch) {
    // Offloaded (pack_loss): nll_loss_backward unpacks its self and target, _log_softmax_backward_data its result.
    // Without streams each comes back from the CPU for its node and dies after it. With streams the first node
    // finds its tensors still in the forward's stash (no copy); the hook after it drops the stash (the compute
    // stream waiting on every copy still running), so the result comes back from the CPU for the second node and
    // stays until the next node that unpacks has run.
    const int unit = c_.segments.back().unit;
    const int target = packs_.loss_target > 0 ? 1 : 0;
    const int self =
        loss_off_ && !offload_streams() ? bring_back(unit, l.saved, MemCategory::Logits, "loss H2D", target, packs_.loss_target) : -1;
    Op& nll = loss_op(OpKind::Backward, "nll bwd");
    const int g1 = b_.buffer("nll_grad", nll.unit, l.nll_grad, MemCategory::Logits, compute_);
    nll.allocs.push_back(g1);
    for (int i = 0; self >= 0 && i <= target; ++i) nll.frees.push_back({self + i, -1});   // (self, target)
    int result = -1;
    if (loss_off_) {
      if (offload_streams()) release_stash(INT_MAX);
      result = bring_back(unit, l.saved, MemCategory::Logits, "loss H2D");
    }
    Op& lsm = loss_op(OpKind::Backward, "lsm bwd");
    head_grad_ = b_.buffer("lsm_grad", lsm.unit, l.lsm_grad, MemCategory::Logits, compute_);
    lsm.allocs.push_back(head_grad_);
    lsm.frees.push_back({g1, -1});
    release_saved(lsm);
    if (result >= 0 && !offload_streams()) lsm.frees.push_back({result, -1});
    if (result >= 0 && offload_streams()) {
      drop_reload(reload_, reload_n_);   // (none: the first node that unpacks came just before)
      reload_ = result;
      reload_n_ = 1;
      reload_op_ = lsm.id;
    }
    if (l.logits_grad > 0) {
      Op& down = loss_op(OpKind::Backward, "upcast bwd");
      const int g = b_.buffer("logits_grad", down.unit, l.logits_grad, MemCategory::Logits, compute_);
      down.allocs.push_back(g);
      down.frees.push_back({head_grad_, -1});
      head_grad_ = g;
    }
  } else if (l.impl == models::LossImpl::Fused) {
    Op& ce = loss_op(OpKind::Backward, "ce bwd");
    head_grad_ = b_.buffer("logits_grad", ce.unit, l.logits_grad, MemCategory::Logits, compute_);
    ce.allocs.push_back(head_grad_);
    release_saved(ce);
  }
}

// torchtune's chunked output, the head's backward (LossMemory::chunked_output), after the head's backward op
// (which holds the head's and the final norm's GEMMs and kernels and allocates the unit's gradient). After the
// loss's backward the engine runs the loss's reshape nodes (ViewBackward: views, no memory), then each chunk's
// head matmul backward from the last chunk (highest sequence_nr, engine.h CompareNodeTaskTime): MmBackward
// returns the chunk input's gradient (rows x C, compute dtype; held in the input buffer of the chunk()'s
// SplitBackward node) and, when the weight trains, a V x C weight gradient: the first one becomes the .grad
// (the unit's gradient), each later one is added in place and freed (AccumulateGrad, accumulate_grad.h).
// The chunk's logits gradient dies once its matmul backward has run. SplitBackward then cats the inputs'
// gradients (split_backward, torch/csrc/autograd/FunctionsManual.cpp; the head input's gradient of the final
// norm's backward, in its backward_extra with the norm's own temporaries) and the final norm's backward runs.
// Approximations: the head's GEMM kernels run in the op before (memory-only ops take no time); with micro_batch
// > 1 and a trained head, matmul folds each non-contiguous chunk of h with a copy (aten matmul should_fold,
// saved by mm: the same bytes as the saved norm output, in pieces) that is not told apart from the norm output.
void LoweringWalk::head_chunks_backward(int s) {
  const LossMemory& l = c_.loss;
  const int u = c_.segments[s].unit;
  const int n = l.chunks();
  head_in_grads_.clear();
  for (int i = n - 1; i >= 0; --i) {
    Op& o = loss_op(OpKind::Backward, "head bwd");
    const int gi = b_.buffer("in_grad", u, l.rows_of(i) * l.head_in_grad_row, MemCategory::Activations, compute_);
    o.allocs.push_back(gi);
    head_in_grads_.push_back(gi);
    if (i != n - 1) transient(o, "wgrad_tmp", u, l.head_weight_grad, MemCategory::UnshardedGrads);
    const int g = head_chunk_grads_[static_cast<std::size_t>(i)];
    if (g >= 0) o.frees.push_back({g, -1});
  }
  head_chunk_grads_.clear();
  Op& cat = loss_op(OpKind::Backward, "split bwd");
  transient(cat, "bwd_tmp", u, c_.final_norm.backward_extra, MemCategory::Activations);
  for (int gi : head_in_grads_) cat.frees.push_back({gi, -1});
  head_in_grads_.clear();
  free_range(cat, act_[s]);
}

LoweringWalk::ParamGradParts LoweringWalk::param_grad_parts() const {
  const int S = static_cast<int>(c_.segments.size());
  ParamGradParts g;
  g.held.assign(S, {});
  g.transient.assign(S, 0);
  g.unit_held.assign(c_.sizes.size(), 0);
  g.unit_listed.assign(c_.sizes.size(), 0);
  g.trained.assign(S, {});
  g.unit_trained.assign(c_.sizes.size(), 0);
  const models::TrainableSet& ts = c_.trainable;
  const models::ParamCounts pc = models::count_params(*c_.model);
  const bool tied = c_.model->tied_embeddings;
  const std::int64_t tied_weight = tied ? pc.embedding - pc.positions : 0;
  for (int s = 0; s < S; ++s) {
    const Segment& seg = c_.segments[s];
    std::vector<std::int64_t>& h = g.held[s];
    std::vector<std::int64_t>& tr = g.trained[s];
    switch (seg.part) {
      case models::ModulePart::Embedding:
        if (tied && c_.segments.back().unit == seg.unit) {
          h = {pc.positions};
          g.transient[s] = tied_weight;
          g.tied_embedding = s;
        } else {
          h = {pc.embedding};
        }
        break;
      case models::ModulePart::Block:
        // The block's parameters one by one, in the reverse of the forward's module calls (the last
        // module's backward runs first): FSDP2's unsharded parameters are leaves, each .grad its own tensor.
        // An NF4 weight (QLoRA) gets none: torchao's LinearNF4 and bitsandbytes' MatMul4Bit return no gradient
        // for it, and split_with_sizes_backward fills its part of FSDP1's flat gradient with zeros.
        {
          std::vector<const models::Module*> mods;
          for (const models::Module& m : c_.graph->modules)
            if (m.layer == seg.layer && !m.params.empty()) mods.push_back(&m);
          std::sort(mods.begin(), mods.end(), [](const models::Module* a, const models::Module* b) {
            return a->exec_index > b->exec_index;
          });
          for (const models::Module* m : mods)
            for (auto t = m->params.rbegin(); t != m->params.rend(); ++t) {
              g.unit_listed[seg.unit] += t->numel();
              if (models::tensor_nf4(ts.lora, t->name)) continue;
              h.push_back(t->numel());
              if (models::tensor_trains(ts, t->name)) tr.push_back(t->numel());
            }
          if (mods.empty()) {   // a block known by its count
            h = {pc.per_block};
            g.unit_listed[seg.unit] += pc.per_block;
            if (ts.all) tr = h;
            else g.unit_trained[seg.unit] = -1;
          }
          // LoRA's adapters (not in the module tree: models/trainable.h) are parameters whose gradients the
          // block's backward makes too: FSDP1's views of a FlatParameter that holds them (use_orig_params,
          // fsdp1_unit_sizes), FSDP2's own nn.Parameters.
          for (const models::AdapterMatrix& am : ts.block_adapters) {
            h.push_back(am.numel());
            tr.push_back(am.numel());
          }
        }
        break;
      case models::ModulePart::FinalNormAndHead: h = {pc.final_norm, tied ? tied_weight : pc.lm_head}; break;
    }
    if (seg.part != models::ModulePart::Block) {
      for (std::int64_t n : h) g.unit_listed[seg.unit] += n;
      // outside the blocks the rule trains no weight; LoRA's head adapters (not among `held`) train
      if (ts.all) tr = h;
      if (seg.part == models::ModulePart::FinalNormAndHead)
        for (const models::AdapterMatrix& am : ts.head_adapters) tr.push_back(am.numel());
    }
    std::erase(h, 0);
    std::erase(tr, 0);
    for (std::int64_t n : h) g.unit_held[seg.unit] += n;
    if (g.unit_trained[seg.unit] >= 0)
      for (std::int64_t n : tr) g.unit_trained[seg.unit] += n;
  }
  if (g.tied_embedding >= 0 && tied_weight > 0 && c_.segments.back().part == models::ModulePart::FinalNormAndHead) {
    g.tied = tied_weight;
    g.tied_head = S - 1;
  }
  return g;
}

LoweringWalk::SideStreams LoweringWalk::add_side_streams(const char* copy_in, const char* all_gather,
                                                          const char* reduce_scatter, bool all_reduce) {
  compute_ = b_.add_stream(StreamRole::Compute, "default");
  SideStreams s;
  s.copy_in = b_.add_stream(StreamRole::CopyIn, copy_in);
  s.all_gather = b_.add_stream(StreamRole::AllGather, all_gather);
  s.reduce_scatter = b_.add_stream(StreamRole::ReduceScatter, reduce_scatter);
  if (all_reduce) s.all_reduce = b_.add_stream(StreamRole::AllReduce, "all_reduce");
  return s;
}

void LoweringWalk::collective(Op& o, CommGroup group, Bytes bytes) const {
  const GroupShape& shape = group == CommGroup::Shard       ? c_.shard_group
                            : group == CommGroup::Replicate ? c_.replicate_group
                            : group == CommGroup::World     ? c_.world_group
                                                            : c_.post_forward_group;
  o.comm_bytes = bytes;
  o.group = group;
  o.group_size = shape.size;
  o.nodes_spanned = shape.nodes;
}

Op& LoweringWalk::all_reduce(int u, int stream, int buf, Bytes bytes, CommGroup group, int after) {
  Op& ar = b_.op(OpKind::AllReduce, stream, u, mb_, "AR");
  b_.wait(ar, after);
  b_.read(ar, buf);
  b_.write(ar, buf);
  collective(ar, group, bytes);
  return ar;
}

int LoweringWalk::divide(int u, int stream, int buf, Bytes bytes, int after) {
  Op& o = b_.op(OpKind::Divide, stream, u, mb_, "div");
  b_.wait(o, after);
  b_.read(o, buf);
  b_.write(o, buf);
  o.copy_bytes = 2 * bytes;
  return o.id;
}

bool LoweringWalk::reduced_is_grad(int u) const {
  return plan_.reduce_dtype == plan_.master_weights_dtype && grad_shard_[u] < 0 && !plan_.cpu_offload.params;
}

Op& LoweringWalk::cast_to_sharded_grad(int u, int stream, int src, std::int64_t numel, int& staging) {
  const bool adding = grad_shard_[u] >= 0;
  Op& o = b_.op(OpKind::Cast, stream, u, mb_, adding ? "grad acc" : "grad fp32");
  b_.read(o, src);
  o.copy_bytes = numel * (c_.br + c_.bm + (adding ? c_.bm : 0));
  if (plan_.cpu_offload.params) {
    staging = b_.buffer("grad_dev", u, numel * c_.bm, MemCategory::CommBuffers, stream);
    o.allocs.push_back(staging);
    b_.write(o, staging);
    return o;
  }
  if (!adding) {   // a new fp32 tensor, allocated in the pool of the stream the reduction finishes on
    grad_shard_[u] = b_.buffer("grad_shard", u, numel * c_.bm, MemCategory::ShardedGrads, stream);
    o.allocs.push_back(grad_shard_[u]);
  }
  b_.write(o, grad_shard_[u]);
  return o;
}

bool LoweringWalk::checkpointed(int s) const {
  const Segment& seg = c_.segments[s];
  return seg.part == models::ModulePart::Block && c_.act_recompute[seg.layer] > 0;
}

void LoweringWalk::walk_pre_backward(int u) {
  pre_backward_done_[u] = true;
  const int s = c_.first_seg[u];
  if (plan_.activation_checkpointing.outside_fsdp && u != 0 && s == c_.last_seg[u] && checkpointed(s) &&
      !recomputed_[static_cast<std::size_t>(s)]) {
    // A2: checkpoint(FSDP(block)) re-runs the unit's forward, with its pre/post-forward hooks, first: the outermost
    // unit inside the checkpointed block (the block's own, or one of its modules' under a size policy). A unit that
    // spans more than the block (the model's, holding what the blocks' units leave) is outside the checkpoint,
    // gathered for the whole backward: the blocks under it recompute at their own backward (backward_segment).
    fire(&LoweringWalk::pre_recompute, u);
    emit_compute(s, OpKind::Recompute);
    recomputed_[static_cast<std::size_t>(s)] = 1;
    fire(&LoweringWalk::post_recompute, u);
  }
  fire(&LoweringWalk::pre_backward, u);
}

void LoweringWalk::walk_post_backward(int u) {
  accumulate_grad(u);
  fire(&LoweringWalk::post_backward, u);
}

void LoweringWalk::backward_segment(int s) {
  const int u = c_.segments[s].unit;
  const bool offloading = plan_.activation_offloading != ActivationOffload::None;
  if (checkpointed(s) && !recomputed_[static_cast<std::size_t>(s)]) {   // (A1/A3; A2 without a unit in the block)
    if (offloading) offload_unpack(s);
    emit_compute(s, OpKind::Recompute);   // A1/A3: FSDP(checkpoint(block)) recomputes without another all-gather
    rec_op_ = b_.last_op();
    if (offloading && !offload_streams() && offloaded_[s] >= 0) drop_reload(offloaded_[s], 1 + packs_.rope_copied);   // (the copy back)
  }
  // Autograd allocates a unit's unsharded gradient at its first backward compute (the segment where its
  // pre-backward fired).
  const Segment& seg = c_.segments[s];
  cut_ = nullptr;
  cut_bufs_.clear();
  weight_slots_.clear();
  if (seg.part == models::ModulePart::Block && backward_by_tensor(c_.acts(seg.layer), c_.acts(seg.layer).param_grads))
    cut_ = &c_.acts(seg.layer);
  const int first_new = b_.num_buffers();
  for (int v : c_.backward_starts[s]) autograd_grad(v, s);
  const int last_new = b_.num_buffers();
  Bytes grads = segment_grad_bytes(s);
  for (int buf = first_new; buf < last_new; ++buf) grads += p_.buffers[static_cast<std::size_t>(buf)].bytes;
  if (offloading && packs_saved(s))
    unpack_saved(s, seg.part == models::ModulePart::Block && backward_by_tensor(c_.acts(seg.layer), grads));
  emit_compute(s, OpKind::Backward, grads);
  Op& o = b_.at(b_.last_op());
  bwd_op_ = o.id;
  const std::size_t compute_allocs = o.allocs.size();
  for (int buf = first_new; buf < last_new; ++buf) o.allocs.push_back(buf);
  if (const int grad = unsharded_grad(u); grad >= 0) b_.write(o, grad);
  for (std::size_t i = 1; i < cut_bufs_.size(); ++i) b_.write(o, cut_bufs_[i]);   // (autograd_grad's pieces)
  segment_grads(s, o);
  place_weight_grads(o, compute_allocs);
  cut_ = nullptr;
  if (carried_grad_ >= 0 && carried_grad_op_ != o.id) {   // (a backward that did not take it: freed after it)
    b_.free_now(carried_grad_);
    carried_grad_ = -1;
  }
  if (c_.loss.chunked_output && c_.segments[s].part == models::ModulePart::FinalNormAndHead) head_chunks_backward(s);
  if (offloading) offload_after_backward(s);
}

void LoweringWalk::backward() {
  begin_backward();
  carried_grad_ = -1;
  pre_backward_done_.assign(c_.sizes.size(), false);
  recomputed_.assign(c_.segments.size(), 0);
  b_.site(mb_, SitePhase::Backward, -1);
  // F1.9/F2.7: the root's pre-backward queues the final callback; it fires when the gradient reaches the
  // model's outputs: before the loss's backward if the loss is one of them, after it if the logits are.
  if (!c_.loss.inside_model) loss_backward();
  walk_pre_backward(0);
  if (c_.loss.inside_model) loss_backward();
  const int S = static_cast<int>(c_.segments.size());
  for (int s = S - 1; s >= 0; --s) {
    b_.site(mb_, SitePhase::Backward, segment_site_layer(c_, s));
    for (auto it = c_.closing[s].rbegin(); it != c_.closing[s].rend(); ++it) walk_pre_backward(*it);
    backward_segment(s);
    for (auto it = c_.opening[s].rbegin(); it != c_.opening[s].rend(); ++it) walk_post_backward(*it);
  }
  b_.site(mb_, SitePhase::Backward, -1);
  walk_post_backward(0);   // the root's post-backward runs in the final callback (its inputs need no grad)
  b_.free_now(carried_grad_);   // (none: the embedding's backward takes the first block's input gradient)
  carried_grad_ = -1;
  final_callback();
  // torchtune's queued callback (wait_and_del_remaining_references), queued after FSDP's at the first unpack, drops
  // the last input brought back.
  drop_reload(reload_, reload_n_);
  drop_pending_copies();
  reload_ = reload_op_ = reload_wait_ = -1;
  release_stash(INT_MAX);   // (none left when a backward node unpacked an offloaded tensor: the first one's hook drops them)
  // Logits the training loop still references (free_logits_before_backward false: `logits = model(x)`,
  // the loss, then loss.backward()) are no input of any backward node (the loss saves its own tensors),
  // so nothing frees them before backward() returns and the step function drops them.
  if (logits_ >= 0) b_.free_now(logits_);
  logits_ = -1;
}

// ---- activation offloading ----------------------------------------------------------------------------------
// torchtune's OffloadActivations (torchtune/training/_activation_offloading.py at pytorch/torchtune bd2a0fc7c) around
// the model's forward (resolve_plan refuses only checkpoint(FSDP(block))). Its pack hook sees what autograd
// saves inside the forward outside any inner saved-tensors hooks: each checkpoint's inputs (torch.utils.checkpoint's
// non-reentrant _NoopSaveInputs saves the block's tensor arguments, its own hooks drop everything inside the block):
// the block input and the rotary tables (OffloadPacks); every tensor a block that is not checkpointed saves; the
// final norm's saved tensors; the loss's when the model's
// forward computes it (OffloadPacks::loss); the output projection runs under NoOpManager (its saved input stays), and
// a loss the loop computes on the model's output is outside the context. Every saved tensor gets the next pack id;
// one of at least 1 KiB (min_offload_size) that is no parameter gets a pinned CPU copy.
//  * streams (use_streams true, torchtune's default): pack_tensor first makes the compute stream wait on the copy of
//    every stashed tensor with id <= new id - 5 (max_fwd_stash_size) and drops it, then makes the side stream wait on
//    the compute stream, copies there and keeps the GPU tensor in fwd_stash. The tensors still stashed when the
//    forward ends are used without a copy by the first backward node that unpacks, whose hook then drops them all.
//    Every other tensor comes back on the side stream (allocated in its pool) when its node unpacks it (a block's:
//    when its recompute starts), the compute stream waits for it (s0.wait_stream(s1)), and the hook of the next node
//    that unpacks (for a block, the previous block's first node, after it ran) makes the side stream wait on an event
//    recorded after this node and drops it; the end-of-backward callback drops the last.
//  * sync (use_streams false): the copy runs on the compute stream and only the CPU copy is kept: the GPU tensor dies
//    with its last forward use; the backward copies it back on the compute stream before its node, which drops it.
// Approximations: one copy per group (a block's input and tables, the final norm's tensors, the loss's) after the
// group's pack ids; the final norm's tensors leave once each (HF's RMSNorm packs its fp32 input and rstd twice, a
// few hundred MiB more to copy), after the op that also runs the output projection; the embedding's saved indices
// (one small pack) are not counted. The pinned host copies count in the host memory
// (sim/host_memory.h offloaded_activations_pinned).
void LoweringWalk::offload_pack(int s) {
  const Segment& seg = c_.segments[s];
  if (seg.part != models::ModulePart::Block || !checkpointed(s)) return;
  const models::ForwardEvent* in = input_event(c_.acts(seg.layer).forward_events);
  if (!in || in->kind != models::ForwardEvent::Kept || carried_ < 0 || carried_bytes_ != in->bytes ||
      in->bytes < kMinOffloadBytes)
    return;
  const int id = ++pack_id_;
  if (offload_streams()) {
    release_stash(id - kForwardStash);
    b_.defer_wait_stream(offload_, compute_);
  }
  Op& o = b_.op(OpKind::D2H, offload_, seg.unit, mb_, "act D2H");
  b_.read(o, carried_);
  o.copy_bytes = carried_bytes_ + packs_.rope_copied * packs_.rope_bytes;
  offloaded_[s] = carried_;
  if (offload_streams()) stash_.push_back(Stashed{id, carried_, o.id});
  pack_id_ += packs_.rope;   // (the tables are the forward's own tensors: their stash entries free nothing)
  if (offload_streams()) release_stash(pack_id_ - kForwardStash);
}

// The compute stream waits on the copies of the stashed tensors with id <= up_to_id, which are dropped (at the
// current CPU point).
void LoweringWalk::release_stash(int up_to_id) {
  std::size_t k = 0;
  for (; k < stash_.size() && stash_[k].id <= up_to_id; ++k) {
    b_.defer_wait(compute_, stash_[k].copy);
    b_.free_now(stash_[k].buffer);
  }
  stash_.erase(stash_.begin(), stash_.begin() + static_cast<std::ptrdiff_t>(k));
}

void LoweringWalk::drop_pending_copies() {
  for (int b : pending_copies_) b_.free_now(b);
  pending_copies_.clear();
}

bool LoweringWalk::stashed(int buffer) const {
  for (const Stashed& e : stash_)
    if (e.buffer == buffer) return true;
  return false;
}

bool LoweringWalk::offload_owned(int buffer) const {
  return static_cast<std::size_t>(buffer) < owned_.size() && owned_[static_cast<std::size_t>(buffer)];
}

void LoweringWalk::drop_reload(int first, int n) {
  if (first < 0) return;
  for (int i = 0; i < n; ++i) b_.free_now(first + i);
}

int LoweringWalk::bring_back(int unit, Bytes bytes, MemCategory category, const char* what, int tables, Bytes table_bytes,
                             bool allocate) {
  if (offload_streams()) {
    b_.defer_wait(offload_, reload_wait_);
    reload_wait_ = -1;
  }
  Op& o = b_.op(OpKind::H2D, offload_, unit, mb_, what);
  if (!allocate) {
    o.copy_bytes = bytes;
    if (offload_streams()) b_.defer_wait(compute_, o.id);
    return -1;
  }
  const int back = b_.buffer("act_reload", unit, bytes, category, offload_);
  o.allocs.push_back(back);
  b_.write(o, back);
  for (int i = 0; i < tables; ++i) {   // (consecutive ids: drop_reload frees them with the first)
    const int t = b_.buffer("act_reload", unit, table_bytes, category, offload_);
    o.allocs.push_back(t);
    b_.write(o, t);
  }
  o.copy_bytes = bytes + tables * table_bytes;
  if (offload_streams()) b_.defer_wait(compute_, o.id);
  return back;
}

// The block took its offloaded input as its checkpoint's saved input (act_[s].extra): the GPU tensor is the
// stash's now (streams), or dies after this forward (sync); the backward brings a copy back. The final norm's
// saved tensors, and a block's that is not checkpointed, are packed as its forward saves them (pack_saved).
void LoweringWalk::offload_after_forward(int s) {
  if (packs_saved(s)) {
    pack_saved(s);
    return;
  }
  if (offloaded_[s] < 0) return;
  if (act_[s].extra != offloaded_[s])
    throw std::logic_error("lowering: the offloaded block input is not the checkpoint's saved input");
  act_[s].extra = -1;
  if (!offload_streams()) b_.free_now(offloaded_[s]);
}

bool LoweringWalk::packs_saved(int s) const {
  const models::ModulePart part = c_.segments[s].part;
  return part == models::ModulePart::FinalNormAndHead || (part == models::ModulePart::Block && !checkpointed(s));
}

// Which of a segment's saved tensors OffloadActivations copies: a block's all of them, the final norm's all but its
// output, which the output projection saves under NoOpManager; each of at least min_offload_size.
std::vector<char> LoweringWalk::packed_mask(int s) const {
  const bool head = c_.segments[s].part == models::ModulePart::FinalNormAndHead;
  const std::vector<models::SavedTensor>& saved = head ? c_.final_norm.saved : c_.acts(c_.segments[s].layer).saved;
  std::vector<char> m(saved.size(), 0);
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const std::string_view name = saved[i].name ? saved[i].name : "";
    const bool packed = !head || saved[i].is_input || (name.rfind("final_norm.", 0) == 0 && name != "final_norm.out");
    m[i] = saved[i].bytes >= kMinOffloadBytes && packed;
  }
  return m;
}

// A segment's saved tensors (its models::BlockMemory; the input too when it saves it, as `extra`), those packed_mask
// names. One pack id each (an op that saves a tensor another op saved too packs it again: not counted).
void LoweringWalk::pack_saved(int s) {
  // The range's buffers in the order alloc_forward gave them: one per saved tensor with bytes, the taken input as
  // `extra` (program names are empty without a trace: the tensors are told apart by their models::SavedTensor).
  const Segment& seg = c_.segments[s];
  const bool head = seg.part == models::ModulePart::FinalNormAndHead;
  const std::vector<models::SavedTensor>& saved = head ? c_.final_norm.saved : c_.acts(seg.layer).saved;
  const models::ForwardEvent* in = input_event(head ? c_.final_norm.forward_events : c_.acts(seg.layer).forward_events);
  const BufferRange& r = act_[s];
  const int input = r.extra >= 0 && in && in->kind == models::ForwardEvent::Kept ? in->saved : -1;
  const std::vector<char> packed = packed_mask(s);
  std::vector<int>& off = saved_off_[static_cast<std::size_t>(s)];
  off.clear();
  range_buffers(saved, r, input, saved_bufs_);
  for (std::size_t i = 0; i < saved.size(); ++i)
    if (saved_bufs_[i] >= 0 && packed[i]) off.push_back(saved_bufs_[i]);
  if (off.empty()) return;
  const int first = pack_id_ + 1;
  pack_id_ += static_cast<int>(off.size());
  if (offload_streams()) b_.defer_wait_stream(offload_, compute_);
  Op& o = b_.op(OpKind::D2H, offload_, seg.unit, mb_, "act D2H");
  // (sync: the forward's op freed them at their last read, alloc_forward's drop_at_last_read; the copy, on the
  // compute stream, comes first there)
  for (int b : off) {
    if (offload_streams()) b_.read(o, b);
    o.copy_bytes += p_.buffers[static_cast<std::size_t>(b)].bytes;
  }
  const int copy = o.id;
  for (std::size_t i = 0; i < off.size(); ++i) {
    if (owned_.size() <= static_cast<std::size_t>(off[i])) owned_.resize(static_cast<std::size_t>(off[i]) + 1, 0);
    owned_[static_cast<std::size_t>(off[i])] = 1;
    if (offload_streams()) stash_.push_back(Stashed{first + static_cast<int>(i), off[i], copy});
  }
  // (after the copy: the group's own tensors 5 ids older than its last leave too, the compute stream waiting on it)
  if (offload_streams()) release_stash(pack_id_ - kForwardStash);
}

// The loss's saved tensors (OffloadPacks::loss): _log_softmax's result, nll_loss's self (the same tensor) and target,
// then its total_weight (a scalar, no copy). The log-probabilities' GPU tensor leaves with the later of its two stash
// entries (streams), or at once (sync).
void LoweringWalk::pack_loss() {
  const int self = pack_id_ + 2;
  pack_id_ += 4;
  if (offload_streams()) b_.defer_wait_stream(offload_, compute_);
  Op& o = b_.op(OpKind::D2H, offload_, c_.segments.back().unit, mb_, "loss D2H");
  b_.read(o, loss_saved_);
  o.copy_bytes = 2 * c_.loss.saved + packs_.loss_target;
  if (offload_streams()) {
    stash_.push_back(Stashed{self, loss_saved_, o.id});
    release_stash(pack_id_ - kForwardStash);
  } else {
    b_.free_now(loss_saved_);
  }
  loss_saved_ = -1;
  loss_off_ = true;
}

// Before a block's recompute: its input (and the tables it was given) copied back from the CPU.
void LoweringWalk::offload_unpack(int s) {
  if (offloaded_[s] < 0) return;
  const Bytes bytes = p_.buffers[static_cast<std::size_t>(offloaded_[s])].bytes;
  offloaded_[s] = bring_back(c_.segments[s].unit, bytes, MemCategory::Activations, "act H2D", packs_.rope_copied, packs_.rope_bytes);
  // (sync: backward_segment drops it after the recompute)
}

// Before the backward of a segment whose saved tensors were packed: what left the stash comes back from the CPU
// (sync: all of it) in one copy; what is still stashed is used as it is. by_node (a block lowered tensor by tensor):
// the copy's time alone, the backward allocating each node's tensors as it unpacks them (unpacked_,
// emit_backward_events); otherwise (the final norm) one buffer for the set (PyTorch copies each when its node
// unpacks it: an upper bound).
void LoweringWalk::unpack_saved(int s, bool by_node) {
  std::vector<int>& off = saved_off_[static_cast<std::size_t>(s)];
  unpacked_.clear();
  if (off.empty()) return;
  Bytes back = 0;
  for (int b : off)
    if (!stashed(b)) {
      back += p_.buffers[static_cast<std::size_t>(b)].bytes;
      unpacked_.push_back(b);
    }
  off.clear();
  offloaded_[s] = back > 0 ? bring_back(c_.segments[s].unit, back, MemCategory::Activations, "act H2D", 0, 0, !by_node) : -1;
  saved_unpacks_[static_cast<std::size_t>(s)] = 1;
}

// After a segment's backward: sync drops what its node brought back; with streams, the first node that unpacked an
// offloaded tensor drops the stash, and a node that unpacked drops what the previous one brought back.
void LoweringWalk::offload_after_backward(int s) {
  const bool group = packs_saved(s);   // (else a checkpointed block: its input and tables)
  const bool unpacks = group ? saved_unpacks_[static_cast<std::size_t>(s)] != 0 : offloaded_[s] >= 0;
  if (group) saved_unpacks_[static_cast<std::size_t>(s)] = 0;
  if (!offload_streams()) {
    if (group) drop_reload(offloaded_[s], 1);
    if (group) offloaded_[s] = -1;
    return;
  }
  if (!unpacks) return;
  release_stash(INT_MAX);
  if (!group || !node_copied_) drop_pending_copies();   // (a node of another segment unpacked)
  if (reload_ >= 0) {
    drop_reload(reload_, reload_n_);
    reload_wait_ = reload_op_;
    reload_ = -1;
  }
  if (group) {
    // A segment whose every saved tensor was packed has one node per op: each node's hook dropped what the one
    // before it brought back, so once its backward has run only its last node's copies remain: a block's are
    // pending_copies_ (dropped by the next node that unpacks), the final norm's one buffer goes here (one node early).
    if (offloaded_[s] >= 0 || node_copied_) {   // (the next copy back waits on the event after this backward)
      drop_reload(offloaded_[s], 1);
      reload_wait_ = bwd_op_;
    }
    offloaded_[s] = -1;
    node_copied_ = false;
    return;
  }
  reload_ = offloaded_[s];   // (-1: the node used stashed tensors only)
  reload_n_ = group ? 1 : 1 + packs_.rope_copied;
  reload_op_ = reload_ >= 0 ? (group ? bwd_op_ : rec_op_) : -1;
  offloaded_[s] = -1;
}

}  // namespace fsdpsim::sim::lowering
