// The CPU backend's Device (runtime/device.h): the program's buffers in reserved host memory placed by
// the caching-allocator model (device_memory.h), the stream threads of stream_executor.h, fp32 kernels
// on OpenBLAS (segment_compute.h) and fp32 collectives through a Communicator (MPI, or one rank
// in-process). Every buffer is fp32; an op runs at once on the stream thread that calls it.
#pragma once
#include <memory>

#include "runtime/communicator.h"
#include "runtime/device.h"

namespace fsdpsim::runtime {

std::unique_ptr<Device> make_cpu_device(Communicator& comm);

}  // namespace fsdpsim::runtime
