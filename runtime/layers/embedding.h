// Token embedding (nn.Embedding): out[b,t,:] = wte[tokens[b,t],:].
#pragma once
#include <cstdint>

namespace fsdpsim::runtime {

// out[N,C], tokens[N] (N = B*T), wte[V,C].
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, int N, int C);
// dwte[V,C] += scatter of dout[N,C] by token, rows visited in order (deterministic).
void embedding_backward(float* dwte, const float* dout, const std::int32_t* tokens, int N, int C);

}  // namespace fsdpsim::runtime
