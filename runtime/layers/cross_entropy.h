// Cross-entropy over the vocabulary as F.cross_entropy(logits.float(), targets) runs it: the
// forward saves its fp32 log_softmax output for the backward (models/model_activations.cpp counts
// exactly that tensor next to the logits).
#pragma once
#include <cstdint>

namespace fsdpsim::runtime {

// logp[N,V] = log_softmax(logits[N,V]) (logp may alias logits); returns the summed token loss
// sum_n -logp[n, targets[n]] accumulated in double in row order.
double cross_entropy_forward(float* logp, const float* logits, const std::int32_t* targets, int N, int V);
// dlogits[N,V] = (exp(logp) - onehot(targets)) * dloss_scale (dlogits may alias logp).
void cross_entropy_backward(float* dlogits, const float* logp, const std::int32_t* targets, int N, int V,
                            float dloss_scale);

}  // namespace fsdpsim::runtime
