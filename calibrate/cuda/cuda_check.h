// Every CUDA, NCCL, cuBLAS and MPI call of the CUDA calibration is checked with the common macros
// (common/check_cuda.h, common/check_mpi.h): a failure throws with the call, file:line, host and rank;
// main() reports it and aborts the job.
#pragma once
#include "common/check_cuda.h"
#include "common/check_mpi.h"
