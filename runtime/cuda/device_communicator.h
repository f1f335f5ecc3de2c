// The collective layer the CUDA executor drives: runtime::Communicator (fp32, blocking, for the
// runner's host-side needs) plus typed, asynchronous collectives on DEVICE buffers enqueued on a
// stream. Two implementations: NcclCommunicator (real collectives, one NCCL communicator per mesh
// group) and EmulatedCommunicator (rank 0 of a larger world on one GPU, emulated_communicator.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/communicator.h"
#include "runtime/cuda/kernels.h"

namespace fsdpsim::runtime::cuda {

class DeviceCommunicator : public Communicator {
 public:
  // Creates the stream of the blocking calls: the CUDA device must be set before.
  DeviceCommunicator();
  ~DeviceCommunicator() override;
  DeviceCommunicator(const DeviceCommunicator&) = delete;
  DeviceCommunicator& operator=(const DeviceCommunicator&) = delete;

  // out[n*count] receives every member's in[count] in group-rank order (in may be out + rank*count).
  virtual void all_gather(const void* in, void* out, long count, Elem type, sim::CommGroup g, cudaStream_t s) = 0;
  // out[count] = reduction over members of their in[group_rank*count .. +count).
  virtual void reduce_scatter(const void* in, void* out, long count, Elem type, sim::CommGroup g, ReduceOp op,
                              cudaStream_t s) = 0;
  virtual void all_reduce(void* inout, long count, Elem type, sim::CommGroup g, ReduceOp op, cudaStream_t s) = 0;
  // True when collectives are stand-ins (no data from other ranks).
  virtual bool emulated() const { return false; }

  // runtime::Communicator's collectives, for the runner's host-side needs: fp32 DEVICE pointers, the
  // typed call above enqueued on an internal stream and waited for.
  void all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) final;
  void reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) final;
  void all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) final;

 private:
  cudaStream_t sync_stream_ = nullptr;
};

}  // namespace fsdpsim::runtime::cuda
