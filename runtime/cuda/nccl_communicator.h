// The CUDA backend's collectives: one NCCL communicator per process group of the (replicate, shard)
// mesh (sim::CommGroup Shard / Replicate / World, the groups of runtime/communicator.h), each
// bootstrapped as nccl-tests does: the group's first rank calls ncclGetUniqueId and broadcasts it
// over an MPI communicator of the group (MPI_Comm_split), then every member calls ncclCommInitRank.
// Without MPI (one rank, no mpirun) every group has one member and no NCCL communicator is made:
// all-gather and reduce-scatter are device copies, all-reduce does nothing.
//
// Two interfaces:
//  * the typed, asynchronous one the executor uses: all_gather / reduce_scatter / all_reduce on
//    DEVICE buffers of fp32 or bf16, enqueued on the stream given (the group's NCCL stream);
//  * runtime::Communicator (fp32, blocking) for the runner's host-side needs (gathering parameters
//    for --dump, losses, timings): its float* arguments are DEVICE pointers; the call enqueues on an
//    internal stream and waits.
//
// Contract differences from communicator.h: NCCL's sums follow its ring/tree algorithm, not
// group-rank order 0..n-1, so reductions are NOT bitwise reproducible across group sizes,
// algorithms or NCCL versions (they are run-to-run deterministic for a fixed configuration in
// practice, which NCCL does not promise either). Avg is ncclAvg (sum, then a division by n on the
// fly). sum_world/max_world (doubles) go through MPI and keep rank order.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <array>

#include "runtime/cuda/device_communicator.h"

namespace fsdpsim::runtime::cuda {

class NcclCommunicator : public DeviceCommunicator {
 public:
  // use_mpi: MPI is initialized and MPI_COMM_WORLD is the job; otherwise a one-rank world.
  // shard_size = the mesh's shard dimension. The CUDA device must be set before.
  NcclCommunicator(int shard_size, bool use_mpi);
  ~NcclCommunicator() override;

  // ---- typed, asynchronous (executor) ----
  void all_gather(const void* in, void* out, long count, Elem type, sim::CommGroup g, cudaStream_t s) override;
  void reduce_scatter(const void* in, void* out, long count, Elem type, sim::CommGroup g, ReduceOp op,
                      cudaStream_t s) override;
  void all_reduce(void* inout, long count, Elem type, sim::CommGroup g, ReduceOp op, cudaStream_t s) override;

  // ---- runtime::Communicator (its collectives: DeviceCommunicator's) ----
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int group_rank(sim::CommGroup g) const override;
  int group_size(sim::CommGroup g) const override;
  void barrier() override;
  double sum_world(double v) override;
  double max_world(double v) override;

 private:
  ncclComm_t comm(sim::CommGroup g) const;

  bool mpi_ = false;
  int rank_ = 0, world_ = 1, shard_ = 1;
  std::array<ncclComm_t, 3> comms_{};   // Shard, Replicate, World
};

}  // namespace fsdpsim::runtime::cuda
