// Host (CPU) memory of a plan: what CPU offload keeps in each node's RAM, checked against the node's
// host memory (issue 20, item 3). simulate() calls apply_host_memory once, after the step has run.
//
// What a rank keeps on the host (fsdp-semantics.md M11), in the master dtype:
//  * FSDP1 CPUOffload(offload_params=True): per FlatParameter the local shard, pinned, and the
//    pre-allocated gradient `_cpu_grad` of the same size, pinned (torch/distributed/fsdp/_flat_param.py
//    `init_flat_param_attributes`: `_local_shard.pin_memory()`, `torch.zeros_like(_local_shard,
//    device=cpu).pin_memory()`); the optimizer states, pageable (torch.optim creates them with zeros_like).
//  * FSDP2 CPUOffloadPolicy(pin_memory=True): per parameter the padded local chunk, pinned
//    (_fsdp_param.py `_init_sharded_param`: `padded_sharded_param.pin_memory()`), and its gradient, pinned:
//    `new_sharded_grad.to("cpu", non_blocking=True)` in _fsdp_collectives.py `foreach_reduce` allocates
//    its output pinned (aten TensorConversions.cpp `_to_copy`: pin_out when non_blocking and CUDA -> CPU);
//    the optimizer states, pageable.
//  * Pinned allocations go through PyTorch's CachingHostAllocator, which rounds every request up to the
//    next power of two (aten/src/ATen/core/CachingHostAllocator.h `allocate`: PowerOf2Ceil): counted so.
//  * cpu_offload.optimizer without params (not a PyTorch FSDP option): the grads copied down, a copy of
//    the sharded params and the optimizer states, unrounded (how such a step pins is not defined).
//  * torchtune's activation offloading (plan.activation_offloading; program/lower_walk.cpp "activation
//    offloading"): every copy of one micro-batch's forward, pinned (torch.empty_like(..., pin_memory=True)) and held
//    until its backward, each a power-of-two block: per checkpointed block its input (micro_batch x seq_len x hidden
//    in param_dtype) and rotary tables (lowering::OffloadPacks), per block without checkpointing what it saves
//    (models::block_saved_activation_bytes, unrounded), and the loss's log-probabilities twice and its target
//    when the model's forward computes the loss; the final norm's few tensors are not counted (add
//    offloaded_activations_pinned to pinned_per_rank).
// Every rank of a node does the same (SPMD), so a node needs gpus_per_node times one rank's bytes.
// Not counted: the process itself, the data loader, pageable temporaries of an accumulating D2H.
#pragma once
#include <string>

#include "calibrate/hardware_profile.h"
#include "common/units.h"
#include "models/model_spec.h"
#include "models/trainable.h"
#include "models/wrap_graph.h"
#include "program/plan.h"
#include "program/sim_result.h"

namespace fsdpsim::sim {

struct HostMemory {
  Bytes pinned_per_rank = 0;     // page-locked (CachingHostAllocator, power-of-two blocks)
  Bytes pageable_per_rank = 0;   // ordinary host memory (optimizer states)
  int ranks_per_node = 1;
  Bytes per_node() const { return (pinned_per_rank + pageable_per_rank) * ranks_per_node; }
};

// The host bytes of `rp` (a resolved plan) on `graph`, with `gpus_per_node` ranks per node; `ts`: the
// plan's trainable set (models::trainable_set; the default: everything trains).
HostMemory host_memory(const models::WrapGraph& graph, const Plan& rp, int gpus_per_node,
                       const models::TrainableSet& ts = {});

// The pinned host bytes torchtune's activation offloading holds per rank (0 when the plan does not offload).
Bytes offloaded_activations_pinned(const models::ModelSpec& m, const Plan& rp);

// A paged optimizer's state in CUDA unified memory per rank (program/optimizer_state.h): outside PyTorch's
// allocator, so in neither the allocated nor the reserved figures. 0 for any other optimizer.
Bytes paged_optimizer_bytes(const models::WrapGraph& graph, const Plan& rp, const models::TrainableSet& ts);

// Writes the host figures into `r` (host_memory_per_node, host_capacity_per_node), marks a plan that
// needs more host memory than a node has as not fitting (with a note naming both figures and the
// node), and notes how the CPU optimizer step was costed when the plan offloads.
void apply_host_memory(const HostMemory& h, const calibrate::HardwareProfile& hw, const Plan& rp, SimResult& r);

}  // namespace fsdpsim::sim
