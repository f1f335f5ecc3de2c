// The compute of one forward segment (embedding, block l, final norm + head) for one micro-batch,
// as the Forward / Recompute / Backward ops of a StepProgram ask for it. Saved activations live in
// the buffers the program allocated for them (act, recomp, logits); what the models' activation
// formula does not count lives in this object's scratch and is reported (untracked_bytes()).
//
// Block activations (block.h BlockActs, layout block_acts_layout):
//  * not checkpointed: all of them in the "act" buffer;
//  * full checkpointing: the block input x in "act", the rest in "recomp" (allocated by the
//    Recompute op, which re-runs the forward from x).
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/model/block.h"
#include "runtime/model/dims.h"
#include "runtime/model/ends.h"

namespace fsdpsim::runtime {

class SegmentCompute {
 public:
  // dloss_scale = d(loss)/d(token loss) for this rank's tokens (1 / (tokens per micro-batch * micro-batches)).
  SegmentCompute(const Dims& d, float dloss_scale, std::vector<bool> checkpointed_layers);

  int segments() const { return d_.L + 2; }   // 0 = embedding, 1..L = blocks, L+1 = head
  void set_batch(int micro_batch, std::vector<std::int32_t> inputs, std::vector<std::int32_t> targets);

  // params/grads: the segment's tensors in param_tensors.h order (the head's list is [norm, lm_head]
  // with lm_head = the embedding when tied; the embedding's [wte]).
  void forward(int seg, int mb, const std::vector<float*>& params, float* act);
  void recompute(int seg, int mb, const std::vector<float*>& params, float* act, float* recomp);
  // Recompute as non-reentrant checkpointing's early stop does (block_forward's stop_early): the
  // program's recompute kernels (models/kernels_recompute.cpp) follow the same rule.
  void set_recompute_early_stop(bool on) { early_stop_ = on; }
  void backward(int seg, int mb, const std::vector<float*>& params, const std::vector<float*>& grads, float* act,
                float* recomp);

  double loss_sum(int mb) const { return loss_[mb]; }   // summed token loss of a micro-batch's forward
  Bytes untracked_bytes() const;                      // scratch outside the program's buffers
  // Bytes this runtime keeps per segment in the program's act / recomp buffers (for the check
  // against the buffer sizes the lowering chose).
  Bytes act_bytes(int seg) const;
  Bytes recomp_bytes(int seg) const;

 private:
  BlockActs bind(float* act, float* recomp, int layer) const;

  Dims d_;
  float dloss_scale_;
  std::vector<bool> ckpt_;
  bool early_stop_ = true;
  std::vector<std::vector<std::int32_t>> inputs_, targets_;
  std::vector<double> loss_;
  std::vector<float> x_, dx_;           // [N, C] residual stream and its gradient between segments
  std::vector<float> transient_;        // a full BlockActs for checkpointed forwards
  std::vector<float> scratch_;          // BlockScratch
  std::vector<float> head_aux_;         // final-norm input/stats/output
};

}  // namespace fsdpsim::runtime
