// What one transformer block keeps for backward, tensor by tensor, as each framework's code runs it
// (issue 19 item 3; fsdp-semantics.md section 9). The recipes and the sources they follow are in
// models/implementation.cpp; the op-by-op accounting in models/autograd_tape.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/units.h"
#include "models/autograd_tape.h"
#include "models/model_spec.h"
#include "models/trainable.h"

namespace fsdpsim::models {

struct ImplOptions {
  ModelImpl impl = ModelImpl::HF;
  bool compile = false;                         // torch.compile (inductor) on each block
  Float8Recipe float8 = Float8Recipe::None;     // torchao Float8Linear on the block's nn.Linear layers
  LoraShape lora{};                             // LoRA adapters (models/trainable.h)
  // The GPU's multiprocessors: PyTorch's reduction kernels size their cross-block staging buffers by it
  // (a biased linear's bias gradient, models/cuda_reduce.h); 0: none (no CUDA device, the bundled runtime).
  int sm_count = 0;
  // Compiled and fully checkpointed: true when an eager checkpoint wraps the compiled block
  // (checkpoint(compile(block)), torchtune's order): the block keeps its input only, however the compiled
  // graph treats the ops inside it (sim::ActivationCheckpointing::outside_compile).
  bool checkpoint_outside_compile = false;
};

struct SavedTensor {
  const char* name = nullptr;  // static string, unique within a block ("attn_norm.x_fp32", "attn.q_rope", "attn.lse")
  Bytes bytes = 0;
  // The entry is the block's input ("x"): the tensor the previous block (or the embedding) produced,
  // kept by this block, not allocated by it.
  bool is_input = false;
};

struct BlockMemory {
  // What autograd keeps for backward, one entry per distinct storage (a view of a kept tensor keeps
  // its whole base: the base is counted once), in the order the forward creates them (the input first).
  std::vector<SavedTensor> saved;
  // The most bytes of forward temporaries (not saved) alive at one moment on top of the saved tensors
  // created so far. It includes the block input while the block still holds it when it is not saved,
  // and the block output once created (the next block's input): the block accounts for both.
  Bytes forward_extra = 0;
  // The forward's allocator events in op order (models::AutogradTape::forward_events), each Kept event
  // naming its entry of `saved`: the lowering allocates the saved tensors and frees the
  // temporaries in this order, tensor by tensor (issue 19 item 4). Empty for the bundled runtime's blocks.
  std::vector<ForwardEvent> forward_events;
  // The peak during the block's backward minus the sum of `saved`: peak = sum(saved) + backward_extra.
  // The walk starts with every saved tensor and the incoming gradient of the block output, includes the
  // recompute of a checkpointed block, allocates activation gradients and kernel workspaces, and frees
  // saved tensors as the backward consumes them; the block input's gradient (handed to the previous
  // block) is alive at the end. Parameter gradients are FSDP's accounting, not this one.
  Bytes backward_extra = 0;
  // The same peak with the weights' gradients counted from the backward op that creates each (models::TapeCost
  // backward_extra_with_grads), and their total (param_grads: the block's trainable weights in the compute
  // dtype). With every gradient allocated with the backward, it needs backward_extra_with_grads - param_grads
  // on top of them: a block's peak comes where its first ops (the MLP's down projection) have made only their
  // own weight's gradient, not all of them.
  Bytes backward_extra_with_grads = 0;
  Bytes param_grads = 0;
  // A checkpointed block's recompute tensor by tensor (models::AutogradTape::recompute_events: Kept events are
  // the recomputed saved tensors, named as the uncheckpointed block's `saved` entries), and the backward's
  // peaks without the recompute (TapeCost backward_phase_extra*) with the incoming gradient they include.
  std::vector<ForwardEvent> recompute_events;
  Bytes backward_phase_extra = 0, backward_phase_extra_with_grads = 0, incoming_grad = 0;
  // The backward after the recompute tensor by tensor (models::AutogradTape::backward_events): a Release, or a
  // gradient written into a saved storage, names its entry of `saved` (BackwardEvent::saved) when the forward
  // kept it; a recomputed one is named by the lowering (its recompute list). Empty for the bundled runtime's
  // blocks and a block without a backward.
  std::vector<BackwardEvent> backward_events;

  Bytes saved_bytes() const;  // sum of `saved`
};

// One block, one micro-batch of `micro_batch` x `seq_len` tokens, activations in `act`, under `mode`:
//   None: everything the code saves; Full: the block input only (torch.utils.checkpoint, non-reentrant);
//   SelectiveOp: torchtitan's op-level SAC policy (fsdp-semantics.md A4): the block input and the outputs
//   of the ops the policy saves. Names are the same across modes, so what a recompute re-creates is
//   saved(None) minus saved(mode) by name; a SelectiveOp entry may name a tensor plain autograd does not
//   keep (the SAC cache holds matmul outputs such as "attn.qkv" or "mlp.down").
// `g`: which of the block's weights require grad and whether its input does (models/trainable.h): a frozen
// linear saves no input, nothing before the block's first trainable weight is saved when its input does not
// require grad, and a block that records no graph keeps nothing (not even a checkpoint's input) and has no
// backward. Throws InputError for a non-positive micro_batch or seq_len.
BlockMemory block_memory(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype act,
                         CheckpointMode mode, const ImplOptions& o, const GradFlow& g = {});

// The final norm before the LM head, and the head's input (the norm output the head's linear saves):
// their saved tensors and transients. torchtitan compiles blocks only, so compile does not apply to its
// final norm. The logits are not part of it (logits_bytes).
// `g`: the final norm's and the LM head's weights (Weight::FinalNorm, Weight::LmHead) and whether the last
// block's output requires grad.
BlockMemory final_norm_memory(const ModelSpec& m, std::int64_t micro_batch, std::int64_t seq_len, Dtype act,
                              const ImplOptions& o, const GradFlow& g = {});

// Whether the recipe's training loop / loss upcasts the logits to fp32 before cross_entropy:
// torchtitan (components/loss.py cross_entropy_loss: pred.float()), HF transformers
// (loss/loss_utils.py ForCausalLMLoss: logits.float()) and the fused recipe (an HF model) do; litgpt
// (utils.py chunked_cross_entropy) passes the logits as they are.
bool loss_upcasts_logits(const ModelSpec& m, const ImplOptions& o);

// Rows per chunk of the recipe's cross-entropy over the logits [T, V] (0: one call over all rows).
// litgpt's chunked_cross_entropy (litgpt/utils.py; chunk_size=128, what its pretrain/finetune scripts
// pass) splits the logits into 128-row views and calls cross_entropy(reduction="none") on each: each
// chunk saves its own log_softmax output, and the backward runs one chunk at a time before
// split_with_sizes_backward (torch/csrc/autograd/FunctionsManual.cpp) concatenates the chunks' gradients.
std::int64_t loss_chunk_rows(const ModelSpec& m, const ImplOptions& o);

// "torchtitan" | "hf" | "litgpt" | "fused" (InputError naming `field` otherwise).
ModelImpl parse_model_impl(const std::string& s, const std::string& field);

}  // namespace fsdpsim::models
