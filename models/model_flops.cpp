// Model FLOPs per token, the convention MFU is quoted in (PaLM appendix B; llm-foundry's
// `flops_per_batch`; torchtitan's `get_num_flop_per_token`). Derivation:
//   * A matmul y[T, n] = x[T, k] W[k, n] costs 2*k*n FLOPs per token (one multiply + one add per
//     weight), so all matmuls of the forward cost 2 * (matmul weights a token goes through). That is
//     ParamCounts::matmul_active: every block's attention and MLP weights (for MoE only the router and
//     the top_k experts a token is routed to) plus the LM head [V, h] (counted even when tied: the
//     head is still a matmul; the embedding lookup is not). Biases, norms, position tables and
//     elementwise ops are left out (they are O(h) per token, < 0.1% for the zoo).
//   * Attention's sequence term per layer and token: QK^T is 2 * s * (n_heads * head_dim) FLOPs and
//     AV the same, so 4 * s * n_heads * head_dim. No causal halving: a causal kernel executes about
//     half of it, but PaLM and llm-foundry count the full square, and so do we (kernels.cpp times the
//     executed half instead).
//   * Backward: two matmuls per forward matmul (input grad and weight grad) => 2x forward, so
//     fwd+bwd = 3x forward. Activation-checkpointing recompute is NOT included (that would be HFU).
#include <algorithm>

#include "models/model_spec.h"

namespace fsdpsim::models {

FlopsPerToken flops_per_token(const ModelSpec& m, std::int64_t seq_len) {
  const ParamCounts c = count_params(m);
  FlopsPerToken f;
  f.matmul_forward = 2.0 * static_cast<double>(c.matmul_active);
  f.attention_forward = 4.0 * static_cast<double>(m.n_layers) * static_cast<double>(seq_len) *
                        static_cast<double>(m.n_heads) * static_cast<double>(m.head_dim);
  f.forward = f.matmul_forward + f.attention_forward;
  f.forward_backward = 3.0 * f.forward;
  return f;
}

double trained_flops_per_token(const ModelSpec& m, std::int64_t seq_len, double trainable_fraction) {
  const FlopsPerToken f = flops_per_token(m, seq_len);
  if (trainable_fraction >= 1.0) return f.forward_backward;
  return f.forward_backward - (1.0 - std::max(0.0, trainable_fraction)) * f.matmul_forward;
}

}  // namespace fsdpsim::models
