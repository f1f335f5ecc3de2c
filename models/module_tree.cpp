// The module tree of a ModelSpec as PyTorch would build it, with Hugging Face naming:
//   llama-family (llama, mistral, qwen2, gemma, mixtral): model.embed_tokens, model.layers.N.{self_attn.
//     {q,k,v,o}_proj, mlp.{gate,up,down}_proj | block_sparse_moe.{gate, experts.J.{w1,w2,w3}},
//     input_layernorm, post_attention_layernorm}, model.norm, lm_head;
//   gpt2: transformer.{wte, wpe, h.N.{ln_1, attn.{c_attn, c_proj}, ln_2, mlp.{c_fc, c_proj}}, ln_f}, lm_head;
//   mpt (llm-foundry): transformer.{wte, wpe, blocks.N.{norm_1, attn.{Wqkv, out_proj}, norm_2,
//     ffn.{up_proj, down_proj}}, norm_f} (lm_head only when untied);
//   gpt_neox (modeling_gpt_neox.py): gpt_neox.{embed_in, layers.N.{input_layernorm, post_attention_layernorm,
//     attention.{query_key_value, dense}, mlp.{dense_h_to_4h, dense_4h_to_h}}, final_layer_norm}, embed_out;
//   phi (modeling_phi.py): model.{embed_tokens, layers.N.{self_attn.{q_proj, k_proj, v_proj, dense},
//     mlp.{fc1, fc2}, input_layernorm}, final_layernorm}, lm_head (with a bias).
// Children are listed in registration order (= named_parameters order, which FSDP1 flattens in);
// exec_index records the order forward() calls them (a llama layer registers self_attn before
// input_layernorm but runs the norm first). Parameter-free modules (dropout, activations, rotary
// embedding) are left out: they own nothing FSDP shards. A tied LM head is kept, with no tensors:
// its weight belongs to the embedding (PyTorch dedups shared parameters to their first owner).
#include <algorithm>
#include <numeric>
#include <string>

#include "models/wrap_graph.h"

namespace fsdpsim::models {

std::int64_t ParamTensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

class TreeBuilder {
 public:
  explicit TreeBuilder(const std::string& root_type) {
    Module root;
    root.type = root_type;
    root.part = ModulePart::Embedding;
    mods_.push_back(root);
    exec_rank_.push_back(0);
  }
  // exec_rank orders siblings in forward execution (default: registration order).
  int add(int parent, const std::string& local, const std::string& type, ModulePart part, int layer, int exec_rank = -1) {
    Module m;
    m.name = mods_[parent].name.empty() ? local : mods_[parent].name + "." + local;
    m.type = type;
    m.parent = parent;
    m.part = part;
    m.layer = layer;
    const int id = static_cast<int>(mods_.size());
    mods_[parent].children.push_back(id);
    exec_rank_.push_back(exec_rank < 0 ? static_cast<int>(mods_[parent].children.size()) - 1 : exec_rank);
    mods_.push_back(std::move(m));
    return id;
  }
  void param(int mod, const std::string& pname, std::vector<std::int64_t> shape) {
    Module& m = mods_[mod];
    m.params.push_back({m.name + "." + pname, std::move(shape)});
    m.own_params += m.params.back().numel();
  }
  // nn.Linear: weight [out, in] (+ bias [out]); GPT-2's Conv1D: weight [in, out].
  int linear(int parent, const std::string& local, const std::string& type, std::int64_t in, std::int64_t out,
             bool bias, bool conv1d, ModulePart part, int layer) {
    const int id = add(parent, local, type, part, layer);
    param(id, "weight", conv1d ? std::vector<std::int64_t>{in, out} : std::vector<std::int64_t>{out, in});
    if (bias) param(id, "bias", {out});
    return id;
  }
  std::vector<Module> finish() {
    // subtree sums (children always have larger ids than their parent)
    for (auto& m : mods_) m.subtree_params = m.own_params;
    for (int i = static_cast<int>(mods_.size()) - 1; i > 0; --i) mods_[mods_[i].parent].subtree_params += mods_[i].subtree_params;
    int next = 0;
    assign_exec(0, next);
    return std::move(mods_);
  }

