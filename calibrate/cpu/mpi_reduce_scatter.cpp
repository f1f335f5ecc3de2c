// MPI_Reduce_scatter_block in place: every rank contributes the full n*count buffer; afterwards
// buf[0, count) holds the sum over ranks of block `rank`. S = n * count * 4 bytes; busbw factor
// (n-1)/n (nccl-tests doc/PERFORMANCE.md).
#include "calibrate/cpu/mpi_check.h"
#include "calibrate/cpu/mpi_collective.h"

namespace fsdpsim::calibrate::cpu {
namespace {

std::size_t count(std::size_t total, int n) { return total / static_cast<std::size_t>(n); }
std::size_t buffer_elems(std::size_t c, int n) { return c * static_cast<std::size_t>(n); }

// Element i of block b gets rank's input_value(rank, b*count + i): the sum over ranks of the
// block this rank receives is summed_value(n, rank*count + i).
void init(float* buf, std::size_t c, int rank, int n) {
  for (std::size_t i = 0; i < c * n; ++i) buf[i] = input_value(rank, i);
}

std::size_t check(const float* buf, std::size_t c, int rank, int n) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < c; ++i) wrong += buf[i] != summed_value(n, rank * c + i);
  return wrong;
}

void run(float* buf, std::size_t c, MPI_Comm comm) {
  FSDPSIM_MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, static_cast<int>(c), MPI_FLOAT, MPI_SUM, comm));
}

}  // namespace

const MpiCollective& mpi_reduce_scatter() {
  static const MpiCollective c{"MPI_Reduce_scatter_block", CollectiveOp::ReduceScatter, count, buffer_elems, init, check, run};
  return c;
}

}  // namespace fsdpsim::calibrate::cpu
