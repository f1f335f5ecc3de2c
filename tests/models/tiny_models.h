// The tiny llama both the recipe tests and the frozen-weight tests count by hand (hidden 8, heads 2, kv heads
// 1, head_dim 4, ffn 16, vocab 32), and the (name, bytes) view of a block's saved tensors they compare.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "models/implementation.h"
#include "models/model_spec.h"

namespace fsdpsim::models::testing {

inline ModelSpec tiny_llama() {
  return ModelSpec{.name = "tiny", .model_type = "llama", .block_class = "LlamaDecoderLayer", .vocab_size = 32,
                   .hidden = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .ffn_hidden = 16,
                   .max_positions = 64, .qkv_bias = false, .out_bias = false, .mlp_bias = false, .norm_bias = true,
                   .conv1d_weights = false, .hidden_act = "silu"};
}

using Entries = std::vector<std::pair<std::string, Bytes>>;

inline Entries entries(const BlockMemory& bm) {
  Entries e;
  for (const SavedTensor& t : bm.saved) e.emplace_back(t.name, t.bytes);
  return e;
}

}  // namespace fsdpsim::models::testing