 private:
  void assign_exec(int id, int& next) {
    mods_[id].exec_index = next++;
    std::vector<int> kids = mods_[id].children;
    std::stable_sort(kids.begin(), kids.end(), [&](int x, int y) { return exec_rank_[x] < exec_rank_[y]; });
    for (int k : kids) assign_exec(k, next);
  }
  std::vector<Module> mods_;
  std::vector<int> exec_rank_;
};

struct Names {
  std::string prefix;        // class-name prefix: "Llama", "Mistral", "GPT2", "MPT", ...
  std::string root_type, base, base_type, embed, pos, layers, norm_f;
  std::string in_norm, attn, post_norm, mlp;
};

Names names_for(const ModelSpec& m) {
  Names n;
  if (m.model_type == "gpt2") {
    n = {"GPT2", "GPT2LMHeadModel", "transformer", "GPT2Model", "wte", "wpe", "h", "ln_f", "ln_1", "attn", "ln_2", "mlp"};
  } else if (m.model_type == "mpt") {
    n = {"MPT", "MPTForCausalLM", "transformer", "MPTModel", "wte", "wpe", "blocks", "norm_f", "norm_1", "attn", "norm_2", "ffn"};
  } else if (m.model_type == "gpt_neox") {
    n = {"GPTNeoX", "GPTNeoXForCausalLM", "gpt_neox", "GPTNeoXModel", "embed_in", "", "layers", "final_layer_norm",
         "input_layernorm", "attention", "post_attention_layernorm", "mlp"};
  } else if (m.model_type == "phi") {
    n = {"Phi", "PhiForCausalLM", "model", "PhiModel", "embed_tokens", "", "layers", "final_layernorm",
         "input_layernorm", "self_attn", "", "mlp"};
  } else {
    std::string p = m.block_class;
    const std::string suffix = "DecoderLayer";
    if (p.size() > suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0)
      p = p.substr(0, p.size() - suffix.size());
    else
      p = "";
    n = {p, p + "ForCausalLM", "model", p + "Model", "embed_tokens", "embed_positions", "layers", "norm",
         "input_layernorm", "self_attn", "post_attention_layernorm", "mlp"};
  }
  return n;
}

std::string norm_type(const ModelSpec& m, const Names& n) {
  if (m.model_type == "mpt") return "LPLayerNorm";
  if (m.norm == NormKind::LayerNorm) return "LayerNorm";
  return n.prefix + "RMSNorm";
}

int add_norm(TreeBuilder& t, const ModelSpec& m, const Names& n, int parent, const std::string& local, ModulePart part,
             int layer, int exec_rank) {
  const int id = t.add(parent, local, norm_type(m, n), part, layer, exec_rank);
  t.param(id, "weight", {m.hidden});
  if (m.norm == NormKind::LayerNorm && m.norm_bias) t.param(id, "bias", {m.hidden});
  return id;
}

void add_attention(TreeBuilder& t, const ModelSpec& m, const Names& n, int blk, int layer, int exec_rank,
                   bool fused_qkv = false) {
  const std::int64_t h = m.hidden, q = m.n_heads * m.head_dim, kv = m.n_kv_heads * m.head_dim;
  const auto B = ModulePart::Block;
  if (m.model_type == "gpt2") {
    const int at = t.add(blk, n.attn, "GPT2Attention", B, layer, exec_rank);
    t.linear(at, "c_attn", "Conv1D", h, q + 2 * kv, m.qkv_bias, m.conv1d_weights, B, layer);
    t.linear(at, "c_proj", "Conv1D", q, h, m.out_bias, m.conv1d_weights, B, layer);
  } else if (m.model_type == "mpt") {
    const int at = t.add(blk, n.attn, m.n_kv_heads == m.n_heads ? "MultiheadAttention" : "GroupedQueryAttention", B,
                         layer, exec_rank);
    t.linear(at, "Wqkv", "Linear", h, q + 2 * kv, m.qkv_bias, false, B, layer);
    t.linear(at, "out_proj", "Linear", q, h, m.out_bias, false, B, layer);
  } else if (m.model_type == "gpt_neox" && !fused_qkv) {   // GPTNeoXAttention: query_key_value, dense
    const int at = t.add(blk, n.attn, "GPTNeoXAttention", B, layer, exec_rank);
    t.linear(at, "query_key_value", "Linear", h, q + 2 * kv, m.qkv_bias, false, B, layer);
    t.linear(at, "dense", "Linear", q, h, m.out_bias, false, B, layer);
  } else if (m.model_type == "phi" && !fused_qkv) {   // PhiAttention: q_proj, k_proj, v_proj, dense
    const int at = t.add(blk, n.attn, "PhiAttention", B, layer, exec_rank);
    t.linear(at, "q_proj", "Linear", h, q, m.qkv_bias, false, B, layer);
    t.linear(at, "k_proj", "Linear", h, kv, m.qkv_bias, false, B, layer);
    t.linear(at, "v_proj", "Linear", h, kv, m.qkv_bias, false, B, layer);
    t.linear(at, "dense", "Linear", q, h, m.out_bias, false, B, layer);
  } else if (m.model_type == "phi3") {   // Phi3Attention: o_proj, then the fused qkv_proj
    const int at = t.add(blk, n.attn, n.prefix + "Attention", B, layer, exec_rank);
    t.linear(at, "o_proj", "Linear", q, h, m.out_bias, false, B, layer);
    t.linear(at, "qkv_proj", "Linear", h, q + 2 * kv, m.qkv_bias, false, B, layer);
  } else if (fused_qkv) {   // litgpt's CausalSelfAttention: one qkv linear, then proj (named as Phi-3's)
    const int at = t.add(blk, n.attn, n.prefix + "Attention", B, layer, exec_rank);
    t.linear(at, "qkv_proj", "Linear", h, q + 2 * kv, m.qkv_bias, false, B, layer);
    t.linear(at, "o_proj", "Linear", q, h, m.out_bias, false, B, layer);
  } else {
    const int at = t.add(blk, n.attn, n.prefix + "Attention", B, layer, exec_rank);
    t.linear(at, "q_proj", "Linear", h, q, m.qkv_bias, false, B, layer);
    t.linear(at, "k_proj", "Linear", h, kv, m.qkv_bias, false, B, layer);
    t.linear(at, "v_proj", "Linear", h, kv, m.qkv_bias, false, B, layer);
    t.linear(at, "o_proj", "Linear", q, h, m.out_bias, false, B, layer);
    if (m.qk_norm != QkNorm::None) {   // q_norm, k_norm registered after o_proj (Qwen3Attention, Olmo2Attention)
      const bool per_head = m.qk_norm == QkNorm::PerHead;
      const int qn = t.add(at, "q_norm", n.prefix + "RMSNorm", B, layer, 0);
      t.param(qn, "weight", {per_head ? m.head_dim : q});
      const int kn = t.add(at, "k_norm", n.prefix + "RMSNorm", B, layer, 0);
      t.param(kn, "weight", {per_head ? m.head_dim : kv});
    }
  }
}

// One MLP (or one expert): gated = gate/up/down (Mixtral experts: w1/w3/w2, registered w1, w2, w3).
void add_mlp_body(TreeBuilder& t, const ModelSpec& m, int parent, int layer, bool expert) {
  const std::int64_t h = m.hidden, f = m.ffn_hidden;
  const auto B = ModulePart::Block;
  const bool conv = m.conv1d_weights;
  if (m.mlp == MlpKind::Plain) {
    if (m.model_type == "gpt2") {
      t.linear(parent, "c_fc", "Conv1D", h, f, m.mlp_bias, conv, B, layer);
      t.linear(parent, "c_proj", "Conv1D", f, h, m.mlp_bias, conv, B, layer);
    } else if (m.model_type == "gpt_neox") {
      t.linear(parent, "dense_h_to_4h", "Linear", h, f, m.mlp_bias, false, B, layer);
      t.linear(parent, "dense_4h_to_h", "Linear", f, h, m.mlp_bias, false, B, layer);
    } else if (m.model_type == "phi") {
      t.linear(parent, "fc1", "Linear", h, f, m.mlp_bias, false, B, layer);
      t.linear(parent, "fc2", "Linear", f, h, m.mlp_bias, false, B, layer);
    } else {
      t.linear(parent, expert ? "w1" : "up_proj", "Linear", h, f, m.mlp_bias, false, B, layer);
      t.linear(parent, expert ? "w2" : "down_proj", "Linear", f, h, m.mlp_bias, false, B, layer);
    }
    return;
  }
  if (expert) {  // forward: w2(act(w1(x)) * w3(x))
    const int w1 = t.add(parent, "w1", "Linear", B, layer, 0);
    t.param(w1, "weight", {f, h});
    if (m.mlp_bias) t.param(w1, "bias", {f});
    const int w2 = t.add(parent, "w2", "Linear", B, layer, 2);
    t.param(w2, "weight", {h, f});
    if (m.mlp_bias) t.param(w2, "bias", {h});
    const int w3 = t.add(parent, "w3", "Linear", B, layer, 1);
    t.param(w3, "weight", {f, h});
    if (m.mlp_bias) t.param(w3, "bias", {f});
    return;
  }
  if (m.model_type == "phi3") {   // Phi3MLP: the fused gate_up_proj [2f, h], then down_proj
    t.linear(parent, "gate_up_proj", "Linear", h, 2 * f, m.mlp_bias, false, B, layer);
    t.linear(parent, "down_proj", "Linear", f, h, m.mlp_bias, false, B, layer);
    return;
  }
  t.linear(parent, "gate_proj", "Linear", h, f, m.mlp_bias, false, B, layer);
  t.linear(parent, "up_proj", "Linear", h, f, m.mlp_bias, false, B, layer);
  t.linear(parent, "down_proj", "Linear", f, h, m.mlp_bias, false, B, layer);
}

void add_mlp(TreeBuilder& t, const ModelSpec& m, const Names& n, int blk, int layer, int exec_rank) {
  const auto B = ModulePart::Block;
  if (m.is_moe()) {
    const int moe = t.add(blk, "block_sparse_moe", n.prefix + "SparseMoeBlock", B, layer, exec_rank);
    t.linear(moe, "gate", "Linear", m.hidden, m.n_experts, false, false, B, layer);
    const int experts = t.add(moe, "experts", "ModuleList", B, layer);
    for (std::int64_t j = 0; j < m.n_experts; ++j) {
      const int e = t.add(experts, std::to_string(j), n.prefix + "BlockSparseTop2MLP", B, layer);
      add_mlp_body(t, m, e, layer, true);
    }
    return;
  }
  std::string type = n.prefix + "MLP";
  if (m.model_type == "mpt") type = "MPTMLP";
  const int mlp = t.add(blk, n.mlp, type, B, layer, exec_rank);
  add_mlp_body(t, m, mlp, layer, false);
}

}  // namespace

