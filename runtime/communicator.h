// The collective layer of a runtime backend: all-gather, reduce-scatter and all-reduce on fp32
// buffers over the process groups of the (replicate, shard) mesh. The CPU backend implements it on
// MPI (runtime/mpi/mpi_communicator.h) or, for one rank, in-process (LocalCommunicator below); the
// CUDA backend will implement it on NCCL communicators with one stream per group.
//
// Contract shared by every implementation (what the executor relies on):
//  * groups follow sim::CommGroup: Shard = contiguous ranks [r - r % S, ... + S), Replicate = ranks
//    with the same r % S, World = all ranks (S = mesh shard size);
//  * calls on one group are made by one thread at a time, in the same order on every rank (the
//    executor serializes each group's collectives in CPU issue order: one NCCL queue per group, F1.4);
//    calls on different groups may run concurrently from different threads;
//  * reductions sum contributions in group-rank order 0..n-1 whatever the transport does, so results
//    are bitwise reproducible and independent of timing; Avg divides the sum by n.
#pragma once
#include <cstdint>

#include "program/step_program.h"

namespace fsdpsim::runtime {

enum class ReduceOp { Sum, Avg };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int group_rank(sim::CommGroup g) const = 0;
  virtual int group_size(sim::CommGroup g) const = 0;
  // out[n*count] receives every member's in[count] in group-rank order. `in` may be
  // out + group_rank*count (in place, as all_gather_into_tensor with FSDP2's copy-in).
  virtual void all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) = 0;
  // out[count] = reduction over members of their in[group_rank*count .. +count) (in is [n*count]).
  virtual void reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) = 0;
  // inout[count] = reduction over members of their inout.
  virtual void all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) = 0;
  virtual void barrier() = 0;
  // Reduction of one double over the world (losses, timings), in rank order.
  virtual double sum_world(double v) = 0;
  virtual double max_world(double v) = 0;
};

// The one-rank communicator: every group has one member; collectives are copies.
class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  int group_rank(sim::CommGroup) const override { return 0; }
  int group_size(sim::CommGroup) const override { return 1; }
  void all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) override;
  void reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) override;
  void all_reduce(float*, std::int64_t, sim::CommGroup, ReduceOp) override {}
  void barrier() override {}
  double sum_world(double v) override { return v; }
  double max_world(double v) override { return v; }
};

}  // namespace fsdpsim::runtime
