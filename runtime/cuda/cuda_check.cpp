#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (n == 0) return "0 CUDA devices";
  return "";
}

}  // namespace fsdpsim::runtime::cuda
