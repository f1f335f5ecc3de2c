#include "runtime/model/param_tensors.h"

namespace fsdpsim::runtime {

std::int64_t ParamTensor::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::int64_t total_numel(const std::vector<ParamTensor>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

BlockTensorIndex block_tensor_index(const Dims& d) {
  BlockTensorIndex x;
  int i = 0;
  x.wq = i++;
  if (d.qkv_bias) x.bq = i++;
  x.wk = i++;
  if (d.qkv_bias) x.bk = i++;
  x.wv = i++;
  if (d.qkv_bias) x.bv = i++;
  x.wo = i++;
  if (d.out_bias) x.bo = i++;
  x.wgate = i++;
  if (d.mlp_bias) x.bgate = i++;
  x.wup = i++;
  if (d.mlp_bias) x.bup = i++;
  x.wdown = i++;
  if (d.mlp_bias) x.bdown = i++;
  x.ln1 = i++;
  x.ln2 = i++;
  x.count = i;
  return x;
}

std::vector<ParamTensor> part_param_tensors(const Dims& d, models::ModulePart part, int layer) {
  using models::ModulePart;
  std::vector<ParamTensor> ts;
  switch (part) {
    case ModulePart::Embedding:
      ts.push_back({"model.embed_tokens.weight", {d.V, d.C}});
      break;
    case ModulePart::FinalNormAndHead:
      ts.push_back({"model.norm.weight", {d.C}});
      if (!d.tied) ts.push_back({"lm_head.weight", {d.V, d.C}});
      break;
    case ModulePart::Block: {
      const std::string p = "model.layers." + std::to_string(layer) + ".";
      auto lin = [&](const std::string& n, std::int64_t out, std::int64_t in, bool bias) {
        ts.push_back({p + n + ".weight", {out, in}});
        if (bias) ts.push_back({p + n + ".bias", {out}});
      };
      lin("self_attn.q_proj", d.q_dim(), d.C, d.qkv_bias);
      lin("self_attn.k_proj", d.kv_dim(), d.C, d.qkv_bias);
      lin("self_attn.v_proj", d.kv_dim(), d.C, d.qkv_bias);
      lin("self_attn.o_proj", d.C, d.q_dim(), d.out_bias);
      lin("mlp.gate_proj", d.F, d.C, d.mlp_bias);
      lin("mlp.up_proj", d.F, d.C, d.mlp_bias);
      lin("mlp.down_proj", d.C, d.F, d.mlp_bias);
      ts.push_back({p + "input_layernorm.weight", {d.C}});
      ts.push_back({p + "post_attention_layernorm.weight", {d.C}});
      break;
    }
  }
  return ts;
}

std::vector<ParamTensor> unit_param_tensors(const Dims& d, const models::FsdpUnit& unit) {
  using models::ModulePart;
  std::vector<ParamTensor> ts;
  auto has = [&](ModulePart p) {
    for (auto q : unit.parts)
      if (q == p) return true;
    return false;
  };
  auto append = [&](std::vector<ParamTensor> more) { ts.insert(ts.end(), more.begin(), more.end()); };
  if (has(ModulePart::Embedding)) append(part_param_tensors(d, ModulePart::Embedding, -1));
  for (int l : unit.layers) append(part_param_tensors(d, ModulePart::Block, l));
  if (has(ModulePart::FinalNormAndHead)) append(part_param_tensors(d, ModulePart::FinalNormAndHead, -1));
  return ts;
}

}  // namespace fsdpsim::runtime
