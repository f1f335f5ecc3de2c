#include "runtime/layers/rotary.h"

#include <cmath>
#include <vector>

namespace fsdpsim::runtime {

namespace {
// sign = +1 rotates by +angle (forward), -1 by -angle (backward, the transpose).
void rotate(float* x, int B, int T, int H, int HD, float sign) {
  const int half = HD / 2;
  std::vector<float> cosv(half), sinv(half);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      double inv_freq = std::pow(kRopeTheta, -2.0 * i / HD);
      double a = t * inv_freq;
      cosv[i] = static_cast<float>(std::cos(a));
      sinv[i] = sign * static_cast<float>(std::sin(a));
    }
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        float* v = x + ((static_cast<long>(b) * T + t) * H + h) * HD;
        for (int i = 0; i < half; ++i) {
          float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * cosv[i] - x2 * sinv[i];
          v[i + half] = x2 * cosv[i] + x1 * sinv[i];
        }
      }
  }
}
}  // namespace

void rotary_forward(float* x, int B, int T, int H, int HD) { rotate(x, B, T, H, HD, 1.0f); }
void rotary_backward(float* dx, int B, int T, int H, int HD) { rotate(dx, B, T, H, HD, -1.0f); }

}  // namespace fsdpsim::runtime
