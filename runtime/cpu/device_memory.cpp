#include "runtime/cpu/device_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fsdpsim::runtime {

namespace {
char* reserve_host(Bytes space) {
  void* p = mmap(nullptr, static_cast<size_t>(space), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("DeviceMemory: cannot reserve " + std::to_string(space) + " bytes");
  return static_cast<char*>(p);
}
}  // namespace

DeviceMemory::DeviceMemory(const sim::StepProgram& program, Bytes address_space)
    : PlacedMemory(program, reserve_host(address_space), address_space) {}

DeviceMemory::~DeviceMemory() { munmap(base(), static_cast<size_t>(region())); }

PlacedMemory::PlacedMemory(const sim::StepProgram& program, char* base, Bytes space)
    : program_(program),
      base_(base),
      space_(space),
      block_of_(program.buffers.size(), kNotLive),
      addr_(program.buffers.size(), nullptr),
      allocated_(program.buffers.size(), 0) {
  timeline_.push_back({0, 0, 0});
}

void PlacedMemory::after_change(TimeNs now) {
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

void PlacedMemory::alloc(int buffer, TimeNs now) {
  const sim::Buffer& b = program_.buffers.at(buffer);
  if (block_of_[buffer] != kNotLive)
    throw std::runtime_error("device memory: buffer \"" + b.name + "\" allocated twice");
  const sim::AllocatorStats before = alloc_.stats();
  const int segments_before = alloc_.num_segments();
  const Bytes cached_before = alloc_.cached_free_bytes(b.pool_stream);
  const int blk = alloc_.alloc(b.bytes, b.pool_stream);
  if (blk >= 0 && alloc_.block_address(blk) + alloc_.block_size(blk) > space_) {
    const auto& after = alloc_.stats();
    const Bytes grown = after.reserved - before.reserved;
    throw DeviceOutOfMemory(
        "out of device memory: buffer \"" + b.name + "\" (" + std::to_string(b.bytes) + " B, " +
            sim::mem_category_name(b.category) + ", stream " + std::to_string(b.pool_stream) + ") needs " +
            (grown > 0 ? "a new " + std::to_string(grown) + " B segment" : "a cached block") + " ending at " +
            std::to_string(alloc_.block_address(blk) + alloc_.block_size(blk)) + " B, beyond the " +
            std::to_string(space_) + " B of device memory; allocator before it: allocated " +
            std::to_string(before.allocated) + " B, reserved " + std::to_string(before.reserved) + " B in " +
            std::to_string(segments_before) + " segments, cached free on this stream " + std::to_string(cached_before) +
            " B, pending (record_stream) " + std::to_string(before.pending) + " B, peak allocated " +
            std::to_string(before.peak_allocated) + " B, peak reserved " + std::to_string(before.peak_reserved) + " B, " +
            std::to_string(before.num_allocs) + " allocations so far",
        b.name, b.bytes, space_, before);
  }
  block_of_[buffer] = blk;
  addr_[buffer] = blk < 0 ? nullptr : base_ + alloc_.block_address(blk);
  allocated_[buffer] = 1;
  live_[static_cast<int>(b.category)] += b.bytes;
  after_change(now);
}

void PlacedMemory::free(int buffer, int reuse_after_op, TimeNs now) {
  const sim::Buffer& b = program_.buffers.at(buffer);
  if (block_of_[buffer] == kNotLive) throw std::runtime_error("device memory: buffer \"" + b.name + "\" freed while not live");
  if (reuse_after_op < 0) alloc_.free(block_of_[buffer]);
  else alloc_.free_after(block_of_[buffer], reuse_after_op);
  block_of_[buffer] = kNotLive;
  live_[static_cast<int>(b.category)] -= b.bytes;
  after_change(now);
}

void PlacedMemory::process_events(const std::function<bool(std::int64_t)>& is_complete) {
  if (alloc_.has_pending()) alloc_.process_events(is_complete);
}

char* PlacedMemory::address(int buffer) const {
  if (!allocated_.at(buffer))
    throw std::runtime_error("device memory: buffer \"" + program_.buffers[buffer].name + "\" used before it was allocated");
  return addr_[buffer];
}

void PlacedMemory::fill(sim::SimResult& r) const {
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

}  // namespace fsdpsim::runtime
