// Hugging Face config.json import (ecosystem.md section 3), model types llama, mistral, qwen2, gemma,
// mixtral, gemma2, phi3, qwen3, olmo2, gpt2, gpt_neox, phi, and llm-foundry's mpt. The file is read as-is: keys this importer does not use
// (torch_dtype, rope_theta, rms_norm_eps, architectures, sliding_window, ...) are ignored on purpose,
// because they change neither the parameter count nor FLOPs nor activation bytes, and real configs
// carry dozens of them. Keys it does use are type-checked and named in errors as SOURCE:key.
//
// Defaults for absent keys are the transformers / llm-foundry config-class defaults:
//   num_key_value_heads -> num_attention_heads; head_dim -> hidden_size / num_attention_heads;
//   tie_word_embeddings -> true for gemma, gemma2 (GemmaConfig, Gemma2Config) and gpt2/mpt, false for
//   llama, mistral, qwen2, mixtral, phi3, qwen3, olmo2, gpt_neox, phi; head_dim absent: qwen3 128 (Qwen3Config), gemma2
//   256 (Gemma2Config); gpt2 n_inner null -> 4 * n_embd, n_positions -> 1024; mpt expansion_ratio 4,
//   max_seq_len 2048, no_bias false, learned_pos_emb true (MPTConfig).
// Size fields (hidden, layers, heads, vocab, intermediate size, experts) are required: a default
// would silently describe another model.
#include <cmath>
#include <cstdio>
#include <string>

#include "common/errors.h"
#include "common/json_reader.h"
#include "models/zoo.h"

namespace fsdpsim::models {
namespace {

constexpr std::int64_t kWide = std::int64_t{1} << 62;  // range checks proper happen in validate_model

// JsonReader with errors renamed to "SOURCE:key" and aliases ("n_embd" or "hidden_size").
class Cfg {
 public:
  Cfg(const Json& j, std::string source) : j_(j), r_(j, ""), src_(std::move(source)) {}
  std::string field(const std::string& key) const { return src_ + ":" + key; }
  bool has(const std::string& key) const { return r_.has(key); }
  // First present key of `keys`; missing all -> InputError naming the first.
  std::int64_t req_int(std::initializer_list<const char*> keys, const std::string& why) const {
    for (const char* k : keys)
      if (r_.has(k)) return get_int(k);
    throw InputError(field(*keys.begin()), "<missing>", "required for model_type " + why);
  }
  std::int64_t opt_int(std::initializer_list<const char*> keys, std::int64_t dflt) const {
    for (const char* k : keys)
      if (r_.has(k)) return get_int(k);
    return dflt;
  }
  bool opt_bool(const std::string& key, bool dflt) const { return rename([&] { return r_.get_bool(key, dflt); }); }
  std::string opt_string(std::initializer_list<const char*> keys, const std::string& dflt) const {
    for (const char* k : keys)
      if (r_.has(k)) return rename([&] { return r_.get_string(k); });
    return dflt;
  }
  double opt_double(const std::string& key, double dflt) const {
    return rename([&] { return r_.get_double(key, 0, 1e9, dflt); });
  }
  const Json& raw(const std::string& key) const { return j_.at(key); }

