#include "runtime/cuda/device_communicator.h"

#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

DeviceCommunicator::DeviceCommunicator() {
  FSDPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&sync_stream_, cudaStreamNonBlocking));
}

DeviceCommunicator::~DeviceCommunicator() {
  if (sync_stream_) cudaStreamDestroy(sync_stream_);
}

void DeviceCommunicator::all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup g) {
  all_gather(in, out, count, Elem::F32, g, sync_stream_);
  FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(sync_stream_));
}

void DeviceCommunicator::reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup g, ReduceOp op) {
  reduce_scatter(in, out, count, Elem::F32, g, op, sync_stream_);
  FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(sync_stream_));
}

void DeviceCommunicator::all_reduce(float* inout, std::int64_t count, sim::CommGroup g, ReduceOp op) {
  all_reduce(inout, count, Elem::F32, g, op, sync_stream_);
  FSDPSIM_CUDA_CHECK(cudaStreamSynchronize(sync_stream_));
}

}  // namespace fsdpsim::runtime::cuda
