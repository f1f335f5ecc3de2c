#include "runtime/layers/swiglu.h"

#include <cmath>

namespace fsdpsim::runtime {

void swiglu_forward(float* act, float* h, const float* gate, const float* up, long N) {
  for (long i = 0; i < N; ++i) {
    const float g = gate[i];
    const float a = g / (1.0f + std::exp(-g));
    if (act) act[i] = a;
    h[i] = a * up[i];
  }
}

// d silu(g)/dg = sig(g) (1 + g (1 - sig(g))).
void swiglu_backward(float* dgate, float* dup, const float* dh, const float* gate, const float* act, const float* up,
                     long N) {
  for (long i = 0; i < N; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    dup[i] = dh[i] * act[i];
    dgate[i] = dh[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

}  // namespace fsdpsim::runtime
