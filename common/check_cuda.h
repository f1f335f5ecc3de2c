// CUDA, cuBLAS and NCCL call checks (common/check.h). After a kernel launch FSDPSIM_LAUNCH_CHECK()
// surfaces launch-configuration errors; execution errors surface at the next synchronizing call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/check.h"

// One status check: `call` returns a Type; anything but `ok` fails with message(status).
#define FSDPSIM_CHECK_STATUS_(Type, ok, call, message)                                       \
  do {                                                                                        \
    const Type fsdpsim_status_ = (call);                                                      \
    if (fsdpsim_status_ != (ok)) ::fsdpsim::check_failed(#call, __FILE__, __LINE__, message(fsdpsim_status_)); \
  } while (0)
#define FSDPSIM_CUDA_CHECK(call) FSDPSIM_CHECK_STATUS_(cudaError_t, cudaSuccess, call, cudaGetErrorString)
#define FSDPSIM_CUBLAS_CHECK(call) FSDPSIM_CHECK_STATUS_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, call, cublasGetStatusString)
#define FSDPSIM_NCCL_CHECK(call) FSDPSIM_CHECK_STATUS_(ncclResult_t, ncclSuccess, call, ncclGetErrorString)
#define FSDPSIM_LAUNCH_CHECK() FSDPSIM_CUDA_CHECK(cudaGetLastError())
