// Single-rank emulation of a larger world (issue #8 "On one GPU"): this process is rank 0 of a
// `world`-rank job on a (world / shard, shard) mesh, with rank 0's true shard sizes and buffers, and
// every collective replaced by a local operation that writes the same output bytes:
//  * all-gather: this rank's input copied into every member's slot (as if all ranks held the same
//    shard);
//  * reduce-scatter: this rank's own chunk of the input (Avg), times the group size (Sum) — the
//    reduction of n identical contributions;
//  * all-reduce: nothing (Avg), times the group size (Sum).
// Peak memory, compute, streams and their overlap are real; communication time is not (the ops take
// a local copy's time), and training is that of n ranks seeing rank 0's data and parameters, so
// losses are meaningful only as a smoke test. sum_world multiplies by the world (every rank is
// assumed to report the same value); max_world is the identity.
#pragma once
#include "runtime/cuda/device_communicator.h"

namespace fsdpsim::runtime::cuda {

class EmulatedCommunicator : public DeviceCommunicator {
 public:
  EmulatedCommunicator(int world, int shard_size);

  void all_gather(const void* in, void* out, long count, Elem type, sim::CommGroup g, cudaStream_t s) override;
  void reduce_scatter(const void* in, void* out, long count, Elem type, sim::CommGroup g, ReduceOp op,
                      cudaStream_t s) override;
  void all_reduce(void* inout, long count, Elem type, sim::CommGroup g, ReduceOp op, cudaStream_t s) override;
  bool emulated() const override { return true; }

  int rank() const override { return 0; }
  int world() const override { return world_; }
  int group_rank(sim::CommGroup) const override { return 0; }
  int group_size(sim::CommGroup g) const override;
  void barrier() override {}
  double sum_world(double v) override { return v * world_; }
  double max_world(double v) override { return v; }

 private:
  int world_ = 1, shard_ = 1;
};

}  // namespace fsdpsim::runtime::cuda
