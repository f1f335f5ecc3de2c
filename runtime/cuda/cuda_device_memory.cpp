#include "runtime/cuda/cuda_device_memory.h"

#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

namespace {
char* device_region(Bytes bytes) {
  void* p = nullptr;
  FSDPSIM_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(bytes)));
  return static_cast<char*>(p);
}
}  // namespace

CudaDeviceMemory::CudaDeviceMemory(const sim::StepProgram& program, Bytes region)
    : PlacedMemory(program, device_region(region), region) {}

CudaDeviceMemory::~CudaDeviceMemory() { cudaFree(base()); }

}  // namespace fsdpsim::runtime::cuda
