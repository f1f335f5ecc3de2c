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

#include "sim/lower_walk.h"

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

class FlatParamLowering final : public LoweringWalk {
 public:
  explicit FlatParamLowering(const Context& c) : LoweringWalk(c) {}

 private:
  void add_streams() override {
    compute_ = b_.add_stream(StreamRole::Compute, "default");
    pre_unshard_ = b_.add_stream(StreamRole::CopyIn, "pre_unshard");
    unshard_ = b_.add_stream(StreamRole::AllGather, "unshard");
    post_backward_ = b_.add_stream(StreamRole::ReduceScatter, "post_backward");
    // F1.1: the all-reduce stream exists only with HSDP; otherwise it is the default stream.
    all_reduce_ = c_.hybrid ? b_.add_stream(StreamRole::AllReduce, "all_reduce") : compute_;
  }

  void notes_after_step() override {
    if (plan_.limit_all_gathers && c_.sharded)
      p_.notes.push_back("FSDP1 rate limiter: at most 2 all-gathers in flight (CPU blocks on the free event of "
                         "the reshard two back, P4)");
  }

  // ---- persistent sharded state (M2, M11, M13) ----
  void begin() override { state_.assign(c_.sizes.size(), {}); }
  const char* shard_name() const override { return "flat_shard"; }


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
    b_.defer_hook();
    unshard(u);
    wait_for_params(u);
    if (plan_.forward_prefetch) {
      int pos = c_.forward_pos[u] + 1;
      if (pos < static_cast<int>(c_.forward_order.size())) unshard(c_.forward_order[pos]);
    }
  }
  void post_forward(int u) override {
    b_.defer_hook();
    reshard(u, frees_after_forward(u));
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
    b_.defer_hook();
    unshard(u);
    wait_for_params(u);
  }
  void post_recompute(int u) override {
    b_.defer_hook();
    reshard(u, frees_after_forward(u));
  }

  void pre_backward(int u) override {
    b_.defer_hook();
    unshard(u);   // F1.9: a second all-gather for units freed after forward
    wait_for_params(u);
    if (plan_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch_backward(u);   // P1
  }

  // The unit's flat grad (param_dtype), kept across no_sync micro-batches.
  void autograd_grad(int v) override {
    if (state_[v].grad < 0 && c_.sizes[v].grad > 0)
      state_[v].grad = b_.buffer("grad", v, c_.sizes[v].grad * c_.bp, MemCategory::UnshardedGrads, compute_);
  }
  int unsharded_grad(int u) const override { return state_[u].grad; }

  void post_backward(int u) override {
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
      if (!accumulate(u, post_backward_, src, src_numel)) release(src, b_.last_on(post_backward_));
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
    int out = b_.buffer("rs_out", u, s.grad_shard * c_.br,
                        reduced_is_grad(u) ? MemCategory::ShardedGrads : MemCategory::CommBuffers, post_backward_);
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
    if (!accumulate(u, stream, out, s.grad_shard)) release(out, b_.last_on(stream));
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

  // The reduced shard itself becomes the sharded gradient (_cast_grad_to_param_dtype makes no copy when
  // the reduce dtype is the parameters' and _saved_grad_shard is assigned, not added to).
  bool reduced_is_grad(int u) const {
    return plan_.reduce_dtype == plan_.master_weights_dtype && grad_shard_[u] < 0 && !plan_.cpu_offload.params;
  }

  // _accumulate_sharded_grad: cast to the fp32 sharded grad, `+=` when one exists from an earlier micro-batch
  // (grad_sync with accumulation). Returns true when `src` itself became the sharded gradient (kept until the
  // step's end, not released).
  bool accumulate(int u, int stream, int src, std::int64_t numel) {
    if (reduced_is_grad(u)) {
      grad_shard_[u] = src;
      return true;
    }
    const bool adding = grad_shard_[u] >= 0;
    Op& o = b_.op(OpKind::Cast, stream, u, mb_, adding ? "grad acc" : "grad fp32");
    b_.read(o, src);
    o.copy_bytes = numel * (c_.br + c_.bm + (adding ? c_.bm : 0));
    if (plan_.cpu_offload.params) {
      offload_grad_ = b_.buffer("grad_dev", u, numel * c_.bm, MemCategory::CommBuffers, stream);
      o.allocs.push_back(offload_grad_);
      b_.write(o, offload_grad_);
    } else if (adding) {
      b_.write(o, grad_shard_[u]);
    } else {
      // a new fp32 tensor, allocated in the pool of the stream the reduction finishes on
      grad_shard_[u] = b_.buffer("grad_shard", u, numel * c_.bm, MemCategory::ShardedGrads, stream);
      o.allocs.push_back(grad_shard_[u]);
      b_.write(o, grad_shard_[u]);
    }
    return false;
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

  // F1.13: the compute stream waits on post_backward (and all_reduce); with CPU offload the CPU syncs.
  void final_callback() override {
    b_.defer_wait_stream(compute_, post_backward_);
    if (c_.hybrid) b_.defer_wait_stream(compute_, all_reduce_);
    if (plan_.cpu_offload.params && sync_) {
      b_.defer_cpu_wait(b_.last_on(post_backward_));
      if (c_.hybrid) b_.defer_cpu_wait(b_.last_on(all_reduce_));
      b_.defer_cpu_wait(b_.last_on(compute_));
    }
  }

  int pre_unshard_ = 1, unshard_ = 2, post_backward_ = 3, all_reduce_ = 0;
  std::vector<UnitState> state_;
  std::deque<int> free_events_;        // P4 _FreeEventQueue: compute-stream ops whose completion frees a unit
  int offload_grad_ = -1;
};

}  // namespace

StepProgram lower_fsdp1(const Context& c) { return FlatParamLowering(c).run(); }

}  // namespace fsdpsim::sim::lowering
