#include "runtime/layers/cross_entropy.h"

#include <algorithm>
#include <cmath>

namespace fsdpsim::runtime {

double cross_entropy_forward(float* logp, const float* logits, const std::int32_t* targets, int N, int V) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    const float* x = logits + static_cast<long>(n) * V;
    float* y = logp + static_cast<long>(n) * V;
    float mx = x[0];
    for (int i = 1; i < V; ++i) mx = std::max(mx, x[i]);
    double sum = 0;
    for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
    const double lse = mx + std::log(sum);
    const double target_logit = x[targets[n]];
    for (int i = 0; i < V; ++i) y[i] = static_cast<float>(x[i] - lse);
    total += lse - target_logit;
  }
  return total;
}

void cross_entropy_backward(float* dlogits, const float* logp, const std::int32_t* targets, int N, int V,
                            float dloss_scale) {
  for (int n = 0; n < N; ++n) {
    const float* y = logp + static_cast<long>(n) * V;
    float* d = dlogits + static_cast<long>(n) * V;
    for (int i = 0; i < V; ++i) d[i] = (std::exp(y[i]) - (i == targets[n] ? 1.0f : 0.0f)) * dloss_scale;
  }
}

}  // namespace fsdpsim::runtime
