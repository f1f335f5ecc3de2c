// The one harness of the CPU calibration (nccl-tests' common.cu): for every size, warm-up runs,
// timed runs between barriers, each rank's average combined as the maximum over ranks, then a
// separate run on initialized data whose result every rank checks.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "calibrate/cpu/mpi_collective.h"
#include "calibrate/sweep.h"

namespace fsdpsim::calibrate::cpu {

struct MpiGroup {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1, nodes = 1;
};

// Called on rank 0 of the group after each size (progress display).
using SizeDone = std::function<void(const SweepResult&, const SweepPoint&)>;

// Sizes whose iterations spread widely, or that took longer than the next larger size, are measured
// again (twice at most, keeping the fastest); any still suspect is described in `warnings`.
// `transport`, when given, runs the collective instead of c.run (same buffer semantics): the calibration
// times the CPU runtime's own communicator with it.
using Transport = std::function<void(float* buf, std::size_t count)>;
SweepResult run_mpi_sweep(const MpiCollective& c, const MpiGroup& g, const SweepOptions& o, const std::string& host,
                          const SizeDone& done, std::vector<std::string>* warnings = nullptr,
                          const Transport* transport = nullptr);

}  // namespace fsdpsim::calibrate::cpu
