// What `fsdpsim model-info` shows: the spec, parameter counts, FLOPs per token, activation bytes and
// the FSDP units of one wrap policy, as JSON and as text (the command file only parses and prints).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "models/implementation.h"
#include "models/model_spec.h"
#include "models/wrap_graph.h"

namespace fsdpsim::models {

struct ModelInfoRequest {
  std::int64_t seq_len = 4096;
  std::int64_t micro_batch = 1;
  Dtype dtype = Dtype::BF16;   // activation (compute) dtype
  WrapPolicy policy;
  ModelImpl implementation = ModelImpl::HF;  // whose block code saves the tensors (models/implementation.h)
};

// Keys: model, seq_len, micro_batch, activation_dtype, params_* , flops_per_token_fwd/_fwdbwd,
// activation_bytes_per_block{,_per_token}, block_backward_working_bytes, logits_bytes,
// logits_peak_bytes, implementation, saved_bytes_per_block_per_token (per checkpointing mode, the
// recipe's block_memory), final_norm_saved_bytes_per_token, wrap_policy, units, forward_order, notes. `context` is added by the caller.
nlohmann::json model_info_json(const ModelSpec& m, const ModelInfoRequest& req);
std::string model_info_text(const ModelSpec& m, const ModelInfoRequest& req);

}  // namespace fsdpsim::models
