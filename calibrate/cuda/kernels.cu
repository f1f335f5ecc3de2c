#include "calibrate/cuda/kernels.h"

namespace fsdpsim::calibrate::cuda {
namespace {

// 16-byte loads and stores in a grid-stride loop: the pattern of PyTorch's vectorized elementwise kernels.
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

__global__ void empty_kernel() {}

}  // namespace

void launch_copy(const void* src, void* dst, std::size_t bytes, cudaStream_t stream) {
  std::size_t n = bytes / sizeof(uint4);
  copy_kernel<<<1024, 512, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), n);
}

void launch_empty(cudaStream_t stream) { empty_kernel<<<1, 32, 0, stream>>>(); }

}  // namespace fsdpsim::calibrate::cuda
