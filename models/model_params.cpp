// Exact parameter counts from the ModelSpec, tensor by tensor (nn.Linear weight [out, in] + optional
// bias [out]; RMSNorm weight [h]; LayerNorm weight [h] + bias [h] unless norm_bias is false).
// module_tree.cpp builds the same tensors by name; a test checks both agree on every zoo model.
//
// Per block (a = n_heads, g = n_kv_heads, d = head_dim, h = hidden, f = ffn_hidden, E = n_experts):
//   attention  q [a*d, h] + k [g*d, h] + v [g*d, h] + o [h, a*d]
//              + qkv_bias * (a*d + 2*g*d) + out_bias * h
//   dense MLP  gated (SwiGLU/GeGLU): gate [f, h] + up [f, h] + down [h, f] (+ mlp_bias * (2f + h))
//              plain (GELU):         up [f, h] + down [h, f]              (+ mlp_bias * (f + h))
//   MoE        router [E, h] (no bias, as Mixtral) + E experts, each one MLP as above
//   norms      block_norms per block (2: pre-attention, pre-MLP; gemma2 4), plus the q/k norms:
//              per head [d] twice (qwen3) or over the whole projections [a*d] + [g*d] (olmo2)
// Outside blocks: token embedding [V, h], learned positions [P, h], final norm, LM head [V, h]
// (0 when tied: the head reuses the embedding's weight) and its bias [V] where it has one (Phi).
#include "models/model_spec.h"

namespace fsdpsim::models {
namespace {

std::int64_t norm_params(const ModelSpec& m) {
  if (m.norm == NormKind::RMSNorm) return m.hidden;
  return m.norm_bias ? 2 * m.hidden : m.hidden;
}

struct MlpParams {
  std::int64_t weights = 0;
  std::int64_t biases = 0;
};

MlpParams one_mlp(const ModelSpec& m) {
  const std::int64_t h = m.hidden, f = m.ffn_hidden;
  if (m.mlp == MlpKind::Plain) return {2 * h * f, m.mlp_bias ? f + h : 0};
  return {3 * h * f, m.mlp_bias ? 2 * f + h : 0};
}

}  // namespace

ParamCounts count_params(const ModelSpec& m) {
  const std::int64_t h = m.hidden, a = m.n_heads, g = m.n_kv_heads, d = m.head_dim, V = m.vocab_size;
  ParamCounts c;

  const std::int64_t attn_weights = h * a * d + 2 * h * g * d + a * d * h;
  const std::int64_t attn_biases = (m.qkv_bias ? a * d + 2 * g * d : 0) + (m.out_bias ? h : 0);
  const MlpParams mlp = one_mlp(m);
  std::int64_t mlp_total = 0, mlp_active = 0, mlp_matmul_active = 0, mlp_biases = 0;
  if (m.is_moe()) {
    const std::int64_t router = m.n_experts * h;
    mlp_total = router + m.n_experts * (mlp.weights + mlp.biases);
    mlp_active = router + m.experts_top_k * (mlp.weights + mlp.biases);
    mlp_matmul_active = router + m.experts_top_k * mlp.weights;
    mlp_biases = m.n_experts * mlp.biases;
  } else {
    mlp_total = mlp_active = mlp.weights + mlp.biases;
    mlp_matmul_active = mlp.weights;
    mlp_biases = mlp.biases;
  }

  const std::int64_t qk = m.qk_norm == QkNorm::PerHead ? 2 * d : m.qk_norm == QkNorm::Full ? a * d + g * d : 0;
  c.block_norms = m.block_norms * norm_params(m) + qk;
  c.block_biases = attn_biases + mlp_biases;
  c.per_block = attn_weights + attn_biases + mlp_total + c.block_norms;
  c.active_per_block = attn_weights + attn_biases + mlp_active + c.block_norms;
  c.blocks = m.n_layers * c.per_block;
  c.positions = m.positions == PositionKind::Learned ? m.max_positions * h : 0;
  c.embedding = V * h + c.positions;
  c.final_norm = norm_params(m);
  c.lm_head = (m.tied_embeddings ? 0 : V * h) + (m.lm_head_bias ? V : 0);
  c.total = c.embedding + c.blocks + c.final_norm + c.lm_head;
  c.matmul_active = m.n_layers * (attn_weights + mlp_matmul_active) + V * h;
  return c;
}

}  // namespace fsdpsim::models
