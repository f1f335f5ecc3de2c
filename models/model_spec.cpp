// Small ModelSpec helpers that belong to no bigger concept.
#include "models/model_spec.h"

namespace fsdpsim::models {

ModelSpec with_seq_len(const ModelSpec& m, std::int64_t seq_len) {
  if (!m.positions_follow_seq_len || m.positions != PositionKind::Learned || seq_len <= 0) return m;
  ModelSpec out = m;
  out.max_positions = seq_len;
  return out;
}

std::string checkpoint_mode_name(CheckpointMode mode) {
  switch (mode) {
    case CheckpointMode::None: return "none";
    case CheckpointMode::Full: return "full";
    case CheckpointMode::SelectiveOp: return "selective_op";
  }
  return "none";
}

std::string model_impl_name(ModelImpl impl) {
  switch (impl) {
    case ModelImpl::TorchTitan: return "torchtitan";
    case ModelImpl::HF: return "hf";
    case ModelImpl::LitGPT: return "litgpt";
    case ModelImpl::Fused: return "fused";
    case ModelImpl::Runtime: return "runtime";
  }
  return "hf";
}

std::string float8_recipe_name(Float8Recipe r) {
  switch (r) {
    case Float8Recipe::None: return "none";
    case Float8Recipe::Tensorwise: return "tensorwise";
    case Float8Recipe::Rowwise: return "rowwise";
  }
  return "none";
}

}  // namespace fsdpsim::models
