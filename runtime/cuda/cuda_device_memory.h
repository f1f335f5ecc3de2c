// The CUDA backend's device memory: runtime::PlacedMemory (runtime/cpu/device_memory.h) over ONE
// cudaMalloc'd region, so block address a of the caching-allocator model is device address base + a
// and the allocator whose peaks we measure IS the one the simulator models. With the default unlimited
// capacity the model never releases a segment, so the highest address in use is the peak reserved
// bytes: the region must hold those (an allocation past it throws DeviceOutOfMemory).
// Single-threaded: the executor's CPU thread performs every alloc and free (program semantics).
#pragma once
#include "runtime/cpu/device_memory.h"
#include "program/step_program.h"

namespace fsdpsim::runtime::cuda {

class CudaDeviceMemory : public PlacedMemory {
 public:
  // cudaMalloc's `region` bytes on the current device.
  CudaDeviceMemory(const sim::StepProgram& program, Bytes region);
  ~CudaDeviceMemory();
  // Device address of the buffer's latest allocation (valid for work already enqueued after a free,
  // as a CUDA pointer freed to PyTorch's caching allocator is). Throws if never allocated.
  char* ptr(int buffer) const { return address(buffer); }
};

}  // namespace fsdpsim::runtime::cuda
