// A GPU-side delay: one thread spins on the global nanosecond timer. The emulated world
// (--emulate-world with --pad-collectives) stands a collective in for its predicted duration with it,
// on the collective's own stream, so the step's overlap of communication with compute is exercised.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace fsdpsim::runtime::cuda {

// Enqueues a kernel on `s` that returns after `ns` nanoseconds of GPU time (no-op for ns <= 0).
void spin_for_ns(std::int64_t ns, cudaStream_t s);

}  // namespace fsdpsim::runtime::cuda