 private:
  std::int64_t get_int(const std::string& key) const { return rename([&] { return r_.get_int(key, -kWide, kWide); }); }
  template <class F>
  auto rename(F f) const -> decltype(f()) {
    try {
      return f();
    } catch (const InputError& e) {
      throw InputError(src_ + ":" + e.field(), e.value(), e.allowed());
    }
  }
  const Json& j_;
  JsonReader r_;
  std::string src_;
};

// The size keys transformers' configs share (required: a default would describe another model).
void read_sizes(const Cfg& c, const std::string& type, ModelSpec& m) {
  m.hidden = c.req_int({"hidden_size"}, type);
  m.n_layers = c.req_int({"num_hidden_layers"}, type);
  m.n_heads = c.req_int({"num_attention_heads"}, type);
  m.vocab_size = c.req_int({"vocab_size"}, type);
  m.ffn_hidden = c.req_int({"intermediate_size"}, type);
}

MlpKind gated_kind(const Cfg& c, const std::string& act, const std::string& key) {
  if (act.find("gelu") != std::string::npos) return MlpKind::GeGLU;
  if (act == "silu" || act == "swish") return MlpKind::SwiGLU;
  throw InputError(c.field(key), "\"" + act + "\"", "silu/swish (SwiGLU) or a gelu variant (GeGLU)");
}

// llama, mistral, qwen2, gemma, mixtral, gemma2, phi3, qwen3, olmo2: one family, a few per-type
// defaults and block shapes. What the newer types add that counts (transformers modeling_*.py):
//   gemma2  a norm after attention and after the MLP too (input_, post_attention_, pre_feedforward_,
//           post_feedforward_layernorm: 4 per block); its logit soft-capping and alternating sliding
//           window hold no parameters (the window would lower attention FLOPs past 4096 tokens: not
//           modelled, the FLOPs count full causal attention);
//   phi3    fused qkv_proj and gate_up_proj: the same parameters as separate projections;
//   qwen3   RMSNorm(head_dim) on the queries and on the keys (q_norm, k_norm), no QKV bias;
//   olmo2   norms after attention and after the MLP only (2 per block), and RMSNorm over all queries
//           and all keys (q_norm [heads*head_dim], k_norm [kv_heads*head_dim]).
void import_llama_family(const Cfg& c, const std::string& type, ModelSpec& m) {
  static const struct {
    const char* type;
    const char* cls;
    bool tied;
    std::int64_t max_pos;
    const char* act;
    std::int64_t head_dim;   // the config class's default when the file has no head_dim (0: hidden / heads)
  } kTypes[] = {
      // max_position_embeddings defaults: LlamaConfig 2048, MistralConfig 4096*32, Qwen2Config 32768,
      // GemmaConfig 8192, MixtralConfig 4096*32, Gemma2Config 8192, Phi3Config 4096, Qwen3Config 32768,
      // Olmo2Config 2048 (transformers configuration_*.py).
      {"llama", "LlamaDecoderLayer", false, 2048, "silu", 0},
      {"mistral", "MistralDecoderLayer", false, 4096 * 32, "silu", 0},
      {"qwen2", "Qwen2DecoderLayer", false, 32768, "silu", 0},
      {"gemma", "GemmaDecoderLayer", true, 8192, "gelu_pytorch_tanh", 0},
      {"mixtral", "MixtralDecoderLayer", false, 4096 * 32, "silu", 0},
      {"gemma2", "Gemma2DecoderLayer", true, 8192, "gelu_pytorch_tanh", 256},
      {"phi3", "Phi3DecoderLayer", false, 4096, "silu", 0},
      {"qwen3", "Qwen3DecoderLayer", false, 32768, "silu", 128},
      {"olmo2", "Olmo2DecoderLayer", false, 2048, "silu", 0},
  };
  const auto* t = &kTypes[0];
  for (const auto& k : kTypes)
    if (type == k.type) t = &k;
  m.block_class = t->cls;
  read_sizes(c, type, m);
  m.n_kv_heads = c.opt_int({"num_key_value_heads"}, m.n_heads);
  if (c.has("head_dim")) {
    m.head_dim = c.opt_int({"head_dim"}, 0);
  } else if (t->head_dim > 0) {
    m.head_dim = t->head_dim;
  } else {
    if (m.n_heads <= 0) throw InputError(c.field("num_attention_heads"), std::to_string(m.n_heads), "an integer >= 1");
    if (m.hidden % m.n_heads != 0)
      throw InputError(c.field("num_attention_heads"), std::to_string(m.n_heads),
                       "a divisor of hidden_size (" + std::to_string(m.hidden) + ") when head_dim is absent");
    m.head_dim = m.hidden / m.n_heads;
  }
  m.max_positions = c.opt_int({"max_position_embeddings"}, t->max_pos);
  m.tied_embeddings = c.opt_bool("tie_word_embeddings", t->tied);
  // gemma, gemma2: `hidden_activation` (newer files) wins over `hidden_act`.
  const char* act_key = (type == "gemma" || type == "gemma2") && c.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  m.hidden_act = c.opt_string({act_key}, t->act);
  m.mlp = gated_kind(c, m.hidden_act, act_key);
  m.norm = NormKind::RMSNorm;
  m.positions = PositionKind::Rotary;
  if (type == "qwen2") {
    m.qkv_bias = true;  // Qwen2Attention: q/k/v Linear(bias=True), o_proj bias=False
  } else if (type == "llama" || type == "gemma" || type == "gemma2" || type == "qwen3" || type == "olmo2") {
    const bool ab = c.opt_bool("attention_bias", false);  // bias on q, k, v and o
    m.qkv_bias = m.out_bias = ab;
  }
  if (type == "gemma2") m.block_norms = 4;
  if (type == "qwen3") m.qk_norm = QkNorm::PerHead;
  if (type == "olmo2") m.qk_norm = QkNorm::Full;
  if (type == "llama") m.mlp_bias = c.opt_bool("mlp_bias", false);
  // Dropout: every config of this family has attention_dropout (inside SDPA); phi3 also drops each residual
  // branch and the embeddings (modeling_phi3.py resid_attn_dropout / resid_mlp_dropout with resid_pdrop,
  // embed_dropout with embd_pdrop; Phi3Config defaults 0.0).
  m.attn_dropout = c.opt_double("attention_dropout", 0.0);
  if (type == "phi3") {
    m.resid_dropout = c.opt_double("resid_pdrop", 0.0);
    m.embd_dropout = c.opt_double("embd_pdrop", 0.0);
  }
  if (type == "mixtral") {
    m.n_experts = c.req_int({"num_local_experts", "num_experts"}, type);
    m.experts_top_k = c.req_int({"num_experts_per_tok"}, type);
  }
}

// hidden / heads, the error naming the file's heads key (configs without a head_dim key).
std::int64_t head_dim_of(const Cfg& c, const ModelSpec& m, const char* heads_key, const char* hidden_key) {
  if (m.n_heads <= 0) throw InputError(c.field(heads_key), std::to_string(m.n_heads), "an integer >= 1");
  if (m.hidden % m.n_heads != 0)
    throw InputError(c.field(heads_key), std::to_string(m.n_heads),
                     std::string("a divisor of ") + hidden_key + " (" + std::to_string(m.hidden) + ")");
  return m.hidden / m.n_heads;
}

void import_gpt2(const Cfg& c, ModelSpec& m) {
  m.block_class = "GPT2Block";
  m.hidden = c.req_int({"n_embd", "hidden_size"}, "gpt2");
  m.n_layers = c.req_int({"n_layer", "num_hidden_layers"}, "gpt2");
  m.n_heads = c.req_int({"n_head", "num_attention_heads"}, "gpt2");
  m.vocab_size = c.req_int({"vocab_size"}, "gpt2");
  m.n_kv_heads = m.n_heads;  // GPT-2 is multi-head attention
  m.head_dim = head_dim_of(c, m, "n_head", "n_embd");
  m.ffn_hidden = c.opt_int({"n_inner", "intermediate_size"}, 4 * m.hidden);  // n_inner null -> 4 * n_embd
  m.max_positions = c.opt_int({"n_positions", "max_position_embeddings"}, 1024);
  m.tied_embeddings = c.opt_bool("tie_word_embeddings", true);
  m.hidden_act = c.opt_string({"activation_function"}, "gelu_new");
  m.qkv_bias = m.out_bias = m.mlp_bias = true;  // Conv1D layers all carry a bias
  m.norm = NormKind::LayerNorm;
  m.mlp = MlpKind::Plain;
  m.positions = PositionKind::Learned;
  m.conv1d_weights = true;
  // GPT2Config's defaults (0.1 each): GPT2Model.drop after wte + wpe, GPT2Attention.resid_dropout after
  // c_proj, GPT2MLP.dropout after its c_proj; attn_pdrop inside SDPA.
  m.resid_dropout = c.opt_double("resid_pdrop", 0.1);
  m.embd_dropout = c.opt_double("embd_pdrop", 0.1);
  m.attn_dropout = c.opt_double("attn_pdrop", 0.1);
}

// The rotated dimensions of a head: int(head_dim * fraction), as GPTNeoXRotaryEmbedding / PhiRotaryEmbedding
// compute them (the fraction in (0, 1]; an odd result cannot be rotated in pairs).
std::int64_t rotary_dims(const Cfg& c, const char* key, double fraction, std::int64_t head_dim) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", fraction);
    throw InputError(c.field(key), buf, "a fraction of the head dimension in (0, 1]");
  }
  const auto r = static_cast<std::int64_t>(static_cast<double>(head_dim) * fraction);
  if (r < 2 || r % 2 != 0)
    throw InputError(c.field(key), std::to_string(fraction),
                     "a fraction giving an even number >= 2 of rotated dimensions (head_dim " + std::to_string(head_dim) +
                         " gives " + std::to_string(r) + ")");
  return r == head_dim ? 0 : r;
}

