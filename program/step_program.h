// The StepProgram: one training step of one rank as FSDP issues it (design.md "The one idea").
// A plain data structure, independent of any cost model: the simulator executes it against a
// hardware profile, the runtime executes it on real hardware. Lowering (program/lowering.h) builds it.
//
// Execution semantics (shared by both executors, see note "program semantics" in README):
//  * ops are listed in CPU issue order; the CPU issues them one after the other;
//  * before issuing op i the CPU blocks until every op in `cpu_waits` has completed on the GPU
//    (event.synchronize(): the FSDP1 rate limiter, offload syncs); in the simulator also until op i's
//    `kernel_launches` fit in its stream's launch queue (a CUDA stream holds about 1000 pending kernels:
//    sim/executor.cpp "Launch queue"; the CPU runtime's stream queues are unbounded);
//  * at issue the CPU performs `allocs` (caching allocator, pool = the buffer's pool_stream; a
//    first_step_lazy buffer only in the first step), with the frees inside the op (FreeSpec
//    free_inside_op, listed first in `frees`) between them, then enqueues the op on `stream`; after
//    enqueueing it performs the other `frees`;
//  * on the GPU an op starts when its stream has finished the previous op on that stream AND every
//    op in `waits` has completed (cudaStreamWaitEvent / wait_stream);
//  * collectives of one process group are serialized on one NCCL queue (semantics F1.4);
//  * a FreeSpec with reuse_after_op >= 0 models record_stream (FSDP1, semantics M10): the bytes stop
//    counting as allocated at the free, but the block returns to its pool only when that op completes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/units.h"
#include "models/kernels.h"
#include "program/sim_result.h"

