#include "runtime/cuda/cuda_device_memory.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "runtime/cuda/cuda_check.h"

namespace fsdpsim::runtime::cuda {

CudaDeviceMemory::CudaDeviceMemory(const sim::StepProgram& program, Bytes region)
    : program_(program),
      space_(region),
      block_of_(program.buffers.size(), kNotLive),
      addr_(program.buffers.size(), nullptr),
      allocated_(program.buffers.size(), 0) {
  void* p = nullptr;
  FSDPSIM_CU_CHECK(cudaMalloc(&p, static_cast<size_t>(space_)));
  base_ = static_cast<char*>(p);
  timeline_.push_back({0, 0, 0});
}

CudaDeviceMemory::~CudaDeviceMemory() {
  if (base_) cudaFree(base_);
}

void CudaDeviceMemory::after_change(TimeNs now) {
  const auto& s = alloc_.stats();
  if (s.allocated > peak_allocated_) {
    peak_allocated_ = s.allocated;
    live_at_peak_ = live_;
    reserved_at_peak_ = s.reserved;
  }
  if (!timeline_.empty() && timeline_.back().t_ns == now) {
    timeline_.back().allocated = s.allocated;
    timeline_.back().reserved = s.reserved;
  } else {
    timeline_.push_back({now, s.allocated, s.reserved});
  }
}

void CudaDeviceMemory::alloc(int buffer, TimeNs now) {
  const sim::Buffer& b = program_.buffers.at(buffer);
  if (block_of_[buffer] != kNotLive) throw std::runtime_error("CudaDeviceMemory: buffer \"" + b.name + "\" allocated twice");
  const int blk = alloc_.alloc(b.bytes, b.pool_stream);
  if (blk >= 0 && alloc_.block_address(blk) + alloc_.block_size(blk) > space_)
    throw std::runtime_error("CudaDeviceMemory: the caching allocator's segments (" +
                             std::to_string(alloc_.block_address(blk) + alloc_.block_size(blk)) +
                             " B) exceed the device region of " + std::to_string(space_) + " B (" + error_where() + ")");
  block_of_[buffer] = blk;
  addr_[buffer] = blk < 0 ? nullptr : base_ + alloc_.block_address(blk);
  allocated_[buffer] = 1;
  live_[static_cast<int>(b.category)] += b.bytes;
  after_change(now);
}

void CudaDeviceMemory::free(int buffer, int reuse_after_op, TimeNs now) {
  const sim::Buffer& b = program_.buffers.at(buffer);
  if (block_of_[buffer] == kNotLive) throw std::runtime_error("CudaDeviceMemory: buffer \"" + b.name + "\" freed while not live");
  if (reuse_after_op < 0) alloc_.free(block_of_[buffer]);
  else alloc_.free_after(block_of_[buffer], reuse_after_op);
  block_of_[buffer] = kNotLive;
  live_[static_cast<int>(b.category)] -= b.bytes;
  after_change(now);
}

void CudaDeviceMemory::process_events(const std::function<bool(std::int64_t)>& is_complete) {
  if (alloc_.has_pending()) alloc_.process_events(is_complete);
}

char* CudaDeviceMemory::ptr(int buffer) const {
  if (!allocated_.at(buffer))
    throw std::runtime_error("CudaDeviceMemory: buffer \"" + program_.buffers[buffer].name + "\" used before it was allocated");
  return addr_[buffer];
}

void CudaDeviceMemory::fill(sim::SimResult& r) const {
  const auto& s = alloc_.stats();
  r.peak_allocated = s.peak_allocated;
  r.peak_reserved = s.peak_reserved;
  r.alloc_retries = s.num_alloc_retries;
  r.breakdown_at_peak.clear();
  Bytes requested = 0;
  for (int c = 0; c < sim::kNumMemCategories; ++c) {
    auto cat = static_cast<sim::MemCategory>(c);
    if (cat == sim::MemCategory::AllocatorSlack || cat == sim::MemCategory::CudaContext) continue;
    r.breakdown_at_peak[sim::mem_category_name(cat)] = live_at_peak_[c];
    requested += live_at_peak_[c];
  }
  r.breakdown_at_peak[sim::mem_category_name(sim::MemCategory::AllocatorSlack)] =
      std::max<Bytes>(0, reserved_at_peak_ - requested);
  r.memory_timeline = timeline_;
}

}  // namespace fsdpsim::runtime::cuda
