// One rank of the bundled FSDP runtime on the CUDA backend: the rank runner (runtime/rank_runner.h)
// over the CUDA device (cuda_device.h), with mixed precision as the plan says (fsdp-semantics.md
// M6/M9, F2.2, F2.9, F1.10-F1.12):
//  * sharded parameters, their gradients and the optimizer states in fp32 (master_weights_dtype);
//  * unsharded parameters, activations and unsharded gradients in bf16 (param_dtype): the all-gather
//    runs in bf16 after the program's cast;
//  * gradient reduction in reduce_dtype (fp32 or bf16), accumulated into the fp32 sharded grad;
//  * the optimizer (AdamW / SGD-momentum) on the fp32 shards.
// Each buffer's element type comes from the rank program (rank_program.h buffer_elem).
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/device_communicator.h"
#include "runtime/rank_runner.h"

namespace fsdpsim::runtime::cuda {

// InputError if the CUDA runtime cannot execute this plan/model (bf16 compute, fp32 masters, ...).
void check_cuda_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan);

class CudaRankRunner : public Runner {
 public:
  // cfg.address_space caps the device region for the allocator's segments (it also stays below the
  // free device memory less headroom for cuBLAS and NCCL).
  CudaRankRunner(const RunConfig& cfg, DeviceCommunicator& comm);

  // Emulated worlds only: after each collective's local stand-in, its stream waits per_op_ns[op id]
  // more (a GPU-side delay, spin.h), e.g. the profile's predicted duration of that collective, so that
  // communication overlaps compute as it would on the real fabric.
  void pad_collectives(std::vector<TimeNs> per_op_ns);
  // What the driver says the device uses (cudaMemGetInfo: total - free), issue 19: at the runner's start
  // (CUDA context, NCCL communicators, cuBLAS handle), the placed allocator's fixed region, and the most
  // after setup and after each step, so that the bytes outside the region (context, cuBLAS workspaces,
  // NCCL buffers, untracked scratch) can be set beside the prediction's context bytes.
  nlohmann::json device_memory() const;
};

}  // namespace fsdpsim::runtime::cuda
