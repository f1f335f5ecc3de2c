#include "runtime/layers/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace fsdpsim::runtime {

namespace {
inline const float* row(const float* base, int b, int t, int h, int T, int H, int HD) {
  return base + ((static_cast<long>(b) * T + t) * H + h) * HD;
}
inline float* row(float* base, int b, int t, int h, int T, int H, int HD) {
  return base + ((static_cast<long>(b) * T + t) * H + h) * HD;
}
inline float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HD) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int group = NH / NKV;
  std::vector<float> s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int kvh = h / group;
      for (int t = 0; t < T; ++t) {
        const float* qt = row(q, b, t, h, T, NH, HD);
        float mx = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          s[u] = dot(qt, row(k, b, u, kvh, T, NKV, HD), HD) * scale;
          mx = std::max(mx, s[u]);
        }
        float sum = 0;
        for (int u = 0; u <= t; ++u) {
          s[u] = std::exp(s[u] - mx);
          sum += s[u];
        }
        float* o = row(out, b, t, h, T, NH, HD);
        std::memset(o, 0, sizeof(float) * HD);
        const float inv = 1.0f / sum;
        for (int u = 0; u <= t; ++u) {
          const float p = s[u] * inv;
          const float* vu = row(v, b, u, kvh, T, NKV, HD);
          for (int d = 0; d < HD; ++d) o[d] += p * vu[d];
        }
        lse[(static_cast<long>(b) * NH + h) * T + t] = mx + std::log(sum);
      }
    }
}

// With P = softmax(S), S = scale * q k^T:  dV = P^T dO;  dP = dO V^T;  dS = P o (dP - D),
// D_t = rowsum(dO_t o O_t);  dQ = scale dS K;  dK = scale dS^T Q.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, int B, int T, int NH, int NKV, int HD) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int group = NH / NKV;
  std::memset(dq, 0, sizeof(float) * static_cast<long>(B) * T * NH * HD);
  std::memset(dk, 0, sizeof(float) * static_cast<long>(B) * T * NKV * HD);
  std::memset(dv, 0, sizeof(float) * static_cast<long>(B) * T * NKV * HD);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int kvh = h / group;
      for (int t = 0; t < T; ++t) {
        const float* qt = row(q, b, t, h, T, NH, HD);
        const float* dot_ = row(dout, b, t, h, T, NH, HD);
        const float D = dot(dot_, row(out, b, t, h, T, NH, HD), HD);
        const float l = lse[(static_cast<long>(b) * NH + h) * T + t];
        float* dqt = row(dq, b, t, h, T, NH, HD);
        for (int u = 0; u <= t; ++u) {
          const float* ku = row(k, b, u, kvh, T, NKV, HD);
          const float* vu = row(v, b, u, kvh, T, NKV, HD);
          const float p = std::exp(dot(qt, ku, HD) * scale - l);
          const float dp = dot(dot_, vu, HD);
          const float ds = p * (dp - D) * scale;
          float* dku = row(dk, b, u, kvh, T, NKV, HD);
          float* dvu = row(dv, b, u, kvh, T, NKV, HD);
          for (int d = 0; d < HD; ++d) {
            dqt[d] += ds * ku[d];
            dku[d] += ds * qt[d];
            dvu[d] += p * dot_[d];
          }
        }
      }
    }
}

}  // namespace fsdpsim::runtime
