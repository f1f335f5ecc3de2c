// Note "mirrored steady step": the steady-state step's memory (sim/memory_tracker.h, note "first and
// steady step") without replaying it, when the first step's replay shows that the steady step makes the
// same choices.
//
// The steady step performs the first step's calls (minus the first_step_lazy allocations) on the
// allocator the first step left: every segment the first step created is there, cached, from the start.
// Suppose the first step released no cached segment (no cudaMalloc retry), every first_step_lazy
// allocation created a segment of its own (cudaMalloc), and the allocator follows the default rules (no
// max_split_size, no expandable segments). Then by induction over the calls, before each call the
// steady step's free blocks are the first step's at the same call plus F = the segments the first
// step creates later (whole and free: nothing took them yet) and the free remainders of the lazy
// buffers' segments (before those were created); the allocated blocks are the first step's, the lazy
// buffers' included. F lies at higher addresses than every block the first step has at that call
// (segments are laid out one after the other). Best fit picks the smallest free block >= the request,
// ties by address: the steady step picks the first step's block B (or the segment X the first step
// creates there), as it was before alloc() split it, unless F holds a block of a size in [request, size
// of B): a larger one loses, one of B's size loses the tie. If no allocation of the first step chose a
// block larger than its (rounded) request with a size of F's in between — checked over every allocation
// of the first step against the sizes of every segment it created (a superset of each call's F) — the
// steady step takes
// the same blocks, splits them the same way, frees them the same way, never calls cudaMalloc, and ends
// in the state the first step ended in. Its allocated bytes at each call are then the first step's
// minus the lazy bytes allocated so far plus all of them; reserved stays what the first step ended
// with. The first step's replay keeps the largest such value (its "shadow" peak), the op and the live
// bytes per category there; where the fold skips periods (sim/memory_fold.cpp) the shadow moves with
// the real peak (no lazy allocation lies inside a run: checked). The steady step's figures follow.
// tests/sim/test_memory_fold.cpp compares them, and the allocator's whole state, with the replay.
#include "sim/memory_tracker.h"

namespace fsdpsim::sim {

void MemoryTracker::mirror_start() {
  Mirror& m = mirror_;
  const AllocatorConfig& c = allocator_.config();
  m.ok = !c.expandable_segments && c.max_split_size == kAllocNoMaxSplit;
  m.lazy_bytes = 0;
  m.lazy_allocs = 0;
  m.lazy_live = {};
  const AllocatorStats& s = allocator_.stats();
  m.shadow_peak = s.allocated;   // the steady step's start: the persistent and (all) lazy buffers
  m.shadow_op = -1;
  m.shadow_live = live_;
  m.allocs_at_start = s.num_allocs;
  m.retries_at_start = s.num_alloc_retries;
  m.free_later.clear();
  m.loose.clear();
}

void MemoryTracker::mirror_note(int buffer, int op, int block, Bytes reserved_before) {
  Mirror& m = mirror_;
  const CompiledBuffer& b = bufs_[buffer];
  const AllocatorStats& s = allocator_.stats();
  if (block >= 0) {
    const int pool = CachingAllocator::request_pool(b.bytes, b.pool_stream);
    const Bytes request = CachingAllocator::round_size(b.bytes), size = allocator_.block_size(block);
    const Bytes segment = s.reserved - reserved_before;   // (no retry: one cudaMalloc or none)
    const Bytes chosen = segment > 0 ? segment : allocator_.block_size_before_split(block);
    if (chosen > request) m.loose.push_back(Mirror::Loose{pool, request, chosen});
    if (b.first_step_lazy) {
      if (segment <= 0) {
        m.ok = false;   // a lazy buffer in a block another call may have used earlier in the step
        return;
      }
      if (segment > size) m.free_later.emplace_back(pool, segment - size);   // its segment's free rest
      m.lazy_bytes += size;
      ++m.lazy_allocs;
      m.lazy_live[static_cast<int>(b.category)] += b.bytes;
      return;
    }
    if (segment > 0) m.free_later.emplace_back(pool, segment);
  } else if (b.first_step_lazy) {
    return;   // (0 bytes: nothing allocated in either step)
  }
  const Bytes v = s.allocated - m.lazy_bytes;
  if (v > m.shadow_peak) {
    m.shadow_peak = v;
    m.shadow_op = op;
    for (int c = 0; c < kNumMemCategories; ++c) m.shadow_live[c] = live_[c] - m.lazy_live[c];
  }
}

bool MemoryTracker::mirror_steady_step() {
  const Mirror& m = mirror_;
  const AllocatorStats& s = allocator_.stats();
  if (!m.ok || steady_ || s.num_alloc_retries != m.retries_at_start) return false;
  for (const Mirror::Loose& l : m.loose)
    for (const auto& [pool, size] : m.free_later)
      if (pool == l.pool && size >= l.request && size < l.block) return false;
  // A buffer the first step left live that a step must free: the replay reports it (MemoryTracker::alloc).
  for (int b = 0; b < num_bufs_; ++b)
    if (block_of_[static_cast<std::size_t>(b)] != kNotLive && !bufs_[b].persistent) return false;
  first_peak_allocated_ = s.peak_allocated;
  first_peak_reserved_ = s.peak_reserved;
  first_allocated_peak_op_ = allocated_peak_op_;
  first_reserved_peak_op_ = reserved_peak_op_;
  steady_ = true;
  // The steady step's statistics: its allocations counted, its peaks; the rest as the first step left them.
  AllocatorStats st = s;
  st.num_allocs += s.num_allocs - m.allocs_at_start - m.lazy_allocs;
  st.peak_allocated = m.shadow_peak + m.lazy_bytes;
  st.peak_reserved = s.reserved;
  allocator_.set_stats(st);
  peak_allocated_ = st.peak_allocated;
  for (int c = 0; c < kNumMemCategories; ++c) live_at_peak_[c] = m.shadow_live[c] + m.lazy_live[c];
  reserved_at_peak_ = s.reserved;
  allocated_peak_op_ = m.shadow_op;
  reserved_peak_seen_ = s.reserved;
  reserved_peak_op_ = -1;
  return true;
}

}  // namespace fsdpsim::sim
