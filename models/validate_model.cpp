// One place that decides whether a ModelSpec is sane (style.md lesson 7): every size positive,
// heads divisible by kv heads, top-k within the experts, and nothing absurd. The limits are far above
// any published model (the largest dense models have hidden ~ 2.5e4, ~ 1.3e2 layers, ~ 1e12 params) and
// exist to turn a typo into an error instead of an overflow or an hours-long search.
// Fields are named the way the user's file spells them (SOURCE:n_embd for gpt2, SOURCE:d_model for mpt).
#include <cstdio>
#include <string>
#include <utility>

#include "common/errors.h"
#include "models/zoo.h"

namespace fsdpsim::models {
namespace {

constexpr std::int64_t kMaxHidden = 1'000'000;
constexpr std::int64_t kMaxLayers = 10'000;
constexpr std::int64_t kMaxHeads = 100'000;
constexpr std::int64_t kMaxHeadDim = 65'536;
constexpr std::int64_t kMaxFfn = 10'000'000;
constexpr std::int64_t kMaxVocab = 100'000'000;
constexpr std::int64_t kMaxPositions = std::int64_t{1} << 30;
constexpr std::int64_t kMaxExperts = 100'000;
constexpr double kMaxTotalParams = 1e14;

struct Keys {
  const char *hidden, *layers, *heads, *kv, *head_dim, *ffn, *vocab, *positions, *experts, *top_k;
};

Keys keys_for(const std::string& type) {
  if (type == "gpt2") return {"n_embd", "n_layer", "n_head", "n_head", "n_embd", "n_inner", "vocab_size", "n_positions", "num_local_experts", "num_experts_per_tok"};
  if (type == "mpt") return {"d_model", "n_layers", "n_heads", "attn_config.kv_n_heads", "d_model", "expansion_ratio", "vocab_size", "max_seq_len", "num_local_experts", "num_experts_per_tok"};
  return {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings", "num_local_experts", "num_experts_per_tok"};
}

void check_range(const std::string& source, const char* key, std::int64_t v, std::int64_t lo, std::int64_t hi) {
  if (v < lo || v > hi)
    throw InputError(source + ":" + key, std::to_string(v),
                     "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

void validate_model(const ModelSpec& m, const std::string& source) {
  const Keys k = keys_for(m.model_type);
  check_range(source, k.hidden, m.hidden, 1, kMaxHidden);
  check_range(source, k.layers, m.n_layers, 1, kMaxLayers);
  check_range(source, k.heads, m.n_heads, 1, kMaxHeads);
  check_range(source, k.kv, m.n_kv_heads, 1, kMaxHeads);
  check_range(source, k.head_dim, m.head_dim, 1, kMaxHeadDim);
  check_range(source, k.ffn, m.ffn_hidden, 1, kMaxFfn);
  check_range(source, k.vocab, m.vocab_size, 1, kMaxVocab);
  check_range(source, k.positions, m.max_positions, m.positions == PositionKind::Learned ? 1 : 0, kMaxPositions);
  if (m.n_heads % m.n_kv_heads != 0)
    throw InputError(source + ":" + k.kv, std::to_string(m.n_kv_heads),
                     "a divisor of " + std::string(k.heads) + " (" + std::to_string(m.n_heads) + ")");
  if (m.rotary_dim != 0) {
    const char* key = m.model_type == "gpt_neox" ? "rotary_pct" : "partial_rotary_factor";
    if (m.positions != PositionKind::Rotary || m.rotary_dim < 2 || m.rotary_dim > m.head_dim || m.rotary_dim % 2 != 0)
      throw InputError(source + ":" + key, std::to_string(m.rotary_dim) + " rotated dimensions",
                       "an even number of dimensions in [2, head_dim = " + std::to_string(m.head_dim) + "] (rotary positions)");
  }
  if (m.parallel_residual && m.block_norms != 1 && m.block_norms != 2)
    throw InputError(source + ":use_parallel_residual", "true",
                     "a block of one shared norm or two pre-norms (this block has " + std::to_string(m.block_norms) + ")");
  if (m.n_experts != 0 || m.experts_top_k != 0) {
    check_range(source, k.experts, m.n_experts, 1, kMaxExperts);
    check_range(source, k.top_k, m.experts_top_k, 1, m.n_experts);
  }
  // Dropout probabilities: [0, 1) (p = 1 zeroes the branch: nn.Dropout allows it, no training config uses it).
  const bool gpt2 = m.model_type == "gpt2", mpt = m.model_type == "mpt";
  for (const auto& [key, p] : {std::pair<const char*, double>{"resid_pdrop", m.resid_dropout},
                               {gpt2 ? "embd_pdrop" : mpt ? "emb_pdrop" : "embd_pdrop", m.embd_dropout},
                               {gpt2 ? "attn_pdrop" : mpt ? "attn_config.attn_pdrop" : "attention_dropout", m.attn_dropout}}) {
    if (!(p >= 0.0 && p < 1.0)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", p);
      throw InputError(source + ":" + key, buf, "a dropout probability in [0, 1)");
    }
  }
  // Total parameters, in floating point first: the exact int64 count could overflow for absurd input.
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn_hidden);
  const double qkvo = h * static_cast<double>(m.head_dim) * static_cast<double>(2 * m.n_heads + 2 * m.n_kv_heads);
  const double mlp = 3.0 * h * f * static_cast<double>(m.n_experts > 0 ? m.n_experts : 1);
  const double approx = static_cast<double>(m.n_layers) * (qkvo + mlp) +
                        h * (2.0 * static_cast<double>(m.vocab_size) + static_cast<double>(m.max_positions));
  if (approx > kMaxTotalParams) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g", approx);
    throw InputError(source + ":" + k.hidden, std::to_string(m.hidden),
                     std::string("a model of at most 1e14 parameters (these sizes give about ") + buf + ")");
  }
}

}  // namespace fsdpsim::models
