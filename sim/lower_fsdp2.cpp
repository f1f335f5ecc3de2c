// FSDP2 (fully_shard) lowering: one training step of one rank as FSDP2 issues it.
// Rule ids (F2.x, P5, P6, M6-M12, D1-D5, A3) refer to docs/fsdp-semantics.md.
//
// Streams (F2.1): default (compute), all_gather_copy_in, all_gather, reduce_scatter, and all_reduce
// (HSDP). Per param group:
//   unshard          = copy-in stream: [H2D] [foreach cast] alloc AG output + copy-in; all_gather stream:
//                      all_gather_into_tensor (F2.2, D2, M7)
//   wait_for_unshard = compute: copy-out into the unsharded params (AG output + params coexist, 2x);
//                      in forward the AG output is kept until the next group's copy-in (F2.3, P5)
//   reshard          = free the unsharded params (no record_stream); rAF=int keeps a 1/k clone (F2.4)
//   post_backward    = compute waits on the previous RS; RS copy-in on compute (reduce_dtype); RS on the
//                      RS stream; [HSDP all_reduce]; fp32 cast on the post-reduce stream (F2.8-F2.10, M8)
#include "sim/lower_context.h"

namespace fsdpsim::sim::lowering {
namespace {

enum class ParamState { Sharded, PostForwardSharded, Gathering, Unsharded };

struct GroupState {
  ParamState state = ParamState::Sharded;
  int ag_out = -1;          // all-gather output (until copy-out / the next copy-in)
  int ag_op = -1;
  int unsharded = -1;       // per-param unsharded storage
  int post_forward = -1;    // rAF=int: the 1/k slice kept from forward to backward (F2.4)
  int grad = -1;            // unsharded grads (param_dtype), or the reduce_dtype accumulation (M12)
  bool grad_upcast = false; // `grad` is unsharded_accumulated_grad in reduce_dtype
};

enum class Phase { Forward, Backward };

class Fsdp2Lowering {
 public:
  explicit Fsdp2Lowering(const Context& c) : c_(c), plan_(*c.plan), b_(p_, c.recycler, c.full, c.sites) {}

