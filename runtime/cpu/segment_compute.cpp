#include "runtime/cpu/segment_compute.h"

#include <cstring>
#include <stdexcept>

namespace fsdpsim::runtime {

SegmentCompute::SegmentCompute(const Dims& d, float dloss_scale, std::vector<bool> ckpt)
    : d_(d), dloss_scale_(dloss_scale), ckpt_(std::move(ckpt)) {
  const long NC = d.tokens() * d.C;
  x_.assign(NC, 0.0f);
  dx_.assign(NC, 0.0f);
  transient_.assign(block_acts_layout(d).bytes() / 4, 0.0f);
  scratch_.assign(block_scratch_layout(d).bytes() / 4, 0.0f);
  head_aux_.assign(head_aux_layout(d).bytes() / 4, 0.0f);
}

void SegmentCompute::set_batch(int mb, std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets) {
  if (static_cast<int>(inputs_.size()) <= mb) {
    inputs_.resize(mb + 1);
    targets_.resize(mb + 1);
    loss_.resize(mb + 1, 0.0);
  }
  inputs_[mb] = std::move(inputs);
  targets_[mb] = std::move(targets);
}

Bytes SegmentCompute::untracked_bytes() const {
  return static_cast<Bytes>(x_.size() + dx_.size() + transient_.size() + scratch_.size() + head_aux_.size()) * 4;
}

Bytes SegmentCompute::act_bytes(int seg) const {
  if (seg == 0) return 0;
  if (seg == d_.L + 1) return head_logits_layout(d_).bytes();
  return ckpt_[seg - 1] ? static_cast<Bytes>(d_.tokens() * d_.C * 4) : block_acts_layout(d_).bytes();
}

Bytes SegmentCompute::recomp_bytes(int seg) const {
  if (seg == 0 || seg == d_.L + 1 || !ckpt_[seg - 1]) return 0;
  return block_acts_layout(d_).bytes() - static_cast<Bytes>(d_.tokens() * d_.C * 4);
}

// BlockActs fields in block_acts_layout order; x is first, so with checkpointing x sits in `act`
// and every later field at its offset minus N*C in `recomp`.
BlockActs SegmentCompute::bind(float* act, float* recomp, int layer) const {
  if (!ckpt_[layer]) return bind_block_acts(d_, act);
  const long NC = d_.tokens() * d_.C;
  BlockActs a = bind_block_acts(d_, recomp - NC);
  a.x = act;
  return a;
}

namespace {
BlockParams block_params(const Dims& d, const std::vector<float*>& p) {
  return bind_block_params(d, std::vector<const float*>(p.begin(), p.end()));
}
}  // namespace

void SegmentCompute::forward(int seg, int mb, const std::vector<float*>& p, float* act) {
  const long NC = d_.tokens() * d_.C;
  if (seg == 0) {
    embed_forward(d_, p.at(0), inputs_.at(mb).data(), x_.data());
    return;
  }
  if (seg == d_.L + 1) {
    HeadActs h = bind_head_acts(d_, head_aux_.data(), act);
    loss_.at(mb) = head_forward(d_, p.at(0), p.at(1), x_.data(), targets_.at(mb).data(), h);
    return;
  }
  const int layer = seg - 1;
  BlockActs a;
  if (ckpt_[layer]) {
    // The forward under torch.utils.checkpoint: intermediates are transient, only the input is kept.
    a = bind_block_acts(d_, transient_.data());
    std::memcpy(act, x_.data(), sizeof(float) * NC);
  } else {
    a = bind_block_acts(d_, act);
  }
  std::vector<float> out(NC);
  block_forward(d_, block_params(d_, p), x_.data(), a, out.data());
  std::memcpy(x_.data(), out.data(), sizeof(float) * NC);
}

void SegmentCompute::recompute(int seg, int mb, const std::vector<float*>& p, float* act, float* recomp) {
  const int layer = seg - 1;
  if (seg < 1 || seg > d_.L || !ckpt_[layer]) throw std::logic_error("recompute of a segment that is not checkpointed");
  BlockActs a = bind(act, recomp, layer);
  std::vector<float> out(d_.tokens() * d_.C);
  block_forward(d_, block_params(d_, p), a.x, a, out.data(), early_stop_);   // a.x is the saved input
}

void SegmentCompute::backward(int seg, int mb, const std::vector<float*>& p, const std::vector<float*>& g, float* act,
                              float* recomp) {
  if (seg == 0) {
    embed_backward(d_, g.at(0), inputs_.at(mb).data(), dx_.data());
    return;
  }
  if (seg == d_.L + 1) {
    HeadActs h = bind_head_acts(d_, head_aux_.data(), act);
    std::vector<float> dln(d_.tokens() * d_.C);
    head_backward(d_, p.at(0), p.at(1), targets_.at(mb).data(), dloss_scale_, h, g.at(0),
                  g.at(1), dx_.data(), dln.data());
    return;
  }
  const int layer = seg - 1;
  BlockActs a = bind(act, recomp, layer);
  BlockGrads gr = bind_block_grads(d_, g);
  BlockScratch s = bind_block_scratch(d_, scratch_.data());
  block_backward(d_, block_params(d_, p), gr, a, dx_.data(), dx_.data(), s);
}

}  // namespace fsdpsim::runtime
