#include "runtime/train/optimizer.h"

#include <cmath>

namespace fsdpsim::runtime {

void optimizer_step(const OptimizerConfig& cfg, float* p, const float* g, float* state, std::int64_t n, int step) {
  if (cfg.adamw) {
    float* m = state;
    float* v = state + n;
    const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), step);
    const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), step);
    const float step_size = static_cast<float>(cfg.lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    for (std::int64_t i = 0; i < n; ++i) {
      p[i] *= 1.0f - cfg.lr * cfg.weight_decay;
      m[i] = cfg.beta1 * m[i] + (1.0f - cfg.beta1) * g[i];
      v[i] = cfg.beta2 * v[i] + (1.0f - cfg.beta2) * g[i] * g[i];
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + cfg.eps);
    }
    return;
  }
  float* buf = state;
  for (std::int64_t i = 0; i < n; ++i) {
    float gi = g[i] + cfg.weight_decay * p[i];
    buf[i] = step == 1 ? gi : cfg.momentum * buf[i] + gi;
    p[i] -= cfg.lr * buf[i];
  }
}

}  // namespace fsdpsim::runtime
