// The parameter tensors of the runtime's transformer, named and ordered as Hugging Face's
// LlamaForCausalLM registers them (module registration order = FSDP's flattening order):
//   model.embed_tokens.weight
//   model.layers.{i}: self_attn.{q,k,v,o}_proj (weight, bias), mlp.{gate,up,down}_proj (weight, bias),
//                     input_layernorm.weight, post_attention_layernorm.weight
//   model.norm.weight, lm_head.weight (absent when tied to the embedding)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/wrap_graph.h"
#include "runtime/model/dims.h"

namespace fsdpsim::runtime {

struct ParamTensor {
  std::string name;                  // "model.layers.3.self_attn.q_proj.weight"
  std::vector<std::int64_t> shape;   // PyTorch shape (dim 0 is the one FSDP2 shards)
  std::int64_t numel() const;
};

// Tensors of one part in registration order (layer = block index for ModulePart::Block).
std::vector<ParamTensor> part_param_tensors(const Dims& d, models::ModulePart part, int layer);
// Tensors of one FSDP unit: its parts (embedding, then its blocks in order, then final norm/head).
std::vector<ParamTensor> unit_param_tensors(const Dims& d, const models::FsdpUnit& unit);
std::int64_t total_numel(const std::vector<ParamTensor>& ts);

// Index of each tensor within a block's list (part_param_tensors(d, Block, i)): these are fixed
// positions, with -1 for an absent bias.
struct BlockTensorIndex {
  int wq = -1, bq = -1, wk = -1, bk = -1, wv = -1, bv = -1, wo = -1, bo = -1;
  int wgate = -1, bgate = -1, wup = -1, bup = -1, wdown = -1, bdown = -1, ln1 = -1, ln2 = -1;
  int count = 0;
};
BlockTensorIndex block_tensor_index(const Dims& d);

}  // namespace fsdpsim::runtime
