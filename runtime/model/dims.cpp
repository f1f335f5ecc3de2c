#include "runtime/model/dims.h"

#include <limits>
#include <string>

#include "common/errors.h"

namespace fsdpsim::runtime {

Dims runtime_dims(const models::ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len) {
  const std::string what = "the CPU runtime implements Llama-family models";
  if (m.norm != models::NormKind::RMSNorm) throw InputError("model.norm", "LayerNorm", what + " (RMSNorm)");
  if (m.mlp != models::MlpKind::SwiGLU) throw InputError("model.mlp", m.mlp == models::MlpKind::GeGLU ? "GeGLU" : "Plain", what + " (SwiGLU MLP)");
  if (m.positions != models::PositionKind::Rotary) throw InputError("model.positions", "learned", what + " (rotary positions)");
  if (m.parallel_residual) throw InputError("model.parallel_residual", "true", what + " (sequential blocks)");
  if (m.rope_dims() != m.head_dim)
    throw InputError("model.rotary_dim", std::to_string(m.rotary_dim), what + " (RoPE on the whole head)");
  if (m.is_moe()) throw InputError("model.n_experts", std::to_string(m.n_experts), what + " (dense MLP, n_experts = 0)");
  if (m.n_kv_heads <= 0 || m.n_heads % m.n_kv_heads != 0)
    throw InputError("model.n_kv_heads", std::to_string(m.n_kv_heads), "a positive divisor of n_heads");
  if (m.head_dim % 2 != 0) throw InputError("model.head_dim", std::to_string(m.head_dim), "an even number (rotary pairs)");
  // Every GEMM dimension and element count of one tensor must fit the int BLAS interface.
  const std::int64_t lim = std::numeric_limits<int>::max();
  auto check = [&](const char* field, std::int64_t v) {
    if (v <= 0 || v > lim) throw InputError(field, std::to_string(v), "a positive size below 2^31 for the CPU runtime");
  };
  check("plan.micro_batch", micro_batch);
  check("plan.seq_len", seq_len);
  check("plan.micro_batch*seq_len", micro_batch * seq_len);
  check("model.vocab_size", m.vocab_size);
  check("model.hidden", m.hidden);
  check("model.ffn_hidden", m.ffn_hidden);
  check("model.n_layers", m.n_layers);
  if (micro_batch * seq_len > lim / std::max<std::int64_t>(m.vocab_size, m.ffn_hidden))
    throw InputError("plan.micro_batch*seq_len", std::to_string(micro_batch * seq_len),
                     "small enough that the [tokens, vocab] logits fit in 2^31 elements (CPU runtime)");
  Dims d;
  d.B = static_cast<int>(micro_batch);
  d.T = static_cast<int>(seq_len);
  d.C = static_cast<int>(m.hidden);
  d.NH = static_cast<int>(m.n_heads);
  d.NKV = static_cast<int>(m.n_kv_heads);
  d.HD = static_cast<int>(m.head_dim);
  d.F = static_cast<int>(m.ffn_hidden);
  d.V = static_cast<int>(m.vocab_size);
  d.L = static_cast<int>(m.n_layers);
  d.qkv_bias = m.qkv_bias;
  d.out_bias = m.out_bias;
  d.mlp_bias = m.mlp_bias;
  d.tied = m.tied_embeddings;
  return d;
}

}  // namespace fsdpsim::runtime
