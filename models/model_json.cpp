// ModelSpec as JSON (model-info --json, plan and report files): every field, enums as words.
#include "models/zoo.h"

namespace fsdpsim::models {
namespace {

const char* norm_name(NormKind k) { return k == NormKind::RMSNorm ? "rmsnorm" : "layernorm"; }
const char* mlp_name(MlpKind k) {
  switch (k) {
    case MlpKind::SwiGLU: return "swiglu";
    case MlpKind::GeGLU: return "geglu";
    case MlpKind::Plain: return "plain";
  }
  return "plain";
}
const char* pos_name(PositionKind k) { return k == PositionKind::Rotary ? "rotary" : "learned"; }

}  // namespace

nlohmann::json model_to_json(const ModelSpec& m) {
  nlohmann::json j;
  j["name"] = m.name;
  j["model_type"] = m.model_type;
  j["block_class"] = m.block_class;
  j["vocab_size"] = m.vocab_size;
  j["hidden"] = m.hidden;
  j["n_layers"] = m.n_layers;
  j["n_heads"] = m.n_heads;
  j["n_kv_heads"] = m.n_kv_heads;
  j["head_dim"] = m.head_dim;
  j["ffn_hidden"] = m.ffn_hidden;
  j["max_positions"] = m.max_positions;
  j["qkv_bias"] = m.qkv_bias;
  j["out_bias"] = m.out_bias;
  j["mlp_bias"] = m.mlp_bias;
  j["norm"] = norm_name(m.norm);
  j["norm_bias"] = m.norm == NormKind::LayerNorm && m.norm_bias;
  j["mlp"] = mlp_name(m.mlp);
  j["hidden_act"] = m.hidden_act;
  j["positions"] = pos_name(m.positions);
  j["positions_follow_seq_len"] = m.positions_follow_seq_len;
  j["tied_embeddings"] = m.tied_embeddings;
  j["n_experts"] = m.n_experts;
  j["experts_top_k"] = m.experts_top_k;
  j["block_norms"] = m.block_norms;
  j["qk_norm"] = m.qk_norm == QkNorm::PerHead ? "per_head" : m.qk_norm == QkNorm::Full ? "full" : "none";
  j["resid_dropout"] = m.resid_dropout;
  j["embd_dropout"] = m.embd_dropout;
  j["attn_dropout"] = m.attn_dropout;
  j["parallel_residual"] = m.parallel_residual;
  j["rotary_dim"] = m.positions == PositionKind::Rotary ? m.rope_dims() : 0;
  j["lm_head_bias"] = m.lm_head_bias;
  return j;
}

}  // namespace fsdpsim::models