namespace fsdpsim::sim {

// Streams as PyTorch names them. FSDP1 (F1.1): default, pre_unshard, unshard, post_backward,
// all_reduce. FSDP2 (F2.1): default, all_gather_copy_in, all_gather, reduce_scatter, all_reduce.
// Offload: torchtune's activation-offloading side stream (plan.activation_offloading "streams").
enum class StreamRole { Compute, CopyIn, AllGather, ReduceScatter, AllReduce, Offload };
struct Stream {
  int id = 0;
  StreamRole role = StreamRole::Compute;
  std::string name;   // PyTorch's name: "default", "unshard", "all_gather_copy_in", ...
};

enum class OpKind {
  Forward, Backward, Recompute,          // compute of one unit's parts (see `kernels`)
  AllGather, ReduceScatter, AllReduce,   // NCCL collectives
  CopyIn, CopyOut, Cast, Pad, Divide,    // memory-bound kernels (see `copy_bytes`)
  H2D, D2H,                              // CPU offload copies (pinned, PCIe)
  OptimizerStep,                         // on the GPU shards (memory-bound, `copy_bytes`)
  CpuOptimizerStep,                      // on the CPU (offloaded optimizer): blocks the CPU, `params`
};
const char* op_kind_name(OpKind k);
// The NCCL collectives (AllGather, ReduceScatter, AllReduce): they run on a process group's queue.
constexpr bool is_collective(OpKind k) {
  return k == OpKind::AllGather || k == OpKind::ReduceScatter || k == OpKind::AllReduce;
}

// Which process group a collective runs on.
enum class CommGroup {
  Shard,          // the shard dimension of the mesh
  Replicate,      // the replicate dimension (HSDP all-reduce)
  World,          // every rank (NO_SHARD all-reduce over replicate x shard)
  PostForward,    // FSDP2 reshard_after_forward=int: the smaller backward all-gather group
};

struct Buffer {
  int id = 0;
  std::string name;            // "unit3.full_param_padded", "unit3.grad_shard", ...
  Bytes bytes = 0;             // requested size (the allocator rounds it)
  MemCategory category = MemCategory::UnshardedParams;
  int unit = -1;
  int pool_stream = 0;         // caching-allocator pool (the stream it is allocated on)
  bool persistent = false;     // allocated before the step and alive after it (sharded state)
  // A persistent buffer the first step creates lazily: allocated by the op that lists it in `allocs`
  // (optimizer state: torch.optim creates it inside the first optimizer.step(), adamw.py _init_group),
  // alive from then on; every later step starts with it. The executors replay the first step and a
  // steady-state step (sim/executor.h). Every buffer that is not persistent must be freed by the end of
  // the step (the sharded gradients by optimizer.zero_grad(set_to_none=True)).
  bool first_step_lazy = false;
  // A persistent buffer the training loop makes once the model is built and sharded (after FSDP1's construction,
  // before its torch.cuda.empty_cache()): the batch on the device and the recipe's rotary tables
  // (program/lower_walk.cpp add_loop_inputs). Allocated after every other persistent buffer, in buffer order.
  bool after_construction = false;
  // FSDP1's construction (StepProgram::init_flatten_world): the unit's original parameters, held while this
  // FlatParameter shard is made; an index into StepProgram::init_originals (-1: none).
  int init_originals = -1;
};

struct FreeSpec {
  int buffer = -1;
  // -1: freed after enqueueing, the block reusable at once; >= 0: after enqueueing, the block reusable only
  // after that op completes (record_stream); <= -2 (free_inside_op(k)): freed while the op issues, right
  // after its first k allocs (a temporary the op makes and drops: PyTorch's forward frees each tensor at
  // its last use, between the allocations of later ones), reusable at once.
  int reuse_after_op = -1;
};
// The reuse_after_op of a free inside the op, after its first k >= 1 allocs; and back.
constexpr int free_inside_op(int k) { return -2 - k; }
constexpr bool is_free_inside_op(int reuse_after_op) { return reuse_after_op <= -2; }
constexpr int allocs_before_free(int reuse_after_op) { return -2 - reuse_after_op; }
// Whether a free of op `id` may carry reuse_after_op `r`, given the previous free's (`prev`; for the first
// free pass free_inside_op(1)) and the op's number of allocs: -1 or an op issued so far; a free inside the op
// only among the first frees (before every free after enqueueing), after at least one and at most all of the
// op's allocs, never before an earlier one's.
constexpr bool valid_free_reuse(int r, int prev, int id, int n_allocs) {
  if (!is_free_inside_op(r)) return r >= -1 && r <= id;
  return is_free_inside_op(prev) && allocs_before_free(r) >= std::max(1, allocs_before_free(prev)) &&
         allocs_before_free(r) <= n_allocs;
}

struct Op {
  int id = 0;
  OpKind kind = OpKind::Forward;
  int stream = 0;
  int unit = -1;               // FSDP unit (param group) this op belongs to, -1 if none
  int micro_batch = 0;
  std::string name;            // for traces: "AG unit 3", "fwd unit 3", ...
  std::vector<int> waits;      // GPU: ops that must complete before this one starts
  std::vector<int> cpu_waits;  // CPU: ops whose completion the CPU blocks on before issuing this one
  std::vector<int> allocs;     // buffers allocated at issue
  std::vector<FreeSpec> frees; // buffers freed after enqueueing
  std::vector<int> inputs;     // buffers read (runtime + checks)
  std::vector<int> outputs;    // buffers written
  // ---- cost descriptors (no times here) ----
  // Compute ops: the kernels they run. Read them with kernel_list(): the lowering shares one
  // immutable list among all ops of the same part (80 blocks -> 1 list), hand-built programs may
  // fill `kernels` directly. shared_kernels, when set, wins.
  std::vector<models::KernelDesc> kernels;
  std::shared_ptr<const std::vector<models::KernelDesc>> shared_kernels;
  const std::vector<models::KernelDesc>& kernel_list() const { return shared_kernels ? *shared_kernels : kernels; }
  Bytes comm_bytes = 0;        // collectives: S as nccl-tests counts it (gathered / pre-scatter / reduced buffer)
  CommGroup group = CommGroup::Shard;
  int group_size = 1;          // ranks in the collective's group
  int nodes_spanned = 1;       // nodes the group spans
  Bytes copy_bytes = 0;        // memory-bound ops: bytes read + written; H2D/D2H: bytes copied
  std::int64_t params = 0;     // CpuOptimizerStep: parameters updated
  int cpu_hooks = 0;           // framework hooks the CPU runs before issuing this op
  int kernel_launches = 1;     // kernels the CPU launches for this op (its issue cost; its launch-queue slots)
};

// The allocator calls of op `op` at its issue, in program order: alloc(buffer) for each of `allocs`, with
// free(spec) for each free inside the op among them; returns the index in `frees` of the first free made
// after enqueueing.
template <class Alloc, class Free>
std::size_t issue_memory(const Op& op, Alloc&& alloc, Free&& free) {
  std::size_t a = 0, f = 0;
  for (; f < op.frees.size() && is_free_inside_op(op.frees[f].reuse_after_op); ++f) {
    for (const auto k = static_cast<std::size_t>(allocs_before_free(op.frees[f].reuse_after_op)); a < k; ++a)
      alloc(op.allocs[a]);
    free(op.frees[f]);
  }
  for (; a < op.allocs.size(); ++a) alloc(op.allocs[a]);
  return f;
}

// One call of the training loop's setup after construction (StepProgram::loop_setup).
struct LoopSetupCall {
  enum Kind : std::uint8_t {
    Buffer,      // the next after_construction buffer, in buffer order
    Temporary,   // a temporary of `bytes` on `pool_stream`'s pool
    Free,        // frees temporary number `temporary` (counted from 0 in the order they were made)
  };
  Kind kind = Buffer;
  Bytes bytes = 0;
  int pool_stream = 0;
  int temporary = -1;
  bool operator==(const LoopSetupCall&) const = default;
};

// A request the run makes and frees before the first step's first op (it leaves only its segment reserved).
struct InitRequest {
  Bytes bytes = 0;
  int pool_stream = 0;
  bool operator==(const InitRequest&) const = default;
};

// FSDP1 with parameters offloaded to the CPU (StepProgram::init_offloaded): one FlatParameter made on the device and
// moved to the CPU.
struct InitOffloaded {
  Bytes bytes = 0;        // its device shard (the flattened whole: init_flatten_world times as many)
  int pool_stream = 0;
  int originals = -1;     // an index into StepProgram::init_originals (-1: none)
  bool operator==(const InitOffloaded&) const = default;
};

struct StepProgram {
  std::vector<Stream> streams;   // streams[0] is the compute (default) stream
  std::vector<Buffer> buffers;
  std::vector<Op> ops;           // CPU issue order
  // facts about the step (for the result, the runtime and the report)
  int world = 1, shard_size = 1, replicate_size = 1, gpus_per_node = 1;
  int micro_batches = 1;
  std::int64_t tokens_per_rank = 0;           // tokens this rank processes per optimizer step
  double model_flops_per_rank = 0;            // 6N+attention convention (no recompute)
  std::vector<std::string> notes;             // approximations made by the lowering
  // Allocated and freed one by one, in order, after the persistent buffers and before the first step (FSDP1's
  // lazy init: FlatParamHandle.init_flat_param_attributes makes and frees each handle's _mp_shard,
  // _full_param_padded and _full_prec_full_param_padded on the default stream; program/lower_fsdp1.cpp). A
  // request equal to an earlier one is left out: the block that served it is free again and serves it again.
  std::vector<InitRequest> init_scratch;
  // FSDP1's construction (FullyShardedDataParallel.__init__ -> _init_param_handle_from_module, units in auto-wrap's
  // post-order: the blocks, then the root with the rest): the unit's original parameters are materialized
  // (_materialize_with_param_init_fn, module by module breadth first, or moved to the device by
  // _move_module_to_device), its FlatParameter flattened whole (FlatParamHandle.flatten_tensors: a torch.cat
  // padded to a multiple of the shard group) and then sharded (FlatParamHandle.shard: this rank's chunk cloned
  // while the whole one is alive, which is then freed), and the originals are freed after that, when
  // _init_param_handle_from_module returns (its `managed_params` list holds them through
  // _init_param_handle_from_params; torch/distributed/fsdp/_init_utils.py). With init_flatten_world >= 1, each
  // persistent ShardedParams buffer is made that way: its Buffer::init_originals allocated one by one, a scratch
  // of init_flatten_world times its bytes, the buffer, the scratch freed, the originals freed (init_flatten_world 1,
  // NO_SHARD or a world of 1: no scratch, the flattened whole is the buffer); in buffer order
  // but init_flatten_last (the root's) last, after the other persistent buffers; then torch.cuda.empty_cache() (as
  // the PyTorch harness does after construction: what construction left wholly free is released; what it left in
  // use, such as the root's shard placed in a block's freed flat buffer, stays) and the allocator's peaks restart (the
  // step's peaks are the step's), before init_scratch. 0: none (FSDP2, QLoRA, the bundled
  // runtime). (A model moved to the GPU whole before FSDP wraps it holds every original from the start: not
  // this path; the harness, Lightning's and accelerate's meta-device or CPU loading are.)
  int init_flatten_world = 0;
  int init_flatten_last = -1;
  // With the parameters offloaded to the CPU (CPUOffload(offload_params=True)) each FlatParameter is made on the
  // device the same way and then moved to the CPU (_init_param_handle_from_params calls handle.flat_param_to(cpu)
  // after handle.shard()): its device shard is freed after the flattened whole and before the originals, and no
  // persistent buffer of the step is made that way. In construction order (the blocks', then the root's), before
  // the after_construction buffers.
  std::vector<InitOffloaded> init_offloaded;
  // Distinct lists of original parameter sizes (bytes, in materialization order), named by
  // Buffer::init_originals: identical units share one list.
  std::vector<std::vector<Bytes>> init_originals;
  // How the after_construction buffers are made (after FSDP1's construction, before the cache is emptied): with the
  // temporaries their code makes and frees around them (program/lower_walk.cpp add_loop_inputs). Empty: the
  // after_construction buffers in buffer order, nothing else. Every Temporary is freed by a later Free, and then
  // torch.cuda.empty_cache() (the harness's, after the model's setup) runs with FSDP2 too.
  std::vector<LoopSetupCall> loop_setup;
  // Per FSDP unit, the buffer that is its gradient when the optimizer steps (-1: none, a frozen or empty
  // unit): the reduce-scatter output, the fp32 cast of it, or (NO_SHARD) the all-reduced gradient itself.
  std::vector<int> unit_grads;
};

}  // namespace fsdpsim::sim
