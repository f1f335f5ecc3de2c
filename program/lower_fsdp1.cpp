// FSDP1 (FullyShardedDataParallel) lowering: one training step of one rank as FSDP1 issues it.
// Rule ids (F1.x, P1-P4, M1-M13, A1-A2) refer to docs/fsdp-semantics.md.
//
// Streams (F1.1): default (compute), pre_unshard (cast / H2D), unshard (all-gather), post_backward
// (gradient reduction), and all_reduce only with HSDP. Per unit:
//   unshard  = [pre_unshard: _mp_shard cast or H2D] -> [rate limiter: CPU waits on the free event of
//              two reshards back, P4] -> unshard: alloc _full_param_padded + all_gather_into_tensor (F1.2)
//   reshard  = free _full_param_padded with record_stream on the compute stream (F1.3, M10) and enqueue
//              the free event for the rate limiter
//   reduce   = post_backward: cast to reduce_dtype, pad, pre-divide, reduce_scatter, [HSDP all_reduce on
//              its own stream], post-divide, accumulate into the fp32 sharded grad (F1.10-F1.12)
#include <algorithm>
#include <deque>

#include "program/lower_walk.h"

namespace fsdpsim::sim::lowering {
namespace {

// F1.12: FSDP1 always sums with a pre-divide factor f (f = 1; while N % f == 0 and N / f > f: f *= 2)
// and a post-divide factor N / f, N = all ranks the gradient is averaged over.
int predivide_factor(int n) {
  int f = 1;
  while (n % f == 0 && n / f > f) f *= 2;
  return f;
}

struct UnitState {
  bool unsharded = false;   // params usable for compute (unsharded, or NO_SHARD with its _mp_shard)
  int full = -1;            // _full_param_padded (sharded) or _mp_shard (NO_SHARD + mixed precision)
  int ready_op = -1;        // the op that produced `full` (compute waits on it)
  int grad = -1;            // unsharded flat grad (param_dtype), kept across no_sync micro-batches
  std::vector<int> views;   // the original parameters' gradients autograd holds until it builds the flat one
};

class FlatParamLowering final : public LoweringWalk {
 public:
  explicit FlatParamLowering(const Context& c) : LoweringWalk(c) {}

 private:
  void add_streams() override {
    const SideStreams s = add_side_streams("pre_unshard", "unshard", "post_backward", c_.hybrid);
    pre_unshard_ = s.copy_in;
    unshard_ = s.all_gather;
    post_backward_ = s.reduce_scatter;
    // F1.1: the all-reduce stream exists only with HSDP; otherwise it is the default stream.
    all_reduce_ = c_.hybrid ? s.all_reduce : compute_;
  }

  void notes_after_step() override {
    if (plan_.limit_all_gathers && c_.sharded)
      p_.notes.push_back("FSDP1 rate limiter: at most 2 all-gathers in flight (CPU blocks on the free event of "
                         "the reshard two back, P4)");
  }

