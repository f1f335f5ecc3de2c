// Internal to models/kernels*.cpp: the builder that appends one part's kernels in execution order.
// kernels.cpp lays out the parts (linears, attention, MoE, embedding, head); kernels_elementwise.cpp
// the norms, rotary embedding, activations and residual adds of each implementation, eager or
// compiled; kernels_float8.cpp the casts of float8 linears; kernels_recompute.cpp what a
// checkpointed block reruns, from the annotations the builder records while it lays out a forward.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/kernels.h"
#include "models/trainable.h"

namespace fsdpsim::models::detail {

// What the recompute needs to know of one forward kernel (kernels_recompute.cpp).
struct ForwardNote {
  // Repeats of this entry (of KernelDesc::count) whose output torchtitan's op-level SAC policy saves:
  // the attention, odd-numbered bias-free matmuls, float8 amax reductions (aten.max).
  std::int64_t sac_saved = 0;
  // Traced inside a custom autograd.Function under compile (QLoRA's LinearNF4): full checkpointing keeps its
  // output instead of rerunning it (models/autograd_tape.h TapeOp::escapes_checkpoint).
  bool escapes_checkpoint = false;
};

struct KernelBuilder {
  const ModelSpec& m;
  std::int64_t b, s, T, e;        // micro-batch, sequence, tokens b*s, activation dtype bytes
  Dtype dtype;
  KernelOptions opt;
  bool backward;
  std::vector<KernelDesc>* out;
  // Forward only, when a recompute list is being derived: one note per kernel appended, and the
  // index of the first kernel that a full checkpoint's early stop skips (-1: none recorded).
  std::vector<ForwardNote>* notes = nullptr;
  int early_stop_end = -1;
  int mm_count = 0;               // bias-free matmuls of this block's forward so far (SAC parity)
  // Backward: which weights get a weight-gradient GEMM and whether the part's input needs a gradient
  // (models/trainable.h); the forward ignores it.
  GradFlow flow;
  bool escaping = false;          // forward: the kernels being pushed escape a full checkpoint (ForwardNote)

  bool trains(Weight w) const { return flow.trains_weight(w); }
  // LoRA adapters beside the base weight w that train (their gradient flows back through the linear's output)
  bool adapted(Weight w) const { return opt.lora.adapts(w) && flow.trains_weight(Weight::Adapter); }

  bool eager() const { return !opt.compile; }
  Bytes act() const { return T * m.hidden * e; }   // one [T, h] activation

  KernelDesc& push(KernelDesc k, std::int64_t sac_saved = 0);
  void gemm(const std::string& name, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t count = 1,
            Dtype gemm_dtype = Dtype::BF16, bool fp8 = false, std::int64_t sac_saved = 0);
  // One memory-bound kernel moving `bytes` (every input read once, every output written once).
  void elementwise(const std::string& name, Bytes bytes, MemoryClass cls, KernelKind kind = KernelKind::Elementwise,
                   std::int64_t sac_saved = 0);
  void attention();
  // A linear layer [tokens, in] x [in, out]: forward GEMM (with float8: the operand casts first),
  // or in backward its dgrad (when `dgrad`: its input requires grad) and wgrad (when `wgrad`: its weight
  // trains). `bias`: addmm (the SAC policy neither saves nor counts it). `sac_saved` >= 0: the SAC-saved
  // copies given by the caller (experts, numbered expert by expert), which then advances mm_count itself.
  void linear(const std::string& name, std::int64_t in, std::int64_t outf, bool wgrad, std::int64_t tokens = -1,
              std::int64_t count = 1, bool bias = false, bool float8_allowed = true, std::int64_t sac_saved = -1,
              bool dgrad = true);
  // QLoRA: the kernels that dequantize an NF4 weight of `elems` elements into the compute dtype (models/nf4.h).
  void nf4_dequant(const std::string& name, std::int64_t elems);
  // LoRA adapters beside the linear(s) of base weight `base` (models/trainable.h lora_adapters; nothing
  // when none): forward dropout (p > 0), A and B GEMMs, litgpt's zero-pad, the scaling and the sum with the
  // base output; backward their gradients: A's and B's weight gradients when the adapters train, B's input
  // gradient, A's (and the dropout's, and the sum into the linear input's gradient) when `in_rg`.
  void adapter(const std::string& name, Weight base, std::int64_t outf, bool in_rg);
  // The float8 amax / scale / cast kernels of one linear (kernels_float8.cpp): forward casts of the
  // input and the weight, or backward casts of the output grad (twice), the weight and the input.
  void float8_casts(const std::string& name, std::int64_t tokens, std::int64_t in, std::int64_t outf,
                    std::int64_t count, bool wgrad);
};

// kernels.cpp: the kernels of one part, forward or backward. With `notes`, one note per kernel and the
// early-stop cut of a block's forward in *early_stop_end (-1 when the part has none).
std::vector<KernelDesc> build_kernels(const ModelSpec& m, ModulePart part, std::int64_t b, std::int64_t s, Dtype dtype,
                                      bool backward, const GradFlow& flow, const KernelOptions& opt,
                                      std::vector<ForwardNote>* notes, int* early_stop_end);

// kernels_elementwise.cpp. Each appends the forward or the backward (per b.backward) of one piece.
// Norm over [T, h] (RMSNorm or LayerNorm per the model); `wgrad`: weight (and bias) gradients;
// `grad_uses`: linears reading the norm's output (backward: their input grads are summed first;
// compiled, inside the norm's dx kernel); `residual`: the residual stream is summed at the norm's input
// (forward: x + branch just before it; backward: the residual grad added to its dx). Compiled, both
// sums are fused into the norm's kernels.
void norm(KernelBuilder& b, const std::string& name, bool wgrad, std::int64_t grad_uses = 1, bool residual = false);
void residual_add(KernelBuilder& b, const std::string& name);
// Rotary embedding of q [T, a*d] and k [T, g*d].
void rotary(KernelBuilder& b);
// The MLP activation on `tokens` x f elements (`count` expert copies): GELU, or the gated product.
void activation(KernelBuilder& b, const std::string& prefix, std::int64_t tokens, std::int64_t count);
// Eager autograd sums the input gradients of a tensor used by several linears (InputBuffer's add).
void grad_accumulate(KernelBuilder& b, const std::string& name, std::int64_t uses);

}  // namespace fsdpsim::models::detail
