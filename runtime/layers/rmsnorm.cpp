#include "runtime/layers/rmsnorm.h"

#include <cmath>

namespace fsdpsim::runtime {

namespace {
float row_rstd(const float* x, int C) {
  double ss = 0;   // double: the row sum of squares is the only long reduction here
  for (int c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * x[c];
  return static_cast<float>(1.0 / std::sqrt(ss / C + kRmsNormEps));
}
}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    float* y = out + static_cast<long>(n) * C;
    float r = row_rstd(x, C);
    if (rstd) rstd[n] = r;
    for (int c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
  }
}

// y_c = w_c x_c r, r = (mean(x^2)+eps)^-1/2.  dx_j = r w_j g_j - r^3 x_j / C * sum_c(g_c w_c x_c).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* g = dout + static_cast<long>(n) * C;
    float r = rstd ? rstd[n] : row_rstd(x, C);
    double dot = 0;
    for (int c = 0; c < C; ++c) dot += static_cast<double>(g[c]) * weight[c] * x[c];
    float k = static_cast<float>(dot / C) * r * r * r;
    if (dinp) {
      float* dx = dinp + static_cast<long>(n) * C;
      for (int c = 0; c < C; ++c) dx[c] += r * weight[c] * g[c] - k * x[c];
    }
    if (dweight)
      for (int c = 0; c < C; ++c) dweight[c] += g[c] * x[c] * r;
  }
}

}  // namespace fsdpsim::runtime
