// CUDA, cuBLAS and NCCL call checks (common/check.h). After a kernel launch FSDPSIM_LAUNCH_CHECK()
// surfaces launch-configuration errors; execution errors surface at the next synchronizing call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/check.h"

#define FSDPSIM_CUDA_CHECK(call)                                                              \
  do {                                                                                        \
    const cudaError_t fsdpsim_err_ = (call);                                                  \
    if (fsdpsim_err_ != cudaSuccess)                                                          \
      ::fsdpsim::check_failed(#call, __FILE__, __LINE__, cudaGetErrorString(fsdpsim_err_));   \
  } while (0)
#define FSDPSIM_CUBLAS_CHECK(call)                                                            \
  do {                                                                                        \
    const cublasStatus_t fsdpsim_st_ = (call);                                                \
    if (fsdpsim_st_ != CUBLAS_STATUS_SUCCESS)                                                 \
      ::fsdpsim::check_failed(#call, __FILE__, __LINE__, cublasGetStatusString(fsdpsim_st_)); \
  } while (0)
#define FSDPSIM_NCCL_CHECK(call)                                                              \
  do {                                                                                        \
    const ncclResult_t fsdpsim_nr_ = (call);                                                  \
    if (fsdpsim_nr_ != ncclSuccess)                                                           \
      ::fsdpsim::check_failed(#call, __FILE__, __LINE__, ncclGetErrorString(fsdpsim_nr_));    \
  } while (0)
#define FSDPSIM_LAUNCH_CHECK() FSDPSIM_CUDA_CHECK(cudaGetLastError())
