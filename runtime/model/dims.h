// The shapes the runtime's transformer needs, taken from a ModelSpec and a micro-batch, checked
// once: the CPU runtime implements the Llama family (RMSNorm, rotary, GQA, SwiGLU; optional q/k/v,
// output and MLP biases; tied or untied LM head). Anything else is an InputError naming the field.
#pragma once
#include <cstdint>

#include "models/model_spec.h"

namespace fsdpsim::runtime {

struct Dims {
  int B = 0;     // sequences per micro-batch on this rank
  int T = 0;     // sequence length
  int C = 0;     // hidden
  int NH = 0;    // query heads
  int NKV = 0;   // key/value heads (GQA)
  int HD = 0;    // head dim
  int F = 0;     // MLP intermediate size
  int V = 0;     // vocabulary
  int L = 0;     // blocks
  bool qkv_bias = false, out_bias = false, mlp_bias = false, tied = false;
  long tokens() const { return static_cast<long>(B) * T; }
  int q_dim() const { return NH * HD; }
  int kv_dim() const { return NKV * HD; }
};

// InputError("--model"/"plan.micro_batch"/..., value, what the CPU runtime supports) if the model
// is outside the Llama family or a size would overflow the int GEMM interface.
Dims runtime_dims(const models::ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len);

}  // namespace fsdpsim::runtime
