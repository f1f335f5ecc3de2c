// MemoryTracker's shapes (sim/memory_tracker.h, "repeated periods of a run whose memory follows the
// issues"): the memory compared at two moments p ops apart, and moved on by whole periods.
//
// Why moving is exact. Where memory is replayed with the issues (FSDP1's record_stream frees), an
// allocation's outcome depends on the allocator's state and on which ops have completed when it is
// issued. The executor's fast-forward proves the second part periodic (the engine's state at b is its
// state at a shifted by p ops and b.t - a.t ns, and every op it reads in later periods is the shift of
// one it read between them); shape_repeats proves the first: the same segments cut into the same
// blocks, every allocated block holding the same buffer as at a (one that no op of the period touches:
// it stays) or the one playing its role p ops later, every pending block waiting on the event p ops
// after a's. (Best fit, splits and merges see addresses only through their order, CachingAllocator::BlockState:
// a segment may lie one period's worth of addresses on, cudaMalloc'ed again after a cache release.) The ops of the next period then make the same calls on congruent blocks (their lists are
// the period's shifted: checked by the caller), so they leave the state of b one period on; by
// induction, m periods on, which is what shift_periods writes: the same blocks, each period buffer
// renamed m periods on, each pending event m·p ops on, the counts of calls, retries and OOMs m deltas on,
// and each segment cudaMalloc'ed again every period (with the next address) m periods' worth of addresses
// on, where the calls would have put it. Nothing else moves: a repeated period ends with what it started
// with (the same segments, allocated and reserved bytes), and its peaks were reached already between a
// and b. The memory fold uses the same comparison at the boundaries of a run of whole micro-batches
// (sim/memory_fold.cpp shape_run), where the calls alone decide the memory.
#include <stdexcept>
#include <string>

#include "sim/memory_tracker.h"

