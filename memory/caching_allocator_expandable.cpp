// Expandable segments in the caching-allocator model (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
// the rules are listed in caching_allocator.h). Followed from c10/cuda/CUDACachingAllocator.cpp: Note
// [Expandable Segments], ExpandableSegment::map / unmap, and DeviceCachingAllocator::get_free_block,
// alloc_block, try_allocate_expandable_block, find_expandable_block, map_block, unmap_block,
// release_blocks, release_expandable_segment, should_split.
//
// One segment per pool (stream x small/large): a range of virtual addresses of whole pages (2 MiB in the
// small pool, 20 MiB in the large one) whose blocks are mapped (free, allocated or pending, exactly as in
// a cudaMalloc'ed segment) or unmapped (no physical pages; State::Unmapped, never in a pool, never merged
// with a mapped block). The last block is always unmapped: the rest of the range. Reserved bytes are the
// mapped pages.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "memory/caching_allocator.h"

namespace fsdpsim::sim {

// malloc() with expandable segments: get_free_block, else alloc_block (try_allocate_expandable_block),
// else release_cached_blocks and alloc_block again (isRetry). (alloc() then splits the block whenever at
// least 512 B remain: should_split splits in both pools with expandable segments.)
int CachingAllocator::take_expandable(Bytes size, int pi) {
  int b = find_free_block_expandable(pools_[pi], size);
  if (b < 0) {
    b = try_allocate_expandable_block(pi, size, false);
    if (b < 0) {
      release_cached_blocks();
      ++stats_.num_alloc_retries;
      b = try_allocate_expandable_block(pi, size, false);
      if (b < 0) {
        // A real run raises OutOfMemoryError here; the model records it and maps past capacity.
        ++stats_.num_ooms;
        b = try_allocate_expandable_block(pi, size, true);
      }
    }
  }
  return b;
}

// get_free_block with expandable segments: best fit by (size, address), except that a free block followed
// by unmapped pages counts for best fit as the size it could grow to (its size + the unmapped block's):
// from the smallest fitting block, the walk moves on to the next block in (size, address) order while
// that one's grown size is smaller. Then the max_split_size checks on the mapped size, as without.
int CachingAllocator::find_free_block_expandable(Pool& p, Bytes size) {
  const std::size_t n = p.sizes.size();
  const Pool::Hint& h = p.hints[hint_slot(size)];   // (class_at_least, memoized per size as find_free_block does)
  std::size_t ci = next_nonempty(p, h.size == size ? h.index : lower_class(p, size).index);   // (emptied classes stay)
  if (ci == n) return -1;
  std::size_t pos = p.list(ci).size() - 1;   // (a class's blocks are kept address-descending)
  const auto unmapped_after = [&](int b) {
    const int nx = blocks_[b].next;
    return nx >= 0 && blocks_[nx].state == State::Unmapped ? blocks_[nx].size : Bytes{0};
  };
  for (;;) {
    const int b = p.list(ci)[pos].block;
    const Bytes grown = unmapped_after(b);
    if (grown == 0) break;   // (its grown size is its size: no later block's is smaller)
    std::size_t ci2 = ci, pos2 = pos;
    if (pos2 > 0) {
      --pos2;
    } else {
      ci2 = next_nonempty(p, ci2 + 1);
      if (ci2 == n) break;
      pos2 = p.list(ci2).size() - 1;
    }
    const int b2 = p.list(ci2)[pos2].block;
    if (!(blocks_[b2].size + unmapped_after(b2) < blocks_[b].size + grown)) break;
    ci = ci2;
    pos = pos2;
  }
  const int b = p.list(ci)[pos].block;
  if (split_limits_) {
    const Bytes found = blocks_[b].size;
    if (size < config_.max_split_size && found >= config_.max_split_size) return -1;
    if (size >= config_.max_split_size && found >= size + config_.max_non_split_rounding) return -1;
  }
  pool_erase(p, b);
  return b;
}

// find_expandable_block: the lowest-addressed unmapped block (or the free block just before it) from
// which free and unmapped blocks reach `size` bytes. The pool's segment is created on first use (an
// address range, nothing mapped). The last block is the rest of the range, so it has room for any
// request the address space holds; for one it does not (far beyond any GPU: an OOM in any case) the
// model lengthens the range instead of reserving a second one (PyTorch would).
int CachingAllocator::find_expandable_block(int pi, Bytes size) {
  Pool& p = pools_[pi];
  if (p.expandable < 0) {
    const int seg = add_segment(pi, page_size(pi) * kExpandableVirtualPages);
    const int b = add_block(Block{segments_[seg].base, segments_[seg].size, 0, seg, -1, -1, pi, 0, State::Unmapped});
    Segment& s = segments_[seg];
    s.expandable = true;
    s.first = s.last = b;
    s.unmapped = 1;
    pools_[pi].expandable = seg;
  }
  Segment& s = segments_[pools_[pi].expandable];
  const auto allocatable = [&](int b) {
    return b >= 0 && (blocks_[b].state == State::Free || blocks_[b].state == State::Unmapped);
  };
  const auto from = [&](int u) { return allocatable(blocks_[u].prev) ? blocks_[u].prev : u; };
  const auto room = [&](int c) {
    Bytes r = 0;
    for (int b = c; r < size && allocatable(b); b = blocks_[b].next) r += blocks_[b].size;
    return r;
  };
  // Holes left by a cache release: the lowest one from which (or from the free block just before it) the run of free
  // and unmapped blocks has room.
  for (const auto& [addr, h] : p.holes) {
    const int c = from(h);
    if (room(c) >= size) return c;
  }
  const int c = from(s.last);
  if (const Bytes r = room(c); r < size) {
    const Bytes page = page_size(pi), extra = (size - r + page - 1) / page * page;
    blocks_[s.last].size += extra;
    s.size += extra;
  }
  return c;
}

// try_allocate_expandable_block: from the candidate, map pages until one free block holds `size` bytes
// (each map_block merges the new pages with the free block before them); that block leaves the pool.
// -1 if a mapping fails (beyond capacity, unless `force`); pages mapped before the failure stay mapped.
int CachingAllocator::try_allocate_expandable_block(int pi, Bytes size, bool force) {
  int c = find_expandable_block(pi, size);
  if (blocks_[c].state == State::Unmapped && !map_block(c, std::min(blocks_[c].size, size), force)) return -1;
  while (blocks_[c].size < size) {
    const int nx = blocks_[c].next;   // unmapped (a free block after c would have merged with it)
    if (!map_block(nx, std::min(size - blocks_[c].size, blocks_[nx].size), force)) return -1;
    c = nx;   // (nx absorbed c)
  }
  pool_erase(pools_[pi], c);
  return c;
}

// map_block + ExpandableSegment::map: pages for the first `size` bytes of unmapped block b (its start is
// page-aligned), the rest of b staying unmapped after it; the mapped block becomes free, merges with
// free neighbours and joins the pool. One mapping = one num_device_alloc. False if it does not fit.
bool CachingAllocator::map_block(int b, Bytes size, bool force) {
  const Bytes page = page_size(blocks_[b].pool);
  const Bytes mapped = (size + page - 1) / page * page;
  if (!force && config_.capacity > 0 && stats_.reserved + mapped > config_.capacity) return false;
  const int seg = blocks_[b].segment;
  const bool hole = b != segments_[seg].last;
  if (hole) hole_erase(b);
  if (mapped < blocks_[b].size) {
    const Block& x = blocks_[b];
    const int r = add_block(Block{x.addr + mapped, x.size - mapped, 0, seg, b, x.next, x.pool, 0, State::Unmapped});
    Block& y = blocks_[b];   // (add_block may have moved blocks_)
    if (y.next >= 0) blocks_[y.next].prev = r;
    else segments_[seg].last = r;
    y.next = r;
    y.size = mapped;
    if (hole) hole_insert(r);   // (the rest of a hole is one; the rest of the last block is the last block)
  } else {
    --segments_[seg].unmapped;
  }
  stats_.reserved += mapped;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  ++stats_.num_device_alloc;
  free_block(b);   // (state Free, merged with free neighbours, into the pool; an unmapped one never merges)
  return true;
}

// unmap_block + ExpandableSegment::unmap: the whole pages inside free block b are unmapped; what lies
// before and after them stays mapped, as free blocks of the pool; the unmapped range merges with unmapped
// neighbours. A segment left with no mapped page is released (release_expandable_segment).
void CachingAllocator::unmap_block(int b) {
  const int seg = blocks_[b].segment;
  const Bytes page = page_size(blocks_[b].pool), base = segments_[seg].base;
  const Bytes off = blocks_[b].addr - base, off_end = off + blocks_[b].size;
  const Bytes begin = (off + page - 1) / page * page, end = off_end / page * page;
  if (begin >= end) return;
  const int pi = blocks_[b].pool;
  pool_erase(pools_[pi], b);
  if (begin > off) {
    const Block& x = blocks_[b];
    const int f = add_block(Block{x.addr, begin - off, 0, seg, x.prev, b, pi, 0, State::Free});
    Block& y = blocks_[b];
    if (y.prev >= 0) blocks_[y.prev].next = f;
    else segments_[seg].first = f;
    y.prev = f;
    insert_split_off(f);
  }
  if (off_end > end) {
    const int f = add_block(Block{base + end, off_end - end, 0, seg, b, blocks_[b].next, pi, 0, State::Free});
    Block& y = blocks_[b];
    if (y.next >= 0) blocks_[y.next].prev = f;
    else segments_[seg].last = f;
    y.next = f;
    insert_split_off(f);
  }
  Block& x = blocks_[b];
  x.addr = base + begin;
  x.size = end - begin;
  x.state = State::Unmapped;
  Segment& s = segments_[seg];
  ++s.unmapped;
  if (const int pv = x.prev; pv >= 0 && blocks_[pv].state == State::Unmapped) {
    hole_erase(pv);   // (never the last block: b comes after it)
    x.addr = blocks_[pv].addr;
    x.size += blocks_[pv].size;
    x.prev = blocks_[pv].prev;
    if (x.prev >= 0) blocks_[x.prev].next = b;
    else s.first = b;
    blocks_[pv].state = State::Dead;
    dead_blocks_.push_back(pv);
    --s.unmapped;
  }
  if (const int nx = x.next; nx >= 0 && blocks_[nx].state == State::Unmapped) {
    if (nx != s.last) hole_erase(nx);
    x.size += blocks_[nx].size;
    x.next = blocks_[nx].next;
    if (x.next >= 0) blocks_[x.next].prev = b;
    else s.last = b;
    blocks_[nx].state = State::Dead;
    dead_blocks_.push_back(nx);
    --s.unmapped;
  }
  if (b != s.last) hole_insert(b);
  stats_.reserved -= end - begin;
  ++stats_.num_device_free;
  if (x.prev < 0 && x.next < 0) {
    s.live = false;
    x.state = State::Dead;
    dead_blocks_.push_back(b);
    pools_[pi].expandable = -1;
  }
}

// release_blocks with expandable segments: every free block of every pool, in (size, address) order, is
// unmapped (gathered first: unmapping changes the pools).
void CachingAllocator::release_expandable_cached_blocks() {
  for (std::size_t pi = 0; pi < pools_.size(); ++pi) {
    Pool& p = pools_[pi];
    release_scratch_.clear();
    const std::size_t n = p.sizes.size();   // (its non-empty classes only: emptied ones stay, by thousands)
    for (std::size_t c = next_nonempty(p, 0); c < n; c = next_nonempty(p, c + 1))
      for (auto e = p.list(c).rbegin(); e != p.list(c).rend(); ++e) release_scratch_.push_back(e->block);
    for (int b : release_scratch_) unmap_block(b);
  }
}

void CachingAllocator::hole_insert(int b) {
  std::vector<std::pair<Bytes, int>>& v = pools_[blocks_[b].pool].holes;
  const std::pair<Bytes, int> e{blocks_[b].addr, b};
  v.insert(std::lower_bound(v.begin(), v.end(), e), e);
}

void CachingAllocator::hole_erase(int b) {
  std::vector<std::pair<Bytes, int>>& v = pools_[blocks_[b].pool].holes;
  const auto it = std::lower_bound(v.begin(), v.end(), std::pair<Bytes, int>{blocks_[b].addr, b});
  if (it == v.end() || it->second != b) throw std::logic_error("CachingAllocator: an unmapped block missing from its holes");
  v.erase(it);
}

void CachingAllocator::rebuild_holes(Pool& p) {
  p.holes.clear();
  if (p.expandable < 0) return;
  const Segment& s = segments_[p.expandable];
  for (int b = s.first; b >= 0; b = blocks_[b].next)
    if (blocks_[b].state == State::Unmapped && b != s.last) p.holes.emplace_back(blocks_[b].addr, b);
}

}  // namespace fsdpsim::sim
