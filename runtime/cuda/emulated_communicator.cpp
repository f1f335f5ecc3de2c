#include "runtime/cuda/emulated_communicator.h"

#include <stdexcept>
#include <string>

#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

namespace {
long bytes_of(Elem t) { return t == Elem::F32 ? 4 : 2; }
}  // namespace

EmulatedCommunicator::EmulatedCommunicator(int world, int shard_size) : world_(world), shard_(shard_size) {
  if (world_ < 1 || shard_ < 1 || world_ % shard_ != 0)
    throw std::runtime_error("EmulatedCommunicator: shard size " + std::to_string(shard_) + " does not divide world " +
                             std::to_string(world_));
}

int EmulatedCommunicator::group_size(sim::CommGroup g) const {
  switch (g) {
    case sim::CommGroup::Shard: return shard_;
    case sim::CommGroup::Replicate: return world_ / shard_;
    case sim::CommGroup::World: return world_;
    case sim::CommGroup::PostForward: break;
  }
  throw std::runtime_error("EmulatedCommunicator: the post-forward group (reshard_after_forward=int) is not supported");
}

void EmulatedCommunicator::all_gather(const void* in, void* out, long count, Elem t, sim::CommGroup g, cudaStream_t s) {
  const long b = count * bytes_of(t);
  char* o = static_cast<char*>(out);
  for (int r = 0; r < group_size(g); ++r)
    if (o + r * b != in) FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(o + r * b, in, static_cast<size_t>(b), cudaMemcpyDeviceToDevice, s));
}

void EmulatedCommunicator::reduce_scatter(const void* in, void* out, long count, Elem t, sim::CommGroup g, ReduceOp op,
                                          cudaStream_t s) {
  // Group rank 0's chunk is the first.
  if (in != out) FSDPSIM_CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<size_t>(count * bytes_of(t)), cudaMemcpyDeviceToDevice, s));
  if (op == ReduceOp::Sum && group_size(g) > 1) scale(out, t, static_cast<float>(group_size(g)), count, s);
}

void EmulatedCommunicator::all_reduce(void* inout, long count, Elem t, sim::CommGroup g, ReduceOp op, cudaStream_t s) {
  if (op == ReduceOp::Sum && group_size(g) > 1) scale(inout, t, static_cast<float>(group_size(g)), count, s);
}

}  // namespace fsdpsim::runtime::cuda
