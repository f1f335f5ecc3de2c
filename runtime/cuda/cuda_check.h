// Every CUDA, cuBLAS and NCCL call of the CUDA backend is checked (style.md lesson 7): a failure
// throws std::runtime_error naming the call, file:line, host and rank ("rank" is what
// set_error_rank() was told; -1 before the worker knows it). main() reports it and aborts the job.
// MPI calls use FSDPSIM_MPI_CHECK in nccl_communicator.cpp (the only MPI user).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace fsdpsim::runtime::cuda {

void set_error_rank(int rank);
std::string error_where();   // "host H, rank R"
[[noreturn]] void cuda_fail(const char* call, const char* file, int line, const std::string& what);

// "" when a CUDA device and driver are usable, else why not (cudaGetDeviceCount's error or "0 devices").
std::string no_device_reason();

}  // namespace fsdpsim::runtime::cuda

#define FSDPSIM_CU_CHECK(call)                                                                          \
  do {                                                                                                  \
    const cudaError_t fsdpsim_err_ = (call);                                                            \
    if (fsdpsim_err_ != cudaSuccess)                                                                    \
      ::fsdpsim::runtime::cuda::cuda_fail(#call, __FILE__, __LINE__, cudaGetErrorString(fsdpsim_err_)); \
  } while (0)
#define FSDPSIM_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                                  \
    const cublasStatus_t fsdpsim_st_ = (call);                                                          \
    if (fsdpsim_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::fsdpsim::runtime::cuda::cuda_fail(#call, __FILE__, __LINE__, cublasGetStatusString(fsdpsim_st_)); \
  } while (0)
#define FSDPSIM_NCCL_CHECK(call)                                                                        \
  do {                                                                                                  \
    const ncclResult_t fsdpsim_nr_ = (call);                                                            \
    if (fsdpsim_nr_ != ncclSuccess)                                                                     \
      ::fsdpsim::runtime::cuda::cuda_fail(#call, __FILE__, __LINE__, ncclGetErrorString(fsdpsim_nr_));  \
  } while (0)
// After a kernel launch: launch-configuration errors surface here, execution errors at the next sync.
#define FSDPSIM_LAUNCH_CHECK() FSDPSIM_CU_CHECK(cudaGetLastError())
