// The executor's view of device memory: a StepProgram's buffers on top of the caching-allocator
// model. It maps buffer ids to allocator blocks, keeps the requested bytes per MemCategory, the
// breakdown at the allocated peak (with allocator_slack = reserved − requested at that moment) and the
// memory timeline. Errors in the program's alloc/free sequence are InputError naming the op.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "sim/caching_allocator.h"
#include "sim/sim_result.h"
#include "sim/step_program.h"

namespace fsdpsim::sim {

class MemoryTracker {
 public:
  MemoryTracker(const StepProgram& program, Bytes capacity, bool record_timeline);

  // Allocates every persistent buffer at time 0.
  void allocate_persistent();
  // Blocks whose record_stream op has completed go back to their pools (process_events).
  template <class IsComplete>
  void process_events(IsComplete&& is_complete) {
    if (allocator_.has_pending()) allocator_.process_events(is_complete);
  }
  void alloc(int buffer, int op, TimeNs now);
  // reuse_after_op < 0 or already complete: the block is reusable at once; else when that op completes.
  void free(int buffer, int reuse_after_op, bool reuse_op_complete, int op, TimeNs now);

  // Fills peak_allocated, peak_reserved, breakdown_at_peak (without cuda_context), alloc_retries,
  // memory_timeline (decimated to max_samples if > 0) and notes about OOM in the allocator.
  void fill(SimResult& r, int max_samples);
  const AllocatorStats& stats() const { return allocator_.stats(); }

 private:
  void after_change(TimeNs now);

  const StepProgram& program_;
  CachingAllocator allocator_;
  bool record_timeline_;
  std::vector<int> block_of_;                                 // buffer id -> allocator block, -2 = not live
  std::array<Bytes, kNumMemCategories> live_{};               // requested bytes per category
  std::array<Bytes, kNumMemCategories> live_at_peak_{};
  Bytes reserved_at_peak_ = 0;
  Bytes peak_allocated_ = -1;
  std::vector<MemorySample> timeline_;
};

// Keeps at most max_samples samples: the series is cut into buckets and each keeps its sample with
// the highest allocated bytes (and the one with the highest reserved bytes), so peaks survive.
std::vector<MemorySample> decimate_timeline(const std::vector<MemorySample>& in, int max_samples);

}  // namespace fsdpsim::sim
