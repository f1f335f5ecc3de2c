// The few device kernels the CUDA calibration needs (kernels.cu): a bandwidth-bound copy for the
// memory-bound cost and an empty kernel for launch overhead and the minimum kernel time.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace fsdpsim::calibrate::cuda {

void launch_copy(const void* src, void* dst, std::size_t bytes, cudaStream_t stream);   // bytes % 16 == 0
void launch_empty(cudaStream_t stream);

}  // namespace fsdpsim::calibrate::cuda
