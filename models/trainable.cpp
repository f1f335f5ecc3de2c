// The trainable set of a plan's trainable_fraction (models/trainable.h): the rule, and the module tree's
// tensors mapped onto the weights it names.
#include "models/trainable.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "models/block_recipes.h"

namespace fsdpsim::models {
namespace {

// scripts/torch_memory/parallel.py `_evenly_spaced`: sorted({(i * n) // k for i in range(k)}).
std::vector<std::int64_t> evenly_spaced(std::int64_t n, std::int64_t k) {
  std::set<std::int64_t> s;
  for (std::int64_t i = 0; i < k; ++i) s.insert((i * n) / k);
  return {s.begin(), s.end()};
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

constexpr WeightMask kAttentionWeights = weight_bit(Weight::Q) | weight_bit(Weight::K) | weight_bit(Weight::V) |
                                         weight_bit(Weight::QKV);

}  // namespace

std::int64_t TrainableSet::first_trained_layer() const {
  if (all) return 0;
  for (std::size_t l = 0; l < layers.size(); ++l)
    if (layers[l] != 0) return static_cast<std::int64_t>(l);
  return static_cast<std::int64_t>(layers.size());
}

// scripts/torch_memory/parallel.py `freeze_to_fraction`, on the recipe's block matrices:
//   target = fraction * total; for each kind in TRAIN_ORDER (ties: registration order):
//     room = (target - trainable) // size; if room > 0: count = min(room, L) blocks, evenly spaced;
//   none trained: the smallest matrix (first in registration order) of block 0.
TrainableSet trainable_set(const ModelSpec& m, ModelImpl impl, double fraction) {
  TrainableSet s;
  const ParamCounts pc = count_params(m);
  s.total = pc.total;
  s.fraction = fraction;
  if (fraction >= 1.0) {
    s.all = true;
    s.trainable = pc.total;
    return s;
  }
  s.all = false;
  const std::int64_t L = m.n_layers;
  s.layers.assign(static_cast<std::size_t>(std::max<std::int64_t>(L, 0)), 0);
  const std::vector<BlockMatrix> reg = block_matrices(m, impl);
  std::vector<BlockMatrix> order = reg;
  std::stable_sort(order.begin(), order.end(),
                   [](const BlockMatrix& a, const BlockMatrix& b) { return a.weight < b.weight; });
  // The fraction is known to 6 decimals (what the harness records): a matrix within half a unit of the
  // 6th decimal of the target still fits.
  const double target = fraction * static_cast<double>(pc.total);
  const double slack = 5e-7 * static_cast<double>(pc.total);
  std::int64_t trainable = 0;
  for (const BlockMatrix& k : order) {
    if (k.numel <= 0 || L <= 0) continue;
    const auto room = static_cast<std::int64_t>(
        std::floor((target - static_cast<double>(trainable) + slack) / static_cast<double>(k.numel)));
    if (room <= 0) continue;
    const std::int64_t count = std::min(room, L);
    for (std::int64_t l : evenly_spaced(L, count)) s.layers[static_cast<std::size_t>(l)] |= weight_bit(k.weight);
    trainable += count * k.numel;
  }
  if (trainable == 0 && L > 0 && !reg.empty()) {
    // below one matrix: the smallest one of the first block (min() keeps the first of equal sizes)
    const BlockMatrix& k = *std::min_element(reg.begin(), reg.end(),
                                             [](const BlockMatrix& a, const BlockMatrix& b) { return a.numel < b.numel; });
    s.layers[0] |= weight_bit(k.weight);
    trainable = k.numel;
  }
  s.trainable = trainable;
  return s;
}

std::vector<AdapterMatrix> lora_adapters(const ModelSpec& m, ModelImpl impl, const LoraShape& l, bool head) {
  std::vector<AdapterMatrix> v;
  if (!l.on()) return v;
  const std::int64_t r = l.rank;
  const auto pair = [&](Weight base, std::int64_t in, std::int64_t out) {
    v.push_back({base, r, in, true});
    v.push_back({base, out, r, false});
  };
  if (head) {
    if (l.adapts(Weight::LmHead)) pair(Weight::LmHead, m.hidden, m.vocab_size);
    return v;
  }
  const std::int64_t h = m.hidden, a = m.n_heads, g = m.n_kv_heads, d = m.head_dim, f = m.ffn_hidden;
  const std::vector<BlockMatrix> mats = block_matrices(m, impl);
  const bool fused = std::any_of(mats.begin(), mats.end(), [](const BlockMatrix& b) { return b.weight == Weight::QKV; });
  const bool q = l.adapts(Weight::Q), k = l.adapts(Weight::K), vv = l.adapts(Weight::V);
  if (fused && (q || k || vv)) {
    if (impl == ModelImpl::LitGPT) {
      // LoRAQKVLinear: lora_A (r * sum(enable_lora), in), lora_B (sum(qkv_shapes), r), qkv_shapes the
      // enabled parts' widths (q: n_head * head_size, k and v: n_query_groups * head_size)
      const std::int64_t n = (q ? 1 : 0) + (k ? 1 : 0) + (vv ? 1 : 0);
      const std::int64_t width = (q ? a * d : 0) + (k ? g * d : 0) + (vv ? g * d : 0);
      v.push_back({Weight::QKV, r * n, h, true});
      v.push_back({Weight::QKV, width, r, false});
    } else {
      pair(Weight::QKV, h, (a + 2 * g) * d);
    }
  } else {
    if (q) pair(Weight::Q, h, a * d);
    if (k) pair(Weight::K, h, g * d);
    if (vv) pair(Weight::V, h, g * d);
  }
  if (l.adapts(Weight::Out)) pair(Weight::Out, a * d, h);
  if (m.mlp == MlpKind::Plain) {
    if (l.adapts(Weight::Fc) || l.adapts(Weight::Up)) pair(Weight::Fc, h, f);
  } else {
    if (l.adapts(Weight::Gate)) pair(Weight::Gate, h, f);
    if (l.adapts(Weight::Up)) pair(Weight::Up, h, f);
  }
  if (l.adapts(Weight::Down)) pair(Weight::Down, f, h);
  return v;
}

TrainableSet lora_trainable_set(const ModelSpec& m, ModelImpl impl, const LoraShape& l) {
  TrainableSet s;
  s.all = false;
  s.lora = l;
  s.block_adapters = lora_adapters(m, impl, l, false);
  s.head_adapters = lora_adapters(m, impl, l, true);
  const std::int64_t L = std::max<std::int64_t>(m.n_layers, 0);
  s.layers.assign(static_cast<std::size_t>(L), weight_bit(Weight::Adapter));
  if (!s.head_adapters.empty()) s.outside = weight_bit(Weight::Adapter);
  std::int64_t block = 0, head = 0;
  for (const AdapterMatrix& a : s.block_adapters) block += a.numel();
  for (const AdapterMatrix& a : s.head_adapters) head += a.numel();
  s.trainable = L * block + head;
  s.total = count_params(m).total + s.trainable;
  s.fraction = s.total > 0 ? static_cast<double>(s.trainable) / static_cast<double>(s.total) : 0.0;
  return s;
}

// Names as models/module_tree.cpp builds them: "<base>.<layers>.<N>.<module path>.<param>" with the
// blocks under model.layers (llama family, phi), transformer.h (gpt2), transformer.blocks (mpt) or
// gpt_neox.layers (gpt_neox).
TensorWeight tensor_weight(const std::string& name) {
  TensorWeight t;
  static const char* const kBlockLists[] = {"model.layers.", "transformer.h.", "transformer.blocks.", "gpt_neox.layers."};
  for (const char* list : kBlockLists) {
    const std::string prefix(list);
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) break;
    t.layer = std::atoi(name.substr(prefix.size(), dot - prefix.size()).c_str());
    const std::string rest = name.substr(dot + 1);
    if (contains(rest, "lora_")) {
      t.weights = weight_bit(Weight::Adapter);
      return t;
    }
    if (rest.ends_with(".bias")) return t;   // a linear's or a norm's bias: never trained by the rule
    if (contains(rest, "norm") || contains(rest, "ln_")) {
      const bool mlp_side = contains(rest, "post_attention") || contains(rest, "ln_2") || contains(rest, "norm_2") ||
                            contains(rest, "feedforward");
      t.weights = weight_bit(mlp_side ? Weight::MlpNorm : Weight::AttnNorm);
    } else if (contains(rest, "experts.")) {
      t.weights = weight_bit(Weight::Experts);
    } else if (contains(rest, "block_sparse_moe.gate")) {
      t.weights = weight_bit(Weight::Router);
    } else if (contains(rest, "q_proj.")) {
      t.weights = weight_bit(Weight::Q) | weight_bit(Weight::QKV);
    } else if (contains(rest, "k_proj.")) {
      t.weights = weight_bit(Weight::K) | weight_bit(Weight::QKV);
    } else if (contains(rest, "v_proj.")) {
      t.weights = weight_bit(Weight::V) | weight_bit(Weight::QKV);
    } else if (contains(rest, "qkv_proj.") || contains(rest, "c_attn.") || contains(rest, "Wqkv.") ||
               contains(rest, "query_key_value.")) {
      t.weights = kAttentionWeights;
    } else if (contains(rest, "o_proj.") || contains(rest, "out_proj.") || contains(rest, "attn.c_proj.") ||
               contains(rest, "attention.dense.") || contains(rest, "self_attn.dense.")) {
      t.weights = weight_bit(Weight::Out);
    } else if (contains(rest, "gate_up_proj.")) {
      t.weights = weight_bit(Weight::Gate) | weight_bit(Weight::Up);
    } else if (contains(rest, "gate_proj.")) {
      t.weights = weight_bit(Weight::Gate);
    } else if (contains(rest, "up_proj.")) {
      t.weights = weight_bit(Weight::Up) | weight_bit(Weight::Fc);   // MPT's plain MLP names its first up_proj
    } else if (contains(rest, "c_fc.") || contains(rest, "dense_h_to_4h.") || contains(rest, "mlp.fc1.")) {
      t.weights = weight_bit(Weight::Fc);
    } else if (contains(rest, "down_proj.") || contains(rest, "mlp.c_proj.") || contains(rest, "dense_4h_to_h.") ||
               contains(rest, "mlp.fc2.")) {
      t.weights = weight_bit(Weight::Down);
    }
    return t;
  }
  // Outside the blocks: the embeddings (and learned positions), the final norm, the LM head.
  if (contains(name, "lora_")) t.weights = weight_bit(Weight::Adapter);
  else if (contains(name, "lm_head") || contains(name, "embed_out")) t.weights = weight_bit(Weight::LmHead);
  else if (contains(name, "embed") || contains(name, "wte") || contains(name, "wpe")) t.weights = weight_bit(Weight::Embedding);
  else t.weights = weight_bit(Weight::FinalNorm);
  return t;
}

bool tensor_nf4(const LoraShape& l, const std::string& name) {
  if (!l.nf4 || name.ends_with(".bias")) return false;
  const TensorWeight t = tensor_weight(name);
  constexpr WeightMask kLinears = weight_bit(Weight::Q) | weight_bit(Weight::K) | weight_bit(Weight::V) |
                                  weight_bit(Weight::QKV) | weight_bit(Weight::Out) | weight_bit(Weight::Gate) |
                                  weight_bit(Weight::Up) | weight_bit(Weight::Fc) | weight_bit(Weight::Down);
  return t.layer >= 0 && (t.weights & kLinears) != 0 && (t.weights & ~kLinears) == 0;
}

bool tensor_trains(const TrainableSet& s, const std::string& name) {
  if (s.all) return true;
  const TensorWeight t = tensor_weight(name);
  if (t.layer < 0) return (s.outside & t.weights) != 0;   // outside the blocks: frozen but for LoRA's head
  if (t.layer >= static_cast<int>(s.layers.size())) return false;
  return (s.layers[static_cast<std::size_t>(t.layer)] & t.weights) != 0;
}

double trained_matmul_fraction(const ModelSpec& m, ModelImpl impl, const std::vector<WeightMask>& layers, bool head) {
  const ParamCounts pc = count_params(m);
  if (pc.matmul_active <= 0) return 1.0;
  // A token goes through top_k of the E experts: that share of the experts' matrices is active.
  const double expert_share = m.is_moe() ? static_cast<double>(m.experts_top_k) / static_cast<double>(m.n_experts) : 1.0;
  const std::vector<BlockMatrix> ms = block_matrices(m, impl);
  double trained = head ? static_cast<double>(m.vocab_size * m.hidden) : 0.0;
  for (WeightMask mask : layers)
    for (const BlockMatrix& k : ms)
      if (mask & weight_bit(k.weight))
        trained += static_cast<double>(k.numel) * (k.weight == Weight::Experts ? expert_share : 1.0);
  return std::min(1.0, trained / static_cast<double>(pc.matmul_active));
}

}  // namespace fsdpsim::models
