// FSDP2 (fully_shard) lowering: one training step of one rank as FSDP2 issues it.
// Rule ids (F2.x, P5, P6, M6-M12, D1-D5, A3) refer to docs/fsdp-semantics.md.
//
// Streams (F2.1): default (compute), all_gather_copy_in, all_gather, reduce_scatter, and all_reduce
// (HSDP). Per param group:
//   unshard          = copy-in stream: [H2D] [foreach cast] alloc AG output + copy-in; all_gather stream:
//                      all_gather_into_tensor (F2.2, D2, M7)
//   wait_for_unshard = compute: copy-out into the unsharded params (AG output + params coexist, 2x);
//                      in forward the AG output is kept until the next group's wait_for_unshard,
//                      which frees it before its own copy-out (F2.3, P5)
//   reshard          = free the unsharded params (no record_stream); rAF=int keeps a 1/k clone (F2.4)
//   post_backward    = compute waits on the previous RS; RS copy-in on compute (reduce_dtype); RS on the
//                      RS stream; [HSDP all_reduce]; fp32 cast on the post-reduce stream (F2.8-F2.10, M8)
#include <algorithm>

#include "models/nf4.h"
#include "program/lower_walk.h"

namespace fsdpsim::sim::lowering {
namespace {

enum class ParamState { Sharded, PostForwardSharded, Gathering, Unsharded };

struct GroupState {
  ParamState state = ParamState::Sharded;
  int ag_out = -1;          // all-gather output (until copy-out / the next copy-in)
  int ag_op = -1;
  int unsharded = -1;       // per-param unsharded storage
  std::vector<int> unsharded_parts;   // the other parameters' (unsharded is the first's, param_parts)
  int post_forward = -1;    // rAF=int: the 1/k slice kept from forward to backward (F2.4)
  int grad = -1;            // unsharded grads (param_dtype), or the reduce_dtype accumulation (M12)
  bool grad_upcast = false; // `grad` is unsharded_accumulated_grad in reduce_dtype
};

class ParamGroupLowering final : public LoweringWalk {
 public:
  explicit ParamGroupLowering(const Context& c) : LoweringWalk(c) {}

 private:
  void add_streams() override {
    const SideStreams s = add_side_streams("all_gather_copy_in", "all_gather", "reduce_scatter", c_.R > 1);
    copy_in_ = s.copy_in;
    all_gather_ = s.all_gather;
    reduce_scatter_ = s.reduce_scatter;
    all_reduce_ = s.all_reduce;
  }

  void notes_before_step() override {
    if (!plan_.reshard_after_forward.keeps() && c_.reshard_after_forward[0].is_unset())
      p_.notes.push_back("FSDP2 root group: not resharded after forward (reshard_after_forward=None default for "
                         "the root, F2.6)");
    if (!c_.sharded)
      p_.notes.push_back("FSDP2 with a 1-wide shard dim: modeled as replicated params (cast on the copy-in stream) "
                         "and a gradient all-reduce over all ranks, without the 1-rank all-gather/reduce-scatter");
    if (plan_.fp8_all_gather)
      p_.notes.push_back("fp8 all-gather (D4): all parameters of block groups gathered in fp8 (torchao keeps norm "
                         "weights in bf16; they are < 0.1% of a block)");
  }

  // AG dtype bytes of a group: fp8 for block groups with the float8 all-gather (D4).
  Bytes ag_bytes(int u) const {
    if (!plan_.fp8_all_gather || u == 0) return c_.bp;
    for (auto part : c_.graph->units[u].parts)
      if (part == models::ModulePart::Block) return 1;
    return c_.graph->units[u].layers.empty() ? c_.bp : 1;
  }

