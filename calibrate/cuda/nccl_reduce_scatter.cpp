// ncclReduceScatter (sum) in place: every rank sends the full n*count buffer and receives its
// reduced block at buf + rank*count. S = n * count * 2 bytes; busbw factor (n-1)/n.
#include "calibrate/cuda/nccl_collective.h"

namespace fsdpsim::calibrate::cuda {
namespace {
std::size_t count(std::size_t total, int n) { return total / static_cast<std::size_t>(n); }
std::size_t buffer_elems(std::size_t c, int n) { return c * static_cast<std::size_t>(n); }
void init(std::vector<Bf16Bits>& h, std::size_t c, int rank, int n) {
  h.resize(c * n);
  for (std::size_t i = 0; i < c * n; ++i) h[i] = to_bf16(input_value(rank, i));
}
std::size_t check(const std::vector<Bf16Bits>& h, std::size_t c, int rank, int n) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < c; ++i) wrong += from_bf16(h[rank * c + i]) != summed_value(n, rank * c + i);
  return wrong;
}
void run(void* buf, std::size_t c, int rank, ncclComm_t comm, cudaStream_t s) {
  auto* b = static_cast<char*>(buf);
  FSDPSIM_NCCL_CHECK(ncclReduceScatter(b, b + rank * c * sizeof(Bf16Bits), c, ncclBfloat16, ncclSum, comm, s));
}
}  // namespace

const NcclCollective& nccl_reduce_scatter() {
  static const NcclCollective c{"ncclReduceScatter", CollectiveOp::ReduceScatter, count, buffer_elems, init, check, run};
  return c;
}
}  // namespace fsdpsim::calibrate::cuda
