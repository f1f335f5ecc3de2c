// The CPU backend's device memory: the StepProgram's buffers placed by the caching-allocator model
// itself (memory/caching_allocator.h), so the allocator whose peaks we measure IS the one the simulator
// models. The model hands out virtual addresses (segments laid out one after another, never reused);
// we back that address space with one anonymous mapping reserved up front (MAP_NORESERVE: pages
// become real memory when first touched), so block address a is host address base + a.
// Single-threaded: the executor's CPU thread performs every alloc and free (program semantics).
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "program/sim_result.h"
#include "program/step_program.h"

namespace fsdpsim::runtime {

// The device memory ran out: an allocation's block lies beyond the reserved address space (the
// CPU backend's stand-in for cudaMalloc failing with the caching allocator's cache already empty).
// what() names the buffer, its size, the capacity and the allocator's state before the allocation;
// the worker adds the rank and the simulator's prediction (issue 9).
class DeviceOutOfMemory : public std::runtime_error {
 public:
  DeviceOutOfMemory(const std::string& what, std::string buffer, Bytes bytes, Bytes capacity, sim::AllocatorStats before)
      : std::runtime_error(what), buffer_(std::move(buffer)), bytes_(bytes), capacity_(capacity), before_(before) {}
  const std::string& buffer() const { return buffer_; }
  Bytes bytes() const { return bytes_; }
  Bytes capacity() const { return capacity_; }
  const sim::AllocatorStats& before() const { return before_; }

 private:
  std::string buffer_;
  Bytes bytes_ = 0, capacity_ = 0;
  sim::AllocatorStats before_;
};

// The StepProgram's buffers placed by the caching-allocator model in one region [base, base + space)
// that a backend reserves (DeviceMemory: host virtual memory; cuda::CudaDeviceMemory: one cudaMalloc),
// so the allocator whose peaks are measured IS the one the simulator models.
class PlacedMemory {
 public:
  PlacedMemory(const PlacedMemory&) = delete;
  PlacedMemory& operator=(const PlacedMemory&) = delete;

  // An allocation whose block would end past the region throws DeviceOutOfMemory.
  void alloc(int buffer, TimeNs now);
  // reuse_after_op < 0: reusable at once; else when is_complete(reuse_after_op) (record_stream).
  void free(int buffer, int reuse_after_op, TimeNs now);
  // Returns blocks whose record_stream op has completed to their pools.
  void process_events(const std::function<bool(std::int64_t)>& is_complete);
  // Drops the timeline samples (the next step records its own; peaks are kept).
  void reset_timeline() { timeline_.clear(); timeline_.push_back({0, alloc_.stats().allocated, alloc_.stats().reserved}); }
  bool live(int buffer) const { return block_of_[buffer] != kNotLive; }
  // Address of the buffer's latest allocation. It stays valid after the free for the ops already
  // enqueued (as a CUDA pointer does for work ordered on the stream): stream threads read it while
  // the CPU thread goes on issuing. Throws if the buffer was never allocated.
  char* address(int buffer) const;
  Bytes region() const { return space_; }

  // Peak allocated/reserved, breakdown at the allocated peak (incl. allocator_slack) and the
  // timeline, exactly as sim::MemoryTracker fills them for the prediction.
  void fill(sim::SimResult& r) const;
  const sim::AllocatorStats& stats() const { return alloc_.stats(); }

 protected:
  PlacedMemory(const sim::StepProgram& program, char* base, Bytes space);
  ~PlacedMemory() = default;
  char* base() const { return base_; }

 private:
  static constexpr int kNotLive = -2;
  void after_change(TimeNs now);

  const sim::StepProgram& program_;
  sim::CachingAllocator alloc_;
  char* base_ = nullptr;
  Bytes space_ = 0;
  std::vector<int> block_of_;
  std::vector<char*> addr_;       // per buffer: its latest address (written before the op is enqueued)
  std::vector<char> allocated_;   // per buffer: allocated at least once
  std::array<Bytes, sim::kNumMemCategories> live_{}, live_at_peak_{};
  Bytes reserved_at_peak_ = 0, peak_allocated_ = -1;
  std::vector<sim::MemorySample> timeline_;
};

// The CPU backend's device memory: `address_space` bytes of reserved host virtual memory.
class DeviceMemory : public PlacedMemory {
 public:
  DeviceMemory(const sim::StepProgram& program, Bytes address_space);
  ~DeviceMemory();
  float* ptr(int buffer) const { return reinterpret_cast<float*>(address(buffer)); }
};

}  // namespace fsdpsim::runtime
