// Deterministic parameter initialization that any rank can evaluate for any element on its own:
// value = f(seed, tensor name, element index). A rank fills its shard without the full tensor, and
// the unsharded reference gets bit-identical starting weights.
#pragma once
#include <cstdint>

#include "runtime/model/param_tensors.h"

namespace fsdpsim::runtime {

// HF LlamaConfig initializer_range = 0.02 (std of the normal init of linear/embedding weights); we
// draw uniform(-a, a) with the same std, a = 0.02 * sqrt(3). Norm weights are 1, biases 0.
inline constexpr double kInitStd = 0.02;

float init_param_value(std::uint64_t seed, const ParamTensor& t, std::int64_t index);

// The same values with the per-tensor work (name tests and hash) done once: for filling billions of
// elements (an 8B model's shards) where init_param_value's per-element string work dominates.
class ParamInitializer {
 public:
  ParamInitializer(std::uint64_t seed, const ParamTensor& t);
  float operator()(std::int64_t index) const;

 private:
  enum class Kind { One, Zero, Uniform } kind_;
  std::uint64_t base_ = 0;
};

// splitmix64 (Steele, Lea, Flood 2014): a stateless 64-bit mixer, used for init and data.
std::uint64_t mix64(std::uint64_t x);

}  // namespace fsdpsim::runtime
