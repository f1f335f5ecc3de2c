// Each framework's transformer block (and final norm + LM head input) written on an AutogradTape,
// op by op as its code runs (models/block_recipes.cpp cites the code). Internal to models/: the public
// interface is models/implementation.h.
#pragma once
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "models/autograd_tape.h"
#include "models/implementation.h"
#include "models/model_spec.h"
#include "models/trainable.h"

namespace fsdpsim::models {

// `tokens` = micro_batch * seq_len (> 0); the model's shape is validated by the caller. `g`: which of the
// part's weights require grad and whether its input does (models/trainable.h).
AutogradTape build_block_tape(const ModelSpec& m, std::int64_t tokens, Dtype act, const ImplOptions& o,
                              const GradFlow& g = {});
AutogradTape build_final_norm_tape(const ModelSpec& m, std::int64_t tokens, Dtype act, const ImplOptions& o,
                                   const GradFlow& g = {});

// One weight matrix of a transformer block as `impl`'s code holds it (the linears its tape writes), in
// the order the code registers them (nn.Module attribute order).
struct BlockMatrix {
  Weight weight = Weight::Q;
  std::int64_t numel = 0;   // the weight's elements (no bias); MoE experts: all experts' matrices
};
std::vector<BlockMatrix> block_matrices(const ModelSpec& m, ModelImpl impl);

}  // namespace fsdpsim::models