  // F2.9: every parameter of a group gets its own .grad, allocated by autograd in the backward op that
  // computes it (the unsharded parameters are leaves: _fsdp_param.py FSDPParam.init_unsharded_param), and
  // foreach_reduce's chunk_cat reads them all. So the root group's embedding gradient appears only in the
  // embedding's backward, at the end of the step, not with the head's. Per segment and parameter group
  // (param_grad_parts' `trained`: only a parameter that requires grad gets one, so a group with frozen or
  // LoRA adapter parameters has its trained ones' gradients in the segments that make them); a group whose
  // trained parameters are not known one by one (a count, unplaceable names) and the bundled runtime (one
  // gradient buffer per unit) get theirs whole at the group's first backward compute.
  void begin(const ParamGradParts& g) override {
    st_.assign(c_.sizes.size(), {});
    const int U = static_cast<int>(c_.sizes.size());
    const bool per_param = plan_.implementation != models::ModelImpl::Runtime;
    split_.assign(U, false);
    for (int u = 0; u < U; ++u) split_[u] = per_param && c_.sizes[u].grad > 0 && g.unit_trained[u] == c_.sizes[u].grad;
    seg_grads_ = g.trained;
    // (the tied weight's second gradient: under a partial set the embedding never trains)
    seg_transient_ = g.transient;
    if (!c_.trainable.all) std::fill(seg_transient_.begin(), seg_transient_.end(), 0);
    split_now_.assign(U, false);
    grad_parts_.assign(U, {});
    tied_head_grad_.assign(U, -1);
  }
  const char* shard_name() const override { return "shard"; }

