// The optimizer step on flat fp32 arrays (a rank's shards, or the reference's full tensors). The
// update is elementwise, so a sharded step equals the unsharded one element by element; zero
// padding stays zero (zero grad and zero state give a zero update).
#pragma once
#include <cstdint>

namespace fsdpsim::runtime {

struct OptimizerConfig {
  bool adamw = true;          // false: SGD with momentum
  // torch.optim.AdamW defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2.
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 1e-2f;
  float momentum = 0.9f;      // SGD (common choice; torch.optim.SGD's default is 0)
  int states() const { return adamw ? 2 : 1; }   // fp32 state tensors per parameter
};

// One step (step = 1 for the first). state holds states() arrays of n floats, back to back.
// AdamW as torch.optim.AdamW (decoupled decay: p *= 1 - lr*wd, then the Adam update with bias
// correction); SGD as torch.optim.SGD with momentum (buf = g on the first step, then mu*buf + g).
void optimizer_step(const OptimizerConfig& cfg, float* params, const float* grads, float* state, std::int64_t n,
                    int step);

}  // namespace fsdpsim::runtime
