// The one harness of the CUDA calibration (nccl-tests' common.cu): per size, warm-up runs, timed
// runs between CUDA events on every local GPU (each rank's mean, combined as the maximum over all
// ranks), then a run on initialized data that every rank checks. A group is either all local GPUs
// of one process (ncclCommInitAll, issued in ncclGroupStart/End) or one GPU per MPI rank.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "calibrate/cuda/nccl_collective.h"
#include "calibrate/sweep.h"

namespace fsdpsim::calibrate::cuda {

struct LocalRank {
  int device = 0, rank = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* buf = nullptr;
  std::size_t buf_bytes = 0;
};

struct NcclGroup {
  std::vector<LocalRank> local;   // the GPUs this process drives in the group
  int size = 0, nodes = 1;
  MPI_Comm mpi = MPI_COMM_NULL;   // the processes of the group (MPI_COMM_NULL: a single process)
  void destroy();
};

// Single process: devices 0..n-1. MPI: every rank of `comm` brings `device`.
NcclGroup make_local_group(int n);
NcclGroup make_mpi_group(MPI_Comm comm, int device, int nodes);

using SizeDone = std::function<void(const SweepResult&, const SweepPoint&)>;
SweepResult run_nccl_sweep(const NcclCollective& c, NcclGroup& g, const SweepOptions& o, const std::string& host,
                           const SizeDone& done);
double max_over(double mine, MPI_Comm comm);   // comm may be MPI_COMM_NULL

}  // namespace fsdpsim::calibrate::cuda
