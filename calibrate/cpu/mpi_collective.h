// One MPI collective as the harness sees it (nccl-tests' struct testColl): the buffer sizes for a
// size S, how to fill inputs so the result is exactly checkable, how to check it, the run itself.
// Buffers are fp32 and in place (MPI_IN_PLACE), as FSDP runs its all-gather and reduce-scatter
// into one flat buffer. One file per collective: mpi_all_gather.cpp, mpi_reduce_scatter.cpp,
// mpi_all_reduce.cpp.
#pragma once
#include <mpi.h>

#include <cstddef>

#include "calibrate/hardware_profile.h"

namespace fsdpsim::calibrate::cpu {

struct MpiCollective {
  const char* name;          // "MPI_Allgather"
  CollectiveOp op;
  // Elements per rank for S bytes over n ranks (count), and the in-place buffer length (elements).
  std::size_t (*count)(std::size_t total_elems, int n);
  std::size_t (*buffer_elems)(std::size_t count, int n);
  // Fill this rank's input so that every output element is a small exact integer (see expected()).
  void (*init)(float* buf, std::size_t count, int rank, int n);
  // Number of wrong elements in this rank's result.
  std::size_t (*check)(const float* buf, std::size_t count, int rank, int n);
  void (*run)(float* buf, std::size_t count, MPI_Comm comm);
};

// Rank r's input value for element i of its block: small integers, so sums over ranks are exact in fp32.
inline float input_value(int rank, std::size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 5)); }
// The sum over n ranks of input_value(r, i).
inline float summed_value(int n, std::size_t i) {
  return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 5));
}

const MpiCollective& mpi_all_gather();
const MpiCollective& mpi_reduce_scatter();
const MpiCollective& mpi_all_reduce();

}  // namespace fsdpsim::calibrate::cpu
