// ncclAllGather in place: rank r sends buf + r*count and receives all n blocks into buf.
// S = n * count * 2 bytes; busbw factor (n-1)/n (nccl-tests doc/PERFORMANCE.md).
#include "calibrate/cuda/nccl_collective.h"

namespace fsdpsim::calibrate::cuda {
namespace {
std::size_t count(std::size_t total, int n) { return total / static_cast<std::size_t>(n); }
std::size_t buffer_elems(std::size_t c, int n) { return c * static_cast<std::size_t>(n); }
void init(std::vector<Bf16Bits>& h, std::size_t c, int rank, int n) {
  h.assign(c * n, to_bf16(-1.0f));
  for (std::size_t i = 0; i < c; ++i) h[rank * c + i] = to_bf16(input_value(rank, i));
}
std::size_t check(const std::vector<Bf16Bits>& h, std::size_t c, int, int n) {
  std::size_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < c; ++i) wrong += from_bf16(h[r * c + i]) != input_value(r, i);
  return wrong;
}
void run(void* buf, std::size_t c, int rank, ncclComm_t comm, cudaStream_t s) {
  auto* b = static_cast<char*>(buf);
  FSDPSIM_NCCL_CHECK(ncclAllGather(b + rank * c * sizeof(Bf16Bits), b, c, ncclBfloat16, comm, s));
}
}  // namespace

const NcclCollective& nccl_all_gather() {
  static const NcclCollective c{"ncclAllGather", CollectiveOp::AllGather, count, buffer_elems, init, check, run};
  return c;
}
}  // namespace fsdpsim::calibrate::cuda