  // ---- the flat gradient ----
  // FSDP1 computes with the original parameters as Tensor views of the unsharded flat parameter
  // (_flat_param.py FlatParamHandle._use_unsharded_views(as_params=False): `split.view(shape)` of
  // torch.split(flat_param) in _get_unflat_views_aligned/_unaligned, use_orig_params or not). Autograd
  // therefore computes each view's gradient as a tensor of its own, in the backward op that uses the
  // view, and holds it in the split's backward node until the last one arrives; then
  // split_with_sizes_backward (torch/csrc/autograd/FunctionsManual.cpp) cats them into a new flat gradient,
  // which AccumulateGrad steals as flat_param.grad (or adds in place into the .grad that no_sync kept),
  // and only then does FSDP's post-backward hook run. A view used twice (a tied embedding and LM head)
  // gets its second gradient (a transient) summed with the first out of place (below).
  // Per segment: the view gradients its backward produces and holds (numel), and the transient ones.
  // A unit whose parts do not account for all its parameters gets none (its flat grad alone, at the cat).
  // A tied weight's head gradient is a buffer of its own (tied_held_), which the embedding's backward replaces
  // with the sum of both gradients, allocated in the unshard stream's pool: the tied view's backward node was
  // made under the unshard stream (FlatParamHandle._use_unsharded_views in _unshard's `with stream(unshard)`),
  // and InputBuffer::add accumulates on the consumer's stream.
  void begin(const ParamGradParts& g) override {
    state_.assign(c_.sizes.size(), {});
    const int S = static_cast<int>(c_.segments.size());
    const int U = static_cast<int>(c_.sizes.size());
    view_held_.assign(S, 0);
    tied_held_.assign(S, 0);
    view_transient_ = g.transient;
    for (int s = 0; s < S; ++s)
      for (std::int64_t n : g.held[s]) view_held_[s] += n;
    if (g.tied_head >= 0) {
      tied_held_[g.tied_head] = g.tied;
      view_held_[g.tied_head] -= g.tied;
    }
    whole_views_.assign(U, 0);
    for (int u = 0; u < U; ++u)
      if (g.unit_listed[u] != c_.graph->units[u].params && c_.sizes[u].grad > 0) whole_views_[u] = c_.graph->units[u].params;
    // LoRA without use_orig_params: the adapters are a FlatParameter of their own and the base one does not
    // require grad, so the base's views get no gradient (a view of a tensor that does not require grad does not
    // either); the adapters' views do (their split backward cats them into the adapters' flat gradient).
    if (c_.trainable.lora.on() && !plan_.use_orig_params) {
      std::int64_t block = 0, head = 0;
      for (const models::AdapterMatrix& a : c_.trainable.block_adapters) block += a.numel();
      for (const models::AdapterMatrix& a : c_.trainable.head_adapters) head += a.numel();
      for (int s = 0; s < S; ++s) {
        const models::ModulePart part = c_.segments[s].part;
        view_held_[s] = part == models::ModulePart::Block ? block : part == models::ModulePart::FinalNormAndHead ? head : 0;
        view_transient_[s] = tied_held_[s] = 0;
      }
    }
    for (int s = 0; s < S; ++s) {
      const int u = c_.segments[s].unit;
      if (whole_views_[u] > 0 || c_.sizes[u].grad <= 0) view_held_[s] = view_transient_[s] = tied_held_[s] = 0;
    }
    tied_grad_.assign(U, -1);
    lazy_init_scratch();
    construction_scratch();
  }

  // FSDP1's construction (StepProgram::init_flatten_world; torch/distributed/fsdp/_init_utils.py
  // _init_param_handle_from_params: FlatParamHandle(params, ...) flattens the unit's parameters into one padded
  // flat tensor, then handle.shard() keeps a clone of this rank's chunk, _flat_param.py), unit by unit in auto-wrap's
  // post-order (wrap.py _recursive_wrap wraps the children first): the blocks, then the root. PyTorch 2.11's
  // allocator histories of the FSDP1 llama-1b fixtures start the step from what that leaves after the harness's
  // empty_cache: 750,780,416 B reserved in 18 segments, each block's 30,437,376 B shard in a 30 MiB segment of its
  // own, the root's 125.25 MiB shard in a 234 MiB one, a block's freed flat tensor
  // (reports/validation/torch-memory-2026-11-26, trace_segments.py: "initial"). NO_SHARD (FSDP1 uses it for a world
  // of 1 too): init_flatten_world 1, the flattened whole is the FlatParameter itself (FlatParamHandle.shard keeps it,
  // nothing is cloned). With the parameters offloaded to the CPU each shard is moved there once made
  // (StepProgram::init_offloaded). Not for bitsandbytes' QLoRA units nor the bundled runtime.
  void construction_scratch() {
    p_.init_flatten_world = 0;
    p_.init_flatten_last = -1;
    if (plan_.implementation == models::ModelImpl::Runtime) return;
    int world = 0;
    for (const UnitSizes& s : c_.sizes) {
      if (s.nf4_replicated_bytes > 0 || s.nf4_shard > 0) return;
      if (s.shard <= 0) continue;
      if (s.unsharded % s.shard != 0 || (world > 0 && s.unsharded / s.shard != world)) return;
      world = static_cast<int>(s.unsharded / s.shard);
    }
    if (world < 1) return;
    p_.init_flatten_world = world;   // (init_flatten_last, the root's shard: add_persistent)
  }