  // Each parameter's unsharded numel, dim 0 padded to a multiple of the shard group (M6), in registration
  // order: the storages FSDPParam.alloc_all_gather_outputs allocates one by one. Empty when the group's
  // listed tensors do not add up to `total` (LoRA adapters, a group known by its count) and for the bundled
  // runtime (one buffer per group).
  // Each parameter's bytes at `per_elem` bytes per element (an NF4 weight at its NF4 bytes, models/nf4.h).
  std::vector<Bytes> param_parts(int u, std::int64_t total, Bytes per_elem) const {
    std::vector<Bytes> v;
    if (plan_.implementation == models::ModelImpl::Runtime) return v;
    std::int64_t sum = 0;
    const auto padded = [&](std::int64_t numel, std::int64_t d0) {
      return d0 <= 0 ? 0 : (d0 + c_.N - 1) / c_.N * c_.N * (numel / d0);
    };
    for (const models::ParamTensor& t : c_.graph->units[u].tensors) {
      const std::int64_t n = padded(t.numel(), t.shape.empty() ? 1 : t.shape[0]);
      v.push_back(models::tensor_nf4(c_.trainable.lora, t.name) ? models::nf4_bytes(n) : n * per_elem);
      sum += n;
    }
    // LoRA adapters are parameters of the group like the others (until 2026-11-29 they were left out here, so a
    // LoRA unit's parameters were one buffer: PyTorch's allocator history of l70b-fsdp2-lora-r16-qkv-ac-mb2-hf
    // shows each block weight's own unsharded tensor, 128, 16, 16, 128 and three 448 MiB)
    for (const auto& [numel, d0] : unit_adapters(c_, u)) {
      const std::int64_t n = padded(numel, d0);
      if (n == 0) continue;
      v.push_back(n * per_elem);
      sum += n;
    }
    if (sum != total) v.clear();
    return v;
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
      // A one-rank shard group runs no all-gather (FSDPParamGroup.unshard returns an empty AllGatherResult
      // when the all-gather group's size is 1) and FSDPParamGroup.wait_for_unshard, on the current stream,
      // copies each parameter's shard into its own all_gather_outputs storage: one tensor per parameter in
      // the default stream's pool (PyTorch's allocator history of l1b-fsdp2-w1-hf: no all-gather stream
      // at all). Per parameter its loop first takes `all_gather_input = fsdp_param.all_gather_inputs[0]`, the
      // shard cast to the param dtype (a new tensor), then allocates the output and copies; the local is
      // rebound at the next parameter's cast, so each cast is freed once the next one exists, the last when
      // wait_for_unshard returns (the same history: the root's 501 MiB cast, then its 501 MiB output, then the
      // cast freed, events [2]-[6]). The bundled runtime keeps one buffer per unit on the copy-in stream.
      const std::vector<Bytes> parts = offload ? std::vector<Bytes>{} : param_parts(u, s.shard, c_.bp);
      const int stream = parts.empty() ? copy_in_ : compute_;
      Op& o = offload ? b_.op(OpKind::H2D, copy_in_, u, mb_, "H2D") : b_.op(OpKind::Cast, stream, u, mb_, "cast");
      if (!offload) b_.read(o, param_shard_[u]);   // the cast reads the fp32 parameters
      int cast = -1;
      for (Bytes bytes : parts.empty() ? std::vector<Bytes>{s.shard_bytes(c_.bp)} : parts) {
        if (!parts.empty()) {
          const int prev = cast;
          cast = b_.buffer("ag_in", u, bytes, MemCategory::CommBuffers, stream);
          o.allocs.push_back(cast);
          b_.write(o, cast);
          if (prev >= 0) o.frees.push_back({prev, free_inside_op(static_cast<int>(o.allocs.size()))});
        }
        const int buf = b_.buffer("params", u, bytes, MemCategory::UnshardedParams, stream);
        o.allocs.push_back(buf);
        b_.write(o, buf);
        (g.unsharded < 0 ? g.unsharded : g.unsharded_parts.emplace_back()) = buf;
      }
      if (cast >= 0) o.frees.push_back({cast, -1});
      o.copy_bytes = offload ? s.shard * c_.bm : s.shard * (c_.bm + c_.bp);
      g.ag_op = o.id;
      return;
    }
    const Bytes bag = ag_bytes(u);
    const bool from_post_forward = g.state == ParamState::PostForwardSharded;
    int src = -1;
    Bytes src_bytes = s.shard_bytes(bag);
    if (from_post_forward) {
      src = g.post_forward;
      src_bytes = s.unsharded_bytes(bag) / c_.post_forward_group.size;
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
        int buf = b_.buffer("ag_in", u, s.shard_bytes(bag), MemCategory::CommBuffers, copy_in_);
        cast.allocs.push_back(buf);
        b_.read(cast, src >= 0 ? src : param_shard_[u]);
        b_.write(cast, buf);
        cast.copy_bytes = s.shard_bytes(c_.bm) + s.shard_bytes(bag);
        if (src >= 0) cast.frees.push_back({src, -1});
        src = buf;
      }
    }
    Op& ci = b_.op(OpKind::CopyIn, copy_in_, u, mb_, "copy-in");
    g.ag_out = b_.buffer("ag_out", u, s.unsharded_bytes(bag), MemCategory::CommBuffers, copy_in_);
    ci.allocs.push_back(g.ag_out);
    b_.read(ci, src >= 0 ? src : param_shard_[u]);
    b_.write(ci, g.ag_out);
    ci.copy_bytes = 2 * src_bytes;   // read the shard, write this rank's slice
    if (src >= 0 && !from_post_forward) ci.frees.push_back({src, -1});
    Op& ag = b_.op(OpKind::AllGather, all_gather_, u, mb_, "AG");
    b_.wait(ag, ci.id);
    b_.read(ag, g.ag_out);
    b_.write(ag, g.ag_out);
    collective(ag, from_post_forward ? CommGroup::PostForward : CommGroup::Shard, s.unsharded_bytes(bag));
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
    // Implicit prefetch (P5): in forward, the previous group's kept AG output is freed first, before the
    // copy-out allocates this group's unsharded params (FSDPParamGroup.wait_for_unshard drops
    // comm_ctx.all_gather_state, then runs foreach_all_gather_copy_out).
    if (phase == Phase::Forward) flush_all_gather_state();
    Op& co = b_.op(OpKind::CopyOut, compute_, u, mb_, "copy-out");
    b_.wait(co, g.ag_op);
    std::vector<Bytes> parts = param_parts(u, s.unsharded, bag);
    if (parts.empty()) parts.push_back(s.unsharded_bytes(bag));
    for (Bytes bytes : parts) {
      const int buf = b_.buffer("params", u, bytes, MemCategory::UnshardedParams, compute_);
      co.allocs.push_back(buf);
      b_.write(co, buf);
      (g.unsharded < 0 ? g.unsharded : g.unsharded_parts.emplace_back()) = buf;
    }
    b_.read(co, g.ag_out);
    co.copy_bytes = 2 * s.unsharded_bytes(bag);   // split_with_sizes_copy: read the AG output, write the params
    const int event = co.id;
    if (phase == Phase::Forward) {
      // Implicit prefetch (P5): keep this AG output until the next group's wait_for_unshard.
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
    const ReshardAfterForward raf = c_.reshard_after_forward[u];
    if (c_.sharded && phase == Phase::Forward && raf.is_group() && s.params > 0) {
      // to_sharded_post_forward clones this rank's 1/k slice (of the AG output) and keeps it for backward.
      Op& cl = b_.op(OpKind::CopyOut, compute_, u, mb_, "clone");
      const Bytes bytes = s.unsharded_bytes(ag_bytes(u)) / raf.group_size();
      g.post_forward = b_.buffer("post_fwd", u, bytes, MemCategory::UnshardedParams, compute_);
      cl.allocs.push_back(g.post_forward);
      b_.read(cl, g.unsharded);
      b_.write(cl, g.post_forward);
      cl.copy_bytes = 2 * bytes;
    }
    b_.free_now(g.unsharded);   // storage resize to 0; no record_stream (M10)
    for (int part : g.unsharded_parts) b_.free_now(part);
    g.unsharded = -1;
    g.unsharded_parts.clear();
    g.state = g.post_forward >= 0 ? ParamState::PostForwardSharded : ParamState::Sharded;
  }

