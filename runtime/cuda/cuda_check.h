// The CUDA backend's call checks are common/check_cuda.h's (every CUDA, cuBLAS and NCCL call; MPI calls
// use common/check_mpi.h): a failure throws std::runtime_error naming the call, file:line, host and rank
// (what fsdpsim::set_check_rank() was told). main() reports it and aborts the job.
#pragma once
#include <string>

#include "common/check_cuda.h"

namespace fsdpsim::runtime::cuda {

// "" when a CUDA device and driver are usable, else why not (cudaGetDeviceCount's error or "0 devices").
std::string no_device_reason();

}  // namespace fsdpsim::runtime::cuda