  // FSDP1's _lazy_init (torch/distributed/fsdp/_runtime_utils.py, at the root's first forward) calls each handle's
  // init_flat_param_attributes (_flat_param.py) in the order of the root's handles: with parameter mixed precision
  // `_mp_shard = torch.empty_like(_local_shard, device, param_dtype)`; with a sharded strategy
  // `_full_param_padded = torch.empty(numel * world, device, param dtype or the flat parameter's)` and, with mixed
  // precision, `_full_prec_full_param_padded` in the flat parameter's dtype, each storage freed at once
  // (_free_storage). On the default stream, before anything else of the step: only the segments stay reserved, and
  // the first forward's tensors then land in them (PyTorch 2.11's allocator history of l3-8b-fsdp1-ac-lora1pct-hf,
  // reports/validation/torch-memory-2026-11-26: 2006 and 4010 MiB default-stream segments for the root's bf16 and
  // fp32 padded buffers, then no new segment for any activation of step 1's forward). The bundled runtime is not
  // PyTorch: none.
  void lazy_init_scratch() {
    p_.init_scratch.clear();
    if (plan_.implementation == models::ModelImpl::Runtime) return;
    const auto add = [&](Bytes bytes) {
      const InitRequest q{bytes, compute_};
      if (bytes > 0 && std::find(p_.init_scratch.begin(), p_.init_scratch.end(), q) == p_.init_scratch.end())
        p_.init_scratch.push_back(q);
    };
    for (const UnitSizes& s : c_.sizes) {
      if (s.params == 0) continue;
      if (c_.mixed) add(s.shard * c_.bp);
      if (c_.sharded) {
        add(s.unsharded * (c_.mixed ? c_.bp : c_.bm));
        if (c_.mixed) add(s.unsharded * c_.bm);
      }
    }
  }

  void segment_grads(int s, Op& o) override {
    const int u = c_.segments[s].unit;
    if (view_held_[s] > 0) {
      // (one buffer for the segment's views, or each view's where the block's backward makes it: cut_grads)
      const auto held = [&](int g) {
        o.allocs.push_back(g);
        b_.write(o, g);
        state_[u].views.push_back(g);
      };
      if (const std::vector<int>* cut = cut_grads("param_grads", u, view_held_[s] * c_.bp)) {
        for (int g : *cut) held(g);
      } else {
        held(b_.buffer("param_grads", u, view_held_[s] * c_.bp, MemCategory::UnshardedGrads, compute_));
      }
    }
    if (tied_held_[s] > 0) {   // the tied weight's gradient from the head
      const int g = b_.buffer("tied_grad", u, tied_held_[s] * c_.bp, MemCategory::UnshardedGrads, compute_);
      o.allocs.push_back(g);
      b_.write(o, g);
      state_[u].views.push_back(g);
      tied_grad_[u] = g;
    }
    if (view_transient_[s] > 0) {
      transient(o, "param_grad_tmp", u, view_transient_[s] * c_.bp, MemCategory::UnshardedGrads);
      b_.write(o, o.allocs.back());
      if (tied_grad_[u] >= 0) {   // the sum of the two, out of place on the unshard stream (plan_view_grads)
        const int sum = b_.buffer("tied_grad_sum", u, view_transient_[s] * c_.bp, MemCategory::UnshardedGrads, unshard_);
        o.allocs.push_back(sum);
        b_.write(o, sum);
        o.frees.push_back({tied_grad_[u], -1});
        std::replace(state_[u].views.begin(), state_[u].views.end(), tied_grad_[u], sum);
        tied_grad_[u] = -1;
      }
    }
  }
  Bytes segment_grad_bytes(int s) const override { return (view_held_[s] + tied_held_[s]) * c_.bp; }

