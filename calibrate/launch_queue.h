// How many kernels a CUDA stream's launch queue holds before a launch blocks the CPU (the simulator's
// CPU issue model, sim/executor.cpp "Launch queue"). A constant of its own so that the executor and
// the hardware profile (overheads.launch_queue_depth) share it without including each other.
#pragma once

namespace fsdpsim::calibrate {

// ASSUMPTION, not a documented figure: NVIDIA does not document the depth of a stream's launch queue.
// Measured and reported by users: the host thread blocks in cudaLaunchKernel once about 1000 kernels are
// pending on one stream, each stream with its own buffer (NVIDIA developer forum, "CUDA stream are
// blocked when launching lots of kernels (>1000)",
// https://forums.developer.nvidia.com/t/cuda-stream-are-blocked-when-luanch-lots-of-kernels-1000/68937;
// StackOverflow question 53970187, the same observation: ~1000 kernels per stream). 1024 is that figure
// rounded to a power of two. A profile may override it (0: unbounded, as the CPU backend's stream
// threads, whose queues are unbounded).
inline constexpr int kDefaultLaunchQueueDepth = 1024;

}  // namespace fsdpsim::calibrate
