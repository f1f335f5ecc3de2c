// The CPU backend's collectives on MPI (OpenMPI): one communicator per process group of the
// (replicate, shard) mesh, created with MPI_Comm_split. Each collective is started non-blocking and
// completed by polling MPI_Test with short sleeps, so a rank's stream threads can run collectives of
// different groups at once (MPI_THREAD_MULTIPLE) without burning the cores compute needs.
// Reductions are deterministic (communicator.h): reduce-scatter is an all-to-all of the chunks
// followed by a local sum in group-rank order; all-reduce is that reduce-scatter plus an all-gather
// (the ring's traffic, 2(n-1)/n of the buffer per rank). Every MPI call is checked with file:line
// and the rank (style.md lesson 7).
#pragma once
#include <mpi.h>

#include "runtime/cpu/communicator.h"

namespace fsdpsim::runtime {

class MpiCommunicator : public Communicator {
 public:
  // MPI must be initialized (MPI_THREAD_MULTIPLE). shard_size = the mesh's shard dimension.
  explicit MpiCommunicator(int shard_size);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int group_rank(sim::CommGroup g) const override;
  int group_size(sim::CommGroup g) const override;
  void all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) override;
  void reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) override;
  void all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) override;
  void barrier() override;
  double sum_world(double v) override;
  double max_world(double v) override;

 private:
  MPI_Comm comm(sim::CommGroup g) const;
  void wait(MPI_Request& req, const char* what) const;

  int rank_ = 0, world_ = 1, shard_ = 1;
  MPI_Comm shard_comm_ = MPI_COMM_NULL, replicate_comm_ = MPI_COMM_NULL;
};

}  // namespace fsdpsim::runtime