  // The stream autograd runs unit u's split backward and AccumulateGrad on, and so the post-backward hook
  // (engine.cpp evaluate_function guards onto Node::stream(), the stream current when the node's forward
  // ran; hooks registered on the AccumulateGrad node run under that guard): _unshard creates the views on
  // the unshard stream (`with stream(unshard_stream): handle.unshard()`, _runtime_utils.py), so it is the
  // unshard stream for every unit with a gradient (NO_SHARD too: its unshard() still switches to the views
  // there). A unit without one (frozen) reshards from the compute stream.
  int hook_stream(int u) const { return c_.sizes[u].grad > 0 ? unshard_ : compute_; }

  // split_with_sizes_backward + AccumulateGrad, before the post-backward hook, on the unshard stream (after
  // the compute stream, the engine's producer-consumer sync): the flat gradient is an unshard-pool block.
  void accumulate_grad(int u) override {
    UnitState& st = state_[u];
    const Bytes bytes = c_.sizes[u].grad * c_.bp;
    if (bytes <= 0) return;
    b_.defer_wait_stream(unshard_, compute_);
    Op& o = b_.op(OpKind::CopyOut, unshard_, u, mb_, "grad cat");
    for (int v : st.views) {
      b_.read(o, v);
      o.frees.push_back({v, -1});
    }
    st.views.clear();
    o.copy_bytes = 2 * bytes;
    if (st.grad < 0) {
      st.grad = b_.buffer("grad", u, bytes, MemCategory::UnshardedGrads, unshard_);
      o.allocs.push_back(st.grad);
    } else {
      // no_sync kept .grad: AccumulateGrad adds the new flat gradient into it in place.
      const int t = b_.buffer("grad_new", u, bytes, MemCategory::UnshardedGrads, unshard_);
      o.allocs.push_back(t);
      o.frees.push_back({t, -1});
      b_.read(o, st.grad);
      o.copy_bytes += 3 * bytes;
    }
    b_.write(o, st.grad);
  }

  const char* shard_name() const override { return "flat_shard"; }

  // ---- unshard / reshard (F1.2, F1.3, F1.8) ----
  // CPU offload with mixed precision: FlatParamHandle._use_low_precision_shard runs
  // `_mp_shard.copy_(_local_shard.to(device, non_blocking=True))` (torch/distributed/fsdp/_flat_param.py):
  // the fp32 CPU shard lands in a temporary of its own on the pre-unshard stream, after _mp_shard is
  // allocated, and is freed once cast into it.
  void h2d_staging(Op& o, int u) {
    if (!plan_.cpu_offload.params || !c_.mixed) return;
    const int t = b_.buffer("h2d_fp32_shard", u, c_.sizes[u].shard * c_.bm, MemCategory::CommBuffers, pre_unshard_);
    o.allocs.push_back(t);
    o.frees.push_back({t, -1});
  }

