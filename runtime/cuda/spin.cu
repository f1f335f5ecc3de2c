#include "runtime/cuda/spin.h"

#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

namespace {

__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_k(std::uint64_t ns) {
  const std::uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
    __nanosleep(500);
  }
}

}  // namespace

void spin_for_ns(std::int64_t ns, cudaStream_t s) {
  if (ns <= 0) return;
  spin_k<<<1, 1, 0, s>>>(static_cast<std::uint64_t>(ns));
  FSDPSIM_LAUNCH_CHECK();
}

}  // namespace fsdpsim::runtime::cuda