  bool explicit_prefetch() const { return plan_.forward_prefetch || plan_.prefetch_depth > 1; }

  // ---- forward (F2.5, F2.6, P5, P6) ----
  void root_pre_forward() override {
    // F2.5: the copy-in and all-gather streams wait on the current stream (the previous optimizer/backward).
    b_.defer_wait_stream(copy_in_, compute_);
    b_.defer_wait_stream(all_gather_, compute_);
  }

  void pre_forward(int u) override {
    unshard(u);
    wait_for_unshard(u, Phase::Forward);
    if (explicit_prefetch()) {   // P6: set_modules_to_forward_prefetch, issued after this group's copy-out
      for (int d = 1; d <= plan_.prefetch_depth; ++d) {
        int pos = c_.forward_pos[u] + d;
        if (pos < static_cast<int>(c_.forward_order.size())) unshard(c_.forward_order[pos]);
      }
    }
  }

  void post_forward(int u) override {
    const ReshardAfterForward raf = c_.reshard_after_forward[u];
    if (u == 0) {
      flush_all_gather_state();   // the root flushes the kept AG output in its post-forward (F2.3)
      if (raf.is_unset() || raf.keeps()) return;   // and is not resharded unless told to (F2.6)
    }
    if (!raf.keeps() || !c_.sharded) reshard(u, Phase::Forward);
  }

  int unsharded_params(int u) const override { return st_[u].unsharded; }

  // ---- backward (F2.7-F2.11, A2, A3) ----
  // A2: checkpoint(fully_shard(block)) re-runs the group's forward (with its hooks) before its backward.
  void pre_recompute(int u) override {
    unshard(u);
    wait_for_unshard(u, Phase::Backward);
  }
  void post_recompute(int u) override {
    if (!c_.reshard_after_forward[u].keeps()) reshard(u, Phase::Backward);
  }