  void unshard(int u) {
    UnitState& st = state_[u];
    const UnitSizes& s = c_.sizes[u];
    if (st.unsharded) return;
    st.unsharded = true;
    if (s.params == 0) return;
    const bool offload = plan_.cpu_offload.params;
    int src = -1, pre = -1;
    if (!c_.sharded) {
      // F1.8: NO_SHARD has no all-gather; with mixed precision the full-size low-precision _mp_shard is the
      // compute copy (cast on pre_unshard; H2D with CPU offload).
      if (!c_.mixed && !offload) return;
      Op& o = offload ? b_.op(OpKind::H2D, pre_unshard_, u, mb_, "H2D")
                      : b_.op(OpKind::Cast, pre_unshard_, u, mb_, "mp_shard");
      int buf = b_.buffer("mp_shard", u, s.shard * c_.bp, MemCategory::UnshardedParams, pre_unshard_);
      o.allocs.push_back(buf);
      h2d_staging(o, u);
      b_.write(o, buf);
      o.copy_bytes = offload ? s.shard * c_.bm : s.shard * (c_.bm + c_.bp);
      if (param_shard_[u] >= 0) b_.read(o, param_shard_[u]);
      st.full = buf;
      st.ready_op = o.id;
      return;
    }
    if (offload || c_.mixed) {
      // M3/M11: _mp_shard (low precision) on pre_unshard; with offload an H2D copy of the fp32 CPU shard.
      Op& o = offload ? b_.op(OpKind::H2D, pre_unshard_, u, mb_, "H2D")
                      : b_.op(OpKind::Cast, pre_unshard_, u, mb_, "mp_shard");
      src = b_.buffer("mp_shard", u, s.shard * c_.bp, MemCategory::CommBuffers, pre_unshard_);
      o.allocs.push_back(src);
      h2d_staging(o, u);
      b_.write(o, src);
      o.copy_bytes = offload ? s.shard * c_.bm : s.shard * (c_.bm + c_.bp);
      if (param_shard_[u] >= 0) b_.read(o, param_shard_[u]);
      pre = o.id;
    }
    // P4: before the all-gather, if 2 free events are queued, the CPU synchronizes on the oldest.
    if (plan_.limit_all_gathers && free_events_.size() >= 2) {
      b_.defer_cpu_wait(free_events_.front());
      free_events_.pop_front();
    }
    Op& ag = b_.op(OpKind::AllGather, unshard_, u, mb_, "AG");
    b_.wait(ag, pre);   // the unshard stream waits on pre_unshard (F1.2)
    int full = b_.buffer("full_param", u, s.unsharded * c_.bp, MemCategory::UnshardedParams, unshard_);
    ag.allocs.push_back(full);
    b_.write(ag, full);
    b_.read(ag, src >= 0 ? src : param_shard_[u]);
    collective(ag, CommGroup::Shard, s.unsharded * c_.bp);
    // post_unshard frees _mp_shard with record_stream on the unshard stream (M10).
    if (src >= 0) ag.frees.push_back({src, ag.id});
    st.full = full;
    st.ready_op = ag.id;
  }

  // `free`: FSDP1's free_unsharded_flat_param. NO_SHARD's post_reshard frees its _mp_shard regardless (F1.8).
  // `current`: the stream current when the hook runs: the compute stream in forward; in backward the
  // stream autograd runs the flat parameter's AccumulateGrad (and so its post-backward hook) on.
  void reshard(int u, bool free, int current) {
    UnitState& st = state_[u];
    if (!st.unsharded) return;
    // F1.3, M10: _free_unsharded_flat_param / _free_low_precision_sharded_param call
    // record_stream(current stream) and free: a block allocated on the current stream is back in its pool
    // at once, any other once the current stream passes this point.
    const int last = b_.last_on(current);
    auto release = [&](int buf) {
      if (buf >= 0) b_.free_now(buf, b_.buffer_pool(buf) == current ? -1 : last);
    };
    if (!c_.sharded) {
      release(st.full);
      st.full = -1;
      st.unsharded = false;
      return;
    }
    if (!free) return;
    release(st.full);
    st.full = -1;
    st.unsharded = false;
    // _reshard: the rate limiter's free event is recorded on the current stream.
    if (plan_.limit_all_gathers && c_.sizes[u].params > 0 && last >= 0) free_events_.push_back(last);
  }

  // F1.6: the compute stream waits on the unshard stream (everything issued on it so far).
  void wait_for_params(int u) {
    b_.defer_wait_stream(compute_, unshard_);
    if (!c_.sharded) b_.defer_wait(compute_, state_[u].ready_op);
  }

  bool frees_after_forward(int u) const {
    // F1.7: only non-root units of FULL_SHARD / HYBRID_SHARD free after forward.
    return u != 0 && (c_.strategy == ShardingStrategy::FULL_SHARD || c_.strategy == ShardingStrategy::HYBRID_SHARD);
  }

  // ---- forward (F1.5-F1.7, P3) ----
  void root_pre_forward() override {
    // F1.5 root pre-forward: pre_unshard and unshard streams wait on the compute stream.
    b_.defer_wait_stream(pre_unshard_, compute_);
    b_.defer_wait_stream(unshard_, compute_);
    if (mb_ > 0) {
      // ... and the compute stream already waits on the previous backward's reduction (F1.13), so do they.
      b_.defer_wait_stream(pre_unshard_, post_backward_);
      b_.defer_wait_stream(unshard_, post_backward_);
    }
  }

