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
#include <deque>

#include "sim/lower_context.h"

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
};

class Fsdp1Lowering {
 public:
  explicit Fsdp1Lowering(const Context& c) : c_(c), plan_(*c.plan), b_(p_, c.recycler, c.full, c.sites) {}

  StepProgram run() {
    const int U = static_cast<int>(c_.sizes.size());
    // Builders hand out Op& references that must stay valid while the next ops are added, so the
    // vector must never reallocate during lowering: reserve an upper bound (a unit issues at most
    // ~25 ops per micro-batch: offload H2D + cast + copy-in + AG + copy-out twice, recompute, an extra
    // AG for checkpoint-outside-FSDP, backward, RS copy-in, RS, AR, post-reduce, D2H); Builder::op checks it.
    p_.ops.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 8 + U * 32) + 64);
    p_.buffers.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 3 + U * 8) + U * 3);
    compute_ = b_.add_stream(StreamRole::Compute, "default");
    pre_unshard_ = b_.add_stream(StreamRole::CopyIn, "pre_unshard");
    unshard_ = b_.add_stream(StreamRole::AllGather, "unshard");
    post_backward_ = b_.add_stream(StreamRole::ReduceScatter, "post_backward");
    // F1.1: the all-reduce stream exists only with HSDP; otherwise it is the default stream.
    all_reduce_ = c_.hybrid ? b_.add_stream(StreamRole::AllReduce, "all_reduce") : compute_;
    add_persistent();
    state_.assign(U, {});
    act_.assign(c_.segments.size(), -1);
    recompute_.assign(c_.segments.size(), -1);
    for (int mb = 0; mb < c_.micro_batches; ++mb) {
      mb_ = mb;
      sync_ = plan_.grad_sync || mb == c_.micro_batches - 1;
      forward();
      backward();
    }
    add_optimizer_step(c_, b_, p_, grad_shard_, param_shard_, compute_);
    if (plan_.limit_all_gathers && c_.sharded)
      p_.notes.push_back("FSDP1 rate limiter: at most 2 all-gathers in flight (CPU blocks on the free event of "
                         "the reshard two back, P4)");
    fill_facts(c_, p_);
    b_.finish();
    return std::move(p_);
  }

 private:
  // ---- persistent sharded state (M2, M11, M13) ----
  void add_persistent() {
    const int U = static_cast<int>(c_.sizes.size());
    param_shard_.assign(U, -1);
    grad_shard_.assign(U, -1);
    const bool on_gpu = !plan_.cpu_offload.params;
    for (int u = 0; u < U; ++u) {
      b_.site(-1, SitePhase::Persistent, unit_site_layer(c_, u));
      const UnitSizes& s = c_.sizes[u];
      if (s.params == 0) continue;
      if (on_gpu) {
        param_shard_[u] = b_.buffer("flat_shard", u, s.shard * c_.bm, MemCategory::ShardedParams, compute_, true);
        grad_shard_[u] = b_.buffer("grad_shard", u, s.grad_shard * c_.bm, MemCategory::ShardedGrads, compute_, true);
      }
      if (!plan_.cpu_offload.optimizer && s.optim > 0)
        b_.buffer("optim", u, s.optim * c_.optimizer_states * c_.bm, MemCategory::OptimizerState, compute_, true);
    }
  }

  // ---- unshard / reshard (F1.2, F1.3, F1.8) ----
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
    ag.comm_bytes = s.unsharded * c_.bp;
    ag.group = CommGroup::Shard;
    ag.group_size = c_.shard_group.size;
    ag.nodes_spanned = c_.shard_group.nodes;
    // post_unshard frees _mp_shard with record_stream on the unshard stream (M10).
    if (src >= 0) ag.frees.push_back({src, ag.id});
    st.full = full;
    st.ready_op = ag.id;
  }

  // `free`: FSDP1's free_unsharded_flat_param. NO_SHARD's post_reshard frees its _mp_shard regardless (F1.8).
  void reshard(int u, bool free) {
    UnitState& st = state_[u];
    if (!st.unsharded) return;
    if (!c_.sharded) {
      if (st.full >= 0) b_.free_now(st.full, b_.last_on(compute_));
      st.full = -1;
      st.unsharded = false;
      return;
    }
    if (!free) return;
    // F1.3: record_stream(current stream) then resize to 0: reusable once the compute stream passes here.
    int last = b_.last_on(compute_);
    if (st.full >= 0) b_.free_now(st.full, last);
    st.full = -1;
    st.unsharded = false;
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
  void pre_forward(int u) {
    b_.defer_hook();
    unshard(u);
    wait_for_params(u);
    if (plan_.forward_prefetch) {
      int pos = c_.forward_pos[u] + 1;
      if (pos < static_cast<int>(c_.forward_order.size())) unshard(c_.forward_order[pos]);
    }
  }
  void post_forward(int u) {
    b_.defer_hook();
    reshard(u, frees_after_forward(u));
  }

  void forward() {
    b_.site(mb_, SitePhase::Forward, -1);
    // F1.5 root pre-forward: pre_unshard and unshard streams wait on the compute stream.
    b_.defer_wait_stream(pre_unshard_, compute_);
    b_.defer_wait_stream(unshard_, compute_);
    if (mb_ > 0) {
      // ... and the compute stream already waits on the previous backward's reduction (F1.13), so do they.
      b_.defer_wait_stream(pre_unshard_, post_backward_);
      b_.defer_wait_stream(unshard_, post_backward_);
    }
    pre_forward(0);
    const int S = static_cast<int>(c_.segments.size());
    for (int s = 0; s < S; ++s) {
      b_.site(mb_, SitePhase::Forward, segment_site_layer(c_, s));
      for (int u : c_.opening[s]) pre_forward(u);
      emit_compute(s, OpKind::Forward);
      for (int u : c_.closing[s]) post_forward(u);
    }
    b_.site(mb_, SitePhase::Forward, -1);
    post_forward(0);
  }

  void emit_compute(int s, OpKind kind) {
    const Segment& seg = c_.segments[s];
    const int part = static_cast<int>(seg.part);
    const auto& ks = kind == OpKind::Backward    ? c_.bwd_kernels[part]
                     : kind == OpKind::Recompute ? c_.rec_kernels[static_cast<int>(layer_checkpoint_mode(
                                                       plan_.activation_checkpointing, seg.layer))]
                                                 : c_.fwd_kernels[part];
    const char* what = kind == OpKind::Forward ? "fwd" : kind == OpKind::Backward ? "bwd" : "recompute";
    Op& o = b_.compute_op(kind, compute_, seg.unit, mb_, what, ks);
    o.kernel_launches = static_cast<int>(ks->size());
    if (state_[seg.unit].full >= 0) b_.read(o, state_[seg.unit].full);
    if (kind == OpKind::Forward) {
      if (seg.part == models::ModulePart::Block && c_.act_saved[seg.layer] > 0) {
        act_[s] = b_.buffer("act", seg.unit, c_.act_saved[seg.layer], MemCategory::Activations, compute_);
        o.allocs.push_back(act_[s]);
      } else if (seg.part == models::ModulePart::FinalNormAndHead) {
        act_[s] = b_.buffer("logits", seg.unit, c_.logits, MemCategory::Logits, compute_);
        o.allocs.push_back(act_[s]);
        if (c_.loss_transient > 0) {   // the fp32 upcast inside cross-entropy, freed within the loss
          int t = b_.buffer("loss_tmp", seg.unit, c_.loss_transient, MemCategory::Logits, compute_);
          o.allocs.push_back(t);
          o.frees.push_back({t, -1});
        }
      }
    } else if (kind == OpKind::Recompute) {
      recompute_[s] = b_.buffer("recomp", seg.unit, c_.act_recompute[seg.layer], MemCategory::Activations, compute_);
      o.allocs.push_back(recompute_[s]);
    } else {
      if (act_[s] >= 0) o.frees.push_back({act_[s], -1});
      if (recompute_[s] >= 0) o.frees.push_back({recompute_[s], -1});
      act_[s] = recompute_[s] = -1;
    }
  }

  bool checkpointed(int s) const {
    const Segment& seg = c_.segments[s];
    return seg.part == models::ModulePart::Block && c_.act_recompute[seg.layer] > 0;
  }

  // ---- backward (F1.9-F1.14, P1, P2, A1, A2) ----
  // _get_handle_to_prefetch: the next unit in reverse post-forward order, only while its pre-backward
  // has not run yet (_needs_pre_backward_unshard).
  void prefetch_backward(int u) {
    int pos = c_.backward_pos[u] + 1;
    if (pos < static_cast<int>(c_.backward_order.size()) && !pre_backward_done_[c_.backward_order[pos]])
      unshard(c_.backward_order[pos]);
  }

  void pre_backward(int u) {
    pre_backward_done_[u] = true;
    // A2: checkpoint(FSDP(block)) re-runs the unit's forward, with its pre/post-forward hooks, first.
    if (plan_.activation_checkpointing.outside_fsdp && u != 0) {
      bool any = false;
      for (int s = c_.last_seg[u]; s >= c_.first_seg[u]; --s) any = any || checkpointed(s);
      if (any) {
        b_.defer_hook();
        unshard(u);
        wait_for_params(u);
        for (int s = c_.first_seg[u]; s <= c_.last_seg[u]; ++s)
          if (checkpointed(s)) emit_compute(s, OpKind::Recompute);
        b_.defer_hook();
        reshard(u, frees_after_forward(u));
      }
    }
    b_.defer_hook();
    unshard(u);   // F1.9: a second all-gather for units freed after forward
    wait_for_params(u);
    if (plan_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch_backward(u);   // P1
  }

  // The unit's flat grad is allocated by its first backward compute (the segment where its pre-backward fired).
  void backward_segment(int s) {
    const int u = c_.segments[s].unit;
    if (!plan_.activation_checkpointing.outside_fsdp && checkpointed(s))
      emit_compute(s, OpKind::Recompute);   // A1: FSDP(checkpoint(block)) recomputes after the pre-backward unshard
    const int first_new = b_.num_buffers();
    for (int v : c_.backward_starts[s])
      if (state_[v].grad < 0 && c_.sizes[v].grad > 0)
        state_[v].grad = b_.buffer("grad", v, c_.sizes[v].grad * c_.bp, MemCategory::UnshardedGrads, compute_);
    const int last_new = b_.num_buffers();
    emit_compute(s, OpKind::Backward);
    Op& o = b_.at(b_.last_op());
    for (int buf = first_new; buf < last_new; ++buf) o.allocs.push_back(buf);
    if (state_[u].grad >= 0) b_.write(o, state_[u].grad);
  }

  void post_backward(int u) {
    b_.defer_hook();
    // F1.10 (1): sharded strategies free when syncing grads, or always for FULL_SHARD/HYBRID_SHARD;
    // inside no_sync SHARD_GRAD_OP keeps the params (M12).
    bool free = sync_ || c_.strategy == ShardingStrategy::FULL_SHARD || c_.strategy == ShardingStrategy::HYBRID_SHARD;
    reshard(u, free);
    if (plan_.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_backward(u);   // P2
    if (!sync_) return;   // (2) no_sync: the unsharded grad stays in .grad (M12)
    reduce(u);
  }

  void reduce(int u) {
    UnitState& st = state_[u];
    const UnitSizes& s = c_.sizes[u];
    if (st.grad < 0) return;
    b_.defer_wait_stream(post_backward_, compute_);   // (3) post_backward waits on the compute stream
    int src = st.grad;
    Bytes src_numel = s.grad;
    auto release = [&](int buf, int after) { b_.at(after).frees.push_back({buf, after}); };
    if (c_.reduce_cast) {
      Op& o = b_.op(OpKind::Cast, post_backward_, u, mb_, "grad cast");
      int g = b_.buffer("grad_rd", u, src_numel * c_.br, MemCategory::CommBuffers, post_backward_);
      o.allocs.push_back(g);
      b_.read(o, src);
      b_.write(o, g);
      o.copy_bytes = src_numel * (c_.bp + c_.br);
      release(src, o.id);   // (4) record_stream(unsharded grad, post_backward)
      src = g;
    }
    const int world = c_.W;
    const int pre = predivide_factor(world);
    const int post = world / pre;
    if (!c_.sharded) {
      // F1.11: NO_SHARD all-reduces the full grad over every rank, with pre/post divide.
      divide(u, post_backward_, src, src_numel * c_.br, pre);
      Op& ar = b_.op(OpKind::AllReduce, post_backward_, u, mb_, "AR");
      b_.read(ar, src);
      b_.write(ar, src);
      ar.comm_bytes = src_numel * c_.br;
      ar.group = CommGroup::World;
      ar.group_size = c_.world_group.size;
      ar.nodes_spanned = c_.world_group.nodes;
      divide(u, post_backward_, src, src_numel * c_.br, post);
      accumulate(u, post_backward_, src, src_numel);
      release(src, b_.last_on(post_backward_));
      finish_offload(u, post_backward_, src_numel);
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
      release(src, o.id);
      src = g;
    }
    divide(u, post_backward_, src, s.rs_input * c_.br, pre);
    Op& rs = b_.op(OpKind::ReduceScatter, post_backward_, u, mb_, "RS");
    int out = b_.buffer("rs_out", u, s.grad_shard * c_.br, MemCategory::CommBuffers, post_backward_);
    rs.allocs.push_back(out);
    b_.read(rs, src);
    b_.write(rs, out);
    rs.comm_bytes = s.rs_input * c_.br;
    rs.group = CommGroup::Shard;
    rs.group_size = c_.shard_group.size;
    rs.nodes_spanned = c_.shard_group.nodes;
    rs.frees.push_back({src, rs.id});
    int stream = post_backward_;
    if (c_.hybrid) {
      // F1.10: the all-reduce stream waits on post_backward; all_reduce over the replicate (inter-node) group.
      Op& ar = b_.op(OpKind::AllReduce, all_reduce_, u, mb_, "AR");
      b_.wait(ar, rs.id);
      b_.read(ar, out);
      b_.write(ar, out);
      ar.comm_bytes = s.grad_shard * c_.br;
      ar.group = CommGroup::Replicate;
      ar.group_size = c_.replicate_group.size;
      ar.nodes_spanned = c_.replicate_group.nodes;
      stream = all_reduce_;
    }
    divide(u, stream, out, s.grad_shard * c_.br, post);
    accumulate(u, stream, out, s.grad_shard);
    release(out, b_.last_on(stream));
    finish_offload(u, stream, s.grad_shard);
    st.grad = -1;
  }

  void divide(int u, int stream, int buf, Bytes bytes, int factor) {
    if (factor <= 1) return;
    Op& o = b_.op(OpKind::Divide, stream, u, mb_, "div");
    b_.read(o, buf);
    b_.write(o, buf);
    o.copy_bytes = 2 * bytes;   // in place: read + write
  }

  // _accumulate_sharded_grad: cast to the fp32 sharded grad, `+=` when a grad is already there.
  void accumulate(int u, int stream, int src, std::int64_t numel) {
    const bool adding = mb_ > 0;   // grad_sync=true with grad_accum > 1: accumulate into the saved shard
    // reduce_dtype == the fp32 (master) dtype: the reduced shard is the grad as is (no cast kernel).
    if (plan_.reduce_dtype == plan_.master_weights_dtype && !adding && !plan_.cpu_offload.params) return;
    Op& o = b_.op(OpKind::Cast, stream, u, mb_, adding ? "grad acc" : "grad fp32");
    b_.read(o, src);
    o.copy_bytes = numel * (c_.br + c_.bm + (adding ? c_.bm : 0));
    if (plan_.cpu_offload.params) {
      offload_grad_ = b_.buffer("grad_dev", u, numel * c_.bm, MemCategory::CommBuffers, stream);
      o.allocs.push_back(offload_grad_);
      b_.write(o, offload_grad_);
    } else if (grad_shard_[u] >= 0) {
      b_.write(o, grad_shard_[u]);
    }
  }

  // M11: with CPU offload the fp32 shard goes to the pinned CPU grad (non_blocking D2H).
  void finish_offload(int u, int stream, std::int64_t numel) {
    if (!plan_.cpu_offload.params || offload_grad_ < 0) return;
    Op& o = b_.op(OpKind::D2H, stream, u, mb_, "grad D2H");
    b_.read(o, offload_grad_);
    o.copy_bytes = numel * c_.bm;
    o.frees.push_back({offload_grad_, o.id});
    offload_grad_ = -1;
  }

  void backward() {
    pre_backward_done_.assign(c_.sizes.size(), false);
    b_.site(mb_, SitePhase::Backward, -1);
    pre_backward(0);   // F1.9: the root's pre-backward fires first and queues the final callback
    const int S = static_cast<int>(c_.segments.size());
    for (int s = S - 1; s >= 0; --s) {
      b_.site(mb_, SitePhase::Backward, segment_site_layer(c_, s));
      for (auto it = c_.closing[s].rbegin(); it != c_.closing[s].rend(); ++it) pre_backward(*it);
      backward_segment(s);
      for (auto it = c_.opening[s].rbegin(); it != c_.opening[s].rend(); ++it) post_backward(*it);
    }
    b_.site(mb_, SitePhase::Backward, -1);
    post_backward(0);
    final_callback();
  }

  // F1.13: the compute stream waits on post_backward (and all_reduce); with CPU offload the CPU syncs.
  void final_callback() {
    b_.defer_wait_stream(compute_, post_backward_);
    if (c_.hybrid) b_.defer_wait_stream(compute_, all_reduce_);
    if (plan_.cpu_offload.params && sync_) {
      b_.defer_cpu_wait(b_.last_on(post_backward_));
      if (c_.hybrid) b_.defer_cpu_wait(b_.last_on(all_reduce_));
      b_.defer_cpu_wait(b_.last_on(compute_));
    }
  }

  const Context& c_;
  const Plan& plan_;
  StepProgram p_;
  Builder b_;
  int compute_ = 0, pre_unshard_ = 1, unshard_ = 2, post_backward_ = 3, all_reduce_ = 0;
  int mb_ = 0;
  bool sync_ = true;
  std::vector<UnitState> state_;
  std::vector<int> param_shard_, grad_shard_;
  std::vector<int> act_, recompute_;   // per segment: saved activations / recomputed activations
  std::vector<bool> pre_backward_done_;
  std::deque<int> free_events_;        // P4 _FreeEventQueue: compute-stream ops whose completion frees a unit
  int offload_grad_ = -1;
};

}  // namespace

StepProgram lower_fsdp1(const Context& c) { return Fsdp1Lowering(c).run(); }

}  // namespace fsdpsim::sim::lowering
