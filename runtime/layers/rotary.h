// Rotary position embedding (RoPE, Su et al. 2021) in Hugging Face Llama's "rotate_half" layout:
// dimension i pairs with i + HD/2 and both rotate by the angle t * theta^(-2i/HD).
#pragma once

namespace fsdpsim::runtime {

// RoFormer / HF LlamaConfig default rope_theta = 10000.0 (ModelSpec carries no theta).
inline constexpr double kRopeTheta = 10000.0;

// In place on x[B,T,H,HD] (H heads of HD dims; HD even): x <- R(t) x.
void rotary_forward(float* x, int B, int T, int H, int HD);
// In place on the gradient dx[B,T,H,HD]: dx <- R(t)^T dx (a rotation's inverse is its transpose).
void rotary_backward(float* dx, int B, int T, int H, int HD);

}  // namespace fsdpsim::runtime
