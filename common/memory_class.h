// Classes of memory-bound kernels. On a GPU every such kernel streams HBM at about the same rate
// (one `hbm` figure in the profile); the CPU + MPI backend's scalar kernels do not (an exp per element
// in SwiGLU or the cross-entropy costs more than a copy), so a calibrated CPU profile gives each class
// its own measured rate (profiles/README.md, `elementwise_bytes_per_s`). models/ tags each kernel,
// calibrate/ maps the class to a rate; neither knows the other.
#pragma once
#include <cstdint>

namespace fsdpsim {

enum class MemoryClass : std::uint8_t {
  Copy,          // copies, casts, pads, divides, permutes, float8 casts: read and write, no math
  Norm,          // RMSNorm / LayerNorm forward and backward
  Rotary,        // rotary position embedding
  Activation,    // GELU, SiLU x up (SwiGLU), their backward; MoE router softmax
  Residual,      // residual adds and gradient sums
  Embedding,     // embedding gather / scatter-add
  CrossEntropy,  // the loss and its gradient
  Optimizer,     // the optimizer step (AdamW / SGD on the sharded master params)
};
inline constexpr int kMemoryClasses = 8;

inline const char* memory_class_name(MemoryClass c) {
  static const char* const kNames[kMemoryClasses] = {"copy",     "norm",      "rotary",        "activation",
                                                     "residual", "embedding", "cross_entropy", "optimizer"};
  return kNames[static_cast<int>(c)];
}

}  // namespace fsdpsim
