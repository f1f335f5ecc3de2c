// Every CUDA, NCCL, cuBLAS and MPI call of the CUDA calibration is checked (style.md lesson 7): a
// failure throws with the call, file:line, host and rank; main() reports it and aborts the job.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace fsdpsim::calibrate::cuda {

std::string where();   // "host:rank N"

[[noreturn]] inline void fail(const char* call, const char* file, int line, const std::string& what) {
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + " on " + where() + ": " + what);
}

#define FSDPSIM_CUDA_CHECK(call)                                                                       \
  do {                                                                                                 \
    cudaError_t fsdpsim_e_ = (call);                                                                           \
    if (fsdpsim_e_ != cudaSuccess) ::fsdpsim::calibrate::cuda::fail(#call, __FILE__, __LINE__, cudaGetErrorString(fsdpsim_e_)); \
  } while (0)
#define FSDPSIM_NCCL_CHECK(call)                                                                       \
  do {                                                                                                 \
    ncclResult_t fsdpsim_r_ = (call);                                                                          \
    if (fsdpsim_r_ != ncclSuccess) ::fsdpsim::calibrate::cuda::fail(#call, __FILE__, __LINE__, ncclGetErrorString(fsdpsim_r_)); \
  } while (0)
#define FSDPSIM_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                                 \
    cublasStatus_t fsdpsim_s_ = (call);                                                                        \
    if (fsdpsim_s_ != CUBLAS_STATUS_SUCCESS)                                                                   \
      ::fsdpsim::calibrate::cuda::fail(#call, __FILE__, __LINE__, "cublas status " + std::to_string(static_cast<int>(fsdpsim_s_))); \
  } while (0)
#define FSDPSIM_MPI_CHECK(call)                                                                        \
  do {                                                                                                 \
    int fsdpsim_m_ = (call);                                                                                   \
    if (fsdpsim_m_ != MPI_SUCCESS) ::fsdpsim::calibrate::cuda::fail(#call, __FILE__, __LINE__, "MPI error " + std::to_string(fsdpsim_m_)); \
  } while (0)

}  // namespace fsdpsim::calibrate::cuda
