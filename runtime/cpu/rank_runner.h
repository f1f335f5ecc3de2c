// One rank of the bundled FSDP runtime on the CPU backend: the rank runner (runtime/rank_runner.h)
// over the CPU device (cpu_device.h): fp32 throughout, OpenBLAS kernels, collectives through a
// Communicator (MPI, or LocalCommunicator for one rank).
#pragma once
#include "runtime/communicator.h"
#include "runtime/cpu/cpu_device.h"
#include "runtime/rank_runner.h"

namespace fsdpsim::runtime {

// InputError if the CPU runtime cannot execute this plan/model (it computes in fp32 only, etc.).
void check_runtime_supports(const models::ModelSpec& m, const sim::Plan& plan);

class RankRunner : public Runner {
 public:
  RankRunner(const RunConfig& cfg, Communicator& comm);
};

}  // namespace fsdpsim::runtime