namespace fsdpsim::sim {

void MemoryTracker::begin_shapes(const CompiledProgram& program) {
  ShapeIndex& ix = shapes_;
  if (ix.on && ix.program == &program) return;
  ix.on = true;
  ix.program = &program;
  ix.alloc_op.assign(static_cast<std::size_t>(num_bufs_), -1);
  ix.alloc_idx.assign(static_cast<std::size_t>(num_bufs_), -1);
  const OpRec* ops = program.ops.data();
  const int* lists = program.lists.data();
  for (int i = 0, n = program.num_ops(); i < n; ++i)
    for (int k = ops[i].allocs; k < ops[i].frees; ++k) {
      ix.alloc_op[static_cast<std::size_t>(lists[k])] = i;
      ix.alloc_idx[static_cast<std::size_t>(lists[k])] = k - ops[i].allocs;
    }
  // The blocks of the buffers live now (allocate_persistent's, and any allocated before this call; the
  // memory fold's replay notes every block itself).
  for (int b = 0; b < num_bufs_; ++b)
    if (block_of_[b] >= 0) note_block(block_of_[b], b);
}

int MemoryTracker::shift_buffer(int x, int d) const {
  const ShapeIndex& ix = shapes_;
  const int op = ix.alloc_op[static_cast<std::size_t>(x)];
  if (op < 0) return -1;
  const CompiledProgram& p = *ix.program;
  const long long op2 = static_cast<long long>(op) + d;
  if (op2 < 0 || op2 >= p.num_ops()) return -1;
  const OpRec& r = p.ops[static_cast<std::size_t>(op2)];
  const int k = r.allocs + ix.alloc_idx[static_cast<std::size_t>(x)];
  if (k >= r.frees) return -1;
  const int x2 = p.lists[static_cast<std::size_t>(k)];
  return bufs_[x2] == bufs_[x] ? x2 : -1;
}

void MemoryTracker::capture_shape(Shape& s) const {
  s.stats = allocator_.stats();
  s.live = live_;
  allocator_.all_blocks(s.blocks, s.segments);
  s.next_address = allocator_.next_address();
  s.tags.resize(s.blocks.size());
  for (std::size_t k = 0; k < s.blocks.size(); ++k)
    s.tags[k] = s.blocks[k].state == 1 ? buffer_of_block_[static_cast<std::size_t>(s.blocks[k].block)] : -1;
  const int np = allocator_.num_pending();
  s.pending.resize(static_cast<std::size_t>(np));
  if (np == 0) return;
  // Where each pending block lies (its entry in s.blocks, found through a block -> entry map).
  std::vector<int>& entry = shapes_.entry_of_block;
  for (std::size_t k = 0; k < s.blocks.size(); ++k) {
    const auto blk = static_cast<std::size_t>(s.blocks[k].block);
    if (blk >= entry.size()) entry.resize(2 * blk + 64, -1);
    entry[blk] = static_cast<int>(k);
  }
  for (int k = 0; k < np; ++k) {
    const auto [blk, ev] = allocator_.pending_at(k);
    const CachingAllocator::BlockState& b = s.blocks[static_cast<std::size_t>(entry[static_cast<std::size_t>(blk)])];
    s.pending[static_cast<std::size_t>(k)] = Shape::Pending{b.segment, b.offset, ev};
  }
}

bool MemoryTracker::shape_repeats(const Shape& a, const Shape& b, int p) const {
  const AllocatorStats &x = a.stats, &y = b.stats;
  if (x.allocated != y.allocated || x.requested != y.requested || x.reserved != y.reserved || x.pending != y.pending ||
      a.live != b.live || a.segments.size() != b.segments.size() || a.blocks.size() != b.blocks.size() ||
      a.pending.size() != b.pending.size())
    return false;
  // The same sizes in the same order; each segment where it was, or cudaMalloc'ed again one period's
  // worth of addresses on (a period that releases the cache and cudaMallocs again).
  const Bytes dnext = b.next_address - a.next_address;
  for (std::size_t k = 0; k < a.segments.size(); ++k) {
    const auto &u = a.segments[k], &v = b.segments[k];
    if (u.size != v.size || (v.base != u.base && v.base - u.base != dnext)) return false;
    // (an expandable segment is one address range per pool, never cudaMalloc'ed again: shift_periods cannot
    // relocate one; a pool whose range was released and mapped anew is not a repeat it can write)
    if (v.base != u.base && (allocator_.segment_expandable(u.slot) || allocator_.segment_expandable(v.slot))) return false;
  }
  for (std::size_t k = 0; k < a.blocks.size(); ++k) {
    const auto &u = a.blocks[k], &v = b.blocks[k];
    if (u.segment != v.segment || u.offset != v.offset || u.size != v.size || u.requested != v.requested ||
        u.state != v.state)
      return false;
    if (u.state == 1 && a.tags[k] != b.tags[k] &&
        !shifted_buffer(static_cast<int>(a.tags[k]), static_cast<int>(b.tags[k]), p))
      return false;
  }
  for (std::size_t k = 0; k < a.pending.size(); ++k) {
    const Shape::Pending &u = a.pending[k], &v = b.pending[k];
    if (u.segment != v.segment || u.offset != v.offset || v.event != u.event + p) return false;
  }
  return true;
}

bool MemoryTracker::can_shift(const Shape& a, const Shape& b, int p, int m) const {
  for (std::size_t k = 0; k < b.blocks.size(); ++k)
    if (b.blocks[k].state == 1 && a.tags[k] != b.tags[k] && shift_buffer(static_cast<int>(b.tags[k]), m * p) < 0)
      return false;
  return true;
}

bool MemoryTracker::shift_periods(const Shape& a, const Shape& b, int p, int m, bool waited) {
  const int d = m * p;
  if (!can_shift(a, b, p, m)) return false;   // (nothing changed)
  // (Renamed in two passes: a buffer m periods on may be one of those renamed, when buffers live longer
  // than m periods.)
  std::vector<std::pair<int, int>>& moves = shapes_.moves;
  moves.clear();
  for (std::size_t k = 0; k < b.blocks.size(); ++k) {
    if (b.blocks[k].state != 1 || a.tags[k] == b.tags[k]) continue;
    const int old_buf = static_cast<int>(b.tags[k]);
    moves.emplace_back(b.blocks[k].block, shift_buffer(old_buf, d));
    block_of_[old_buf] = kNotLive;
  }
  for (const auto& [blk, new_buf] : moves) {
    if (block_of_[new_buf] != kNotLive)
      throw std::logic_error("memory shift: buffer " + std::to_string(new_buf) + " would be live twice");
    block_of_[new_buf] = blk;
    note_block(blk, new_buf);
  }
  allocator_.shift_pending_events(d);
  if (waited) {
    for (int k = 0, np = allocator_.num_pending(); k < np; ++k) {
      const std::int64_t ev = allocator_.pending_at(k).second;
      if (ev < 0 || ev >= static_cast<std::int64_t>(waited_on_.size()))
        throw std::logic_error("memory shift: a pending block's event " + std::to_string(ev) + " is not an op");
      waited_on_[static_cast<std::size_t>(ev)] = 1;
    }
    ready_ = true;   // (a scan at the next allocation releases what has completed: none sooner)
  }
  // Segments cudaMalloc'ed again every period lie m periods' worth of addresses further on.
  std::vector<std::pair<int, Bytes>>& moved = shapes_.relocations;
  moved.clear();
  for (std::size_t k = 0; k < b.segments.size(); ++k)
    if (b.segments[k].base != a.segments[k].base)
      moved.emplace_back(b.segments[k].slot, m * (b.segments[k].base - a.segments[k].base));
  allocator_.relocate(moved, m * (b.next_address - a.next_address));
  AllocatorStats s = allocator_.stats();
  const AllocatorStats &x = a.stats, &y = b.stats;
  s.num_allocs += m * (y.num_allocs - x.num_allocs);
  s.num_device_alloc += m * (y.num_device_alloc - x.num_device_alloc);
  s.num_device_free += m * (y.num_device_free - x.num_device_free);
  s.num_alloc_retries += m * (y.num_alloc_retries - x.num_alloc_retries);
  s.num_ooms += m * (y.num_ooms - x.num_ooms);
  allocator_.set_stats(s);
  return true;
}

}  // namespace fsdpsim::sim
