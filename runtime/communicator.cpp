#include "runtime/communicator.h"

#include <cstring>

namespace fsdpsim::runtime {

void LocalCommunicator::all_gather(const float* in, float* out, std::int64_t count, sim::CommGroup) {
  if (in != out) std::memmove(out, in, sizeof(float) * count);
}

void LocalCommunicator::reduce_scatter(const float* in, float* out, std::int64_t count, sim::CommGroup, ReduceOp) {
  if (in != out) std::memmove(out, in, sizeof(float) * count);   // a sum (or average) over one member
}

}  // namespace fsdpsim::runtime
