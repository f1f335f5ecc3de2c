// The kernels one module runs, as cost descriptors (shapes, FLOPs, bytes). The simulator's cost
// model times them; the runtime runs the real ones. Backward kernels are listed explicitly
// (dgrad + wgrad GEMMs, attention backward, elementwise backward); a recomputation's kernels
// (activation checkpointing) come from recompute_kernels: what the checkpointing mode reruns.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/memory_class.h"
#include "common/units.h"
#include "models/model_spec.h"
#include "models/trainable.h"

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
  Dtype dtype = Dtype::BF16; // GEMM: the operands' dtype (FP8 for a float8 _scaled_mm, whose output is bf16)
  MemoryClass mem_class = MemoryClass::Copy;   // memory-bound kernels: which rate times them (common/memory_class.h)
};

enum class ModulePart { Embedding, Block, FinalNormAndHead };

// How the model's code runs (plan keys `implementation`, `compile`, `float8`), which decides the
// kernels besides the GEMMs and the attention (models/kernels_elementwise.cpp, kernels_float8.cpp):
//  * implementation: whose eager code computes the norms, rotary embedding and gated activation
//    (Hugging Face's and torchtitan's RMSNorm are chains of 8 small ops, a fused one 1 kernel);
//  * compile: torch.compile (inductor) of each block: every chain of pointwise and reduction ops
//    between two GEMM / attention kernels becomes one kernel;
//  * float8: torchao Float8Linear on the blocks' linears: GEMMs in fp8 plus the amax / cast kernels
//    of their operands (tensorwise and rowwise scaling differ);
//  * checkpoint_early_stop: a full-checkpoint recompute stops once the last tensor backward needs is
//    re-saved (torch.utils.checkpoint non-reentrant, early_stop=True, its default); false for
//    torchtitan (its checkpoint_wrapper passes early_stop=False) and for reentrant checkpointing;
//  * checkpoint_outside_compile: compiled, an eager checkpoint wraps the compiled block (torchtune's order,
//    sim::ActivationCheckpointing::outside_compile): its recompute reruns the whole compiled forward.
// The default (fused, eager, no float8) is one kernel per norm / rotary / activation.
struct KernelOptions {
  ModelImpl implementation = ModelImpl::Fused;
  bool compile = false;
  Float8Recipe float8 = Float8Recipe::None;
  bool checkpoint_early_stop = true;
  bool checkpoint_outside_compile = false;
  LoraShape lora{};                      // LoRA adapters beside the targeted linears (models/trainable.h)
  bool operator==(const KernelOptions&) const = default;
};

// Kernels of one forward pass of a part for a micro-batch (b sequences of s tokens), activations in dtype.
std::vector<KernelDesc> forward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                        std::int64_t seq_len, Dtype dtype, const KernelOptions& options = {});
// Kernels of the backward of the same part (input grads and, if trainable, weight grads).
std::vector<KernelDesc> backward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                         std::int64_t seq_len, Dtype dtype, bool weight_grads,
                                         const KernelOptions& options = {});
// The same with frozen weights (models/trainable.h): a weight-gradient GEMM for each weight that trains,
// an input gradient for each tensor that requires grad, nothing for a part whose output does not.
std::vector<KernelDesc> backward_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                         std::int64_t seq_len, Dtype dtype, const GradFlow& flow,
                                         const KernelOptions& options = {});
// Kernels a checkpointed part reruns before its backward (models/kernels_recompute.cpp):
//  * Full: the forward, less what follows the last tensor backward needs when the checkpoint stops
//    early (KernelOptions::checkpoint_early_stop: the last linear of the MLP and the residual add), and
//    less what escapes the checkpoint (compiled QLoRA: the NF4 linears' dequantization and GEMMs, kept);
//    around a compiled block (KernelOptions::checkpoint_outside_compile), the whole compiled forward;
//  * SelectiveOp (torchtitan's op-level SAC policy, fsdp-semantics.md A4): only the ops whose outputs
//    the policy does not save: every kernel but the attention, the odd-numbered bias-free matmuls
//    (aten.mm, counted in forward order within the block) and float8's amax reductions (aten.max);
//  * None: nothing.
// Only a transformer block is ever checkpointed: other parts return an empty list.
std::vector<KernelDesc> recompute_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                          std::int64_t seq_len, Dtype dtype, CheckpointMode mode,
                                          const KernelOptions& options = {});
Flops total_flops(const std::vector<KernelDesc>& ks);

}  // namespace fsdpsim::models