// GPT-NeoX (transformers modeling_gpt_neox.py; GPTNeoXConfig defaults): one query_key_value linear and
// dense, both with bias (attention_bias true); LayerNorm with bias; MLP dense_h_to_4h -> gelu ->
// dense_4h_to_h with biases; RoPE on rotary_pct of each head (the rest concatenated back); with
// use_parallel_residual (default true) y = x + attn(ln_1(x)) + mlp(ln_2(x)); embed_out untied by default;
// hidden_dropout drops the embeddings and both branches (post_attention_dropout, post_mlp_dropout).
void import_gpt_neox(const Cfg& c, ModelSpec& m) {
  m.block_class = "GPTNeoXLayer";
  read_sizes(c, "gpt_neox", m);
  m.n_kv_heads = m.n_heads;
  m.head_dim = head_dim_of(c, m, "num_attention_heads", "hidden_size");
  m.max_positions = c.opt_int({"max_position_embeddings"}, 2048);
  m.tied_embeddings = c.opt_bool("tie_word_embeddings", false);
  m.hidden_act = c.opt_string({"hidden_act"}, "gelu");
  const bool bias = c.opt_bool("attention_bias", true);
  m.qkv_bias = m.out_bias = bias;
  m.mlp_bias = true;
  m.norm = NormKind::LayerNorm;
  m.mlp = MlpKind::Plain;
  m.positions = PositionKind::Rotary;
  const char* frac_key = c.has("partial_rotary_factor") ? "partial_rotary_factor" : "rotary_pct";
  m.rotary_dim = rotary_dims(c, frac_key, c.opt_double(frac_key, 0.25), m.head_dim);
  m.parallel_residual = c.opt_bool("use_parallel_residual", true);
  m.resid_dropout = m.embd_dropout = c.opt_double("hidden_dropout", 0.0);
  m.attn_dropout = c.opt_double("attention_dropout", 0.0);
}