std::vector<Module> build_module_tree(const ModelSpec& m, ModelImpl impl) {
  const Names n = names_for(m);
  const bool hf_llama = m.model_type != "gpt2" && m.model_type != "mpt" && m.model_type != "gpt_neox" && m.model_type != "phi";
  // litgpt's Block (litgpt/model.py): norm_1, attn (one fused qkv linear and proj), norm_2, mlp, registered
  // in execution order, for the llama-family models with plain blocks (two norms, no q/k norms, dense MLP)
  // (and for GPT-NeoX / Phi shapes: litgpt's parallel_residual Block, norm_2 absent with shared_attention_norm)
  const bool litgpt_shape = hf_llama || m.model_type == "gpt_neox" || m.model_type == "phi";
  const bool litgpt = impl == ModelImpl::LitGPT && litgpt_shape && m.model_type != "phi3" &&
                      (m.block_norms == 2 || (m.parallel_residual && m.block_norms == 1)) &&
                      m.qk_norm == QkNorm::None && !m.is_moe();
  TreeBuilder t(n.root_type);
  const int base = t.add(0, n.base, n.base_type, ModulePart::Embedding, -1);
  const int emb = t.add(base, n.embed, m.model_type == "mpt" ? "SharedEmbedding" : "Embedding", ModulePart::Embedding, -1);
  t.param(emb, "weight", {m.vocab_size, m.hidden});
  if (m.positions == PositionKind::Learned) {
    const int pos = t.add(base, n.pos, "Embedding", ModulePart::Embedding, -1);
    t.param(pos, "weight", {m.max_positions, m.hidden});
  }
  const int layers = t.add(base, n.layers, "ModuleList", ModulePart::Block, -1);
  for (std::int64_t i = 0; i < m.n_layers; ++i) {
    const int L = static_cast<int>(i);
    const int blk = t.add(layers, std::to_string(i), m.block_class.empty() ? "TransformerBlock" : m.block_class,
                          ModulePart::Block, L);
    if (m.model_type == "olmo2") {   // registered self_attn, mlp, post_attention_layernorm, post_feedforward_layernorm
      add_attention(t, m, n, blk, L, 0);
      add_mlp(t, m, n, blk, L, 2);
      add_norm(t, m, n, blk, "post_attention_layernorm", ModulePart::Block, L, 1);
      add_norm(t, m, n, blk, "post_feedforward_layernorm", ModulePart::Block, L, 3);
    } else if (m.block_norms == 4) {   // gemma2: self_attn, mlp, then the four norms around them
      add_attention(t, m, n, blk, L, 1);
      add_mlp(t, m, n, blk, L, 4);
      add_norm(t, m, n, blk, n.in_norm, ModulePart::Block, L, 0);
      add_norm(t, m, n, blk, n.post_norm, ModulePart::Block, L, 2);
      add_norm(t, m, n, blk, "pre_feedforward_layernorm", ModulePart::Block, L, 3);
      add_norm(t, m, n, blk, "post_feedforward_layernorm", ModulePart::Block, L, 5);
    } else if (litgpt) {
      add_norm(t, m, n, blk, n.in_norm, ModulePart::Block, L, 0);
      add_attention(t, m, n, blk, L, 1, true);
      if (m.block_norms == 2) add_norm(t, m, n, blk, n.post_norm.empty() ? "norm_2" : n.post_norm, ModulePart::Block, L, 2);
      add_mlp(t, m, n, blk, L, 3);
    } else if (m.model_type == "gpt_neox") {   // registered both norms, attention, mlp; run norm, attn, norm, mlp
      add_norm(t, m, n, blk, n.in_norm, ModulePart::Block, L, 0);
      add_norm(t, m, n, blk, n.post_norm, ModulePart::Block, L, 2);
      add_attention(t, m, n, blk, L, 1);
      add_mlp(t, m, n, blk, L, 3);
    } else if (m.model_type == "phi") {   // registered self_attn, mlp, input_layernorm; run the norm, attn, mlp
      add_attention(t, m, n, blk, L, 1);
      add_mlp(t, m, n, blk, L, 2);
      add_norm(t, m, n, blk, n.in_norm, ModulePart::Block, L, 0);
    } else if (hf_llama) {  // registered self_attn, mlp, input_layernorm, post_attention_layernorm; run norm, attn, norm, mlp
      add_attention(t, m, n, blk, L, 1);
      add_mlp(t, m, n, blk, L, 3);
      add_norm(t, m, n, blk, n.in_norm, ModulePart::Block, L, 0);
      add_norm(t, m, n, blk, n.post_norm, ModulePart::Block, L, 2);
    } else {         // GPT2Block / MPTBlock register in execution order
      add_norm(t, m, n, blk, n.in_norm, ModulePart::Block, L, 0);
      add_attention(t, m, n, blk, L, 1);
      add_norm(t, m, n, blk, n.post_norm, ModulePart::Block, L, 2);
      add_mlp(t, m, n, blk, L, 3);
    }
  }
  add_norm(t, m, n, base, n.norm_f, ModulePart::FinalNormAndHead, -1, -1);
  // MPT has no lm_head module when tied (it calls F.linear on wte.weight); HF models keep a tied one.
  if (!(m.model_type == "mpt" && m.tied_embeddings)) {
    const int head = t.add(0, m.model_type == "gpt_neox" ? "embed_out" : "lm_head", "Linear", ModulePart::FinalNormAndHead, -1);
    if (!m.tied_embeddings) t.param(head, "weight", {m.vocab_size, m.hidden});
    if (m.lm_head_bias) t.param(head, "bias", {m.vocab_size});
  }
  return t.finish();
}

}  // namespace fsdpsim::models
