// The one lowering walk (sim/lower_walk.h): the step's module walk and the model's compute, for both FSDP
// versions. Rule ids (A1-A3, F1.x, F2.x) refer to docs/fsdp-semantics.md.
#include "sim/lower_walk.h"

namespace fsdpsim::sim::lowering {

StepProgram LoweringWalk::run() {
  const int U = static_cast<int>(c_.sizes.size());
  // Builders hand out Op& references that must stay valid while the next ops are added, so the
  // vector must never reallocate during lowering: reserve an upper bound (a unit issues at most
  // ~25 ops per micro-batch: offload H2D + cast + copy-in + AG + copy-out twice, recompute, an extra
  // AG for checkpoint-outside-FSDP, backward, RS copy-in, RS, AR, post-reduce, D2H); Builder::op checks it.
  p_.ops.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 8 + U * 32) + 64);
  p_.buffers.reserve(static_cast<std::size_t>(c_.micro_batches) * (c_.segments.size() * 3 + U * 8) + U * 3);
  add_streams();
  add_persistent();
  act_.assign(c_.segments.size(), -1);
  recompute_.assign(c_.segments.size(), -1);
  notes_before_step();
  for (int mb = 0; mb < c_.micro_batches; ++mb) {
    mb_ = mb;
    sync_ = plan_.grad_sync || mb == c_.micro_batches - 1;
    forward();
    backward();
  }
  add_optimizer_step(c_, b_, p_, optimizer_grads(), optimizer_params(), compute_);
  notes_after_step();
  fill_facts(c_, p_);
  b_.finish();
  return std::move(p_);
}

void LoweringWalk::forward() {
  b_.site(mb_, SitePhase::Forward, -1);
  root_pre_forward();
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

void LoweringWalk::emit_compute(int s, OpKind kind) {
  const Segment& seg = c_.segments[s];
  const int part = static_cast<int>(seg.part);
  const auto& ks = kind == OpKind::Backward ? c_.bwd_kernels[part] : c_.fwd_kernels[part];
  const char* what = kind == OpKind::Forward ? "fwd" : kind == OpKind::Backward ? "bwd" : "recompute";
  Op& o = b_.compute_op(kind, compute_, seg.unit, mb_, what, ks);
  o.kernel_launches = static_cast<int>(ks->size());
  if (const int params = unsharded_params(seg.unit); params >= 0) b_.read(o, params);
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

bool LoweringWalk::checkpointed(int s) const {
  const Segment& seg = c_.segments[s];
  return seg.part == models::ModulePart::Block && c_.act_recompute[seg.layer] > 0;
}

void LoweringWalk::walk_pre_backward(int u) {
  pre_backward_done_[u] = true;
  if (plan_.activation_checkpointing.outside_fsdp && u != 0) {
    // A2: checkpoint(FSDP(block)) re-runs the unit's forward, with its pre/post-forward hooks, first.
    bool any = false;
    for (int s = c_.first_seg[u]; s <= c_.last_seg[u]; ++s) any = any || checkpointed(s);
    if (any) {
      pre_recompute(u);
      for (int s = c_.first_seg[u]; s <= c_.last_seg[u]; ++s)
        if (checkpointed(s)) emit_compute(s, OpKind::Recompute);
      post_recompute(u);
    }
  }
  pre_backward(u);
}

void LoweringWalk::backward_segment(int s) {
  const int u = c_.segments[s].unit;
  if (!plan_.activation_checkpointing.outside_fsdp && checkpointed(s))
    emit_compute(s, OpKind::Recompute);   // A1/A3: FSDP(checkpoint(block)) recomputes without another all-gather
  // Autograd allocates a unit's unsharded gradient at its first backward compute (the segment where its
  // pre-backward fired).
  const int first_new = b_.num_buffers();
  for (int v : c_.backward_starts[s]) autograd_grad(v);
  const int last_new = b_.num_buffers();
  emit_compute(s, OpKind::Backward);
  Op& o = b_.at(b_.last_op());
  for (int buf = first_new; buf < last_new; ++buf) o.allocs.push_back(buf);
  if (const int grad = unsharded_grad(u); grad >= 0) b_.write(o, grad);
}

void LoweringWalk::backward() {
  begin_backward();
  pre_backward_done_.assign(c_.sizes.size(), false);
  b_.site(mb_, SitePhase::Backward, -1);
  walk_pre_backward(0);   // F1.9/F2.7: the root's pre-backward fires first and queues the final callback
  const int S = static_cast<int>(c_.segments.size());
  for (int s = S - 1; s >= 0; --s) {
    b_.site(mb_, SitePhase::Backward, segment_site_layer(c_, s));
    for (auto it = c_.closing[s].rbegin(); it != c_.closing[s].rend(); ++it) walk_pre_backward(*it);
    backward_segment(s);
    for (auto it = c_.opening[s].rbegin(); it != c_.opening[s].rend(); ++it) post_backward(*it);
  }
  b_.site(mb_, SitePhase::Backward, -1);
  post_backward(0);   // the root's post-backward runs in the final callback (its inputs need no grad)
  final_callback();
}

}  // namespace fsdpsim::sim::lowering
