// What the rank runner (rank_runner.h) derives from a plan before executing anything, for every
// backend: the StepProgram the simulator executes (sim::lower), each FSDP unit's parameter layout,
// which unit and tensors every compute segment (embedding, blocks, norm + head) uses, the persistent
// buffers per unit, each buffer's element type, and each op's role (analyze): what it does to data,
// a compute op's segment, a Divide's factor, and where a unit's gradient-reduction chain ends.
// Backend-neutral: no BLAS, no CUDA.
#pragma once
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "models/wrap_graph.h"
#include "runtime/elem.h"
#include "runtime/unit_layout.h"
#include "runtime/model/dims.h"
#include "runtime/runtime_plan.h"
#include "runtime/train/synthetic_data.h"
#include "program/sim_result.h"
#include "program/plan.h"
#include "program/step_program.h"

namespace fsdpsim::runtime {

// FSDP1's gradient pre-divide factor (F1.12, default_hooks._get_gradient_predivide_factor).
int predivide_factor(int world);
// Ops of the gradient-reduction path (copy-in excluded) and the collectives.
bool is_reduce_path(sim::OpKind k);
using sim::is_collective;   // (program/step_program.h)

// What an op does to data. The program's kind says it for most ops; a copy-in, a copy-out and a cast
// serve several FSDP steps, told apart by where their input comes from (analyze).
enum class OpRole {
  Unsupported,          // a kind the runtime does not execute (offload copies, ...)
  None,                 // a compute op that runs no kernel (the loss's memory-only ops)
  Forward, Backward, Recompute,   // the compute of op_segment
  AllGatherCopyIn,      // FSDP2 (F2.2): this rank's (cast) shard into its slice of the all-gather output
  ReduceScatterCopyIn,  // FSDP2 (F2.9 chunk_cat): the unsharded grads into the reduce-scatter input
  ParamCopyOut,         // FSDP2 split_with_sizes_copy: the all-gather output into the unsharded params
  GradCat,              // FSDP1 split-backward cat + AccumulateGrad: the views' grads into the flat grad
  AllGather, ReduceScatter, AllReduce,
  Divide,               // by op_divide
  Pad,                  // FSDP1 F.pad of the flat grad to N * ceil(numel / N)
  CastToShardedGrad,    // into the unit's sharded grad: assigns where it creates it, else accumulates
  CastAccumulate,       // FSDP2 no_sync: inputs[0] added into the accumulated grad (inputs[1] = outputs[0])
  CastConvert,          // a dtype conversion (mixed-precision parameters, the gradient upcast)
  OptimizerStep,
};

struct ChainEnd {
  int unit = -1;
  int result_buffer = -1;   // accumulate this buffer into the unit's sharded grad after the op
};

struct RankProgram {
  Dims dims;
  models::WrapGraph graph;
  sim::StepProgram program;
  bool fsdp2 = true;
  int N = 1;                                   // shard group size
  int micro_batches = 1;
  std::vector<UnitLayout> layouts;             // per unit
  // Per unit: the persistent sharded parameter and optimizer state, and the sharded gradient (not persistent:
  // created by the unit's reduction, as the reduce-scatter output or by the post-reduce cast, and freed by
  // zero_grad after the optimizer step), -1 if none.
  std::vector<int> shard_buf, grad_shard_buf, optim_buf;
  std::vector<int> seg_unit;                   // per segment (0 embedding, 1..L blocks, L+1 norm + head)
  std::vector<std::vector<int>> seg_tensors;   // per segment: indices into its unit's layout tensors
  std::vector<bool> checkpointed;              // per block (layer)
  bool recompute_early_stop = true;            // the recompute stops after the MLP's activation (kernel_options)
  // Per buffer: its element type (the compute dtype's; activations and logits are the kernels' business).
  std::vector<Elem> buffer_elem;
  std::vector<OpRole> op_role;                 // per op
  std::vector<int> op_segment;                 // per op: segment of a compute op, else -1
  std::vector<int> op_divide;                  // per op: Divide factor
  std::vector<ChainEnd> op_chain_end;          // per op

  long numel(int buffer) const { return program.buffers.at(buffer).bytes / elem_size(buffer_elem.at(buffer)); }
};

// Lowers cfg's plan for `world` ranks (gpus_per_node ranks per node) and analyzes the program.
// `shard_group_size` is the communicator's: it must equal the program's. `backend` names the runtime
// in messages ("CPU runtime", "CUDA runtime"). InputError for a wrap policy the runtime cannot execute;
// std::runtime_error if the program and the runtime's layout disagree (a bug).
RankProgram build_rank_program(const models::ModelSpec& model, const sim::Plan& plan, int world, int gpus_per_node,
                               int shard_group_size, const std::string& backend);

// This rank's micro-batches of optimizer step `step` (0-based) of the synthetic data, the data-parallel
// split over `world` ranks that the reference trainer's global batch is made of.
std::vector<TokenBatch> rank_step_batches(const RankProgram& rp, std::uint64_t seed, int step, int rank, int world);
// The mean token loss over the global batch from the sum of this rank's token losses, all ranks summed.
double global_mean_loss(const RankProgram& rp, double loss_sum_all_ranks, int world);
// The throughput fields and notes of a measured step (the executor fills times and memory).
void complete_measured(const RankProgram& rp, int world, const std::vector<std::string>& runner_notes, sim::SimResult& r);

}  // namespace fsdpsim::runtime
