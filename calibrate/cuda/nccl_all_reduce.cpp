// ncclAllReduce (sum) in place over count = S/2 bf16 elements; busbw factor 2(n-1)/n.
#include "calibrate/cuda/nccl_collective.h"

namespace fsdpsim::calibrate::cuda {
namespace {
std::size_t count(std::size_t total, int) { return total; }
std::size_t buffer_elems(std::size_t c, int) { return c; }
void init(std::vector<Bf16Bits>& h, std::size_t c, int rank, int) {
  h.resize(c);
  for (std::size_t i = 0; i < c; ++i) h[i] = to_bf16(input_value(rank, i));
}
std::size_t check(const std::vector<Bf16Bits>& h, std::size_t c, int, int n) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < c; ++i) wrong += from_bf16(h[i]) != summed_value(n, i);
  return wrong;
}
void run(void* buf, std::size_t c, int, ncclComm_t comm, cudaStream_t s) {
  FSDPSIM_NCCL_CHECK(ncclAllReduce(buf, buf, c, ncclBfloat16, ncclSum, comm, s));
}
}  // namespace

const NcclCollective& nccl_all_reduce() {
  static const NcclCollective c{"ncclAllReduce", CollectiveOp::AllReduce, count, buffer_elems, init, check, run};
  return c;
}
}  // namespace fsdpsim::calibrate::cuda