  StepProgram run() {
    const int U = static_cast<int>(c_.sizes.size());
    // Builders hand out Op& references that must stay valid while the next ops are added, so the
    // vector must never reallocate during lowering: reserve an upper bound (a unit issues at most
    // ~25 ops per micro-batch: offload H2D + cast + copy-in + AG + copy-out twice, recompute, an extra
    // AG for checkpoint-outside-FSDP, backward, RS copy-in, RS, AR, post-reduce, D2H); Builder::op checks it.
    p_.ops.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 8 + U * 32) + 64);
    p_.buffers.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 3 + U * 8) + U * 3);
    compute_ = b_.add_stream(StreamRole::Compute, "default");
    copy_in_ = b_.add_stream(StreamRole::CopyIn, "all_gather_copy_in");
    all_gather_ = b_.add_stream(StreamRole::AllGather, "all_gather");
    reduce_scatter_ = b_.add_stream(StreamRole::ReduceScatter, "reduce_scatter");
    all_reduce_ = c_.R > 1 ? b_.add_stream(StreamRole::AllReduce, "all_reduce") : -1;
    add_persistent();
    st_.assign(U, {});
    act_.assign(c_.segments.size(), -1);
    recompute_.assign(c_.segments.size(), -1);
    if (plan_.reshard_after_forward != 0)
      p_.notes.push_back("FSDP2 root group: not resharded after forward (reshard_after_forward=None default for "
                         "the root, F2.6)");
    if (!c_.sharded)
      p_.notes.push_back("FSDP2 with a 1-wide shard dim: modeled as replicated params (cast on the copy-in stream) "
                         "and a gradient all-reduce over all ranks, without the 1-rank all-gather/reduce-scatter");
    if (plan_.fp8_all_gather)
      p_.notes.push_back("fp8 all-gather (D4): all parameters of block groups gathered in fp8 (torchao keeps norm "
                         "weights in bf16; they are < 0.1% of a block)");
    for (int mb = 0; mb < c_.micro_batches; ++mb) {
      mb_ = mb;
      sync_ = plan_.grad_sync || mb == c_.micro_batches - 1;
      forward();
      backward();
    }
    add_optimizer_step(c_, b_, p_, grad_shard_, param_shard_, compute_);
    fill_facts(c_, p_);
    b_.finish();
    return std::move(p_);
  }

 private:
  // AG dtype bytes of a group: fp8 for block groups with the float8 all-gather (D4).
  Bytes ag_bytes(int u) const {
    if (!plan_.fp8_all_gather || u == 0) return c_.bp;
    for (auto part : c_.graph->units[u].parts)
      if (part == models::ModulePart::Block) return 1;
    return c_.graph->units[u].layers.empty() ? c_.bp : 1;
  }

  void add_persistent() {
    const int U = static_cast<int>(c_.sizes.size());
    param_shard_.assign(U, -1);
    grad_shard_.assign(U, -1);
    for (int u = 0; u < U; ++u) {
      b_.site(-1, SitePhase::Persistent, unit_site_layer(c_, u));
      const UnitSizes& s = c_.sizes[u];
      if (s.params == 0) continue;
      if (!plan_.cpu_offload.params) {
        // M6: the padded local chunk in the master dtype; the sharded grad covers trainable params (D5).
        param_shard_[u] = b_.buffer("shard", u, s.shard * c_.bm, MemCategory::ShardedParams, compute_, true);
        if (s.grad_shard > 0)
          grad_shard_[u] = b_.buffer("grad_shard", u, s.grad_shard * c_.bm, MemCategory::ShardedGrads, compute_, true);
      }
      if (!plan_.cpu_offload.optimizer && s.optim > 0)
        b_.buffer("optim", u, s.optim * c_.optimizer_states * c_.bm, MemCategory::OptimizerState, compute_, true);
    }
  }

  // ---- unshard (F2.2, D2, M7, M11) ----
  void unshard(int u) {
    GroupState& g = st_[u];
    const UnitSizes& s = c_.sizes[u];
    if (g.state == ParamState::Gathering || g.state == ParamState::Unsharded) return;
    if (s.params == 0) {
      g.state = ParamState::Unsharded;
      return;
    }
    const bool offload = plan_.cpu_offload.params;
    if (!c_.sharded) {
      g.state = ParamState::Unsharded;
      if (!c_.mixed && !offload) return;   // the replicated params are used as they are
      Op& o = offload ? b_.op(OpKind::H2D, copy_in_, u, mb_, "H2D") : b_.op(OpKind::Cast, copy_in_, u, mb_, "cast");
      g.unsharded = b_.buffer("params", u, s.shard * c_.bp, MemCategory::UnshardedParams, copy_in_);
      if (!offload) b_.read(o, param_shard_[u]);   // the cast reads the fp32 parameters
      o.allocs.push_back(g.unsharded);
      b_.write(o, g.unsharded);
      o.copy_bytes = offload ? s.shard * c_.bm : s.shard * (c_.bm + c_.bp);
      g.ag_op = o.id;
      return;
    }
    const Bytes bag = ag_bytes(u);
    const bool from_post_forward = g.state == ParamState::PostForwardSharded;
    int src = -1;
    std::int64_t src_numel = s.shard;
    if (from_post_forward) {
      src = g.post_forward;
      src_numel = s.unsharded / c_.post_forward_group.size;
    } else {
      if (offload) {
        Op& h = b_.op(OpKind::H2D, copy_in_, u, mb_, "H2D");
        src = b_.buffer("shard_dev", u, s.shard * c_.bm, MemCategory::CommBuffers, copy_in_);
        h.allocs.push_back(src);
        b_.write(h, src);
        h.copy_bytes = s.shard * c_.bm;
      }
      if (c_.mixed || bag != c_.bm) {
        // D2: with mixed precision (or fp8, D4) a foreach cast into a flat low-precision buffer first.
        Op& cast = b_.op(OpKind::Cast, copy_in_, u, mb_, "cast");
        int buf = b_.buffer("ag_in", u, s.shard * bag, MemCategory::CommBuffers, copy_in_);
        cast.allocs.push_back(buf);
        b_.read(cast, src >= 0 ? src : param_shard_[u]);
        b_.write(cast, buf);
        cast.copy_bytes = s.shard * (c_.bm + bag);
        if (src >= 0) cast.frees.push_back({src, -1});
        src = buf;
      }
    }
    Op& ci = b_.op(OpKind::CopyIn, copy_in_, u, mb_, "copy-in");
    g.ag_out = b_.buffer("ag_out", u, s.unsharded * bag, MemCategory::CommBuffers, copy_in_);
    ci.allocs.push_back(g.ag_out);
    b_.read(ci, src >= 0 ? src : param_shard_[u]);
    b_.write(ci, g.ag_out);
    ci.copy_bytes = 2 * src_numel * bag;   // read the shard, write this rank's slice
    if (src >= 0 && !from_post_forward) ci.frees.push_back({src, -1});
    Op& ag = b_.op(OpKind::AllGather, all_gather_, u, mb_, "AG");
    b_.wait(ag, ci.id);
    b_.read(ag, g.ag_out);
    b_.write(ag, g.ag_out);
    ag.comm_bytes = s.unsharded * bag;
    const GroupShape& grp = from_post_forward ? c_.post_forward_group : c_.shard_group;
    ag.group = from_post_forward ? CommGroup::PostForward : CommGroup::Shard;
    ag.group_size = grp.size;
    ag.nodes_spanned = grp.nodes;
    g.ag_op = ag.id;
    g.state = ParamState::Gathering;
  }

  // ---- wait_for_unshard (F2.3) ----
  void wait_for_unshard(int u, Phase phase) {
    GroupState& g = st_[u];
    if (g.state != ParamState::Gathering) {
      if (!c_.sharded && g.ag_op >= 0) b_.defer_wait(compute_, g.ag_op);
      return;
    }
    const UnitSizes& s = c_.sizes[u];
    const Bytes bag = ag_bytes(u);
    Op& co = b_.op(OpKind::CopyOut, compute_, u, mb_, "copy-out");
    b_.wait(co, g.ag_op);
    g.unsharded = b_.buffer("params", u, s.unsharded * bag, MemCategory::UnshardedParams, compute_);
    co.allocs.push_back(g.unsharded);
    b_.read(co, g.ag_out);
    b_.write(co, g.unsharded);
    co.copy_bytes = 2 * s.unsharded * bag;   // split_with_sizes_copy: read the AG output, write the params
    const int event = co.id;
    if (phase == Phase::Forward) {
      // Implicit prefetch (P5): keep this AG output until the next group's copy-in, free the previous one.
      flush_all_gather_state();
      ag_state_buf_ = g.ag_out;
      ag_state_event_ = event;
    } else {
      b_.defer_wait(copy_in_, event);
      b_.defer_wait(all_gather_, event);
      b_.free_now(g.ag_out);
    }
    g.ag_out = -1;
    if (g.post_forward >= 0) {   // to_unsharded drops the post-forward shard
      b_.free_now(g.post_forward);
      g.post_forward = -1;
    }
    g.state = ParamState::Unsharded;
  }

  void flush_all_gather_state() {
    if (ag_state_buf_ < 0) return;
    b_.defer_wait(copy_in_, ag_state_event_);
    b_.defer_wait(all_gather_, ag_state_event_);
    b_.free_now(ag_state_buf_);
    ag_state_buf_ = ag_state_event_ = -1;
  }

  // ---- reshard (F2.4) ----
  void reshard(int u, Phase phase) {
    GroupState& g = st_[u];
    if (g.state != ParamState::Unsharded) return;
    const UnitSizes& s = c_.sizes[u];
    const int k = plan_.reshard_after_forward;
    if (c_.sharded && phase == Phase::Forward && k > 1 && s.params > 0) {
      // to_sharded_post_forward clones this rank's 1/k slice (of the AG output) and keeps it for backward.
      Op& cl = b_.op(OpKind::CopyOut, compute_, u, mb_, "clone");
      std::int64_t numel = s.unsharded / k;
      g.post_forward = b_.buffer("post_fwd", u, numel * ag_bytes(u), MemCategory::UnshardedParams, compute_);
      cl.allocs.push_back(g.post_forward);
      b_.read(cl, g.unsharded);
      b_.write(cl, g.post_forward);
      cl.copy_bytes = 2 * numel * ag_bytes(u);
    }
    b_.free_now(g.unsharded);   // storage resize to 0; no record_stream (M10)
    g.unsharded = -1;
    g.state = g.post_forward >= 0 ? ParamState::PostForwardSharded : ParamState::Sharded;
  }

  bool explicit_prefetch() const { return plan_.forward_prefetch || plan_.prefetch_depth > 1; }

  // ---- forward (F2.5, F2.6, P5, P6) ----
  void pre_forward(int u) {
    b_.defer_hook();
    unshard(u);
    wait_for_unshard(u, Phase::Forward);
    if (explicit_prefetch()) {   // P6: set_modules_to_forward_prefetch, issued after this group's copy-out
      for (int d = 1; d <= plan_.prefetch_depth; ++d) {
        int pos = c_.forward_pos[u] + d;
        if (pos < static_cast<int>(c_.forward_order.size())) unshard(c_.forward_order[pos]);
      }
    }
  }

  void post_forward(int u) {
    b_.defer_hook();
    if (u == 0) {
      flush_all_gather_state();   // the root flushes the kept AG output in its post-forward (F2.3)
      return;                     // and is not resharded (F2.6)
    }
    if (plan_.reshard_after_forward != 0 || !c_.sharded) reshard(u, Phase::Forward);
  }

  void forward() {
    b_.site(mb_, SitePhase::Forward, -1);
    // F2.5: the copy-in and all-gather streams wait on the current stream (the previous optimizer/backward).
    b_.defer_wait_stream(copy_in_, compute_);
    b_.defer_wait_stream(all_gather_, compute_);
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
    if (st_[seg.unit].unsharded >= 0) b_.read(o, st_[seg.unit].unsharded);
    if (kind == OpKind::Forward) {
      if (seg.part == models::ModulePart::Block && c_.act_saved[seg.layer] > 0) {
        act_[s] = b_.buffer("act", seg.unit, c_.act_saved[seg.layer], MemCategory::Activations, compute_);
        o.allocs.push_back(act_[s]);
      } else if (seg.part == models::ModulePart::FinalNormAndHead) {
        act_[s] = b_.buffer("logits", seg.unit, c_.logits, MemCategory::Logits, compute_);
        o.allocs.push_back(act_[s]);
        if (c_.loss_transient > 0) {
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

  // ---- backward (F2.7-F2.11, A2, A3) ----
  void pre_backward(int u) {
    pre_backward_done_[u] = true;
    if (plan_.activation_checkpointing.outside_fsdp && u != 0) {
      // A2: checkpoint(fully_shard(block)) re-runs the group's forward (with its hooks) before its backward.
      bool any = false;
      for (int s = c_.first_seg[u]; s <= c_.last_seg[u]; ++s) any = any || checkpointed(s);
      if (any) {
        b_.defer_hook();
        unshard(u);
        wait_for_unshard(u, Phase::Backward);
        for (int s = c_.first_seg[u]; s <= c_.last_seg[u]; ++s)
          if (checkpointed(s)) emit_compute(s, OpKind::Recompute);
        b_.defer_hook();
        if (plan_.reshard_after_forward != 0) reshard(u, Phase::Backward);
      }
    }
    b_.defer_hook();
    unshard(u);
    wait_for_unshard(u, Phase::Backward);
    if (plan_.backward_prefetch != BackwardPrefetch::NONE) {
      // F2.7: default 1-deep prefetch of the previous group in reverse post-forward order; P6 for deeper.
      for (int d = 1; d <= plan_.prefetch_depth; ++d) {
        int pos = c_.backward_pos[u] + d;
        if (pos < static_cast<int>(c_.backward_order.size()) && !pre_backward_done_[c_.backward_order[pos]])
          unshard(c_.backward_order[pos]);
      }
    }
  }

  void backward_segment(int s) {
    const int u = c_.segments[s].unit;
    if (!plan_.activation_checkpointing.outside_fsdp && checkpointed(s))
      emit_compute(s, OpKind::Recompute);   // A3: FSDP(AC(block)) recomputes without another all-gather
    // Autograd allocates a group's unsharded grads at its first backward compute (where its pre-backward
    // fired); inside no_sync without an upcast it accumulates into the existing .grad instead.
    const int first_new = b_.num_buffers();
    for (int v : c_.backward_starts[s]) {
      if (c_.sizes[v].grad <= 0 || fresh_grad_[v] >= 0) continue;
      GroupState& g = st_[v];
      if (g.grad >= 0 && !g.grad_upcast) {
        fresh_grad_[v] = g.grad;
        g.grad = -1;
      } else {
        fresh_grad_[v] = b_.buffer("grad", v, c_.sizes[v].grad * c_.bp, MemCategory::UnshardedGrads, compute_);
      }
    }
    const int last_new = b_.num_buffers();
    emit_compute(s, OpKind::Backward);
    Op& o = b_.at(b_.last_op());
    for (int buf = first_new; buf < last_new; ++buf) o.allocs.push_back(buf);
    if (fresh_grad_[u] >= 0) b_.write(o, fresh_grad_[u]);
  }

  void post_backward(int u) {
    b_.defer_hook();
    GroupState& g = st_[u];
    int fresh = fresh_grad_[u];
    fresh_grad_[u] = -1;
    reshard(u, Phase::Backward);   // reshard_after_backward defaults to True
    if (fresh < 0) return;
    if (!sync_) {
      // F2.8/M12: no gradient sync: keep the unsharded grad; with reduce_dtype it is upcast into
      // unsharded_accumulated_grad (reduce_dtype, full size).
      if (!c_.reduce_cast) {
        g.grad = fresh;   // autograd accumulates into .grad across micro-batches
        return;
      }
      accumulate_upcast(u, fresh);
      return;
    }
    if (g.grad_upcast) accumulate_upcast(u, fresh);   // fold this micro-batch into the accumulation first
    const int src = g.grad_upcast ? g.grad : fresh;
    const Bytes src_bytes = g.grad_upcast ? c_.br : c_.bp;
    g.grad = -1;
    g.grad_upcast = false;
    foreach_reduce(u, src, src_bytes);
  }

  void accumulate_upcast(int u, int fresh) {
    GroupState& g = st_[u];
    const UnitSizes& s = c_.sizes[u];
    Op& o = b_.op(OpKind::Cast, compute_, u, mb_, g.grad_upcast ? "grad acc" : "grad up");
    b_.read(o, fresh);
    if (!g.grad_upcast) {
      g.grad = b_.buffer("grad_acc", u, s.grad * c_.br, MemCategory::UnshardedGrads, compute_);
      o.allocs.push_back(g.grad);
      o.copy_bytes = s.grad * (c_.bp + c_.br);
    } else {
      b_.read(o, g.grad);
      o.copy_bytes = s.grad * (c_.bp + 2 * c_.br);
    }
    b_.write(o, g.grad);
    o.frees.push_back({fresh, -1});
    g.grad_upcast = true;
  }

  // F2.9 foreach_reduce.
  void foreach_reduce(int u, int src, Bytes src_bytes) {
    const UnitSizes& s = c_.sizes[u];
    // F2.8: the current stream waits on the previous group's RS event; its RS input is then freed (M8).
    if (prev_rs_op_ >= 0) b_.defer_wait(compute_, prev_rs_op_);
    if (prev_rs_input_ >= 0) b_.free_now(prev_rs_input_);
    prev_rs_input_ = prev_rs_op_ = -1;
    Op& ci = b_.op(OpKind::CopyIn, compute_, u, mb_, "RS copy-in");
    int in = b_.buffer("rs_in", u, s.rs_input * c_.br, MemCategory::CommBuffers, compute_);
    ci.allocs.push_back(in);
    b_.read(ci, src);
    b_.write(ci, in);
    ci.copy_bytes = s.grad * src_bytes + s.rs_input * c_.br;   // chunk_cat with the widening cast fused
    ci.frees.push_back({src, -1});                              // the unsharded grads are freed
    // F2.10: AVG for fp32/bf16 (no divide kernels); fp16 pre/post-divides to avoid overflow.
    const bool divides = plan_.reduce_dtype == Dtype::FP16;
    int out = -1, post_stream = -1, last = -1;
    if (c_.sharded) {
      if (divides) divide(u, reduce_scatter_, in, s.rs_input * c_.br, ci.id);
      Op& rs = b_.op(OpKind::ReduceScatter, reduce_scatter_, u, mb_, "RS");
      if (!divides) b_.wait(rs, ci.id);
      out = b_.buffer("rs_out", u, s.grad_shard * c_.br, MemCategory::CommBuffers, reduce_scatter_);
      rs.allocs.push_back(out);
      b_.read(rs, in);
      b_.write(rs, out);
      rs.comm_bytes = s.rs_input * c_.br;
      rs.group = CommGroup::Shard;
      rs.group_size = c_.shard_group.size;
      rs.nodes_spanned = c_.shard_group.nodes;
      prev_rs_op_ = rs.id;
      prev_rs_input_ = in;
      post_stream = reduce_scatter_;
      last = rs.id;
      if (c_.hybrid) {
        // F2.9: the all-reduce stream waits on the RS stream; all_reduce over the replicate group. The
        // output is held until the end of backward (_all_reduce_state).
        Op& ar = b_.op(OpKind::AllReduce, all_reduce_, u, mb_, "AR");
        b_.wait(ar, rs.id);
        b_.read(ar, out);
        b_.write(ar, out);
        ar.comm_bytes = s.grad_shard * c_.br;
        ar.group = CommGroup::Replicate;
        ar.group_size = c_.replicate_group.size;
        ar.nodes_spanned = c_.replicate_group.nodes;
        post_stream = all_reduce_;
        last = ar.id;
      }
    } else {
      // Replicated params: the whole gradient is all-reduced over every rank.
      int stream = all_reduce_ >= 0 ? all_reduce_ : reduce_scatter_;
      if (divides) divide(u, stream, in, s.rs_input * c_.br, ci.id);
      Op& ar = b_.op(OpKind::AllReduce, stream, u, mb_, "AR");
      if (!divides) b_.wait(ar, ci.id);
      b_.read(ar, in);
      b_.write(ar, in);
      ar.comm_bytes = s.rs_input * c_.br;
      ar.group = CommGroup::World;
      ar.group_size = c_.world_group.size;
      ar.nodes_spanned = c_.world_group.nodes;
      out = in;
      prev_rs_op_ = ar.id;
      prev_rs_input_ = in;
      post_stream = stream;
      last = ar.id;
    }
    if (divides) last = divide(u, post_stream, out, s.grad_shard * c_.br, -1);
    // Post-reduce: cast to the fp32 (master) dtype into .grad, accumulating when a grad exists.
    const bool adding = mb_ > 0;
    const bool offload = plan_.cpu_offload.params;
    int fp32 = -1;
    if (plan_.reduce_dtype != plan_.master_weights_dtype || adding || offload) {
      Op& o = b_.op(OpKind::Cast, post_stream, u, mb_, adding ? "grad acc" : "grad fp32");
      b_.read(o, out);
      o.copy_bytes = s.grad_shard * (c_.br + c_.bm + (adding ? c_.bm : 0));
      if (offload) {
        fp32 = b_.buffer("grad_dev", u, s.grad_shard * c_.bm, MemCategory::CommBuffers, post_stream);
        o.allocs.push_back(fp32);
        b_.write(o, fp32);
      } else if (grad_shard_[u] >= 0) {
        b_.write(o, grad_shard_[u]);
      }
      last = o.id;
    }
    if (out == in) prev_rs_op_ = last;   // in-place AR: the post-reduce still reads the RS input
    if (c_.sharded) {
      if (c_.hybrid) held_outputs_.push_back(out);
      else b_.at(last).frees.push_back({out, -1});
    }
    if (offload) {   // M11: D2H to the CPU grad (non_blocking unless accumulating)
      Op& d = b_.op(OpKind::D2H, post_stream, u, mb_, "grad D2H");
      b_.read(d, fp32);
      d.copy_bytes = s.grad_shard * c_.bm;
      d.frees.push_back({fp32, -1});
      offload_d2h_.push_back(d.id);
    }
  }

  int divide(int u, int stream, int buf, Bytes bytes, int wait_on) {
    Op& o = b_.op(OpKind::Divide, stream, u, mb_, "div");
    b_.wait(o, wait_on);
    b_.read(o, buf);
    b_.write(o, buf);
    o.copy_bytes = 2 * bytes;
    return o.id;
  }

  void backward() {
    fresh_grad_.assign(c_.sizes.size(), -1);
    pre_backward_done_.assign(c_.sizes.size(), false);
    b_.site(mb_, SitePhase::Backward, -1);
    pre_backward(0);   // F2.7: the root's pre-backward queues the final callback
    const int S = static_cast<int>(c_.segments.size());
    for (int s = S - 1; s >= 0; --s) {
      b_.site(mb_, SitePhase::Backward, segment_site_layer(c_, s));
      for (auto it = c_.closing[s].rbegin(); it != c_.closing[s].rend(); ++it) pre_backward(*it);
      backward_segment(s);
      for (auto it = c_.opening[s].rbegin(); it != c_.opening[s].rend(); ++it) post_backward(*it);
    }
    b_.site(mb_, SitePhase::Backward, -1);
    post_backward(0);   // the root's post_backward runs in the final callback (its inputs need no grad)
    final_callback();
  }

  // F2.11: the compute stream waits on the post-reduce work and the last RS; held buffers are released;
  // with CPU offload the CPU synchronizes on the grad D2H events.
  void final_callback() {
    b_.defer_wait_stream(compute_, reduce_scatter_);
    if (all_reduce_ >= 0) b_.defer_wait_stream(compute_, all_reduce_);
    if (prev_rs_input_ >= 0) b_.free_now(prev_rs_input_);
    prev_rs_input_ = prev_rs_op_ = -1;
    for (int buf : held_outputs_) b_.free_now(buf);
    held_outputs_.clear();
    for (int d : offload_d2h_) b_.defer_cpu_wait(d);
    offload_d2h_.clear();
  }

  const Context& c_;
  const Plan& plan_;
  StepProgram p_;
  Builder b_;
  int compute_ = 0, copy_in_ = 1, all_gather_ = 2, reduce_scatter_ = 3, all_reduce_ = -1;
  int mb_ = 0;
  bool sync_ = true;
  std::vector<GroupState> st_;
  std::vector<int> param_shard_, grad_shard_;
  std::vector<int> act_, recompute_;
  std::vector<int> fresh_grad_;
  std::vector<bool> pre_backward_done_;
  int ag_state_buf_ = -1, ag_state_event_ = -1;   // comm_ctx.all_gather_state
  int prev_rs_input_ = -1, prev_rs_op_ = -1;      // comm_ctx.reduce_scatter_state
  std::vector<int> held_outputs_;                 // HSDP: _all_reduce_state until the end of backward
  std::vector<int> offload_d2h_;
};

}  // namespace

StepProgram lower_fsdp2(const Context& c) { return Fsdp2Lowering(c).run(); }

}  // namespace fsdpsim::sim::lowering
