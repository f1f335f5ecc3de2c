// Each framework's transformer block (and final norm + LM head input) written on an AutogradTape,
// op by op as its code runs (models/block_recipes.cpp cites the code). Internal to models/: the public
// interface is models/implementation.h.
#pragma once
#include <cstdint>

#include "common/dtype.h"
#include "models/autograd_tape.h"
#include "models/implementation.h"
#include "models/model_spec.h"

namespace fsdpsim::models {

// `tokens` = micro_batch * seq_len (> 0); the model's shape is validated by the caller.
AutogradTape build_block_tape(const ModelSpec& m, std::int64_t tokens, Dtype act, const ImplOptions& o);
AutogradTape build_final_norm_tape(const ModelSpec& m, std::int64_t tokens, Dtype act, const ImplOptions& o);

}  // namespace fsdpsim::models