// Phi (transformers modeling_phi.py; PhiConfig defaults): q_proj, k_proj, v_proj, dense with biases; one
// LayerNorm (input_layernorm) feeding attention and MLP in parallel, y = x + attn(ln(x)) + mlp(ln(x));
// MLP fc1 -> gelu_new -> fc2 with biases; RoPE on partial_rotary_factor (0.5) of each head; final_layernorm;
// lm_head with a bias; resid_pdrop on both branches, embd_pdrop after the embedding.
void import_phi(const Cfg& c, ModelSpec& m) {
  m.block_class = "PhiDecoderLayer";
  read_sizes(c, "phi", m);
  m.head_dim = head_dim_of(c, m, "num_attention_heads", "hidden_size");
  // num_key_value_heads: null or absent -> num_attention_heads (PhiConfig)
  m.n_kv_heads = c.has("num_key_value_heads") && !c.raw("num_key_value_heads").is_null()
                     ? c.opt_int({"num_key_value_heads"}, m.n_heads) : m.n_heads;
  if (c.opt_bool("qk_layernorm", false))
    throw InputError(c.field("qk_layernorm"), "true", "false (Phi's per-head LayerNorms on q and k are not modelled)");
  m.max_positions = c.opt_int({"max_position_embeddings"}, 2048);
  m.tied_embeddings = c.opt_bool("tie_word_embeddings", false);
  m.hidden_act = c.opt_string({"hidden_act"}, "gelu_new");
  m.qkv_bias = m.out_bias = m.mlp_bias = true;
  m.lm_head_bias = !m.tied_embeddings;
  m.norm = NormKind::LayerNorm;
  m.mlp = MlpKind::Plain;
  m.positions = PositionKind::Rotary;
  m.rotary_dim = rotary_dims(c, "partial_rotary_factor", c.opt_double("partial_rotary_factor", 0.5), m.head_dim);
  m.parallel_residual = true;
  m.block_norms = 1;
  m.resid_dropout = c.opt_double("resid_pdrop", 0.0);
  m.embd_dropout = c.opt_double("embd_pdrop", 0.0);
  m.attn_dropout = c.opt_double("attention_dropout", 0.0);
}

