// What a checkpointed block reruns before its backward, from the same kernel model as its forward.
//
// Full checkpointing (torch.utils.checkpoint around the block): the forward runs again under
// enable_grad. Non-reentrant checkpointing stops early by default (torch/utils/checkpoint.py:
// _recomputation_hook's pack_hook raises _StopRecomputationError once as many tensors were re-saved
// as the forward saved; set_checkpoint_early_stop, default True): the last tensors a llama or MPT
// block saves are the MLP's last linear's input and weight, packed before that matmul runs, and the
// residual add after it saves nothing, so that linear (its float8 casts included) and the add are not
// rerun. torchtitan passes early_stop=False to checkpoint_wrapper and reentrant checkpointing has no
// early stop: the whole forward reruns (KernelOptions::checkpoint_early_stop = false). Under
// torch.compile the checkpointed region is recomputed by AOTAutograd's partitioner, which reruns only
// what the backward graph reads: the same cut as the early stop. An eager checkpoint around a compiled
// block (checkpoint(compile(block)), torchtune's order) reruns the compiled forward whole: it is one
// autograd Function whose tensors are packed, and the early stop checked, only after its last kernel ran;
// nothing escapes that checkpoint, so the NF4 linears rerun too.
//
// Selective op checkpointing (torchtitan's op-level SAC policy, fsdp-semantics.md A4): ops the policy
// saves (SDPA, odd-numbered aten.mm, aten.max) are replayed from the cache; every other op reruns
// (torchtitan's SAC passes early_stop=False, so all of them). Under compile the partitioner reruns the
// same ops inside the backward graph, where inductor may fuse the pointwise ones into backward kernels:
// they are listed as the compiled forward's kernels (an approximation: an upper bound on their traffic).
#include "models/kernel_builder.h"

namespace fsdpsim::models {

std::vector<KernelDesc> recompute_kernels(const ModelSpec& m, ModulePart part, std::int64_t micro_batch,
                                          std::int64_t seq_len, Dtype dtype, CheckpointMode mode,
                                          const KernelOptions& options) {
  if (part != ModulePart::Block || mode == CheckpointMode::None) return {};
  std::vector<detail::ForwardNote> notes;
  int stop = -1;
  std::vector<KernelDesc> fwd =
      detail::build_kernels(m, part, micro_batch, seq_len, dtype, false, GradFlow{}, options, &notes, &stop);
  if (mode == CheckpointMode::Full) {
    const bool around_compiled = options.compile && options.checkpoint_outside_compile;
    if (around_compiled) return fwd;
    if ((options.checkpoint_early_stop || options.compile) && stop >= 0) fwd.resize(static_cast<std::size_t>(stop));
    std::vector<KernelDesc> rerun;   // what escaped the checkpoint was kept, not rerun
    rerun.reserve(fwd.size());
    for (std::size_t i = 0; i < fwd.size(); ++i)
      if (!notes[i].escapes_checkpoint) rerun.push_back(std::move(fwd[i]));
    return rerun;
  }
  std::vector<KernelDesc> out;
  for (std::size_t i = 0; i < fwd.size(); ++i) {
    KernelDesc k = fwd[i];
    const std::int64_t saved = notes[i].sac_saved;
    if (saved >= k.count) continue;
    if (saved > 0) {   // some expert copies of a matmul are saved, the others rerun
      k.flops = k.flops / static_cast<double>(k.count) * static_cast<double>(k.count - saved);
      k.bytes = k.bytes / k.count * (k.count - saved);   // bytes are per copy times count: exact
      k.count -= saved;
    }
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace fsdpsim::models
