// MPI_Allreduce (sum) in place over count = S/4 elements; busbw factor 2(n-1)/n (nccl-tests
// doc/PERFORMANCE.md: a ring all-reduce is a reduce-scatter plus an all-gather).
#include "calibrate/cpu/mpi_check.h"
#include "calibrate/cpu/mpi_collective.h"

namespace fsdpsim::calibrate::cpu {
namespace {

std::size_t count(std::size_t total, int) { return total; }
std::size_t buffer_elems(std::size_t c, int) { return c; }

void init(float* buf, std::size_t c, int rank, int) {
  for (std::size_t i = 0; i < c; ++i) buf[i] = input_value(rank, i);
}

std::size_t check(const float* buf, std::size_t c, int, int n) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < c; ++i) wrong += buf[i] != summed_value(n, i);
  return wrong;
}

void run(float* buf, std::size_t c, MPI_Comm comm) {
  FSDPSIM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(c), MPI_FLOAT, MPI_SUM, comm));
}

}  // namespace

const MpiCollective& mpi_all_reduce() {
  static const MpiCollective c{"MPI_Allreduce", CollectiveOp::AllReduce, count, buffer_elems, init, check, run};
  return c;
}

}  // namespace fsdpsim::calibrate::cpu