// llm-foundry MPT (MPTConfig; also transformers' mpt model_type, which shares the keys).
void import_mpt(const Cfg& c, const Json& j, ModelSpec& m) {
  m.block_class = "MPTBlock";
  m.hidden = c.req_int({"d_model"}, "mpt");
  m.n_layers = c.req_int({"n_layers"}, "mpt");
  m.n_heads = c.req_int({"n_heads"}, "mpt");
  m.vocab_size = c.req_int({"vocab_size"}, "mpt");
  m.head_dim = head_dim_of(c, m, "n_heads", "d_model");
  m.n_kv_heads = m.n_heads;
  if (c.has("attn_config")) {
    const Json& ac = c.raw("attn_config");
    if (!ac.is_object()) throw InputError(c.field("attn_config"), json_value_for_message(ac), "a JSON object");
    Cfg a(ac, c.field("attn_config"));
    const std::string at = a.opt_string({"attn_type"}, "multihead_attention");
    if (at == "multiquery_attention") m.n_kv_heads = 1;
    else if (at == "grouped_query_attention") m.n_kv_heads = a.req_int({"kv_n_heads"}, "mpt with grouped_query_attention");
    m.attn_dropout = a.opt_double("attn_pdrop", 0.0);
  }
  // llm-foundry MPTConfig (defaults 0.0): MPTBlock.resid_attn_dropout / resid_ffn_dropout, MPTModel.emb_drop.
  m.resid_dropout = c.opt_double("resid_pdrop", 0.0);
  m.embd_dropout = c.opt_double("emb_pdrop", 0.0);
  const double ratio = c.opt_double("expansion_ratio", 4.0);
  const double ffn = ratio * static_cast<double>(m.hidden);
  if (ffn != std::floor(ffn) || ffn < 1)
    throw InputError(c.field("expansion_ratio"), json_value_for_message(j.at("expansion_ratio")),
                     "a ratio giving an integer d_model * expansion_ratio >= 1");
  m.ffn_hidden = static_cast<std::int64_t>(ffn);
  if (c.has("ffn_config")) {
    const Json& fc = c.raw("ffn_config");
    if (fc.is_object() && fc.contains("ffn_hidden_size") && !fc["ffn_hidden_size"].is_null())
      m.ffn_hidden = Cfg(fc, c.field("ffn_config")).opt_int({"ffn_hidden_size"}, m.ffn_hidden);
  }
  m.max_positions = c.opt_int({"max_seq_len"}, 2048);
  const bool no_bias = c.opt_bool("no_bias", false);
  m.qkv_bias = m.out_bias = m.mlp_bias = m.norm_bias = !no_bias;
  m.positions = c.opt_bool("learned_pos_emb", true) ? PositionKind::Learned : PositionKind::Rotary;
  // (learned_pos_emb false = ALiBi or RoPE: no position table either way; the kernels list RoPE.)
  m.tied_embeddings = c.opt_bool("tie_word_embeddings", true);
  m.norm = NormKind::LayerNorm;
  m.mlp = MlpKind::Plain;
  m.hidden_act = "gelu";
}

}  // namespace

ModelSpec import_hf_config(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object())
    throw InputError(source, json_value_for_message(config), "a JSON object (a Hugging Face config.json)");
  Cfg c(config, source);
  static const char* kAllowed =
      "one of llama, mistral, qwen2, gemma, mixtral, gemma2, phi3, qwen3, olmo2, gpt2, gpt_neox, phi, mpt";
  if (!c.has("model_type")) throw InputError(c.field("model_type"), "<missing>", kAllowed);
  const std::string type = c.opt_string({"model_type"}, "");
  ModelSpec m;
  m.model_type = type;
  m.name = c.opt_string({"_name_or_path"}, "");
  if (m.name.empty()) m.name = source;
  if (type == "llama" || type == "mistral" || type == "qwen2" || type == "gemma" || type == "mixtral" || type == "gemma2" ||
      type == "phi3" || type == "qwen3" || type == "olmo2") {
    import_llama_family(c, type, m);
  } else if (type == "gpt2") {
    import_gpt2(c, m);
  } else if (type == "gpt_neox") {
    import_gpt_neox(c, m);
  } else if (type == "phi") {
    import_phi(c, m);
  } else if (type == "mpt") {
    import_mpt(c, config, m);
  } else {
    throw InputError(c.field("model_type"), "\"" + type + "\"", kAllowed);
  }
  // fsdpsim's own key (zoo entries for llm-foundry benchmark shapes): the position table follows seq_len.
  m.positions_follow_seq_len = c.opt_bool("fsdpsim_positions_follow_seq_len", false);
  validate_model(m, source);
  return m;
}

}  // namespace fsdpsim::models
