// The kernels one module runs, as cost descriptors (shapes, FLOPs, bytes). The simulator's cost
// model times them; the runtime runs the real ones. Backward kernels are listed explicitly
// (dgrad + wgrad GEMMs, attention backward, elementwise backward), so recompute = the forward list.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/units.h"
#include "models/model_spec.h"

namespace fsdpsim::models {

enum class KernelKind { Gemm, Attention, Elementwise, Embedding, CrossEntropy };

struct KernelDesc {
  KernelKind kind = KernelKind::Gemm;
  std::string name;          // "q_proj", "attn_fwd", "rmsnorm", ... (for traces)
  // Gemm: C[m,n] = A[m,k] B[k,n], repeated `count` times (e.g. experts).
  std::int64_t m = 0, n = 0, k = 0, count = 1;
  // Attention: batch, seq, heads, kv heads, head_dim; causal.
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool backward = false;
  Flops flops = 0;           // total FLOPs of this entry (all `count` repeats)
  Bytes bytes = 0;           // HBM bytes moved (memory-bound kernels; informative for GEMMs)
  Dtype dtype = Dtype::BF16;
};

enum class ModulePart { Embedding, Block, FinalNormAndHead };

// Kernels of one forward pass of a part for a micro-batch (b sequences of s tokens), activations in dtype.
std::vector<KernelDesc> forward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                        std::int64_t seq_len, Dtype dtype);
// Kernels of the backward of the same part (input grads and, if trainable, weight grads).
std::vector<KernelDesc> backward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                         std::int64_t seq_len, Dtype dtype, bool weight_grads);
Flops total_flops(const std::vector<KernelDesc>& ks);

}  // namespace fsdpsim::models
