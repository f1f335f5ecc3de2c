#include "runtime/layers/embedding.h"

#include <cstring>

namespace fsdpsim::runtime {

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, int N, int C) {
  for (int n = 0; n < N; ++n)
    std::memcpy(out + static_cast<long>(n) * C, wte + static_cast<long>(tokens[n]) * C, sizeof(float) * C);
}

void embedding_backward(float* dwte, const float* dout, const std::int32_t* tokens, int N, int C) {
  for (int n = 0; n < N; ++n) {
    float* row = dwte + static_cast<long>(tokens[n]) * C;
    const float* g = dout + static_cast<long>(n) * C;
    for (int c = 0; c < C; ++c) row[c] += g[c];
  }
}

}  // namespace fsdpsim::runtime
