// MPI_Allgather in place: rank r's block lives at buf[r*count, (r+1)*count); afterwards every rank
// holds all n blocks. S = n * count * 4 bytes; busbw factor (n-1)/n (nccl-tests doc/PERFORMANCE.md).
#include "calibrate/cpu/mpi_check.h"
#include "calibrate/cpu/mpi_collective.h"

namespace fsdpsim::calibrate::cpu {
namespace {

std::size_t count(std::size_t total, int n) { return total / static_cast<std::size_t>(n); }
std::size_t buffer_elems(std::size_t c, int n) { return c * static_cast<std::size_t>(n); }

void init(float* buf, std::size_t c, int rank, int n) {
  for (std::size_t i = 0; i < c * n; ++i) buf[i] = -1.0f;   // other ranks' blocks must be overwritten
  for (std::size_t i = 0; i < c; ++i) buf[rank * c + i] = input_value(rank, i);
}

std::size_t check(const float* buf, std::size_t c, int rank, int n) {
  std::size_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < c; ++i) wrong += buf[r * c + i] != input_value(r, i);
  return wrong;
}

void run(float* buf, std::size_t c, MPI_Comm comm) {
  FSDPSIM_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, static_cast<int>(c), MPI_FLOAT, comm));
}

}  // namespace

const MpiCollective& mpi_all_gather() {
  static const MpiCollective c{"MPI_Allgather", CollectiveOp::AllGather, count, buffer_elems, init, check, run};
  return c;
}

}  // namespace fsdpsim::calibrate::cpu