  void pre_forward(int u) override {
    unshard(u);
    wait_for_params(u);
    if (plan_.forward_prefetch) {
      int pos = c_.forward_pos[u] + 1;
      if (pos < static_cast<int>(c_.forward_order.size())) unshard(c_.forward_order[pos]);
    }
  }
  void post_forward(int u) override {
    reshard(u, frees_after_forward(u), compute_);
  }

  int unsharded_params(int u) const override { return state_[u].full; }

  // ---- backward (F1.9-F1.14, P1, P2, A1, A2) ----
  // _get_handle_to_prefetch: the next unit in reverse post-forward order, only while its pre-backward
  // has not run yet (_needs_pre_backward_unshard).
  void prefetch_backward(int u) {
    int pos = c_.backward_pos[u] + 1;
    if (pos < static_cast<int>(c_.backward_order.size()) && !pre_backward_done_[c_.backward_order[pos]])
      unshard(c_.backward_order[pos]);
  }

  // A2: checkpoint(FSDP(block)): the recomputed forward runs the unit's pre- and post-forward hooks.
  void pre_recompute(int u) override {
    unshard(u);
    wait_for_params(u);
  }
  void post_recompute(int u) override {
    reshard(u, frees_after_forward(u), compute_);
  }

  void pre_backward(int u) override {
    unshard(u);   // F1.9: a second all-gather for units freed after forward
    wait_for_params(u);
    if (plan_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch_backward(u);   // P1
  }

  // The unit's flat grad (param_dtype) is built after its last backward compute (accumulate_grad).
  // A unit whose parts do not account for its parameters: all its views' gradients at its first backward compute.
  void autograd_grad(int v, int /*s*/) override {
    if (whole_views_[v] <= 0 || !state_[v].views.empty()) return;
    state_[v].views.push_back(
        b_.buffer("param_grads", v, whole_views_[v] * c_.bp, MemCategory::UnshardedGrads, compute_));
  }
  int unsharded_grad(int u) const override { return whole_views_[u] > 0 && !state_[u].views.empty() ? state_[u].views.front() : -1; }

  void post_backward(int u) override {
    // F1.10 (1): sharded strategies free when syncing grads, or always for FULL_SHARD/HYBRID_SHARD;
    // inside no_sync SHARD_GRAD_OP keeps the params (M12).
    bool free = sync_ || c_.strategy == ShardingStrategy::FULL_SHARD || c_.strategy == ShardingStrategy::HYBRID_SHARD;
    reshard(u, free, hook_stream(u));
    if (plan_.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_backward(u);   // P2
    if (!sync_) return;   // (2) no_sync: the unsharded grad stays in .grad (M12)
    reduce(u);
  }

  // A tensor of the reduction freed when the CPU drops it. The caching allocator
  // (c10/cuda/CUDACachingAllocator.cpp, free -> insert_events) records an event only on the streams
  // record_stream added to the block's stream_uses: a block freed on the stream it was allocated on is
  // back in its pool at once (stream order makes the reuse safe), one with a use on another stream only
  // once that stream passes the event recorded now (M10).
  void release_on(int buf, int use_stream) {
    const int pool = b_.buffer_pool(buf);
    b_.free_now(buf, pool == use_stream ? -1 : b_.last_on(use_stream));
  }

  void reduce(int u) {
    UnitState& st = state_[u];
    const UnitSizes& s = c_.sizes[u];
    if (st.grad < 0) return;
    b_.defer_wait_stream(post_backward_, hook_stream(u));   // (3) post_backward waits on the current stream
    // _post_backward_hook: everything below runs under `with stream(post_backward)`. The autograd-computed
    // grad (compute pool) is record_stream'ed to post_backward at the hook's end (4), the reduction's own
    // tensors (the reduce-dtype copy, the padded copy, the reduce-scatter output) are post_backward
    // allocations the CPU drops when _reduce_grad returns: reusable by the next unit's reduction at once.
    const int autograd_grad = st.grad;
    int src = st.grad;
    Bytes src_numel = s.grad;
    std::vector<int> drop;   // post_backward tensors dropped when _reduce_grad returns
    if (c_.reduce_cast) {
      Op& o = b_.op(OpKind::Cast, post_backward_, u, mb_, "grad cast");
      int g = b_.buffer("grad_rd", u, src_numel * c_.br, MemCategory::CommBuffers, post_backward_);
      o.allocs.push_back(g);
      b_.read(o, src);
      b_.write(o, g);
      o.copy_bytes = src_numel * (c_.bp + c_.br);
      src = g;
      drop.push_back(g);
    }
    const int world = c_.W;
    const int pre = predivide_factor(world);
    const int post = world / pre;
    if (!c_.sharded) {
      // F1.11: NO_SHARD all-reduces the full grad over every rank, with pre/post divide.
      if (pre > 1) divide(u, post_backward_, src, src_numel * c_.br);
      all_reduce(u, post_backward_, src, src_numel * c_.br, CommGroup::World, -1);
      if (post > 1) divide(u, post_backward_, src, src_numel * c_.br);
      // _cast_grad_to_param_dtype makes no copy for an fp32 flat param: the reduced grad stays as .grad.
      const bool kept = accumulate(u, post_backward_, src, src_numel);
      finish_offload(u, post_backward_, src_numel);
      for (int d : drop)
        if (!kept || d != src) release_on(d, post_backward_);
      if (!kept || autograd_grad != src) release_on(autograd_grad, post_backward_);
      st.grad = -1;
      return;
    }
    if (s.needs_pad) {   // F1.10: F.pad copy only when numel is not divisible by the shard size
      Op& o = b_.op(OpKind::Pad, post_backward_, u, mb_, "pad");
      int g = b_.buffer("grad_pad", u, s.rs_input * c_.br, MemCategory::CommBuffers, post_backward_);
      o.allocs.push_back(g);
      b_.read(o, src);
      b_.write(o, g);
      o.copy_bytes = (src_numel + s.rs_input) * c_.br;
      src = g;
      drop.push_back(g);
    }
    if (pre > 1) divide(u, post_backward_, src, s.rs_input * c_.br);
    Op& rs = b_.op(OpKind::ReduceScatter, post_backward_, u, mb_, "RS");
    int out = b_.buffer("rs_out", u, s.grad_shard * c_.br,
                        reduced_is_grad(u) || offload_keeps_reduced() ? MemCategory::ShardedGrads : MemCategory::CommBuffers,
                        post_backward_);
    rs.allocs.push_back(out);
    b_.read(rs, src);
    b_.write(rs, out);
    collective(rs, CommGroup::Shard, s.rs_input * c_.br);
    int stream = post_backward_;
    if (c_.hybrid) {
      // F1.10: the all-reduce stream waits on post_backward; all_reduce over the replicate (inter-node) group.
      all_reduce(u, all_reduce_, out, s.grad_shard * c_.br, CommGroup::Replicate, rs.id);
      stream = all_reduce_;
    }
    if (post > 1) divide(u, stream, out, s.grad_shard * c_.br);
    const bool kept = accumulate(u, stream, out, s.grad_shard);
    finish_offload(u, stream, s.grad_shard);
    // _reduce_grad returns: its locals go. The reduce-scatter output, unless it became the sharded grad,
    // was record_stream'ed to the all-reduce stream with HSDP.
    for (int d : drop) release_on(d, post_backward_);
    if (!kept) release_on(out, stream);
    release_on(autograd_grad, post_backward_);   // (4) record_stream(autograd_computed_grad, post_backward)
    st.grad = -1;
  }

  // With CPU offload the flat parameter is the fp32 CPU shard when the reduction finishes, so
  // _cast_grad_to_param_dtype makes no copy of a reduce-dtype (fp32) gradient: the reduced shard itself is
  // `_saved_grad_shard` (_accumulate_sharded_grad), which _offload_grad copies to the pinned CPU gradient
  // (torch/distributed/fsdp/_runtime_utils.py) and which stays on the GPU until the final callback.
  bool offload_keeps_reduced() const { return plan_.cpu_offload.params && c_.br == c_.bm; }

  // _accumulate_sharded_grad: cast to the fp32 sharded grad, `+=` when one exists from an earlier micro-batch
  // (grad_sync with accumulation). Returns true when `src` itself became the sharded gradient (kept until the
  // step's end, or with CPU offload until the final callback: not released here): _cast_grad_to_param_dtype
  // makes no copy when the reduce dtype is the parameters' and _saved_grad_shard is assigned, not added to
  // (reduced_is_grad, offload_keeps_reduced).
  bool accumulate(int u, int stream, int src, std::int64_t numel) {
    if (reduced_is_grad(u)) {
      grad_shard_[u] = src;
      return true;
    }
    if (offload_keeps_reduced()) {
      offload_grad_ = src;
      return true;
    }
    cast_to_sharded_grad(u, stream, src, numel, offload_grad_);
    return false;
  }

  // M11: with CPU offload the fp32 shard goes to the pinned CPU grad (non_blocking D2H). The GPU shard stays
  // `_saved_grad_shard` until the final callback (_post_backward_final_callback -> _finalize_params ->
  // FlatParamHandle.prepare_gradient_for_optim, torch/distributed/fsdp/_flat_param.py: `.grad` becomes
  // `_cpu_grad` and `_saved_grad_shard` is deleted): measured on PyTorch 2.11 (l1b-fsdp1-offload-w8-hf), one
  // reduce-scatter output per unit alive to the end of the backward, each in a segment of its own.
  void finish_offload(int u, int stream, std::int64_t numel) {
    if (!plan_.cpu_offload.params || offload_grad_ < 0) return;
    Op& o = b_.op(OpKind::D2H, stream, u, mb_, "grad D2H");
    b_.read(o, offload_grad_);
    o.copy_bytes = numel * c_.bm;
    offload_held_.push_back({offload_grad_, stream});
    offload_grad_ = -1;
  }

  // F1.13: the compute stream waits on post_backward (and all_reduce); with CPU offload the CPU syncs.
  // The engine first makes the caller's (compute) stream wait on the leaf streams (the AccumulateGrad
  // nodes' unshard stream: GraphTask::exec_post_processing).
  void final_callback() override {
    b_.defer_wait_stream(compute_, unshard_);
    b_.defer_wait_stream(compute_, post_backward_);
    if (c_.hybrid) b_.defer_wait_stream(compute_, all_reduce_);
    if (plan_.cpu_offload.params && sync_) {
      b_.defer_cpu_wait(b_.last_on(post_backward_));
      if (c_.hybrid) b_.defer_cpu_wait(b_.last_on(all_reduce_));
      b_.defer_cpu_wait(b_.last_on(compute_));
    }
    // _finalize_params (prepare_gradient_for_optim) drops the GPU sharded gradients CPU offload kept.
    for (const auto& [buf, stream] : offload_held_) release_on(buf, stream);
    offload_held_.clear();
  }

  int pre_unshard_ = 1, unshard_ = 2, post_backward_ = 3, all_reduce_ = 0;
  std::vector<UnitState> state_;
  std::vector<std::int64_t> view_held_, view_transient_, tied_held_;   // per segment (begin)
  std::vector<int> tied_grad_;                              // per unit: the head's tied-weight gradient
  std::vector<std::int64_t> whole_views_;                   // per unit (begin)
  std::deque<int> free_events_;        // P4 _FreeEventQueue: compute-stream ops whose completion frees a unit
  int offload_grad_ = -1;
  std::vector<std::pair<int, int>> offload_held_;   // CPU offload: the GPU sharded gradients and their streams
};

}  // namespace

StepProgram lower_fsdp1(const Context& c) { return FlatParamLowering(c).run(); }

}  // namespace fsdpsim::sim::lowering