  void pre_backward(int u) override {
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

  void begin_backward() override { fresh_grad_.assign(c_.sizes.size(), -1); }

  // Inside no_sync without an upcast autograd accumulates into the existing .grad instead of a new one.
  // A micro-batch that reduces and starts from no .grad gets the parameters' gradients segment by segment
  // (segment_grads); the others keep one buffer for the group.
  void autograd_grad(int v, int /*s*/) override {
    if (c_.sizes[v].grad <= 0 || fresh_grad_[v] >= 0 || split_now_[v]) return;
    GroupState& g = st_[v];
    if (g.grad >= 0 && !g.grad_upcast) {
      fresh_grad_[v] = g.grad;
      g.grad = -1;
    } else if (split_[v] && sync_ && g.grad < 0) {
      split_now_[v] = true;
    } else if (const std::vector<int>* cut = cut_grads("grad", v, c_.sizes[v].grad * c_.bp)) {
      // each trainable parameter's .grad where the block's backward makes it (foreach_reduce or the upcast
      // accumulation reads them all; a no_sync micro-batch without an upcast keeps them as they are)
      fresh_grad_[v] = cut->front();
      grad_parts_[v].insert(grad_parts_[v].end(), cut->begin() + 1, cut->end());
    } else {
      fresh_grad_[v] = b_.buffer("grad", v, c_.sizes[v].grad * c_.bp, MemCategory::UnshardedGrads, compute_);
    }
  }
  int unsharded_grad(int u) const override { return fresh_grad_[u]; }

  void segment_grads(int s, Op& o) override {
    const int u = c_.segments[s].unit;
    if (!split_now_[u]) return;
    if (const std::vector<int>* cut = cut_grads("grad", u, segment_grad_bytes(s))) {   // (a block backward by tensor)
      for (int b : *cut) {
        o.allocs.push_back(b);
        b_.write(o, b);
        (fresh_grad_[u] < 0 ? fresh_grad_[u] : grad_parts_[u].emplace_back()) = b;
      }
      return;
    }
    int last = -1;
    for (std::int64_t numel : seg_grads_[s]) {
      last = b_.buffer("grad", u, numel * c_.bp, MemCategory::UnshardedGrads, compute_);
      o.allocs.push_back(last);
      b_.write(o, last);
      (fresh_grad_[u] < 0 ? fresh_grad_[u] : grad_parts_[u].emplace_back()) = last;
    }
    // A tied weight (one leaf used by the embedding and the LM head) gets two gradients; the head's, first,
    // waits in the leaf's AccumulateGrad input buffer (torch/csrc/autograd/input_buffer.cpp InputBuffer::add,
    // accumulate) until the embedding's arrives, and the two are summed out of place into a third tensor,
    // the .grad foreach_reduce reads; both addends are freed then (PyTorch's allocator histories of
    // l1b-fsdp2-every2-mb4-tt and l1b-fsdp2-ac-s8192-litgpt: three tensors of the tied weight's size live at
    // once at the embedding's backward). The head's is the last of its segment's (param_grad_parts).
    if (seg_transient_[s] > 0) {
      const Bytes bytes = seg_transient_[s] * c_.bp;
      transient(o, "grad_tmp", u, bytes, MemCategory::UnshardedGrads);
      b_.write(o, o.allocs.back());
      const int head = tied_head_grad_[u];
      if (head < 0) return;
      const int sum = b_.buffer("grad", u, bytes, MemCategory::UnshardedGrads, compute_);
      o.allocs.push_back(sum);
      b_.write(o, sum);
      std::replace(grad_parts_[u].begin(), grad_parts_[u].end(), head, sum);
      if (fresh_grad_[u] == head) fresh_grad_[u] = sum;
      o.frees.push_back({head, -1});
      tied_head_grad_[u] = -1;
    } else if (c_.model->tied_embeddings && c_.segments[s].part == models::ModulePart::FinalNormAndHead) {
      tied_head_grad_[u] = last;
    }
  }
  Bytes segment_grad_bytes(int s) const override {
    const int u = c_.segments[s].unit;
    if (!split_now_[u]) return 0;
    Bytes n = 0;
    for (std::int64_t numel : seg_grads_[s]) n += numel;
    return n * c_.bp;
  }

  void post_backward(int u) override {
    GroupState& g = st_[u];
    int fresh = fresh_grad_[u];
    fresh_grad_[u] = -1;
    split_now_[u] = false;
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
    for (int part : grad_parts_[u]) {   // (each parameter's, when they are apart)
      b_.read(o, part);
      o.frees.push_back({part, -1});
    }
    grad_parts_[u].clear();
    g.grad_upcast = true;
  }

  // F2.9 foreach_reduce.
  void foreach_reduce(int u, int src, Bytes src_bytes) {
    const UnitSizes& s = c_.sizes[u];
    // F2.8: the current stream waits on the previous group's RS event; its RS input is then freed (M8).
    if (prev_rs_op_ >= 0) b_.defer_wait(compute_, prev_rs_op_);
    if (prev_rs_input_ >= 0) b_.free_now(prev_rs_input_);
    prev_rs_input_ = prev_rs_op_ = -1;
    const bool offload = plan_.cpu_offload.params;
    // The reduced output itself becomes the sharded gradient (a view of it, F2.9) unless a cast to the master
    // dtype, an accumulation into an earlier micro-batch's gradient or the offload makes another tensor.
    const bool out_is_grad = reduced_is_grad(u);
    const MemCategory out_category = out_is_grad ? MemCategory::ShardedGrads : MemCategory::CommBuffers;
    // A 1-wide shard dim (NO_SHARD: fully_shard on a (R, 1) mesh): foreach_reduce still allocates the reduce
    // output on the reduce-scatter stream and, with no collective for one rank, copies the RS input into it
    // (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce, world_size 1); the HSDP
    // all-reduce then runs in place on it, and the gradient is a view of it (the RS stream's pool). The
    // bundled runtime all-reduces its RS input in place instead.
    const bool rs_copy = !c_.sharded && plan_.implementation != models::ModelImpl::Runtime;
    const bool reduce_output = c_.sharded || rs_copy;
    Op& ci = b_.op(OpKind::CopyIn, compute_, u, mb_, "RS copy-in");
    int in = b_.buffer("rs_in", u, s.rs_input * c_.br, reduce_output ? MemCategory::CommBuffers : out_category, compute_);
    ci.allocs.push_back(in);
    b_.read(ci, src);
    b_.write(ci, in);
    ci.copy_bytes = s.grad * src_bytes + s.rs_input * c_.br;   // chunk_cat with the widening cast fused
    ci.frees.push_back({src, -1});                              // the unsharded grads are freed
    for (int part : grad_parts_[u]) {                           // (each parameter's, when they are apart)
      b_.read(ci, part);
      ci.frees.push_back({part, -1});
    }
    grad_parts_[u].clear();
    // F2.10: AVG for fp32/bf16 (no divide kernels); fp16 pre/post-divides to avoid overflow.
    const bool divides = plan_.reduce_dtype == Dtype::FP16;
    int out = -1, post_stream = -1, last = -1;
    if (reduce_output) {
      if (divides) divide(u, reduce_scatter_, in, s.rs_input * c_.br, ci.id);
      Op& rs = c_.sharded ? b_.op(OpKind::ReduceScatter, reduce_scatter_, u, mb_, "RS")
                          : b_.op(OpKind::Cast, reduce_scatter_, u, mb_, "RS copy");
      if (!divides) b_.wait(rs, ci.id);
      out = b_.buffer("rs_out", u, s.grad_shard * c_.br, out_category, reduce_scatter_);
      rs.allocs.push_back(out);
      b_.read(rs, in);
      b_.write(rs, out);
      if (c_.sharded) collective(rs, CommGroup::Shard, s.rs_input * c_.br);
      else rs.copy_bytes = 2 * s.rs_input * c_.br;
      prev_rs_op_ = rs.id;
      prev_rs_input_ = in;
      post_stream = reduce_scatter_;
      last = rs.id;
      if (c_.hybrid || (rs_copy && all_reduce_ >= 0)) {
        // F2.9: the all-reduce stream waits on the RS stream; all_reduce over the replicate group (every
        // rank on a 1-wide shard dim). The output is held until the end of backward (_all_reduce_state).
        const CommGroup group = c_.sharded ? CommGroup::Replicate : CommGroup::World;
        last = all_reduce(u, all_reduce_, out, s.grad_shard * c_.br, group, rs.id).id;
        post_stream = all_reduce_;
      }
    } else {
      // Replicated params: the whole gradient is all-reduced over every rank.
      int stream = all_reduce_ >= 0 ? all_reduce_ : reduce_scatter_;
      if (divides) divide(u, stream, in, s.rs_input * c_.br, ci.id);
      last = all_reduce(u, stream, in, s.rs_input * c_.br, CommGroup::World, divides ? -1 : ci.id).id;
      out = in;
      prev_rs_op_ = last;
      prev_rs_input_ = in;
      post_stream = stream;
    }
    if (divides) last = divide(u, post_stream, out, s.grad_shard * c_.br, -1);
    // Post-reduce: cast to the fp32 (master) dtype into .grad (a new tensor in the post-reduce stream's pool),
    // or accumulate into the existing .grad. Offloaded, the D2H copy reads the reduce output itself when it is
    // already in the parameters' dtype (foreach_reduce's _to_dtype_if_needed returns it as it is; the CPU
    // gradient is a copy of its view): no cast (PyTorch's allocator history of l1b-fsdp2-offload-w8-tt, fp32
    // reduction: one 29 MiB reduce-scatter segment per block, no second one).
    const bool offload_reads_output = offload && reduce_output && plan_.reduce_dtype == plan_.master_weights_dtype;
    int fp32 = -1;
    if (out_is_grad) grad_shard_[u] = out;
    else if (!offload_reads_output) last = cast_to_sharded_grad(u, post_stream, out, s.grad_shard, fp32).id;
    if (out == in) {
      prev_rs_op_ = last;                      // in-place AR: the post-reduce still reads the RS input
      if (out_is_grad) prev_rs_input_ = -1;    // ... which is now .grad, kept to the step's end
    }
    const bool held = reduce_output && !out_is_grad && post_stream == all_reduce_;
    if (held) held_outputs_.push_back(out);
    else if (reduce_output && !out_is_grad && !offload_reads_output) b_.at(last).frees.push_back({out, -1});
    if (offload) {   // M11: D2H to the CPU grad (non_blocking unless accumulating)
      Op& d = b_.op(OpKind::D2H, post_stream, u, mb_, "grad D2H");
      b_.read(d, offload_reads_output ? out : fp32);
      d.copy_bytes = s.grad_shard * c_.bm;
      if (!offload_reads_output) d.frees.push_back({fp32, -1});
      else if (!held) d.frees.push_back({out, -1});
      offload_d2h_.push_back(d.id);
    }
  }

  // F2.11: the compute stream waits on the post-reduce work and the last RS; held buffers are released;
  // with CPU offload the CPU synchronizes on the grad D2H events.
  void final_callback() override {
    b_.defer_wait_stream(compute_, reduce_scatter_);
    if (all_reduce_ >= 0) b_.defer_wait_stream(compute_, all_reduce_);
    if (prev_rs_input_ >= 0) b_.free_now(prev_rs_input_);
    prev_rs_input_ = prev_rs_op_ = -1;
    for (int buf : held_outputs_) b_.free_now(buf);
    held_outputs_.clear();
    for (int d : offload_d2h_) b_.defer_cpu_wait(d);
    offload_d2h_.clear();
  }

  int copy_in_ = 1, all_gather_ = 2, reduce_scatter_ = 3, all_reduce_ = -1;
  std::vector<GroupState> st_;
  std::vector<int> fresh_grad_;                   // the group's (first) unsharded gradient this micro-batch
  std::vector<bool> split_, split_now_;           // per unit: gradients per parameter (begin)
  std::vector<std::vector<std::int64_t>> seg_grads_;   // per segment: its parameters' gradient numels
  std::vector<std::int64_t> seg_transient_;       // per segment: a tied weight's second gradient
  std::vector<std::vector<int>> grad_parts_;      // per unit: the gradients after fresh_grad_ (segment_grads)
  std::vector<int> tied_head_grad_;               // per unit: the LM head's gradient of a tied weight, until summed
  int ag_state_buf_ = -1, ag_state_event_ = -1;   // comm_ctx.all_gather_state
  int prev_rs_input_ = -1, prev_rs_op_ = -1;      // comm_ctx.reduce_scatter_state
  std::vector<int> held_outputs_;                 // HSDP: _all_reduce_state until the end of backward
  std::vector<int> offload_d2h_;
};

}  // namespace

StepProgram lower_fsdp2(const Context& c) { return ParamGroupLowering(c).run(); }

}  // namespace fsdpsim::sim::lowering
