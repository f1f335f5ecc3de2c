// The CUDA backend's device memory, the CPU backend's approach (runtime/cpu/device_memory.h) on a
// GPU: the StepProgram's buffers are placed by the caching-allocator model itself
// (sim/caching_allocator.h), so the allocator whose peaks we measure IS the one the simulator models.
// The model hands out addresses in a virtual space (segments one after another); we back it with ONE
// cudaMalloc'd region, so block address a is device address base + a. With the default unlimited
// capacity the model never releases a segment, so the highest address in use is the peak reserved
// bytes: the region must hold those (the constructor takes a size; alloc() throws past it).
// Single-threaded: the executor's CPU thread performs every alloc and free (program semantics).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "sim/caching_allocator.h"
#include "sim/sim_result.h"
#include "sim/step_program.h"

namespace fsdpsim::runtime::cuda {

class CudaDeviceMemory {
 public:
  // cudaMalloc's `region` bytes on the current device.
  CudaDeviceMemory(const sim::StepProgram& program, Bytes region);
  ~CudaDeviceMemory();
  CudaDeviceMemory(const CudaDeviceMemory&) = delete;
  CudaDeviceMemory& operator=(const CudaDeviceMemory&) = delete;

  void alloc(int buffer, TimeNs now);
  // reuse_after_op < 0: reusable at once; else when is_complete(reuse_after_op) (record_stream).
  void free(int buffer, int reuse_after_op, TimeNs now);
  void process_events(const std::function<bool(std::int64_t)>& is_complete);
  void reset_timeline() { timeline_.clear(); timeline_.push_back({0, alloc_.stats().allocated, alloc_.stats().reserved}); }
  bool live(int buffer) const { return block_of_[buffer] != kNotLive; }
  // Device address of the buffer's latest allocation (valid for work already enqueued after a free,
  // as a CUDA pointer freed to PyTorch's caching allocator is). Throws if never allocated.
  char* ptr(int buffer) const;
  Bytes region() const { return space_; }

  void fill(sim::SimResult& r) const;   // peaks, breakdown at the allocated peak, timeline
  const sim::AllocatorStats& stats() const { return alloc_.stats(); }

 private:
  static constexpr int kNotLive = -2;
  void after_change(TimeNs now);

  const sim::StepProgram& program_;
  sim::CachingAllocator alloc_;
  char* base_ = nullptr;
  Bytes space_ = 0;
  std::vector<int> block_of_;
  std::vector<char*> addr_;
  std::vector<char> allocated_;
  std::array<Bytes, sim::kNumMemCategories> live_{}, live_at_peak_{};
  Bytes reserved_at_peak_ = 0, peak_allocated_ = -1;
  std::vector<sim::MemorySample> timeline_;
};

}  // namespace fsdpsim::runtime::cuda
