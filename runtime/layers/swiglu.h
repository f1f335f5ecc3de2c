// SwiGLU activation of the Llama MLP: act = silu(gate), h = act * up, silu(x) = x * sigmoid(x).
// (The gate/up/down projections are matmul.h layers.) Eager PyTorch (F.silu then mul) saves gate
// (silu's input), act and up (the mul's inputs); we keep the same three.
#pragma once

namespace fsdpsim::runtime {

// act[N] = silu(gate[N]); h[N] = act * up[N]  (N = B*T*F elements). act may be null.
void swiglu_forward(float* act, float* h, const float* gate, const float* up, long N);
// dgate[N], dup[N] are overwritten from dh[N] and the forward's gate[N], act[N] (= silu(gate)), up[N].
void swiglu_backward(float* dgate, float* dup, const float* dh, const float* gate, const float* act, const float* up,
                     long N);

}  // namespace fsdpsim::runtime
